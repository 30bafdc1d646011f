package draplugin

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/hamireg/hamireg/annotation"
)

func TestNewValidates(t *testing.T) {
	t.Parallel()
	client := newClient()
	tests := map[string]struct {
		mod  func(*Options)
		want string
	}{
		"no driver":    {func(o *Options) { o.Profile.Driver = "" }, "Options.Profile.Driver is empty: set Options.Profile to dra.SDKProfile()"},
		"no client":    {func(o *Options) { o.Client = nil }, "Options.Client is nil"},
		"no node name": {func(o *Options) { o.NodeName = "" }, "Options.NodeName is empty"},
		"long socket":  {func(o *Options) { o.PluginDir = "/" + strings.Repeat("x", 120) }, "Options.PluginDir gives the socket path"},
		"bad Env":      {func(o *Options) { o.Env.DeviceListStrategy = "cdi" }, "Options.Env: invalid options: device list strategy"},
		"CDI strategy": {func(o *Options) { o.Env.DeviceListStrategy = "envvar,cdi-cri" }, "use envvar or volume-mounts for DRA"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			opts := testOptions(t, client)
			tc.mod(&opts)
			_, err := New(opts)
			if !errors.Is(err, ErrInvalidOptions) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v, want ErrInvalidOptions with %q", err, tc.want)
			}
		})
	}
}

func TestNewDefaults(t *testing.T) {
	t.Parallel()
	p, err := New(Options{Profile: testProfile(), Client: newClient(), NodeName: testNode, PluginDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if p.opts.RegistrarDir != DefaultRegistrarDir || p.opts.CDIDir != DefaultCDIDir || p.syncDelay != DefaultSliceSyncDelay {
		t.Errorf("defaults: %+v, sync delay %v", p.opts, p.syncDelay)
	}
	p, err = New(Options{Profile: testProfile(), Client: newClient(), NodeName: testNode, PluginDir: t.TempDir(), SliceSyncDelay: -5})
	if err != nil {
		t.Fatal(err)
	}
	if p.syncDelay != 0 {
		t.Errorf("negative SliceSyncDelay gives %v, want 0", p.syncDelay)
	}
	q, err := New(Options{Profile: testProfile(), Client: newClient(), NodeName: testNode, RegistrarDir: "/r"})
	if err != nil {
		// The default PluginDir may be unreadable here; only its value matters.
		if !errors.Is(err, ErrCheckpoint) {
			t.Fatal(err)
		}
		return
	}
	if want := filepath.Join(DefaultPluginDirBase, testProfile().Driver); q.opts.PluginDir != want {
		t.Errorf("PluginDir %s, want %s", q.opts.PluginDir, want)
	}
}

// slicesOf lists the ResourceSlices of the fake clientset.
func slicesOf(t *testing.T, client *fake.Clientset) []resourcev1.ResourceSlice {
	t.Helper()
	l, err := client.ResourceV1().ResourceSlices().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}

func countActions(client *fake.Clientset, verb string) int {
	n := 0
	for _, a := range client.Actions() {
		if a.GetVerb() == verb && a.GetResource().Resource == "resourceslices" {
			n++
		}
	}
	return n
}

func TestRunPublishesTheSlice(t *testing.T) {
	t.Parallel()
	client := newClient()
	opts := testOptions(t, client)
	p := newPlugin(t, opts)
	gpus := testGPUs()
	devs := testDevices(t, opts.Profile, gpus)
	p.SetDevices(gpus, devs) // before Run
	log := run(t, p)

	waitFor(t, "the slice", func() bool { return len(slicesOf(t, client)) == 1 })
	s := slicesOf(t, client)[0]
	if s.Spec.Driver != opts.Profile.Driver || s.Spec.Pool.Name != testNode || s.Spec.NodeName == nil || *s.Spec.NodeName != testNode || s.Spec.Pool.ResourceSliceCount != 1 {
		t.Errorf("slice spec: %+v", s.Spec)
	}
	if len(s.OwnerReferences) != 1 || s.OwnerReferences[0].UID != testNodeUID || s.OwnerReferences[0].Kind != "Node" {
		t.Errorf("owner: %+v (want the Node, UID looked up)", s.OwnerReferences)
	}
	if diff := cmp.Diff(devs, s.Spec.Devices); diff != "" {
		t.Errorf("devices (-want +got):\n%s", diff)
	}
	if _, err := os.Stat(filepath.Join(opts.PluginDir, "dra.sock")); err != nil {
		t.Errorf("dra.sock: %v", err)
	}
	if _, err := os.Stat(filepath.Join(opts.RegistrarDir, opts.Profile.Driver+"-reg.sock")); err != nil {
		t.Errorf("registrar socket: %v", err)
	}

	// The create's own watch event syncs the pool once more; after that, an unchanged
	// SetDevices must diff to nothing.
	waitFor(t, "two syncs", func() bool { n, _ := log.count(); return n >= 2 })
	n, _ := log.count()
	p.SetDevices(testGPUs(), testDevices(t, opts.Profile, testGPUs()))
	waitFor(t, "the sync of the unchanged devices", func() bool { m, _ := log.count(); return m > n })
	_, last := log.count()
	if !strings.Contains(last, `"numChangedMatchedSlices"=0`) || !strings.Contains(last, `"numNewSlices"=0`) {
		t.Errorf("sync of unchanged devices: %s", last)
	}
	if got := countActions(client, "update"); got != 0 {
		t.Errorf("%d slice updates after an unchanged SetDevices, want 0", got)
	}
	if st := p.Stats(); st.SliceCreates != 1 || st.SliceUpdates != 0 || st.SliceDeletes != 0 {
		t.Errorf("stats %+v, want 1 create", st)
	}
	if after := slicesOf(t, client)[0]; after.Spec.Pool.Generation != s.Spec.Pool.Generation || after.ResourceVersion != s.ResourceVersion {
		t.Errorf("slice rewritten: generation %d→%d", s.Spec.Pool.Generation, after.Spec.Pool.Generation)
	}

	// A change is one update of the same slice.
	changed := testGPUs()[:1]
	p.SetDevices(changed, testDevices(t, opts.Profile, changed))
	waitFor(t, "the update", func() bool { return p.Stats().SliceUpdates == 1 })
	if got := slicesOf(t, client); len(got) != 1 || len(got[0].Spec.Devices) != 1 {
		t.Errorf("after the change: %d slices, %+v", len(got), got)
	}
}

// The kubelet's DRA manager deletes the node's slices when it starts: the controller sees
// the delete and creates the slice again.
func TestRunRecreatesADeletedSlice(t *testing.T) {
	t.Parallel()
	client := newClient()
	opts := testOptions(t, client)
	p := newPlugin(t, opts)
	run(t, p)
	p.SetDevices(testGPUs(), testDevices(t, opts.Profile, testGPUs())) // after Run
	waitFor(t, "the slice", func() bool { return len(slicesOf(t, client)) == 1 })
	if err := p.Run(t.Context()); !errors.Is(err, ErrAlreadyRunning) {
		t.Errorf("second Run: %v, want ErrAlreadyRunning", err)
	}
	old := slicesOf(t, client)[0]
	if err := client.ResourceV1().ResourceSlices().Delete(t.Context(), old.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the slice again", func() bool {
		s := slicesOf(t, client)
		return len(s) == 1 && s[0].Name != old.Name
	})
	// The controller counts a create after the API server answered it, so the new slice
	// can be listed a moment before the count moves.
	waitFor(t, "the second create counted", func() bool { return p.Stats().SliceCreates >= 2 })
	if st := p.Stats(); st.SliceCreates != 2 {
		t.Errorf("stats %+v, want 2 creates", st)
	}
}

func readSpec(t *testing.T, path string) cdispec.Spec {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var s cdispec.Spec
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatal(err)
	}
	if err := cdispec.ValidateVersion(&s); err != nil {
		t.Errorf("CDI version: %v", err)
	}
	return s
}

func TestPrepareOverGRPC(t *testing.T) {
	t.Parallel()
	claim := testClaim("3f1a0c3e-0000-4000-8000-000000000001", "pod-a-main", testProfile().Driver, "10Gi", "30", "gpu-1")
	client := newClient(claim)
	opts := testOptions(t, client)
	p := newPlugin(t, opts)
	p.SetDevices(testGPUs(), testDevices(t, opts.Profile, testGPUs()))
	run(t, p)
	node := dialPlugin(t, opts.PluginDir)

	req := &drapbv1.Claim{Namespace: claim.Namespace, Name: claim.Name, Uid: string(claim.UID)}
	resp, err := node.NodePrepareResources(t.Context(), &drapbv1.NodePrepareResourcesRequest{Claims: []*drapbv1.Claim{req}})
	if err != nil {
		t.Fatal(err)
	}
	got := resp.Claims[string(claim.UID)]
	if got == nil || got.Error != "" || len(got.Devices) != 1 {
		t.Fatalf("response %v", resp)
	}
	d := got.Devices[0]
	wantID := "k8s.hamireg.io/claim=" + string(claim.UID) + "-gpu-1"
	if d.PoolName != testNode || d.DeviceName != "gpu-1" || !slices.Equal(d.CdiDeviceIds, []string{wantID}) ||
		!slices.Equal(d.RequestNames, []string{"gpu"}) || d.GetShareId() != string(*claim.Status.Allocation.Devices.Results[0].ShareID) {
		t.Errorf("device %v", d)
	}
	specPath := filepath.Join(opts.CDIDir, "k8s.hamireg.io-claim_"+string(claim.UID)+".json")
	fi, err := os.Stat(specPath)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o644 {
		t.Errorf("spec mode %v, want 0644", fi.Mode().Perm())
	}
	spec := readSpec(t, specPath)
	if spec.Kind != "k8s.hamireg.io/claim" || len(spec.Devices) != 1 || spec.Devices[0].Name != string(claim.UID)+"-gpu-1" {
		t.Errorf("spec %+v", spec)
	}
	gpu1 := testGPUs()[1].ID
	for _, env := range []string{"CUDA_DEVICE_MEMORY_LIMIT_0=10240m", "CUDA_DEVICE_SM_LIMIT_0=30", "NVIDIA_VISIBLE_DEVICES=" + gpu1} {
		if !slices.Contains(spec.ContainerEdits.Env, env) {
			t.Errorf("spec env %v lacks %s", spec.ContainerEdits.Env, env)
		}
	}
	if !slices.Equal(spec.Devices[0].ContainerEdits.Env, []string{"HAMIREG_DRA_DEVICE_0=" + gpu1}) {
		t.Errorf("device env %v", spec.Devices[0].ContainerEdits.Env)
	}
	if _, err := os.Stat(opts.Env.HookPath); !os.IsNotExist(err) {
		t.Errorf("without PrepareStateDir the host's hook folder is left alone, but: %v", err)
	}
	if got := p.PreparedGPUs(); !slices.Equal(got[gpu1], []types.UID{claim.UID}) || len(got) != 1 {
		t.Errorf("PreparedGPUs %v", got)
	}

	uresp, err := node.NodeUnprepareResources(t.Context(), &drapbv1.NodeUnprepareResourcesRequest{Claims: []*drapbv1.Claim{req}})
	if err != nil {
		t.Fatal(err)
	}
	if e := uresp.Claims[string(claim.UID)]; e == nil || e.Error != "" {
		t.Fatalf("unprepare %v", uresp)
	}
	if _, err := os.Stat(specPath); !os.IsNotExist(err) {
		t.Errorf("spec after unprepare: %v", err)
	}
	if got := p.PreparedGPUs(); len(got) != 0 {
		t.Errorf("PreparedGPUs after unprepare %v", got)
	}
	if st := p.Stats(); st.Prepared != 1 || st.Unprepared != 1 {
		t.Errorf("stats %+v", st)
	}
}

func dialPlugin(tb testing.TB, pluginDir string) drapbv1.DRAPluginClient {
	tb.Helper()
	sock := filepath.Join(pluginDir, "dra.sock")
	waitFor(tb, "dra.sock", func() bool { _, err := os.Stat(sock); return err == nil })
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = conn.Close() })
	return drapbv1.NewDRAPluginClient(conn)
}

func prepare(t *testing.T, p *Plugin, claims ...*resourcev1.ResourceClaim) map[types.UID]kubeletplugin.PrepareResult {
	t.Helper()
	res, err := p.PrepareResourceClaims(t.Context(), claims)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != len(claims) {
		t.Fatalf("%d results for %d claims", len(res), len(claims))
	}
	return res
}

func unprepare(t *testing.T, p *Plugin, uids ...types.UID) map[types.UID]error {
	t.Helper()
	refs := make([]kubeletplugin.NamespacedObject, len(uids))
	for i, u := range uids {
		refs[i] = kubeletplugin.NamespacedObject{UID: u, NamespacedName: types.NamespacedName{Namespace: "default", Name: "c"}}
	}
	res, err := p.UnprepareResourceClaims(t.Context(), refs)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func TestPrepareIdempotentAndRestart(t *testing.T) {
	t.Parallel()
	opts := testOptions(t, newClient())
	opts.PrepareStateDir = true
	p := newPlugin(t, opts)
	p.SetDevices(testGPUs(), testDevices(t, opts.Profile, testGPUs()))
	claim := testClaim("uid-1", "c1", opts.Profile.Driver, "10Gi", "30", "gpu-0", "gpu-1")

	first := prepare(t, p, claim)[claim.UID]
	if first.Err != nil || len(first.Devices) != 2 {
		t.Fatalf("prepare: %+v", first)
	}
	specPath := filepath.Join(opts.CDIDir, cdiSpecFile(claim.UID))
	before, err := os.Stat(specPath)
	if err != nil {
		t.Fatal(err)
	}
	stateDir := filepath.Join(opts.Env.HookPath, "vgpu", "claims", string(claim.UID))
	if fi, err := os.Stat(stateDir); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o777 {
		t.Errorf("state folder: %v %v", fi, err)
	}
	spec := readSpec(t, specPath)
	for _, env := range []string{"CUDA_DEVICE_MEMORY_LIMIT_0=10240m", "CUDA_DEVICE_SM_LIMIT_1=30", "CUDA_DEVICE_MEMORY_LIMIT_1=10240m"} {
		if !slices.Contains(spec.ContainerEdits.Env, env) {
			t.Errorf("spec env %v lacks %s", spec.ContainerEdits.Env, env)
		}
	}

	again := prepare(t, p, claim)[claim.UID]
	if diff := cmp.Diff(first, again); diff != "" {
		t.Errorf("second prepare differs (-first +second):\n%s", diff)
	}
	after, err := os.Stat(specPath)
	if err != nil || !os.SameFile(before, after) {
		t.Errorf("second prepare rewrote the spec (%v)", err)
	}

	// A new plugin on the same folders (a restart) knows the claim.
	q := newPlugin(t, opts)
	if got := q.PreparedGPUs(); len(got) != 2 {
		t.Errorf("restarted PreparedGPUs %v", got)
	}
	if got, ok := q.Claim(claim.UID); !ok || got.Namespace != claim.Namespace || got.Name != claim.Name {
		t.Errorf("Claim(%s) = %v, %v; want %s/%s", claim.UID, got, ok, claim.Namespace, claim.Name)
	}
	if _, ok := q.Claim("never-prepared"); ok {
		t.Error("Claim of an unknown UID is ok")
	}
	q.SetDevices(testGPUs(), testDevices(t, opts.Profile, testGPUs()))
	if diff := cmp.Diff(first, prepare(t, q, claim)[claim.UID]); diff != "" {
		t.Errorf("prepare after restart differs:\n%s", diff)
	}
	for i := range 2 {
		if err := unprepare(t, q, claim.UID, "never-prepared")[claim.UID]; err != nil {
			t.Errorf("unprepare %d: %v", i, err)
		}
	}
	if _, err := os.Stat(specPath); !os.IsNotExist(err) {
		t.Errorf("spec after unprepare: %v", err)
	}
	if _, err := os.Stat(stateDir); !os.IsNotExist(err) {
		t.Errorf("state folder after unprepare: %v", err)
	}
	if st := q.Stats(); st.Unprepared != 4 || st.Prepared != 1 {
		t.Errorf("stats %+v", st)
	}
	if r := newPlugin(t, opts); len(r.PreparedGPUs()) != 0 {
		t.Errorf("after unprepare and restart: %v", r.PreparedGPUs())
	}
}

func TestPrepareRefuses(t *testing.T) {
	t.Parallel()
	driver := testProfile().Driver
	unhealthy := testGPUs()
	unhealthy[1].Health = false
	tests := map[string]struct {
		claim  *resourcev1.ResourceClaim
		gpus   []annotation.Device
		refuse error
		want   string
	}{
		"Refuse says no":     {claim: testClaim("u", "c", driver, "1Gi", "10", "gpu-0"), refuse: errors.New("GPU held by HAMi"), want: "GPU held by HAMi"},
		"unknown device":     {claim: testClaim("u", "c", driver, "1Gi", "10", "gpu-7"), want: "gpu-7"},
		"unhealthy":          {claim: testClaim("u", "c", driver, "1Gi", "10", "gpu-1"), gpus: unhealthy, want: "unhealthy"},
		"beyond its memory":  {claim: testClaim("u", "c", driver, "50Gi", "10", "gpu-0"), want: "MiB"},
		"not published":      {claim: testClaim("u", "c", driver, "1Gi", "10", "gpu-1"), gpus: testGPUs()[:1], want: "gpu-1"},
		"two results beyond": {claim: testClaim("u", "c", driver, "30Gi", "10", "gpu-0", "gpu-0"), want: "MiB"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			opts := testOptions(t, newClient())
			var asked []annotation.Device
			opts.Refuse = func(_ context.Context, gpus []annotation.Device) error {
				asked = gpus
				return tc.refuse
			}
			p := newPlugin(t, opts)
			gpus := tc.gpus
			if gpus == nil {
				gpus = testGPUs()
			}
			// The slice lists what the scan publishes; "not published" scans GPU 1 but
			// publishes GPU 0 only.
			p.SetDevices(testGPUs(), testDevices(t, opts.Profile, gpus))
			if tc.gpus != nil && name == "unhealthy" {
				p.SetDevices(gpus, testDevices(t, opts.Profile, gpus))
			}
			res := prepare(t, p, tc.claim)[tc.claim.UID]
			if !errors.Is(res.Err, ErrRefused) || !strings.Contains(res.Err.Error(), tc.want) {
				t.Fatalf("Err %v, want ErrRefused naming %q", res.Err, tc.want)
			}
			if tc.refuse != nil && (len(asked) != 1 || asked[0].ID != testGPUs()[0].ID) {
				t.Errorf("Refuse asked with %v", asked)
			}
			if st := p.Stats(); st.Refused != 1 || st.Prepared != 0 {
				t.Errorf("stats %+v", st)
			}
			if ents, _ := os.ReadDir(opts.CDIDir); len(ents) != 0 {
				t.Errorf("CDI specs of a refused claim: %v", ents)
			}
		})
	}
}

func TestPrepareCapacityAcrossClaims(t *testing.T) {
	t.Parallel()
	opts := testOptions(t, newClient())
	p := newPlugin(t, opts)
	p.SetDevices(testGPUs(), testDevices(t, opts.Profile, testGPUs()))
	driver := opts.Profile.Driver
	a := testClaim("a", "a", driver, "30Gi", "60", "gpu-0")
	b := testClaim("b", "b", driver, "10Gi", "50", "gpu-0")
	res := prepare(t, p, a, b)
	if res["a"].Err != nil || !errors.Is(res["b"].Err, ErrRefused) || !strings.Contains(res["b"].Err.Error(), "cores") {
		t.Fatalf("a: %v, b: %v (want b refused for cores)", res["a"].Err, res["b"].Err)
	}
	unprepare(t, p, "a")
	if res := prepare(t, p, b); res["b"].Err != nil {
		t.Errorf("b after a left: %v", res["b"].Err)
	}
}

func TestPrepareOtherDriver(t *testing.T) {
	t.Parallel()
	opts := testOptions(t, newClient())
	p := newPlugin(t, opts)
	p.SetDevices(testGPUs(), testDevices(t, opts.Profile, testGPUs()))
	claim := testClaim("x", "x", "other.example.com", "1Gi", "1", "gpu-0")
	res := prepare(t, p, claim)["x"]
	if res.Err != nil || res.Devices == nil || len(res.Devices) != 0 {
		t.Errorf("claim of another driver: %+v, want no devices", res)
	}
	if _, err := os.Stat(filepath.Join(opts.CDIDir, cdiSpecFile("x"))); !os.IsNotExist(err) {
		t.Errorf("spec for a claim of another driver: %v", err)
	}
}

// A reboot empties /var/run/cdi but not the checkpoint: Prepare writes the spec again.
func TestPrepareRewritesALostSpec(t *testing.T) {
	t.Parallel()
	opts := testOptions(t, newClient())
	p := newPlugin(t, opts)
	p.SetDevices(testGPUs(), testDevices(t, opts.Profile, testGPUs()))
	claim := testClaim("r", "r", opts.Profile.Driver, "1Gi", "10", "gpu-0")
	first := prepare(t, p, claim)["r"]
	specPath := filepath.Join(opts.CDIDir, cdiSpecFile("r"))
	if err := os.Remove(specPath); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(first, prepare(t, p, claim)["r"]); diff != "" {
		t.Errorf("answer differs:\n%s", diff)
	}
	if _, err := os.Stat(specPath); err != nil {
		t.Errorf("spec not written again: %v", err)
	}
}

func TestHandleErrorAndHealth(t *testing.T) {
	t.Parallel()
	opts := testOptions(t, newClient())
	var got []string
	opts.OnError = func(_ context.Context, err error, msg string) { got = append(got, msg+": "+err.Error()) }
	p := newPlugin(t, opts)
	p.HandleError(t.Context(), errors.New("boom"), "publish")
	if !slices.Equal(got, []string{"publish: boom"}) {
		t.Errorf("OnError got %v", got)
	}
	opts.DisableHealthService = true
	if err := newPlugin(t, opts).WatchHealthStatus(t.Context(), nil); !errors.Is(err, kubeletplugin.ErrHealthNotSupported) {
		t.Errorf("WatchHealthStatus with DisableHealthService: %v, want ErrHealthNotSupported", err)
	}
}

func TestClusterRoleRules(t *testing.T) {
	t.Parallel()
	verbs := map[string][]string{}
	for _, r := range ClusterRoleRules() {
		for _, res := range r.Resources {
			verbs[r.APIGroups[0]+"/"+res] = r.Verbs
		}
	}
	want := map[string][]string{
		"resource.k8s.io/resourceslices": {"get", "list", "watch", "create", "update", "delete"},
		"resource.k8s.io/resourceclaims": {"get"},
		"/nodes":                         {"get"},
	}
	if diff := cmp.Diff(want, verbs); diff != "" {
		t.Errorf("rules (-want +got):\n%s", diff)
	}
}

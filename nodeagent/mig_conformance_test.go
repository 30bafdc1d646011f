package nodeagent

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"

	gocmp "github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/clienttest"
	"github.com/hamireg/hamireg/hamicore"
	"github.com/hamireg/hamireg/internal/vectors"
	"github.com/hamireg/hamireg/mig"
	"github.com/hamireg/hamireg/nodelock"
)

// migAllocateFile is mig-allocate.json: successive kubelet Allocate calls into HAMi's plugin
// in MIG mode, and (master) the MIG block of its start-up.
type migAllocateFile struct {
	Vectors        []migAllocateVector `json:"vectors"`
	StartupVectors []migStartupVector  `json:"startup_vectors"`
}

// vectorCall is one kubelet Allocate of a vector: master writes an object, v2.9.0 the
// container requests alone.
type vectorCall struct {
	ContainerRequests [][]string        `json:"container_requests"`
	NodeLock          string            `json:"node_lock"`
	SetPhase          map[string]string `json:"set_phase"`
}

func (c *vectorCall) UnmarshalJSON(data []byte) error {
	if len(data) > 0 && data[0] == '[' {
		return json.Unmarshal(data, &c.ContainerRequests)
	}
	type plain vectorCall
	return json.Unmarshal(data, (*plain)(c))
}

// vectorResponse is a container response of a vector.
type vectorResponse struct {
	Envs   map[string]string `json:"envs"`
	Mounts []struct {
		ContainerPath string `json:"container_path"`
		HostPath      string `json:"host_path"`
		ReadOnly      bool   `json:"read_only"`
	} `json:"mounts"`
}

type migAllocateVector struct {
	Name  string `json:"name"`
	Input struct {
		AllocateCalls []vectorCall `json:"allocate_calls"`
		Config        struct {
			DeviceIDStrategy   string `json:"device_id_strategy"`
			DeviceListStrategy string `json:"device_list_strategy"`
		} `json:"config"`
		NodeLockBefore string      `json:"node_lock_before"`
		NVML           vectorNVML  `json:"nvml"`
		Pods           []vectorPod `json:"pods"`
	} `json:"input"`
	Calls []struct {
		WantError              *string          `json:"want_error"`
		WantPanic              any              `json:"want_panic"`
		WantContainerResponses []vectorResponse `json:"want_container_responses"`
		Patches                []struct {
			Body     json.RawMessage `json:"body"`
			Name     string          `json:"name"`
			Resource string          `json:"resource"`
		} `json:"patches"`
		PodAnnotationsAfter map[string]map[string]string `json:"pod_annotations_after"`
		NodeLockAfter       string                       `json:"node_lock_after"`
		NVMLStateAfter      []vectorGPUState             `json:"nvml_state_after"`
	} `json:"calls"`
}

type migStartupVector struct {
	Name  string `json:"name"`
	Input struct {
		NVML vectorNVML  `json:"nvml"`
		Pods []vectorPod `json:"pods"`
	} `json:"input"`
	Want struct {
		ResetGPUs          []int    `json:"reset_gpus"`
		TrackedAllocations []string `json:"tracked_allocations"`
	} `json:"want"`
	NVMLStateAfter []vectorGPUState `json:"nvml_state_after"`
}

type vectorNVML struct {
	Devices []vectorDevice         `json:"devices"`
	Models  map[string]vectorModel `json:"models"`
}

// vectorModel is an NVML model of a vector. Its gpu_instance_profiles is the list of
// profiles NVML answers, or, for a model that does not support MIG (an A10), a string saying
// so: every MIG query of such a GPU answers ERROR_NOT_SUPPORTED.
type vectorModel struct {
	Name     string
	Profiles []vectorProfile
	NoMIG    bool
}

func (m *vectorModel) UnmarshalJSON(data []byte) error {
	var raw struct {
		Name     string          `json:"name"`
		Profiles json.RawMessage `json:"gpu_instance_profiles"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return err
	}
	m.Name = raw.Name
	var why string
	if json.Unmarshal(raw.Profiles, &why) == nil {
		m.NoMIG = true
		return nil
	}
	return json.Unmarshal(raw.Profiles, &m.Profiles)
}

type vectorDevice struct {
	Index          int    `json:"index"`
	UUID           string `json:"uuid"`
	Model          string `json:"model"`
	MigModeCurrent int    `json:"mig_mode_current"`
	MigModePending int    `json:"mig_mode_pending"`
	Existing       []struct {
		ComputeInstanceID uint32        `json:"compute_instance_id"`
		GPUInstanceID     uint32        `json:"gpu_instance_id"`
		MigUUID           string        `json:"mig_uuid"`
		Placement         mig.Placement `json:"placement"`
		Profile           int           `json:"profile"`
	} `json:"existing_gpu_instances"`
}

type vectorProfile struct {
	Info struct {
		ID uint32 `json:"id"`
	} `json:"info"`
	MigName     string          `json:"mig_name"`
	Placements  []mig.Placement `json:"placements"`
	Profile     int             `json:"profile"`
	ProfileName string          `json:"profile_name"`
}

type vectorPod struct {
	Annotations     map[string]string `json:"annotations"`
	Containers      []string          `json:"containers"`
	Name            string            `json:"name"`
	Namespace       string            `json:"namespace"`
	Phase           corev1.PodPhase   `json:"phase"`
	ResourceVersion string            `json:"resource_version"`
	NodeName        string            `json:"spec_node_name"`
	UID             types.UID         `json:"uid"`
}

type vectorGPUState struct {
	UUID       string `json:"uuid"`
	MigDevices []struct {
		ComputeInstanceID uint32        `json:"compute_instance_id"`
		GPUInstanceID     uint32        `json:"gpu_instance_id"`
		MigUUID           string        `json:"mig_uuid"`
		Placement         mig.Placement `json:"placement"`
		ProfileID         uint32        `json:"profile_id"`
	} `json:"mig_devices"`
}

// hamiKeys are the pod annotations the vectors record after each call.
var hamiKeys = []string{allocation.KeyBindPhase, annotation.KeyNVIDIAToAllocate, mig.KeyAllocations}

// fake builds the MIG manager of the vector's NVML: each GPU's base profiles (the
// GPU_INSTANCE_PROFILE_<N>_SLICE enums, by the names' slice prefix "<N>g", as HAMi's manager
// resolves a reservation's name) and its instances.
func (n vectorNVML) fake(t *testing.T) *fakeMIG {
	t.Helper()
	fm := &fakeMIG{}
	for _, d := range n.Devices {
		model, ok := n.Models[d.Model]
		if !ok {
			t.Fatalf("no model %s", d.Model)
		}
		g := &fakeGPU{uuid: d.UUID, index: d.Index, modeCurrent: d.MigModeCurrent, modePending: d.MigModePending, profiles: map[string]fakeProfile{}, nextGI: 1, noMIG: model.NoMIG}
		for _, p := range model.Profiles {
			var slices int
			if _, err := fmt.Sscanf(p.ProfileName, "GPU_INSTANCE_PROFILE_%d_SLICE", &slices); err == nil && !strings.Contains(p.ProfileName, "REV") {
				g.profiles[fmt.Sprintf("%dg", slices)] = fakeProfile{id: p.Info.ID, placements: p.Placements}
			}
		}
		for _, e := range d.Existing {
			i := slices.IndexFunc(model.Profiles, func(p vectorProfile) bool { return p.Profile == e.Profile })
			if i < 0 {
				t.Fatalf("no profile %d in model %s", e.Profile, d.Model)
			}
			g.insts = append(g.insts, mig.Instance{GPUUUID: d.UUID, Profile: model.Profiles[i].MigName, ProfileID: model.Profiles[i].Info.ID, Placement: e.Placement,
				Runtime: mig.Runtime{MigUUID: e.MigUUID, GPUInstanceID: e.GPUInstanceID, ComputeInstanceID: e.ComputeInstanceID}})
			g.nextGI = max(g.nextGI, e.GPUInstanceID+1)
		}
		fm.gpus = append(fm.gpus, g)
	}
	return fm
}

// devices are the node's devices as HAMi master's scan registers a MIG GPU. A GPU that does
// not support MIG is not registered in mig mode (HAMi: "skip MIG device with no discovered
// profile capacity"; nvmlscan reports it with ErrNoMIGProfile).
func (n vectorNVML) devices() []annotation.Device {
	var out []annotation.Device
	for _, d := range n.Devices {
		if n.Models[d.Model].NoMIG {
			continue
		}
		out = append(out, annotation.Device{ID: d.UUID, Index: uint(d.Index), Count: 7, Devmem: 40960, Devcore: 100,
			Type: "NVIDIA-" + n.Models[d.Model].Name, Mode: allocation.ModeMIG, Health: true})
	}
	return out
}

func (p vectorPod) object() *corev1.Pod {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, UID: p.UID, ResourceVersion: p.ResourceVersion, Annotations: maps.Clone(p.Annotations)},
		Spec:       corev1.PodSpec{NodeName: p.NodeName},
		Status:     corev1.PodStatus{Phase: p.Phase},
	}
	for _, c := range p.Containers {
		pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{Name: c, Image: "cuda"})
	}
	return pod
}

// stateOf is the vector's NVML state in the fake's terms.
func stateOf(gpus []vectorGPUState) []mig.Instance {
	var out []mig.Instance
	for _, g := range gpus {
		for _, m := range g.MigDevices {
			out = append(out, mig.Instance{GPUUUID: g.UUID, ProfileID: m.ProfileID, Placement: m.Placement,
				Runtime: mig.Runtime{MigUUID: m.MigUUID, GPUInstanceID: m.GPUInstanceID, ComputeInstanceID: m.ComputeInstanceID}})
		}
	}
	return out
}

// withoutNames drops the profile names (the vectors record NVML's profile ids only).
func withoutNames(insts []mig.Instance) []mig.Instance {
	out := slices.Clone(insts)
	for i := range out {
		out[i].Profile = ""
	}
	return out
}

// normalizeRV replaces the resourceVersion precondition of a reservation patch: the fake
// clientset of the vectors never changes it ("100"), the SDK's test clientset does, as the
// API server; clienttest enforces the precondition, so a patch that landed carried the pod's
// resourceVersion.
func normalizeRV(t *testing.T, body []byte) string {
	t.Helper()
	var p migPatch
	if err := json.Unmarshal(body, &p); err != nil {
		t.Fatalf("patch %s: %v", body, err)
	}
	if p.Metadata.ResourceVersion == "" {
		t.Errorf("reservation patch %s without resourceVersion precondition", body)
	}
	p.Metadata.ResourceVersion = "<rv>"
	out, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// TestMIGAllocateConformance runs mig-allocate.json's Allocate calls against the agent with
// a fake MIG manager built from the vector's NVML answers, and compares per call the container
// responses, the reservation patch (byte for byte, resourceVersion aside), the HAMi
// annotations of every pod, the node lock and the MIG devices after the call and the agent's
// release. Where the SDK differs on purpose the call is checked against the rule:
//
//   - Instances by reservation: a MIG device overlapping a reserved placement that no live
//     reservation owns (a finished pod's, one made by hand) is destroyed and a fresh one
//     created; HAMi hands a new pod the finished pod's instance of the same (GPU, profile,
//     placement), or fails with NVML's ERROR_INSUFFICIENT_RESOURCES.
//   - A live pod's reservation naming a GPU the node does not have blocks nothing; HAMi fails
//     every MIG Allocate of the node.
//   - HAMi v2.9.0's MIG (geometries, "[t-p]" suffixes) is refused with ErrMIG naming HAMi
//     master's dynamic MIG; HAMi answers a MIG device by position without checking its profile,
//     an empty list, the whole GPU, or panics.
//
// A REV name (1g.10gb at a size-1 placement) reaches the manager as the published name; the
// fake realises it as the published (base) profile, as HAMi does. The SDK's requests are not
// HAMi's (fewer GETs, bind-phase in the entry patch): what lands is compared.
func TestMIGAllocateConformance(t *testing.T) {
	t.Parallel()
	for _, folder := range vectors.Folders(t) {
		var file migAllocateFile
		if !folder.Read(t, "mig-allocate.json", &file) {
			continue
		}
		version := vectors.Pick(folder, annotation.VersionMaster, annotation.VersionV290)
		n := 0
		for _, v := range file.Vectors {
			t.Run(folder.Name()+"/"+v.Name, func(t *testing.T) { runMIGVector(t, folder.V290, version, v) })
			n++
		}
		for _, v := range file.StartupVectors {
			t.Run(folder.Name()+"/startup/"+v.Name, func(t *testing.T) { runMIGStartup(t, v) })
			n++
		}
		t.Logf("checked %d vectors from %s", n, folder.Dir)
	}
}

func runMIGVector(t *testing.T, v290 bool, version annotation.Version, v migAllocateVector) {
	t.Helper()
	const node = "node1"
	fm := v.Input.NVML.fake(t)
	objs := []runtime.Object{&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, Annotations: map[string]string{nodelock.Key: v.Input.NodeLockBefore}}}}
	for _, p := range v.Input.Pods {
		objs = append(objs, p.object())
	}
	opts := Options{Version: version, Allocator: HAMiCore{Env: hamicore.EnvOptions{
		DeviceListStrategy: v.Input.Config.DeviceListStrategy, DeviceIDStrategy: v.Input.Config.DeviceIDStrategy}}}
	f := startMIGAgent(t, node, v.Input.NVML.devices(), fm, opts, objs...)
	var (
		mu      sync.Mutex
		patches []string // reservation patch bodies
	)
	f.cs.PrependReactor("patch", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if body := a.(k8stesting.PatchAction).GetPatch(); strings.Contains(string(body), mig.KeyAllocations) {
			mu.Lock()
			patches = append(patches, string(body))
			mu.Unlock()
		}
		return false, nil, nil
	})
	podsCaughtUp(t, f.agent)
	if err := f.agent.reconcileMIG(f.ctx); err != nil { // the start-up release
		t.Logf("start-up release: %v", err)
	}
	gvr := corev1.SchemeGroupVersion.WithResource("pods")
	for k, call := range v.Calls {
		in := v.Input.AllocateCalls[k]
		for name, phase := range in.SetPhase {
			obj, err := f.cs.Tracker().Get(gvr, "default", name)
			if err != nil {
				t.Fatal(err)
			}
			p := obj.(*corev1.Pod).DeepCopy()
			p.Status.Phase = corev1.PodPhase(phase)
			if err := f.cs.Tracker().Update(gvr, p, "default"); err != nil {
				t.Fatal(err)
			}
		}
		if in.NodeLock != "" {
			body := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, nodelock.Key, in.NodeLock)
			if _, err := f.cs.CoreV1().Nodes().Patch(f.ctx, node, types.MergePatchType, []byte(body), metav1.PatchOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		podsCaughtUp(t, f.agent)
		owner, locked := lockOwner(t, f, node)
		before := fm.state()
		if !locked { // the pod failed at an earlier call and released the lock: the SDK serves no pod without one
			_, err := f.kubelet.Allocate(f.ctx, f.resource, in.ContainerRequests...)
			if err == nil || !strings.Contains(message(err), ErrNoBindingPod.Error()) {
				t.Errorf("call %d: err %v, want %v: the pod failed at an earlier call and released the lock", k, err, ErrNoBindingPod)
			}
			if diff := gocmp.Diff(before, fm.state()); diff != "" {
				t.Errorf("call %d: MIG devices changed (-before +after):\n%s", k, diff)
			}
			continue
		}
		podBefore := f.podIn(t, owner)
		claims, _, err := f.agent.liveClaims(f.ctx)
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		patches = nil
		mu.Unlock()

		resp, err := f.kubelet.Allocate(f.ctx, f.resource, in.ContainerRequests...)
		podsCaughtUp(t, f.agent)
		if rerr := f.agent.reconcileMIG(f.ctx); rerr != nil { // the periodic release
			t.Logf("call %d: release: %v", k, rerr)
		}
		after := fm.state()
		if oerr := fm.noOverlap(); oerr != nil {
			t.Errorf("call %d: overlapping MIG devices: %v", k, oerr)
		}
		annotationsAfter := map[string]map[string]string{}
		for _, p := range v.Input.Pods {
			annotationsAfter[p.Name] = hamiAnnotations(f.podIn(t, types.NamespacedName{Namespace: p.Namespace, Name: p.Name}))
		}
		lockAfter := nodeLock(t, f, node)

		// Rule: v2.9.0 MIG is refused.
		if v290 {
			if err == nil || !strings.Contains(message(err), ErrMIG.Error()) || !strings.Contains(message(err), "HAMi master's dynamic MIG") {
				t.Fatalf("call %d: err %v, want v2.9.0 MIG refused naming HAMi master's dynamic MIG", k, err)
			}
			want := hamiAnnotations(podBefore)
			want[allocation.KeyBindPhase] = string(allocation.PhaseFailed)
			if diff := gocmp.Diff(want, annotationsAfter[owner.Name]); diff != "" {
				t.Errorf("call %d: annotations (-want +got):\n%s", k, diff)
			}
			if lockAfter != "<absent>" {
				t.Errorf("call %d: lock %q left", k, lockAfter)
			}
			if diff := gocmp.Diff(before, after); diff != "" {
				t.Errorf("call %d: MIG devices changed (-before +after):\n%s", k, diff)
			}
			continue
		}

		// Which of the SDK's rules apply to this call.
		allocs, derr := decodeReservations(podBefore)
		pd, perr := allocation.DecodePodDevices(podBefore.Annotations[annotation.KeyNVIDIAToAllocate], version)
		i, _ := pd.Next()
		var mine []mig.Allocation
		if derr == nil && perr == nil {
			mine = mig.Find(allocs, i)
		}
		var unowned []mig.Instance // overlapping a reserved placement, owned by no live reservation
		for _, inst := range before {
			for _, r := range mine {
				if inst.GPUUUID != r.GPUUUID || !mig.Overlaps(inst.Placement, r.Placement) || (r.Runtime != nil && *r.Runtime == inst.Runtime) {
					continue
				}
				if !slices.ContainsFunc(claims, func(c migClaim) bool {
					return (c.pod != owner || c.alloc.ContainerIndex != i) && c.owns(inst)
				}) {
					unowned = append(unowned, inst)
				}
			}
		}
		stale := slices.ContainsFunc(claims, func(c migClaim) bool {
			return c.pod != owner && !slices.ContainsFunc(v.Input.NVML.Devices, func(d vectorDevice) bool { return d.UUID == c.alloc.GPUUUID })
		})

		if len(unowned) == 0 && !stale { // HAMi's outcome
			compareMIGCall(t, k, call.WantError, err, resp, call.WantContainerResponses, func() []string {
				var out []string
				for _, p := range call.Patches {
					if p.Resource == "pods" && strings.Contains(string(p.Body), mig.KeyAllocations) {
						out = append(out, normalizeRV(t, p.Body))
					}
				}
				return out
			}(), patches, call.PodAnnotationsAfter, annotationsAfter, call.NodeLockAfter, lockAfter)
			if diff := gocmp.Diff(stateOf(call.NVMLStateAfter), withoutNames(after)); diff != "" {
				t.Errorf("call %d: MIG devices after (-HAMi +SDK):\n%s", k, diff)
			}
			continue
		}

		// The rules: the SDK serves the pod with fresh instances.
		t.Logf("call %d: by rule: MIG devices no live reservation owns at the reserved placements %v, a stale reservation of another pod %v", k, unowned, stale)
		if err != nil {
			t.Fatalf("call %d: %v; by the SDK's rules (unowned overlapping devices %v, stale reservation of another pod %v) the pod is served", k, err, unowned, stale)
		}
		for _, u := range unowned {
			if slices.ContainsFunc(after, func(in mig.Instance) bool { return in.Runtime == u.Runtime }) {
				t.Errorf("call %d: MIG device %s, owned by no live reservation, still there", k, u.MigUUID)
			}
		}
		for _, c := range claims {
			if c.pod == owner {
				continue
			}
			for _, inst := range before {
				if c.owns(inst) && !slices.Contains(after, inst) {
					t.Errorf("call %d: MIG device %s of %s destroyed", k, inst.MigUUID, c)
				}
			}
		}
		got := mig.Find(f.reservations(t, owner.Name), i)
		var uuids []string
		for _, r := range got {
			if r.Runtime == nil || !slices.ContainsFunc(after, func(in mig.Instance) bool {
				return in.GPUUUID == r.GPUUUID && in.Placement == r.Placement && in.Runtime == *r.Runtime
			}) {
				t.Fatalf("call %d: reservation %+v not realised by a device: %+v", k, r, after)
			}
			uuids = append(uuids, r.Runtime.MigUUID)
		}
		wantResp, rerr := hamicore.MIGResponse(uuids, opts.Allocator.(HAMiCore).Env)
		if rerr != nil {
			t.Fatal(rerr)
		}
		if diff := gocmp.Diff(wantResp.Envs, resp.GetContainerResponses()[0].GetEnvs()); diff != "" {
			t.Errorf("call %d: envs (-want +got):\n%s", k, diff)
		}
		want := hamiAnnotations(podBefore)
		rest := pd.Consume(i)
		want[annotation.KeyNVIDIAToAllocate] = allocation.EncodePodDevices(rest)
		if _, more := rest.Next(); !more {
			want[allocation.KeyBindPhase] = string(allocation.PhaseSuccess)
		}
		for _, r := range got {
			allocs, _ = mig.WithRuntime(allocs, r.ContainerIndex, r.DeviceIndex, *r.Runtime)
		}
		want[mig.KeyAllocations] = mig.EncodeAllocations(allocs)
		if diff := gocmp.Diff(want, annotationsAfter[owner.Name]); diff != "" {
			t.Errorf("call %d: annotations of %s (-want +got):\n%s", k, owner, diff)
		}
		// Where HAMi served the pod too, its answer is the SDK's with HAMi's instance identity.
		if call.WantError == nil {
			for _, u := range unowned {
				for _, r := range got {
					if r.Placement == u.Placement && r.GPUUUID == u.GPUUUID {
						hamiPod := call.PodAnnotationsAfter[owner.Name]
						if !strings.Contains(hamiPod[mig.KeyAllocations], u.MigUUID) || strings.Contains(annotationsAfter[owner.Name][mig.KeyAllocations], u.MigUUID) {
							t.Errorf("call %d: HAMi hands %s the device %s of a reservation no longer live; the SDK must not (%s)", k, owner, u.MigUUID, annotationsAfter[owner.Name][mig.KeyAllocations])
						}
					}
				}
			}
		}
	}
}

// compareMIGCall compares one call where the SDK does what HAMi does.
func compareMIGCall(t *testing.T, k int, wantErr *string, err error, resp *pluginapi.AllocateResponse, wantResp []vectorResponse, wantPatches, gotPatches []string, wantAnn, gotAnn map[string]map[string]string, wantLock, gotLock string) {
	t.Helper()
	switch {
	case wantErr != nil:
		cause := (*wantErr)[strings.LastIndex(*wantErr, ": ")+2:]
		if err == nil || !strings.Contains(message(err), cause) {
			t.Errorf("call %d: err %v, want one naming %q (HAMi: %q)", k, err, cause, *wantErr)
		}
	case err != nil:
		t.Fatalf("call %d: %v", k, err)
	default:
		var got []map[string]any
		for _, r := range resp.GetContainerResponses() {
			ms := []string{}
			for _, m := range r.GetMounts() {
				ms = append(ms, fmt.Sprintf("%s:%s:%v", m.GetContainerPath(), m.GetHostPath(), m.GetReadOnly()))
			}
			got = append(got, map[string]any{"envs": r.GetEnvs(), "mounts": ms, "devices": len(r.GetDevices())})
		}
		var want []map[string]any
		for _, r := range wantResp {
			ms := []string{}
			for _, m := range r.Mounts {
				ms = append(ms, fmt.Sprintf("%s:%s:%v", m.ContainerPath, m.HostPath, m.ReadOnly))
			}
			want = append(want, map[string]any{"envs": r.Envs, "mounts": ms, "devices": 0})
		}
		if diff := gocmp.Diff(want, got); diff != "" {
			t.Errorf("call %d: container responses (-HAMi +SDK):\n%s", k, diff)
		}
	}
	var norm []string
	for _, p := range gotPatches {
		norm = append(norm, normalizeRV(t, []byte(p)))
	}
	if diff := gocmp.Diff(wantPatches, norm); diff != "" {
		t.Errorf("call %d: reservation patches (-HAMi +SDK):\n%s", k, diff)
	}
	if diff := gocmp.Diff(normalizeToAllocate(t, wantAnn), normalizeToAllocate(t, gotAnn)); diff != "" {
		t.Errorf("call %d: pod annotations after (-HAMi +SDK):\n%s", k, diff)
	}
	if wantLock != gotLock {
		t.Errorf("call %d: node lock %q, HAMi %q", k, gotLock, wantLock)
	}
}

// runMIGStartup checks the agent's release at start against HAMi's start-up MIG block, by
// the SDK's rule: every MIG device a live reservation owns stays (those recorded by runtime
// identity are adopted: Allocate reuses them), every other one is destroyed. HAMi wipes idle
// GPUs and keeps busy ones whole; enabling MIG mode is the MIG manager's (at Create), not the
// release's.
func runMIGStartup(t *testing.T, v migStartupVector) {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	fm := v.Input.NVML.fake(t)
	var objs []runtime.Object
	for _, p := range v.Input.Pods {
		objs = append(objs, p.object())
	}
	cs := clienttest.NewClientset(objs...)
	a, err := New(cs, "node1", staticSource(nil), Options{MIG: fm})
	if err != nil {
		t.Fatal(err)
	}
	devs := v.Input.NVML.devices()
	a.devices.Store(&devs)
	startPods(t, a)
	claims, _, err := a.liveClaims(ctx)
	if err != nil {
		t.Fatal(err)
	}
	before := fm.state()
	if err := a.reconcileMIG(ctx); err != nil {
		t.Fatal(err) // a GPU without MIG support beside MIG GPUs does not stop the start-up
	}
	after := fm.state()
	// The SDK's rule: every MIG device that no live reservation owns is destroyed, the others
	// are kept, and nothing is created. HAMi agrees where its start-up block runs; it skips the
	// block (destroys nothing) when a GPU's NVML name matches no allowlist model.
	var want []mig.Instance
	for _, inst := range before {
		if slices.ContainsFunc(claims, func(c migClaim) bool { return c.owns(inst) }) {
			want = append(want, inst)
		}
	}
	if diff := gocmp.Diff(withoutNames(want), withoutNames(after)); diff != "" {
		t.Errorf("MIG devices after start-up (-rule +SDK):\n%s", diff)
	}
	if diff := gocmp.Diff(stateOf(v.NVMLStateAfter), withoutNames(after)); diff != "" {
		t.Logf("MIG devices after start-up differ from HAMi's by the SDK's rule (-HAMi +SDK):\n%s", diff)
		for _, inst := range stateOf(v.NVMLStateAfter) {
			if slices.ContainsFunc(claims, func(c migClaim) bool { return c.owns(inst) }) &&
				!slices.ContainsFunc(after, func(in mig.Instance) bool { return in.Runtime == inst.Runtime }) {
				t.Errorf("HAMi keeps MIG device %s, which a live reservation owns; the SDK destroyed it", inst.MigUUID)
			}
		}
	}
	for _, tr := range v.Want.TrackedAllocations { // HAMi adopted it: the SDK keeps it for reuse
		if !slices.ContainsFunc(after, func(in mig.Instance) bool { return strings.HasSuffix(tr, in.MigUUID) }) {
			t.Errorf("HAMi adopts %q, the SDK destroyed it", tr)
		}
	}
}

// normalizeToAllocate rewrites each pod's to-allocate list by the SDK's rule that the list
// written back has as many entries as the pod has containers (allocation.PodDevices.Consume):
// HAMi's plugin adds an empty entry (a ';') at every write ("a:;" becomes ";;"), the SDK
// writes ";". Both decode to the same entries; the trailing empty ones are dropped here.
func normalizeToAllocate(t *testing.T, ann map[string]map[string]string) map[string]map[string]string {
	t.Helper()
	out := map[string]map[string]string{}
	for pod, a := range ann {
		a = maps.Clone(a)
		if v, ok := a[annotation.KeyNVIDIAToAllocate]; ok {
			pd, err := allocation.DecodePodDevices(v, annotation.VersionMaster)
			if err == nil {
				for len(pd) > 0 && len(pd[len(pd)-1]) == 0 {
					pd = pd[:len(pd)-1]
				}
				a[annotation.KeyNVIDIAToAllocate] = allocation.EncodePodDevices(pd)
			}
		}
		out[pod] = a
	}
	return out
}

// hamiAnnotations are the pod's annotations the vectors record.
func hamiAnnotations(p *corev1.Pod) map[string]string {
	out := map[string]string{}
	for _, k := range hamiKeys {
		if v, ok := p.Annotations[k]; ok {
			out[k] = v
		}
	}
	return out
}

func (f *fixture) podIn(t *testing.T, key types.NamespacedName) *corev1.Pod {
	t.Helper()
	p, err := f.cs.CoreV1().Pods(key.Namespace).Get(f.ctx, key.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func nodeLock(t *testing.T, f *fixture, node string) string {
	t.Helper()
	n, err := f.cs.CoreV1().Nodes().Get(f.ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := n.Annotations[nodelock.Key]; ok {
		return v
	}
	return "<absent>"
}

// lockOwner is the pod the node lock names; false without a lock.
func lockOwner(t *testing.T, f *fixture, node string) (types.NamespacedName, bool) {
	t.Helper()
	n, err := f.cs.CoreV1().Nodes().Get(f.ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	l, present, err := nodelock.FromAnnotations(n.Annotations)
	if err != nil {
		t.Fatal(err)
	}
	if !present {
		return types.NamespacedName{}, false
	}
	o, ok := l.Owner()
	if !ok {
		t.Fatalf("lock %v names no pod", l)
	}
	return o, true
}

// TestMIGStartupGPUWithoutMIG describes, in the vectors' format, an A100 in MIG mode with a
// leftover instance beside an A10, whose every MIG query NVML answers ERROR_NOT_SUPPORTED
// (the model's gpu_instance_profiles is a string): the start-up skips the A10 for MIG (not
// registered, no MIG call made for it) and still releases the A100's leftover.
func TestMIGStartupGPUWithoutMIG(t *testing.T) {
	t.Parallel()
	const in = `{"name":"mig_gpu_beside_gpu_without_mig","input":{"pods":[],"nvml":{
	  "devices":[
	    {"index":0,"uuid":"GPU-0a1b2c3d-0000-1111-2222-333344445555","model":"A100-SXM4-40GB","mig_mode_current":1,"mig_mode_pending":1,
	     "existing_gpu_instances":[{"compute_instance_id":0,"gpu_instance_id":5,"mig_uuid":"MIG-5a5a0000-0005-0000-1111-abcdef000005","placement":{"start":2,"size":2},"profile":1}]},
	    {"index":1,"uuid":"GPU-1a1b2c3d-0000-1111-2222-333344445555","model":"A10","mig_mode_current":0,"mig_mode_pending":0}],
	  "models":{
	    "A100-SXM4-40GB":{"name":"NVIDIA A100-SXM4-40GB","gpu_instance_profiles":[
	      {"info":{"id":14},"mig_name":"2g.10gb","placements":[{"start":0,"size":2},{"start":2,"size":2},{"start":4,"size":2}],"profile":1,"profile_name":"GPU_INSTANCE_PROFILE_2_SLICE"}]},
	    "A10":{"name":"NVIDIA A10","gpu_instance_profiles":"not MIG-capable: every MIG query answers ERROR_NOT_SUPPORTED"}}}},
	  "nvml_state_after":[]}`
	var v migStartupVector
	if err := json.Unmarshal([]byte(in), &v); err != nil {
		t.Fatalf("the harness cannot describe a GPU without MIG: %v", err)
	}
	if m := v.Input.NVML.Models["A10"]; !m.NoMIG || len(m.Profiles) != 0 {
		t.Fatalf("A10 = %+v, want a model without MIG", m)
	}
	devs := v.Input.NVML.devices()
	if len(devs) != 1 || devs[0].ID != "GPU-0a1b2c3d-0000-1111-2222-333344445555" {
		t.Fatalf("registered %v, want the A100 alone (HAMi drops a MIG-mode GPU without profiles)", devs)
	}
	fm := v.Input.NVML.fake(t)
	if _, err := fm.Create(t.Context(), "GPU-1a1b2c3d-0000-1111-2222-333344445555", "1g.5gb", mig.Placement{Start: 0, Size: 1}); err == nil || !strings.Contains(err.Error(), "ERROR_NOT_SUPPORTED") {
		t.Errorf("Create on the A10 = %v, want ERROR_NOT_SUPPORTED", err)
	}
	runMIGStartup(t, v)
}

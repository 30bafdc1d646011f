package drarobust_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/hamireg/hamireg/draplugin"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// gpu0 selects the device of GPU 0.
func gpu0(driver string) []string {
	return []string{`device.attributes["` + driver + `"].index == 0`}
}

// TestStaleClaimCleanup: a claim prepared on the node is deleted on the API side without
// Unprepare (the kubelet lost its state). The next claim on the same GPU is refused while the
// stale one holds its memory; the plugin's next cleanup round unprepares the stale claim, and
// the GPU is usable again.
func TestStaleClaimCleanup(t *testing.T) {
	t.Parallel()
	n := startNode(t)
	fc := clocktesting.NewFakeClock(time.Now())
	n.startAgent(t, agentOptions{staleClaimPeriod: time.Hour, clock: fc})
	p := n.currentPlugin()
	harness.Eventually(t, "the cleanup round at the start", harness.DRAWait, func() bool { return p.Stats().Cleanups >= 1 })
	ctx := harness.Context(t)

	// a takes all of GPU 0's memory (the request's default).
	a, podA := cp.CreateClaimPod(t, n.name, "a", harness.Claim(n.name, "a", n.profile.Driver, harness.ClaimRequest{Count: 1, Selectors: gpu0(n.profile.Driver)}))
	cp.WaitForAllocation(t, a.Namespace, a.Name)
	podA = cp.WaitForBound(t, podA.Namespace, podA.Name)
	if _, err := n.prepare(ctx, podA); err != nil {
		t.Fatal(err)
	}
	if l := n.leftovers(t); l != (leftovers{1, 1, 1}) {
		t.Fatalf("after a's prepare: %+v, want one of each", l)
	}
	cp.ReleaseClaim(t, a.Namespace, podA.Name, a.Name) // no Unprepare

	b, podB := cp.CreateClaimPod(t, n.name, "b", harness.Claim(n.name, "b", n.profile.Driver, harness.ClaimRequest{Count: 1, Selectors: gpu0(n.profile.Driver)}))
	cp.WaitForAllocation(t, b.Namespace, b.Name)
	podB = cp.WaitForBound(t, podB.Namespace, podB.Name)
	if _, err := n.prepare(ctx, podB); err == nil || !strings.Contains(err.Error(), "claim refused") {
		t.Fatalf("prepare b while the stale a holds GPU 0: %v, want refused", err)
	}

	rounds := p.Stats().Cleanups
	harness.Eventually(t, "the cleanup's ticker", harness.DRAWait, fc.HasWaiters)
	fc.Step(time.Hour)
	harness.Eventually(t, "the next cleanup round", harness.DRAWait, func() bool { return p.Stats().Cleanups > rounds })
	if st := p.Stats(); st.StaleUnprepared != 1 {
		t.Fatalf("stats %+v, want 1 stale claim unprepared", st)
	}
	if _, ok := p.Claim(a.UID); ok {
		t.Error("a is still prepared")
	}
	if l := n.leftovers(t); l != (leftovers{}) {
		t.Errorf("after the cleanup: %+v, want nothing of a left", l)
	}
	ids, err := n.prepare(ctx, podB)
	if err != nil {
		t.Fatalf("prepare b after the cleanup: %v", err)
	}
	edits := harness.ResolveCDI(t, n.cdiDir, ids[0])
	if got := edits.EnvMap()["CUDA_DEVICE_MEMORY_LIMIT_0"]; got == "" {
		t.Errorf("b's CDI env %v has no memory limit", edits.Env)
	}
	if err := n.dra.Unprepare(ctx, podB); err != nil {
		t.Fatal(err)
	}
	if l := n.leftovers(t); l != (leftovers{}) {
		t.Errorf("after b's Unprepare: %+v", l)
	}
}

// TestCorruptCheckpoint: the agent stops with two claims prepared; its checkpoint is
// truncated; the restarted agent reports ErrCheckpointCorrupt naming the file and what it did,
// has both claims (rebuilt from their CDI specs) and unprepares them through the kubelet.
func TestCorruptCheckpoint(t *testing.T) {
	t.Parallel()
	n := startNode(t)
	n.startAgent(t, agentOptions{})
	ctx := harness.Context(t)
	var uids []types.UID
	var specs []string
	pods := map[string][]string{}
	for _, name := range []string{"x", "y"} {
		c, pod := cp.CreateClaimPod(t, n.name, name, harness.Claim(n.name, name, n.profile.Driver, harness.ClaimRequest{Count: 1, Memory: "4Gi", Cores: "20"}))
		cp.WaitForAllocation(t, c.Namespace, c.Name)
		pod = cp.WaitForBound(t, pod.Namespace, pod.Name)
		ids, err := n.prepare(ctx, pod)
		if err != nil {
			t.Fatal(err)
		}
		pods[name] = ids
		uids = append(uids, c.UID)
		specs = append(specs, harness.ResolveCDI(t, n.cdiDir, ids[0]).Path)
	}
	want := n.currentPlugin().PreparedGPUs()
	n.stopDriver()

	file := filepath.Join(n.plugin, draplugin.CheckpointFile)
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, data[:len(data)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	n.startAgent(t, agentOptions{})
	p := n.currentPlugin()
	var report error
	harness.Eventually(t, "the recovery reported", harness.DRAWait, func() bool {
		for _, err := range n.reported() {
			if errors.Is(err, draplugin.ErrCheckpointCorrupt) {
				report = err
				return true
			}
		}
		return false
	})
	t.Logf("reported: %v", report)
	if msg := report.Error(); !strings.Contains(msg, file) || !strings.Contains(msg, "moved it to "+file+".corrupt-") || !strings.Contains(msg, "with 2 prepared claim(s)") {
		t.Errorf("report %q: want the file, where it went and the 2 claims rebuilt", msg)
	}
	if st := p.Stats(); st.CheckpointRecoveries != 1 {
		t.Errorf("stats %+v, want 1 recovery", st)
	}
	got := p.PreparedGPUs()
	for gpu, claims := range want {
		if !sameUIDs(got[gpu], claims) {
			t.Errorf("GPU %s: prepared %v after the recovery, want %v", gpu, got[gpu], claims)
		}
	}
	for _, uid := range uids {
		if _, ok := p.Claim(uid); !ok {
			t.Errorf("claim %s lost", uid)
		}
	}
	harness.Eventually(t, "a cleanup round", harness.DRAWait, func() bool { return p.Stats().Cleanups >= 1 })
	if st := p.Stats(); st.StaleUnprepared != 0 {
		t.Errorf("the cleanup unprepared %d claims the API server allocates here", st.StaleUnprepared)
	}
	for _, name := range []string{"x", "y"} {
		pod, err := cp.AdminClient().CoreV1().Pods(n.name).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := n.dra.Unprepare(ctx, pod); err != nil {
			t.Errorf("unprepare %s after the recovery: %v", name, err)
		}
	}
	for _, s := range specs {
		if _, err := os.Stat(s); !os.IsNotExist(err) {
			t.Errorf("CDI spec %s after Unprepare: %v", s, err)
		}
	}
	if l := n.leftovers(t); l != (leftovers{}) {
		t.Errorf("after Unprepare: %+v", l)
	}
}

func sameUIDs(a, b []types.UID) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// TestKilledMidPrepare: the plugin, a process of its own, is SIGKILLed after writing a
// claim's CDI spec and before its checkpoint records it. The restarted plugin adopts the spec
// (the claim is still allocated here and reserved), the kubelet's retry prepares the claim,
// and Unprepare leaves nothing. A second kill, whose claim is then deleted while the plugin
// is down, leaves an orphan spec that the restarted plugin removes.
func TestKilledMidPrepare(t *testing.T) {
	t.Parallel()
	n := startNode(t)
	block := filepath.Join(n.root, "blocked")

	uid, podName := n.prepareUntilKilled(t, block, "k")
	restarted := n.startChild(t, "")
	ctx := harness.Context(t)
	pod, err := cp.AdminClient().CoreV1().Pods(n.name).Get(ctx, podName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	harness.Eventually(t, "the kubelet's retry of Prepare", harness.DRAWait, func() bool {
		ids, err = n.prepare(ctx, pod)
		return err == nil
	})
	if len(ids) != 1 || !strings.Contains(ids[0], string(uid)) {
		t.Fatalf("CDI IDs %q, want one of claim %s", ids, uid)
	}
	env := harness.ResolveCDI(t, n.cdiDir, ids[0]).EnvMap()
	if env["CUDA_DEVICE_MEMORY_LIMIT_0"] != "10240m" || env["CUDA_DEVICE_SM_LIMIT_0"] != "30" {
		t.Errorf("CDI env %v, want the claim's limits", env)
	}
	if l := n.leftovers(t); l != (leftovers{1, 1, 1}) {
		t.Errorf("after the retry: %+v, want one claim's", l)
	}
	if err := n.dra.Unprepare(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if l := n.leftovers(t); l != (leftovers{}) {
		t.Errorf("after Unprepare: %+v, want nothing", l)
	}
	cp.ReleaseClaim(t, n.name, podName, "k")

	// Killed again; the claim goes while the plugin is down.
	restarted.stop(t)
	uid, podName = n.prepareUntilKilled(t, block, "g")
	cp.ReleaseClaim(t, n.name, podName, "g")
	n.startChild(t, "")
	harness.Eventually(t, "the orphan spec of the deleted claim removed", harness.DRAWait, func() bool { return n.leftovers(t) == (leftovers{}) })
	t.Logf("orphan of claim %s removed", uid)
}

// prepareUntilKilled starts the node's plugin as a child that blocks mid-prepare, lets the
// kubelet prepare the claim of a new pod name until the plugin hangs after writing the CDI
// spec, and SIGKILLs it there.
func (n *robustNode) prepareUntilKilled(t *testing.T, block, name string) (uid types.UID, podName string) {
	t.Helper()
	_ = os.Remove(block)
	child := n.startChild(t, block)
	c, pod := cp.CreateClaimPod(t, n.name, name, harness.Claim(n.name, name, n.profile.Driver, harness.ClaimRequest{Count: 1, Memory: "10Gi", Cores: "30"}))
	cp.WaitForAllocation(t, c.Namespace, c.Name)
	pod = cp.WaitForBound(t, pod.Namespace, pod.Name)
	ctx := harness.Context(t)
	errc := make(chan error, 1)
	go func() {
		_, err := n.prepare(ctx, pod)
		errc <- err
	}()
	harness.Eventually(t, "the plugin blocked mid-prepare", harness.DRAWait, func() bool { _, err := os.Stat(block); return err == nil })
	if got, _ := os.ReadFile(block); types.UID(got) != c.UID {
		t.Fatalf("blocked in claim %s, want %s", got, c.UID)
	}
	if l := n.leftovers(t); l.specs != 1 || l.checkpoint != 0 {
		t.Fatalf("mid-prepare: %+v, want the spec written and no checkpoint entry", l)
	}
	child.kill(t)
	select {
	case err := <-errc:
		if err == nil {
			t.Fatal("the kubelet's Prepare succeeded although the plugin was killed")
		}
		t.Logf("the kubelet's Prepare while the plugin was killed: %v", err)
	case <-time.After(harness.DRAWait):
		t.Fatal("the kubelet's Prepare did not return after the plugin was killed")
	}
	return c.UID, pod.Name
}

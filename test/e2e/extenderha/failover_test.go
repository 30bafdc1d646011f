package extenderha_test

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubeschedulerconfigv1 "k8s.io/kube-scheduler/config/v1"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/envtest"
	"github.com/hamireg/hamireg/extender"
	"github.com/hamireg/hamireg/internal/manifests"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// Short leader election for the failover, as kube-scheduler's flags or its configuration set
// it (the Lease carries whole seconds). The renew deadline leaves the leader room on a loaded
// machine; the retry period is how often the standby looks at the Lease.
const (
	leaseDuration = 3 * time.Second
	renewDeadline = 2 * time.Second
	retryPeriod   = 100 * time.Millisecond
)

// Log lines of the extender (schedcache and extender packages, at -v=5).
const (
	linePatch    = "Patching node annotations"
	lineSkip     = "Scheduler is not leader yet, skipping ..."
	lineLeading  = `"Leadership changed"`
	leadingTrue  = "leading=true"
	lineBoundPod = "Bound pod"
	linePlaced   = "Pod placed"
)

// schedulerConfig is deploy/scheduler-config.yaml's KubeSchedulerConfiguration for this test
// cluster: the extender at https://127.0.0.1:port (verified with caPEM), the Lease in
// namespace ns, and short leader-election durations; profiles, extender verbs and managed
// resources are the file's.
func schedulerConfig(tb testing.TB, ns string, port int, caPEM []byte) *kubeschedulerconfigv1.KubeSchedulerConfiguration {
	tb.Helper()
	cm := manifest[*corev1.ConfigMap](tb, "scheduler-config.yaml", "hami-scheduler-config")
	cfg, err := manifests.SchedulerConfig(cm)
	if err != nil {
		tb.Fatalf("deploy/scheduler-config.yaml: %v", err)
	}
	if len(cfg.Extenders) != 1 || cfg.LeaderElection.LeaderElect == nil || !*cfg.LeaderElection.LeaderElect {
		tb.Fatalf("deploy/scheduler-config.yaml: want one extender and leader election: %+v", cfg)
	}
	cfg.Extenders[0].URLPrefix = "https://127.0.0.1:" + strconv.Itoa(port)
	// The file's tlsConfig names the pod's Secrets: verify the test's serving certificate
	// instead, without a client certificate (these extenders require none; test/e2e/attack
	// covers them).
	cfg.Extenders[0].TLSConfig = &kubeschedulerconfigv1.ExtenderTLSConfig{CAData: caPEM}
	le := &cfg.LeaderElection
	le.ResourceNamespace = ns
	le.LeaseDuration = metav1.Duration{Duration: leaseDuration}
	le.RenewDeadline = metav1.Duration{Duration: renewDeadline}
	le.RetryPeriod = metav1.Duration{Duration: retryPeriod}
	return cfg
}

// pair is one replica of the example's Deployment: the extender and kube-scheduler with one
// host name, as the two containers of one pod.
type pair struct {
	host  string
	port  int
	ext   *extenderProc
	sched *envtest.Scheduler
}

// HAMi's Deployment with 2 replicas: two kube-scheduler and extender pairs, each pair with a
// host name of its own, following kube-scheduler's Lease. Only the extender whose
// kube-scheduler holds the Lease writes handshakes (each write counted in each process's log);
// when the leader pair is killed with SIGKILL, the other pair's extender writes a pending
// handshake and answers the filter for a GPU pod that its kube-scheduler sends it, within the
// lease duration plus one second of the kill, and binds the pod.
func TestTwoReplicasOnlyLeaderWritesFailover(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	test := harness.UniqueName("ha")
	ns := test
	if err := cp.EnsureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cp.AdminClient().CoreV1().Namespaces().Delete(context.WithoutCancel(ctx), ns, metav1.DeleteOptions{})
	})
	kubeconfig := extenderKubeconfig(t, ns)
	nodes := []string{test + "-1", test + "-2"}
	for _, n := range nodes {
		createGPUNode(t, test, n, 2)
	}
	cert := newServingCert(t)
	pairs := []*pair{{host: test + "-a"}, {host: test + "-b"}}
	// The extenders start before any kube-scheduler: no Lease, no leader.
	for _, p := range pairs {
		p.port = harness.FreePort(t)
		p.ext = startExtender(t, "extender-"+p.host, p.host, p.port, cert, extenderArgs(t, map[string]string{
			"http_bind": "127.0.0.1:" + strconv.Itoa(p.port), "cert_file": cert.certFile, "key_file": cert.keyFile,
			"kubeconfig": kubeconfig, "leader-elect": "true", "leader-elect-resource-namespace": ns,
			"node-label-selector": harness.TestLabel + "=" + test, "v": "5",
		}))
	}
	a, b := pairs[0], pairs[1]
	patches := func(p *pair, node string) int { return len(p.ext.logLines(t, linePatch, strconv.Quote(node))) }
	for _, p := range pairs {
		for _, n := range nodes {
			harness.Eventually(t, p.host+" decides the stamp of "+n+" and skips it", 20*time.Second, func() bool {
				return len(p.ext.logLines(t, lineSkip, strconv.Quote(n))) > 0
			})
		}
	}
	for _, n := range nodes {
		if v, ok := cp.GetNode(t, n).Annotations[annotation.KeyNVIDIAHandshake]; ok {
			t.Errorf("%s: handshake %q written while no replica leads", n, v)
		}
	}

	startScheduler := func(p *pair) {
		s, err := cp.StartScheduler(ctx, envtest.SchedulerOptions{Config: schedulerConfig(t, ns, p.port, cert.caPEM), Hostname: p.host})
		if err != nil {
			t.Fatalf("start kube-scheduler %s: %v", p.host, err)
		}
		p.sched = s
		t.Cleanup(func() {
			if err := s.Stop(); err != nil {
				t.Errorf("stop kube-scheduler %s: %v", p.host, err)
			}
			if t.Failed() {
				t.Logf("kube-scheduler %s log:\n%s", p.host, s.LogTail(40))
			}
		})
	}
	holder := func() string {
		l, err := cp.AdminClient().CoordinationV1().Leases(ns).Get(ctx, extender.DefaultSchedulerName, metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}
	startScheduler(a)
	harness.Eventually(t, a.host+" holds the Lease", 20*time.Second, func() bool { return strings.HasPrefix(holder(), a.host+"_") })
	for _, n := range nodes {
		harness.Eventually(t, a.host+" stamps "+n, 10*time.Second, func() bool {
			return strings.HasPrefix(cp.GetNode(t, n).Annotations[annotation.KeyNVIDIAHandshake], "Requesting_")
		})
		// The log line comes before the PATCH, the GET above after it.
		if got := patches(a, n); got != 1 {
			t.Errorf("%s patched %s %d times, want 1", a.host, n, got)
		}
	}
	startScheduler(b)
	if h := holder(); !strings.HasPrefix(h, a.host+"_") {
		t.Fatalf("Lease holder %q after the standby started, want %s_…", h, a.host)
	}
	for _, n := range nodes {
		if got := patches(b, n); got != 0 {
			t.Errorf("follower %s patched %s %d times, want 0", b.host, n, got)
		}
	}
	if got := b.ext.logLines(t, lineLeading, leadingTrue); len(got) != 0 {
		t.Errorf("follower %s led: %q", b.host, got)
	}

	// Failover: the leader pod dies at once. A handshake the new leader must write (the key
	// removed, as after HAMi master's cleanup) and a GPU pod for kube-scheduler are waiting.
	killed := time.Now()
	a.ext.kill(t)
	if err := syscall.Kill(-a.sched.Pid(), syscall.SIGKILL); err != nil { // its process group
		t.Fatal(err)
	}
	if err := a.sched.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := cp.PatchNodeAnnotations(ctx, nodes[0], "e2e-agent", map[string]*string{annotation.KeyNVIDIAHandshake: nil}); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu", Namespace: ns},
		Spec: corev1.PodSpec{
			SchedulerName: extender.DefaultSchedulerName,
			NodeSelector:  map[string]string{harness.TestLabel: test},
			Containers: []corev1.Container{{Name: "main", Image: "registry.invalid/never-pulled:0",
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{annotation.ResourceNVIDIAGPU: resource.MustParse("1")}}}},
		},
	}
	if _, err := cp.AdminClient().CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	budget := leaseDuration + time.Second
	harness.Eventually(t, b.host+" stamps "+nodes[0]+" again", budget+10*time.Second, func() bool {
		return strings.HasPrefix(cp.GetNode(t, nodes[0]).Annotations[annotation.KeyNVIDIAHandshake], "Requesting_")
	})
	stamped := time.Since(killed)
	var bound *corev1.Pod
	harness.Eventually(t, "the GPU pod bound by "+b.host, budget+10*time.Second, func() bool {
		p, err := cp.AdminClient().CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		bound = p
		return p.Spec.NodeName != ""
	})
	served := time.Since(killed)
	lease, err := cp.AdminClient().CoordinationV1().Leases(ns).Get(ctx, extender.DefaultSchedulerName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var acquired time.Duration
	if lease.Spec.AcquireTime != nil {
		acquired = lease.Spec.AcquireTime.Sub(killed)
	}
	// The filter answer: its log line follows the pod's patch, before the answer is sent.
	placed := b.ext.logLines(t, linePlaced, ns+"/"+pod.Name)
	if len(placed) != 1 {
		t.Fatalf("%s placed %s/%s %d times, want once", b.host, ns, pod.Name, len(placed))
	}
	at, ok := logTime(placed[0], killed)
	if !ok {
		t.Fatalf("no time in %q", placed[0])
	}
	filtered := at.Sub(killed)
	t.Logf("failover (lease duration %v, retry period %v): Lease acquired by %s %v after the kill, handshake written %v, filter answered %v, GPU pod bound %v",
		leaseDuration, retryPeriod, b.host, acquired.Round(time.Millisecond), stamped.Round(time.Millisecond),
		filtered.Round(time.Millisecond), served.Round(time.Millisecond))
	if h := lease.Spec.HolderIdentity; h == nil || !strings.HasPrefix(*h, b.host+"_") {
		t.Errorf("Lease holder %v after the failover, want %s_…", h, b.host)
	}
	if stamped > budget || filtered > budget {
		t.Errorf("new leader served %v (handshake) and %v (filter) after the kill, want within %v", stamped, filtered, budget)
	}

	// Who wrote: the dead leader once per node before it died, the new leader only the
	// handshake that was missing, after it started leading, and it answered the filter and bind.
	for i, n := range nodes {
		want := 0
		if i == 0 {
			want = 1
		}
		if got := patches(a, n); got != 1 {
			t.Errorf("%s patched %s %d times, want 1", a.host, n, got)
		}
		if got := patches(b, n); got != want {
			t.Errorf("%s patched %s %d times, want %d", b.host, n, got, want)
		}
	}
	lines := b.ext.logLines(t, "")
	lead := slices.IndexFunc(lines, func(l string) bool { return strings.Contains(l, lineLeading) && strings.Contains(l, leadingTrue) })
	patch := slices.IndexFunc(lines, func(l string) bool { return strings.Contains(l, linePatch) })
	if lead < 0 || patch < lead {
		t.Fatalf("%s: first patch at line %d, leadership at line %d: want the patch after leading", b.host, patch, lead)
	}
	// While it still followed, the new leader had decided the write and held it back.
	skipped := slices.ContainsFunc(lines[:lead], func(l string) bool {
		at, ok := logTime(l, killed)
		return ok && !at.Before(killed) && strings.Contains(l, lineSkip) && strings.Contains(l, strconv.Quote(nodes[0]))
	})
	if !skipped {
		t.Errorf("%s did not decide the missing handshake between the kill and its leadership", b.host)
	}
	if at, ok := logTime(lines[lead], killed); ok {
		t.Logf("%s's extender leading %v after the kill", b.host, at.Sub(killed).Round(time.Millisecond))
	}
	// The extender logs the bind after the Binding's answer, which the test's watch can see
	// first: wait for the line, then count.
	harness.Eventually(t, b.host+"'s bind log line", 10*time.Second, func() bool {
		return len(b.ext.logLines(t, lineBoundPod, ns+"/"+pod.Name)) > 0
	})
	if got := b.ext.logLines(t, lineBoundPod, ns+"/"+pod.Name); len(got) != 1 {
		t.Errorf("%s logged %d binds of %s/%s, want 1", b.host, len(got), ns, pod.Name)
	}
	if a := bound.Annotations; a[allocation.KeyNode] != bound.Spec.NodeName || a[allocation.KeyBindPhase] != "allocating" {
		t.Errorf("bound pod: node %s, annotations %v: want HAMi's filter and bind annotations", bound.Spec.NodeName, a)
	}
}

// logTime reads the time of a klog text line ("I1201 11:32:12.737485 …") in the year and
// location of ref.
func logTime(line string, ref time.Time) (time.Time, bool) {
	f := strings.Fields(line)
	if len(f) < 2 || len(f[0]) != 5 {
		return time.Time{}, false
	}
	at, err := time.ParseInLocation("0102 15:04:05.000000", f[0][1:]+" "+f[1], ref.Location())
	if err != nil {
		return time.Time{}, false
	}
	return at.AddDate(ref.Year(), 0, 0), true
}

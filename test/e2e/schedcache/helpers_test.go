package schedcache_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/schedcache"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// gpus returns n devices as a device plugin publishes them; devmem varies with mem.
func gpus(n int, node string, mem int32) []annotation.Device {
	out := make([]annotation.Device, n)
	for i := range out {
		out[i] = annotation.Device{ID: fmt.Sprintf("GPU-%s-%d", node, i), Index: uint(i), Count: 10, Devmem: mem, Devcore: 100,
			Type: "NVIDIA-NVIDIA H100 80GB HBM3", Numa: i / 4, Mode: "hami-core", Health: true}
	}
	return out
}

// createNode creates a Node for test with the given annotations, then sets its allocatable
// nvidia.com/gpu as a kubelet would.
func createNode(tb testing.TB, test, name string, annotations map[string]string, alloc int64) {
	tb.Helper()
	cp.CreateNode(tb, &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name: name, Labels: map[string]string{harness.TestLabel: test}, Annotations: annotations}})
	setAllocatable(tb, name, alloc)
}

// setAllocatable updates the node's status as the kubelet does.
func setAllocatable(tb testing.TB, name string, alloc int64) {
	tb.Helper()
	patch := fmt.Sprintf(`{"status":{"allocatable":{%q:"%d"},"capacity":{%q:"%d"}}}`,
		annotation.ResourceNVIDIAGPU, alloc, annotation.ResourceNVIDIAGPU, alloc)
	if _, err := cp.AdminClient().CoreV1().Nodes().Patch(tb.Context(), name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil {
		tb.Fatalf("set allocatable of %s: %v", name, err)
	}
}

// agentPatch sets (or with nil removes) annotations with a JSON merge patch, as HAMi's device
// plugin does.
func agentPatch(tb testing.TB, name string, annotations map[string]*string) {
	tb.Helper()
	if err := cp.PatchNodeAnnotations(tb.Context(), name, "device-plugin", annotations); err != nil {
		tb.Fatal(err)
	}
}

// managers returns the field managers that wrote the node's handshake annotation.
func handshakeManagers(tb testing.TB, name string) []string {
	tb.Helper()
	var out []string
	key := fmt.Sprintf(`"f:%s"`, annotation.KeyNVIDIAHandshake)
	for _, mf := range cp.GetNode(tb, name).ManagedFields {
		if mf.FieldsV1 != nil && strings.Contains(mf.FieldsV1.GetRawString(), key) {
			out = append(out, mf.Manager)
		}
	}
	slices.Sort(out)
	return out
}

// logSink collects log lines of one replica.
type logSink struct {
	mu    sync.Mutex
	lines []string
}

func (l *logSink) add(prefix, args string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, prefix+" "+args)
}

// has reports whether msg was logged for node at level (-1: as an error).
func (l *logSink) has(msg string, level int, node string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	want := fmt.Sprintf(`"level"=%d "msg"=%q`, level, msg)
	if level < 0 {
		want = fmt.Sprintf(`"msg"=%q "error"=`, msg)
	}
	return slices.ContainsFunc(l.lines, func(s string) bool { return strings.Contains(s, want) && strings.Contains(s, node) })
}

func (l *logSink) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// runner runs leader-only work during its terms (Elector, LeaseFollower).
type runner interface {
	Run(ctx context.Context) error
	IsLeader() bool
}

// replica is one scheduler replica: a cache over the test's nodes with an informer filtered
// server-side, Events to the apiserver, and its Handshaker, run directly or by a leader.
type replica struct {
	cache  *schedcache.Cache
	leader runner // nil when the Handshaker runs directly
	logs   *logSink
	stop   func()
}

// startReplica starts a replica. newLeader, when not nil, returns the runner that runs the
// replica's Handshaker (the leader-only work); nil runs the Handshaker directly.
func startReplica(tb testing.TB, client kubernetes.Interface, test string, opts schedcache.Options, hsOpts schedcache.HandshakerOptions,
	newLeader func(work schedcache.Runnable) runner) *replica {
	tb.Helper()
	r := &replica{logs: &logSink{}}
	ctx, cancel := context.WithCancel(klog.NewContext(tb.Context(), funcr.New(r.logs.add, funcr.Options{Verbosity: 5})))
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.LabelSelector = harness.TestLabel + "=" + test
	}))
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	opts.EventRecorder = broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "hamireg-schedcache"})
	if opts.Handshake.Location == nil {
		opts.Handshake.Location = time.UTC
	}
	c, err := schedcache.New(factory.Core().V1().Nodes(), opts)
	if err != nil {
		cancel()
		tb.Fatalf("new cache: %v", err)
	}
	r.cache = c
	h, err := schedcache.NewHandshaker(client, c, hsOpts)
	if err != nil {
		cancel()
		tb.Fatalf("new handshaker: %v", err)
	}
	var work runner
	if newLeader != nil {
		work = newLeader(h)
		r.leader = work
	}
	factory.Start(ctx.Done())
	var wg sync.WaitGroup
	wg.Go(func() {
		run := h.Run
		if work != nil {
			run = work.Run
		}
		if err := run(ctx); err != nil {
			tb.Errorf("handshaker or leader: %v", err)
		}
	})
	wg.Go(func() {
		if err := c.Run(ctx); err != nil {
			tb.Errorf("cache: %v", err)
		}
	})
	var once sync.Once
	r.stop = func() {
		once.Do(func() {
			cancel()
			wg.Wait()
			factory.Shutdown()
			broadcaster.Shutdown()
		})
	}
	tb.Cleanup(func() {
		r.stop()
		if tb.Failed() {
			tb.Logf("logs of the replica:\n%s", r.logs)
		}
	})
	harness.Eventually(tb, "cache synced", 30*time.Second, c.HasSynced)
	return r
}

func (r *replica) state(name string) schedcache.State {
	n, ok := r.cache.Node(name)
	if !ok {
		return -1
	}
	return n.Registrations[0].State
}

func (r *replica) waitState(tb testing.TB, name string, s schedcache.State) {
	tb.Helper()
	harness.Eventually(tb, fmt.Sprintf("node %s %s", name, s), 20*time.Second, func() bool { return r.state(name) == s })
}

// nodeEvents returns the reasons of the Events recorded on a node.
func nodeEvents(tb testing.TB, name string) []string {
	tb.Helper()
	list, err := cp.AdminClient().CoreV1().Events(metav1.NamespaceDefault).List(tb.Context(), metav1.ListOptions{
		FieldSelector: fields.Set{"involvedObject.kind": "Node", "involvedObject.name": name}.String(),
	})
	if err != nil {
		tb.Fatalf("list events: %v", err)
	}
	var out []string
	for _, e := range list.Items {
		out = append(out, e.Type+" "+e.Reason)
	}
	slices.Sort(out)
	return out
}

func ptr(s string) *string { return &s }

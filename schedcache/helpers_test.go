package schedcache

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/handshake"
)

// t0 is the fake clock's start; handshakes are read in UTC in the tests.
var t0 = time.Date(2026, 5, 19, 9, 0, 0, 0, time.UTC)

func requesting(t time.Time) string { return handshake.Requesting(t, time.UTC) }

// devices returns n GPUs as a device plugin publishes them.
func devices(n int, prefix string) []annotation.Device {
	out := make([]annotation.Device, n)
	for i := range out {
		out[i] = annotation.Device{
			ID: fmt.Sprintf("GPU-%s-%04d-5c4e-8c3d-2f1a9b7c%04d", prefix, i, i), Index: uint(i), Count: 10,
			Devmem: 81559, Devcore: 100, Type: "NVIDIA-NVIDIA H100 80GB HBM3", Numa: i / 4, Mode: "hami-core", Health: true,
		}
	}
	return out
}

// gpuNode returns a Node with n GPUs registered, allocatable alloc and handshake hs ("" = absent).
func gpuNode(name string, n int, alloc int64, hs string) *corev1.Node {
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name), Labels: map[string]string{"gpu": "on"},
			Annotations: map[string]string{annotation.KeyNVIDIARegister: annotation.Encode(devices(n, name))}},
		Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse("64"),
			corev1.ResourceName(annotation.ResourceNVIDIAGPU): *resource.NewQuantity(alloc, resource.DecimalSI),
		}},
	}
	if hs != "" {
		node.Annotations[annotation.KeyNVIDIAHandshake] = hs
	}
	return node
}

// logSink collects log lines.
type logSink struct {
	mu    sync.Mutex
	lines []string
}

func (l *logSink) add(prefix, args string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, prefix+" "+args)
}

// has reports whether a line with msg was logged at level (-1: as an error).
func (l *logSink) has(msg string, level int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	want := fmt.Sprintf(`"level"=%d "msg"=%q`, level, msg)
	if level < 0 {
		want = fmt.Sprintf(`"msg"=%q "error"=`, msg)
	}
	return slices.ContainsFunc(l.lines, func(s string) bool { return strings.Contains(s, want) })
}

func (l *logSink) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// env is a cache running against a fake clientset with a fake clock, inside the test's
// synctest bubble: create it in the function given to synctest.Test, with its t.
type env struct {
	t       *testing.T
	client  *fake.Clientset
	clock   *clocktesting.FakeClock
	rec     *record.FakeRecorder
	logs    *logSink
	cache   *Cache
	hs      *Handshaker
	ctx     context.Context
	factory informers.SharedInformerFactory
	// follower: run does not start the Handshaker (a replica that does not lead).
	follower bool
}

// start runs a cache and its Handshaker over the nodes. opts.Clock, EventRecorder and
// Handshake.Location are filled in.
func start(t *testing.T, opts Options, nodes ...*corev1.Node) *env {
	t.Helper()
	e := newEnv(t, opts, nodes...)
	e.run()
	return e
}

func newEnv(t *testing.T, opts Options, nodes ...*corev1.Node) *env {
	t.Helper()
	e := &env{t: t, clock: clocktesting.NewFakeClock(t0), rec: record.NewFakeRecorder(1000), logs: &logSink{}}
	objs := make([]runtime.Object, 0, len(nodes))
	for _, n := range nodes {
		objs = append(objs, n)
	}
	e.client = fake.NewClientset(objs...)
	if opts.Clock == nil {
		opts.Clock = e.clock
	}
	if opts.EventRecorder == nil {
		opts.EventRecorder = e.rec
	}
	if opts.Handshake.Location == nil {
		opts.Handshake.Location = time.UTC
	}
	factory := informers.NewSharedInformerFactory(e.client, 0)
	c, err := New(factory.Core().V1().Nodes(), opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	e.cache = c
	if e.hs, err = NewHandshaker(e.client, c, HandshakerOptions{}); err != nil {
		t.Fatalf("NewHandshaker: %v", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	e.ctx = klog.NewContext(ctx, funcr.New(e.logs.add, funcr.Options{Verbosity: 5}))
	e.factory = factory
	t.Cleanup(func() {
		cancel()
		factory.Shutdown()
	})
	return e
}

// run starts the informer, the cache and, unless e.follower, the Handshaker. Reactors must be
// added before: the fake clientset does not synchronise them with its use.
func (e *env) run() {
	e.t.Helper()
	e.factory.Start(e.ctx.Done())
	done := make(chan error, 1)
	go func() { done <- e.cache.Run(e.ctx) }()
	e.t.Cleanup(func() {
		if err := <-done; err != nil {
			e.t.Errorf("Run: %v", err)
		}
	})
	e.until("cache synced", e.cache.HasSynced)
	if !e.follower {
		e.lead()
	}
}

// lead runs the Handshaker until the returned function is called or the test ends.
func (e *env) lead() (stop func()) {
	e.t.Helper()
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan error, 1)
	go func() { done <- e.hs.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				e.t.Errorf("Handshaker.Run: %v", err)
			}
		})
	}
	e.t.Cleanup(stop)
	return stop
}

// settled waits until every other goroutine of the bubble is blocked, so that what the test
// set off has run to its end, and fails the test unless cond then holds.
func (e *env) settled(what string, cond func() bool) {
	e.t.Helper()
	synctest.Wait()
	if !cond() {
		e.t.Fatalf("still waiting for %s once the bubble settled\nlogs:\n%s", what, e.logs)
	}
}

// until is settled for what client-go times with the real clock, which in the bubble is fake
// time that moves only while the test goroutine blocks too (the informer's first sync). It lets
// the bubble settle and checks cond, and while cond does not hold lets a millisecond of fake
// time pass, failing after 10 s of it. The cache's own time, the write queue's included, is the
// fake clock, which only the test steps.
func (e *env) until(what string, cond func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		synctest.Wait()
		if cond() {
			return
		}
		if !time.Now().Before(deadline) {
			e.t.Fatalf("still waiting for %s after 10 s of the bubble's fake time\nlogs:\n%s", what, e.logs)
		}
		<-time.After(time.Millisecond)
	}
}

// state returns the NVIDIA state of a node (stateNone when unknown).
func (e *env) state(name string) State {
	n, ok := e.cache.Node(name)
	if !ok {
		return stateNone
	}
	return n.Registrations[0].State
}

// waitState waits until the bubble settled and checks the node's state.
func (e *env) waitState(name string, s State) {
	e.t.Helper()
	e.settled(fmt.Sprintf("node %s in state %s", name, s), func() bool { return e.state(name) == s })
}

// update changes a node through the API, as an agent or the kubelet would.
func (e *env) update(name string, change func(*corev1.Node)) {
	e.t.Helper()
	n, err := e.client.CoreV1().Nodes().Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatalf("get node: %v", err)
	}
	n = n.DeepCopy()
	change(n)
	if _, err := e.client.CoreV1().Nodes().Update(e.ctx, n, metav1.UpdateOptions{}); err != nil {
		e.t.Fatalf("update node: %v", err)
	}
}

// handshakeOf returns the node's handshake annotation as stored by the API.
func (e *env) handshakeOf(name string) (string, bool) {
	e.t.Helper()
	n, err := e.client.CoreV1().Nodes().Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatalf("get node: %v", err)
	}
	v, ok := n.Annotations[annotation.KeyNVIDIAHandshake]
	return v, ok
}

// patches returns the node patches the cache made.
func (e *env) patches() []string {
	var out []string
	for _, a := range e.client.Actions() {
		if p, ok := a.(k8stesting.PatchAction); ok && a.GetResource().Resource == "nodes" {
			out = append(out, p.GetName()+" "+string(p.GetPatch()))
		}
	}
	return out
}

// events drains the recorded Events.
func (e *env) events() []string {
	var out []string
	for {
		select {
		case ev := <-e.rec.Events:
			out = append(out, ev)
		default:
			return out
		}
	}
}

// tick advances the fake clock by d once the cache's ticker waits, and waits for the cycle.
func (e *env) tick(d time.Duration) {
	e.t.Helper()
	e.settled("ticker waiting", e.clock.HasWaiters)
	before := e.cache.Stats().Cycles
	e.clock.Step(d)
	e.settled("a cycle", func() bool { return e.cache.Stats().Cycles > before })
}

var metaDelete = metav1.DeleteOptions{}

func resourceQuantity(n int64) *resource.Quantity { return resource.NewQuantity(n, resource.DecimalSI) }

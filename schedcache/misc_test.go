package schedcache

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2/ktesting"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/handshake"
)

// TestMain fails the package if any test leaves a goroutine behind: Run joins what it starts.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestNewValidation(t *testing.T) {
	t.Parallel()
	dcu, _ := annotation.VendorByName("DCU")
	dcuWithoutResource := dcu
	dcuWithoutResource.ResourceName = ""
	metax, _ := annotation.VendorByName("Metax-SGPU")
	tests := map[string]struct {
		opts    Options
		started bool
		wantErr bool
	}{
		"zero options":            {},
		"legacy vendor":           {opts: Options{Vendors: []annotation.Vendor{annotation.NVIDIA(), dcu}}},
		"empty vendor list":       {opts: Options{Vendors: []annotation.Vendor{}}, wantErr: true},
		"vendor without resource": {opts: Options{Vendors: []annotation.Vendor{dcuWithoutResource}}, wantErr: true},
		"vendor-specific format":  {opts: Options{Vendors: []annotation.Vendor{metax}}, wantErr: true},
		"duplicate vendor":        {opts: Options{Vendors: []annotation.Vendor{annotation.NVIDIA(), annotation.NVIDIA()}}, wantErr: true},
		"negative tick":           {opts: Options{Tick: -time.Second}, wantErr: true},
		"negative window":         {opts: Options{Handshake: handshake.Options{Window: -1}}, wantErr: true},

		"started informer":       {started: true, wantErr: true},
		"started informer, kept": {started: true, opts: Options{KeepNodeFields: true}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				client := fake.NewClientset()
				factory := informers.NewSharedInformerFactory(client, 0)
				nodes := factory.Core().V1().Nodes()
				if tc.started {
					ctx, cancel := context.WithCancel(t.Context())
					nodes.Informer()
					factory.Start(ctx.Done())
					cache.WaitForCacheSync(ctx.Done(), nodes.Informer().HasSynced)
					defer factory.Shutdown()
					defer cancel()
				}
				_, err := New(nodes, tc.opts)
				if (err != nil) != tc.wantErr {
					t.Fatalf("New = %v, want error %v", err, tc.wantErr)
				}
				if err != nil && !errors.Is(err, ErrInvalidOptions) {
					t.Errorf("error %v is not ErrInvalidOptions", err)
				}
			})
		})
	}
	if _, err := New(nil, Options{}); !errors.Is(err, ErrInvalidOptions) {
		t.Errorf("New(nil) = %v", err)
	}
}

func TestTrimNode(t *testing.T) {
	t.Parallel()
	n := realisticNode("n")
	if len(n.ManagedFields) == 0 || len(n.Status.Images) == 0 {
		t.Fatal("test node lacks managedFields or images")
	}
	out, err := TrimNode(n)
	if err != nil {
		t.Fatal(err)
	}
	got := out.(*corev1.Node)
	if got.ManagedFields != nil || got.Status.Images != nil {
		t.Error("managedFields or images kept")
	}
	if got.Annotations[annotation.KeyNVIDIARegister] == "" || len(got.Labels) == 0 || len(got.Status.Allocatable) == 0 || len(got.Status.Conditions) == 0 {
		t.Error("TrimNode dropped what the cache or a scheduler reads")
	}
	tomb := cache.DeletedFinalStateUnknown{Key: "n", Obj: n}
	if out, _ := TrimNode(tomb); out != any(tomb) {
		t.Error("tombstone changed")
	}
}

// TestInformerTransformInstalled: objects in the informer come trimmed.
func TestInformerTransformInstalled(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := start(t, Options{}, realisticNode("n"))
		e.waitState("n", StateRegistered)
		obj, ok, _ := e.cache.informer.GetStore().GetByKey("n")
		if !ok {
			t.Fatal("node not in the informer")
		}
		if n := obj.(*corev1.Node); n.ManagedFields != nil || n.Status.Images != nil {
			t.Error("informer object not trimmed")
		}
	})
}

// TestWriteRetry: a failed PATCH is retried with backoff and counted; nothing is cached as
// written until the API accepted it.
func TestWriteRetry(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, Options{}, gpuNode("n", 8, 80, ""))
		var mu sync.Mutex
		fails := 2
		e.client.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
			mu.Lock()
			defer mu.Unlock()
			if fails > 0 {
				fails--
				return true, nil, apierrors.NewServiceUnavailable("try again")
			}
			return false, nil, nil
		})
		e.run()
		// Retries back off on the cache's clock: 5 ms, then 10 ms.
		for i := 0; ; i++ {
			e.settled("a retry waiting", func() bool { return e.clock.HasWaiters() })
			if hs, _ := e.handshakeOf("n"); hs == requesting(t0) {
				break
			}
			if i == 10 {
				t.Fatalf("no stamp after %d steps of 5 ms", i)
			}
			e.clock.Step(5 * time.Millisecond)
		}
		s := e.cache.Stats()
		if s.WriteErrors != 2 || s.Stamps != 1 {
			t.Errorf("write errors %d stamps %d, want 2 and 1", s.WriteErrors, s.Stamps)
		}
		if !e.logs.has("Failed to patch node annotations", -1) {
			t.Errorf("no error log in\n%s", e.logs)
		}
	})
}

// TestWriteDroppedForDeletedNode: a node deleted before its write is not retried forever.
func TestWriteDroppedForDeletedNode(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, Options{}, gpuNode("n", 8, 80, ""))
		e.client.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewNotFound(schema.GroupResource{Resource: "nodes"}, "n")
		})
		e.run()
		e.until("no pending write", func() bool { return e.cache.Stats().PendingWrites == 0 && len(e.patches()) >= 1 })
		if s := e.cache.Stats(); s.WriteErrors != 0 {
			t.Errorf("write errors = %d", s.WriteErrors)
		}
	})
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		reg := prometheus.NewPedanticRegistry()
		e := start(t, Options{Registerer: reg},
			gpuNode("a", 8, 80, ""), gpuNode("b", 8, 80, requesting(t0)), withRegister(gpuNode("c", 8, 80, ""), "[null]"))
		e.waitState("c", StateInvalidElement)
		e.until("the stamp", func() bool { return e.cache.Stats().Stamps == 1 })
		want := `
	# HELP hamireg_schedcache_decode_failures_total Register annotations that did not decode, by vendor and state (malformed, invalid-element, no-devices).
	# TYPE hamireg_schedcache_decode_failures_total counter
	hamireg_schedcache_decode_failures_total{state="invalid-element",vendor="NVIDIA"} 1
	# HELP hamireg_schedcache_handshake_writes_total Handshake annotation writes by vendor, action (stamp, cleanup) and result (ok, error).
	# TYPE hamireg_schedcache_handshake_writes_total counter
	hamireg_schedcache_handshake_writes_total{action="stamp",result="ok",vendor="NVIDIA"} 1
	# HELP hamireg_schedcache_nodes Nodes per vendor and registration state.
	# TYPE hamireg_schedcache_nodes gauge
	hamireg_schedcache_nodes{state="invalid-element",vendor="NVIDIA"} 1
	hamireg_schedcache_nodes{state="registered",vendor="NVIDIA"} 2
	`
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
			"hamireg_schedcache_nodes", "hamireg_schedcache_decode_failures_total", "hamireg_schedcache_handshake_writes_total"); err != nil {
			t.Error(err)
		}
		if n, err := testutil.GatherAndCount(reg, "hamireg_schedcache_queue_depth"); err != nil || n != 2 {
			t.Errorf("queue depth series = %d, %v", n, err)
		}
		if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) != 0 {
			t.Errorf("metric lint: %v %v", problems, err)
		}
		// A second cache on the same registry is refused, not panicking.
		client := fake.NewClientset()
		factory := informers.NewSharedInformerFactory(client, 0)
		if _, err := New(factory.Core().V1().Nodes(), Options{Registerer: reg}); !errors.Is(err, ErrInvalidOptions) {
			t.Errorf("second registration = %v", err)
		}
	})
}

func TestRunTwice(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := start(t, Options{})
		if err := e.cache.Run(e.ctx); !errors.Is(err, ErrAlreadyRunning) {
			t.Errorf("second Run = %v", err)
		}
	})
}

// TestRunReturnsOnCancel: Run returns nil promptly once ctx is done, even before the informer
// synced, and leaves no goroutine (TestMain checks).
func TestRunReturnsOnCancel(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		_, ctx := ktesting.NewTestContext(t)
		client := fake.NewClientset()
		factory := informers.NewSharedInformerFactory(client, 0) // never started: never syncs
		c, err := New(factory.Core().V1().Nodes(), Options{})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()
		synctest.Wait() // Run waits for the informer
		cancel()
		synctest.Wait()
		if len(done) == 0 {
			t.Fatal("Run did not return once the bubble settled")
		}
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
		if c.HasSynced() {
			t.Error("synced without an informer")
		}
	})
}

// TestConcurrentReaders: readers run against node updates and ticks (meaningful with -race);
// every snapshot is internally consistent.
func TestConcurrentReaders(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const nodes = 20
		var objs []*corev1.Node
		for i := range nodes {
			objs = append(objs, gpuNode(fmt.Sprintf("n%02d", i), 8, 80, requesting(t0)))
		}
		e := start(t, Options{}, objs...)
		e.settled("all registered", func() bool { return e.cache.Snapshot().Len() == nodes })
		e.settled("ticker waiting", e.clock.HasWaiters)
		// synctest.Wait returns only once every other goroutine of the bubble is blocked, and
		// spinning readers never are: the test cannot wait while they read. So they read
		// through the updates and the tick and stop on their own once the tick's cycle has
		// started (where the test used to stop them), or after a million rounds (they need
		// about a tenth of that).
		cycles := e.cache.stats.cycles.Load()
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				for round := 0; round < 1_000_000 && e.cache.stats.cycles.Load() == cycles; round++ {
					s := e.cache.Snapshot()
					count := 0
					for n := range s.All() {
						count++
						if !n.Registered() {
							t.Errorf("unregistered node %s in a snapshot", n.Name)
						}
						if m, ok := s.Node(n.Name); !ok || m != n {
							t.Errorf("snapshot lookup of %s differs", n.Name)
						}
					}
					if count != s.Len() {
						t.Errorf("snapshot yields %d nodes, Len %d", count, s.Len())
					}
					if n, ok := e.cache.Node("n00"); ok {
						_ = n.Devices(annotation.NVIDIA())
					}
				}
			})
		}
		for i := range 30 {
			name := fmt.Sprintf("n%02d", i%nodes)
			value := "[null]"
			if i%2 == 1 {
				value = annotation.Encode(devices(8, name))
			}
			e.update(name, func(n *corev1.Node) { n.Annotations[annotation.KeyNVIDIARegister] = value })
		}
		e.clock.Step(DefaultTick)
		wg.Wait()
		e.settled("a cycle", func() bool { return e.cache.Stats().Cycles > cycles })
		// The last update of every even-numbered node wrote [null].
		e.settled("settled", func() bool { return e.cache.Snapshot().Len() == nodes/2 })
		if g1, g2 := e.cache.Snapshot(), e.cache.Snapshot(); g1 != g2 {
			t.Error("an unchanged cache returned two snapshots")
		}
	})
}

// TestOtherVendor: a legacy-format vendor with its own handshake key works beside NVIDIA.
func TestOtherVendor(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		dcu, _ := annotation.VendorByName("DCU")
		dcu.ResourceName = "hygon.com/dcunum"
		n := gpuNode("n", 2, 20, requesting(t0))
		n.Annotations[dcu.RegisterKey] = annotation.EncodeLegacy(devices(2, "dcu"))
		n.Status.Allocatable[corev1.ResourceName(dcu.ResourceName)] = *resourceQuantity(4)
		e := start(t, Options{Vendors: []annotation.Vendor{annotation.NVIDIA(), dcu}}, n)
		e.settled("both registered", func() bool {
			info, ok := e.cache.Node("n")
			return ok && len(info.Devices(annotation.NVIDIA())) == 2 && len(info.Devices(dcu)) == 2
		})
		e.until("the DCU stamp", func() bool {
			got, err := e.client.CoreV1().Nodes().Get(e.ctx, "n", metav1.GetOptions{})
			return err == nil && got.Annotations[dcu.HandshakeKey] == requesting(t0)
		})
		if p := e.patches(); len(p) != 1 {
			t.Errorf("patches = %q, want only the DCU stamp", p)
		}
	})
}

// TestWaitForSync: readiness without polling; the channel is closed once, for any number of
// waiters; a cancelled wait returns the context's cause.
func TestWaitForSync(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, Options{}, gpuNode("a", 8, 80, requesting(t0)))
		ctx, cancel := context.WithCancelCause(e.ctx)
		cause := errors.New("shutting down")
		cancel(cause)
		if err := e.cache.WaitForSync(ctx); !errors.Is(err, cause) {
			t.Errorf("WaitForSync(cancelled) = %v, want the cause", err)
		}
		waited := make(chan error, 3)
		for range cap(waited) {
			go func() { waited <- e.cache.WaitForSync(e.ctx) }()
		}
		synctest.Wait()
		if len(waited) != 0 {
			t.Fatal("WaitForSync returned before the cache ran")
		}
		e.run()
		synctest.Wait()
		for range cap(waited) {
			if err := <-waited; err != nil {
				t.Errorf("WaitForSync = %v", err)
			}
		}
		select {
		case <-e.cache.Synced():
		default:
			t.Error("Synced not closed")
		}
	})
}

func TestClusterRoleRules(t *testing.T) {
	t.Parallel()
	var verbs []string
	for _, r := range ClusterRoleRules() {
		for _, v := range r.Verbs {
			verbs = append(verbs, r.Resources[0]+"/"+v)
		}
	}
	want := []string{"nodes/list", "nodes/watch", "nodes/patch", "events/create", "events/patch"}
	if !slices.Equal(verbs, want) {
		t.Errorf("rules = %v, want %v", verbs, want)
	}
	if r := LeaseRoleRules(); len(r) != 1 || r[0].Resources[0] != "leases" {
		t.Errorf("lease rules = %v", r)
	}
}

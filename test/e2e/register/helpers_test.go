package register_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/register"
)

// counter is an http.RoundTripper wrapper that counts the requests a client sends, by kind
// ("GET nodes", "LIST nodes", "WATCH nodes", "PATCH nodes", "POST events", …).
//
// With watchScale > 1 it also divides the timeoutSeconds of every watch request by
// watchScale (at least 1 s), so that the watch renewals of a compressed hour happen for real
// (client-go's reflector asks for 300–600 s and will not go lower).
type counter struct {
	watchScale float64

	mu     sync.Mutex
	counts map[string]int
}

func newCounter(watchScale float64) *counter {
	return &counter{watchScale: watchScale, counts: map[string]int{}}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func (c *counter) wrap(next http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		q := req.URL.Query()
		kind := req.Method
		watching := q.Get("watch") == "true" || q.Get("watch") == "1"
		if watching {
			kind = "WATCH"
			if s, err := strconv.Atoi(q.Get("timeoutSeconds")); err == nil && c.watchScale > 1 {
				q.Set("timeoutSeconds", strconv.Itoa(max(1, int(math.Round(float64(s)/c.watchScale)))))
				req = req.Clone(req.Context())
				req.URL.RawQuery = q.Encode()
			}
		}
		segs := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
		resource := "other"
		for i, s := range segs {
			if s == "nodes" || s == "events" {
				resource = s
				if req.Method == http.MethodGet && !watching && i == len(segs)-1 {
					kind = "LIST"
				}
			}
		}
		c.mu.Lock()
		c.counts[kind+" "+resource]++
		c.mu.Unlock()
		return next.RoundTrip(req)
	})
}

// snapshot returns the counts so far.
func (c *counter) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.counts))
	for k, v := range c.counts {
		out[k] = v
	}
	return out
}

// since returns the counts added after before, and their total.
func (c *counter) since(before map[string]int) (map[string]int, int) {
	now := c.snapshot()
	total := 0
	for k, v := range now {
		now[k] = v - before[k]
		total += now[k]
		if now[k] == 0 {
			delete(now, k)
		}
	}
	return now, total
}

// countingClient returns an admin clientset whose requests c counts.
func countingClient(tb testing.TB, c *counter) kubernetes.Interface {
	tb.Helper()
	return countingClientFor(tb, cp.RESTConfig(), c)
}

func countingClientFor(tb testing.TB, cfg *rest.Config, c *counter) kubernetes.Interface {
	tb.Helper()
	cfg.Wrap(c.wrap)
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		tb.Fatalf("new clientset: %v", err)
	}
	return cs
}

// shuffled returns devs in a new random order, as HAMi's agent lists them (Go map iteration
// over its devices).
func shuffled(devs []annotation.Device) []annotation.Device {
	out := slices.Clone(devs)
	rand.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// pushEvery stands in for the node agent's rescan loop (package nodeagent rescans its device
// source every 30 s and pushes what it found): every period it calls
// w.SetDevices(shuffled(devs())). pushes reports how many pushes it has made; stop ends the
// loop and returns after its goroutine has, and also runs when tb ends.
func pushEvery(ctx context.Context, tb testing.TB, w *register.Writer, period time.Duration, devs func() []annotation.Device) (pushes func() uint64, stop func()) {
	tb.Helper()
	ctx, cancel := context.WithCancel(ctx)
	var n atomic.Uint64
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(period)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				w.SetDevices(shuffled(devs()))
				n.Add(1)
			}
		}
	})
	stop = func() { cancel(); wg.Wait() }
	tb.Cleanup(stop)
	return n.Load, stop
}

// syncs counts the syncs w has made: one follows every SetDevices (a no-op when the devices
// are unchanged), and it moves after the API server has answered the sync's request, if any.
func syncs(w *register.Writer) uint64 {
	s := w.Stats()
	return s.Writes + s.NoOps + s.Failures
}

// waitForSync waits up to timeout for w.WaitForSync (the Writer has written, or found in
// place, the devices last set) and returns how long that took; it fails tb with w's Stats
// when the time runs out. The PATCH response has arrived by then, so a GET sees the value; the
// Stats counters may move a moment later.
func waitForSync(ctx context.Context, tb testing.TB, w *register.Writer, timeout time.Duration) time.Duration {
	tb.Helper()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	if err := w.WaitForSync(ctx); err != nil {
		tb.Fatalf("WaitForSync: %v; stats %+v", err, w.Stats())
	}
	return time.Since(start)
}

// newWriter returns a Writer of node that client writes with, given devs in a random order.
func newWriter(tb testing.TB, client kubernetes.Interface, node string, devs []annotation.Device, opts register.Options) *register.Writer {
	tb.Helper()
	w, err := register.New(client, node, opts)
	if err != nil {
		tb.Fatal(err)
	}
	w.SetDevices(shuffled(devs))
	return w
}

// gpus returns n healthy H100s.
func gpus(n int) []annotation.Device {
	devs := make([]annotation.Device, n)
	for i := range devs {
		devs[i] = annotation.Device{
			ID: fmt.Sprintf("GPU-%08x-1111-2222-3333-444444444444", i), Index: uint(i), Count: 10,
			Devmem: 81559, Devcore: 100, Type: "NVIDIA-H100-80GB-HBM3", Numa: i / 4, Mode: "hami-core", Health: true,
		}
	}
	return devs
}

// want is the value the writer must publish for devs.
func want(devs []annotation.Device) string { return annotation.Encode(annotation.Canonical(devs)) }

// createNode creates a Node with the given annotations.
func createNode(tb testing.TB, name string, annotations map[string]string) {
	tb.Helper()
	cp.CreateNode(tb, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: annotations}})
}

// annotations reads the Node's annotations with the admin client.
func annotations(tb testing.TB, name string) map[string]string {
	tb.Helper()
	return cp.GetNode(tb, name).Annotations
}

// handPatch merge-patches annotations as an operator would with kubectl annotate; a nil
// value deletes the key.
func handPatch(tb testing.TB, name string, annotations map[string]*string) {
	tb.Helper()
	if err := cp.PatchNodeAnnotations(tb.Context(), name, "", annotations); err != nil {
		tb.Fatal(err)
	}
}

// run runs w until the test ends, and checks that Run returns nil promptly on cancellation.
func run(ctx context.Context, tb testing.TB, w *register.Writer) (stop func()) {
	tb.Helper()
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					tb.Errorf("Run returned %v, want nil", err)
				}
			case <-time.After(15 * time.Second):
				tb.Errorf("Run did not return within 15 s of cancellation")
			}
		})
	}
	tb.Cleanup(stop)
	return stop
}

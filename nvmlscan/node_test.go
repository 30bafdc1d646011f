package nvmlscan_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"
	"k8s.io/klog/v2/ktesting"

	"github.com/hamireg/hamireg/nvmlscan"
	"github.com/hamireg/hamireg/nvmlscan/nvmlscantest"
)

func TestMain(m *testing.M) {
	// Every Run and every fake event set must be gone when the tests end.
	goleak.VerifyTestMain(m)
}

// newScanner creates a scanner over the node with the node's sysfs and closes it at the end of
// the test.
func newScanner(t *testing.T, n *nvmlscantest.Node, opts nvmlscan.Options) *nvmlscan.Scanner {
	t.Helper()
	if opts.Sysfs == nil {
		opts.Sysfs = n.Sysfs
	}
	s, err := nvmlscan.New(n.Server, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	drainChanged(s)
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// scan scans and fails the test on error.
func scan(ctx context.Context, t *testing.T, s *nvmlscan.Scanner) nvmlscan.Result {
	t.Helper()
	res, err := s.Scan(ctx)
	if err != nil {
		t.Fatalf("Scan: %v", err)
	}
	return res
}

// startRun runs s.Run in a goroutine and returns a function that stops it and returns its
// error. In a synctest bubble the 10 s it waits for Run to return are the bubble's fake time.
func startRun(ctx context.Context, t *testing.T, s *nvmlscan.Scanner) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- s.Run(ctx) }()
	var stopped atomic.Bool
	stop = func() error {
		if stopped.Swap(true) {
			return nil
		}
		cancel()
		select {
		case err := <-errc:
			return err
		case <-time.After(10 * time.Second):
			t.Fatal("Run did not return 10 s after its context ended")
			return nil
		}
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return stop
}

// testContext returns a context whose logger writes to the test log.
func testContext(t *testing.T) context.Context {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	return ctx
}

// waitChanged waits until every other goroutine of the test's synctest bubble is blocked (the
// events sent to the node have been handled) and takes the health notification, which must be
// there by then.
func waitChanged(t *testing.T, s *nvmlscan.Scanner) {
	t.Helper()
	synctest.Wait()
	if !changedSince(s) {
		t.Fatal("no health notification once the bubble settled")
	}
}

// seen holds, per scanner, the Changed channel taken when the test last looked (at New, and at
// each waitChanged, drainChanged or changedSince).
var seen sync.Map // *nvmlscan.Scanner → <-chan struct{}

// changedSince reports whether the health changed since the test last looked, and looks again.
func changedSince(s *nvmlscan.Scanner) bool {
	v, _ := seen.Load(s)
	ch, _ := v.(<-chan struct{})
	seen.Store(s, s.Changed())
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// drainChanged forgets changes so far.
func drainChanged(s *nvmlscan.Scanner) { seen.Store(s, s.Changed()) }

// health returns the Health field of each scanned device by index.
func health(res nvmlscan.Result) map[uint]bool {
	m := make(map[uint]bool, len(res.Devices))
	for _, d := range res.Devices {
		m[d.Index] = d.Health
	}
	return m
}

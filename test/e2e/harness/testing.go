package harness

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hamireg/hamireg/envtest"
)

// TestLabel is the label key by which a test marks the cluster-wide objects it creates
// (value: the test's UniqueName) and by which its informers and Pods select them.
const TestLabel = "e2e.hamireg.io/test"

// UniqueName returns prefix-<8 hex digits>, lower-cased: a valid Node, Namespace or Lease name
// that keeps one test's objects apart from the others' on the shared control plane.
func UniqueName(prefix string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return strings.ToLower(prefix) + "-" + hex.EncodeToString(b)
}

// Eventually polls cond every 5 ms until it holds and returns how long that took; it fails tb
// when timeout passes first, or when the test's context ends. cond runs on the caller's
// goroutine, so it may call tb.Fatal.
//
// Wait on the condition itself, or on the counter that moves last: a component's Stats counter
// moves after the API server answered its request, so a GET can see the write while the
// counter has not moved yet.
func Eventually(tb testing.TB, what string, timeout time.Duration, cond func() bool) time.Duration {
	tb.Helper()
	start := time.Now()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if took := time.Since(start); took > timeout {
			tb.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		select {
		case <-tb.Context().Done():
			tb.Fatalf("test ended while waiting for %s", what)
		case <-tick.C:
		}
	}
	return time.Since(start)
}

// CreateNode creates n with the admin client, fails tb on error, and deletes the Node when tb
// ends. Nodes are cluster-wide: name it with [UniqueName]. The API server drops the status of
// a create, and the TaintNodesByCondition admission plugin adds the not-ready taint; the
// returned Node is what the server stored.
func (cp *ControlPlane) CreateNode(tb testing.TB, n *corev1.Node) *corev1.Node {
	tb.Helper()
	nodes := cp.AdminClient().CoreV1().Nodes()
	created, err := nodes.Create(tb.Context(), n, metav1.CreateOptions{})
	if err != nil {
		tb.Fatalf("create node %s: %v", n.Name, err)
	}
	tb.Cleanup(func() { _ = nodes.Delete(context.WithoutCancel(tb.Context()), n.Name, metav1.DeleteOptions{}) })
	return created
}

// GetNode reads the Node with the admin client and fails tb on error.
func (cp *ControlPlane) GetNode(tb testing.TB, name string) *corev1.Node {
	tb.Helper()
	n, err := cp.AdminClient().CoreV1().Nodes().Get(tb.Context(), name, metav1.GetOptions{})
	if err != nil {
		tb.Fatalf("get node %s: %v", name, err)
	}
	return n
}

// Context returns tb's context with a logger that writes to tb at V(2), so that what a
// component logs appears beside the test's own output; it is cancelled when tb ends.
func Context(tb testing.TB) context.Context {
	tb.Helper()
	return klog.NewContext(tb.Context(), ktesting.NewLogger(tb, ktesting.NewConfig(ktesting.Verbosity(2))))
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago, for a process a test
// starts with a listen address of its own.
func FreePort(tb testing.TB) int {
	tb.Helper()
	ports, err := envtest.FreePorts(1)
	if err != nil {
		tb.Fatal(err)
	}
	return ports[0]
}

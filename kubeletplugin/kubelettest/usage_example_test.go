package kubelettest_test

import (
	"testing"

	"github.com/hamireg/hamireg/kubeletplugin/kubelettest"
)

// Example_usage compiles the package documentation's snippet, the start of a test.
func Example_usage() {
	test := func(t *testing.T) {
		t.Helper()
		ctx := t.Context()
		// snippet: doc
		k := kubelettest.Start(t)
		// the plugin serves k.Dir()/vendor.sock and registers at k.SocketPath()
		st, err := k.WaitFor(ctx, func(s kubelettest.State) bool {
			p, ok := s.Resource("vendor.com/gpu")
			return ok && p.Healthy() == 4
		})
		if err != nil {
			t.Fatal(err, st) // st: the last state seen
		}
		// end snippet
	}
	_ = test
}

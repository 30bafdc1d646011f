package nvmlscantest_test

import (
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"

	"github.com/hamireg/hamireg/nvmlscan"
	"github.com/hamireg/hamireg/nvmlscan/nvmlscantest"
)

// Example is the package documentation's snippet, compiled: the start of a test of a scanner
// on a simulated DGX H100 whose GPU 2 reports XID 79 (package nvmlsim's Example runs it).
func Example() {
	test := func(t *testing.T) {
		t.Helper()
		// snippet: doc
		node := nvmlscantest.NewNode(t, dgxh100.New())
		s, err := nvmlscan.New(node.Server, nvmlscan.Options{Sysfs: node.Sysfs})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		node.XID(2, 79) // GPU 2 reports XID 79 to a running Scanner.Run
		// end snippet
	}
	_ = test
}

package nvmlscan_test

import (
	"fmt"
	"testing"
	"testing/fstest"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/google/go-cmp/cmp"

	"github.com/hamireg/hamireg/nvmlscan"
	"github.com/hamireg/hamireg/nvmlscan/nvmlscantest"
	"github.com/hamireg/hamireg/nvmlscan/nvmlsim"
)

// TestNUMANodes: the scan's GPUs have their sysfs NUMA node; a GPU without affinity (-1), an
// unreadable or malformed numa_node and an excluded GPU have none.
func TestNUMANodes(t *testing.T) {
	t.Parallel()
	n := nvmlscantest.NewNode(t, dgxh100.New())
	buses := nvmlsim.BusNumbers()
	file := func(i int) string { return fmt.Sprintf("bus/pci/devices/0000:%02x:00.0/numa_node", buses[i]) }
	n.Sysfs[file(1)] = &fstest.MapFile{Data: []byte("-1\n")}
	n.Sysfs[file(2)] = &fstest.MapFile{Data: []byte("x")}
	delete(n.Sysfs, file(5))
	s := newScanner(t, n, nvmlscan.Options{ExcludeIndexes: []uint{3}})
	if got := s.NUMANodes(); len(got) != 0 {
		t.Errorf("NUMA nodes before the first scan: %v, want none", got)
	}
	scan(testContext(t), t, s)
	want := map[string]int{n.UUID(0): 0, n.UUID(4): 1, n.UUID(6): 1, n.UUID(7): 1}
	if diff := cmp.Diff(want, s.NUMANodes()); diff != "" {
		t.Errorf("NUMA nodes (-want +got):\n%s", diff)
	}
}

package register

import (
	"slices"
	"strings"
	"testing"

	"github.com/hamireg/hamireg/allocation"
)

// FuzzCordon: for any Node values of hami.io/device-cordon and CordonKey and any UUIDs of the
// writer, the value the writer keeps holds each of its UUIDs once, keeps every operator entry
// (one not recorded as the writer's) in its order, and a Node carrying what the writer writes
// is seen as in place; nothing panics.
func FuzzCordon(f *testing.F) {
	f.Add("GPU-op,GPU-a", "GPU-a", "GPU-b")
	f.Add(" GPU-a , ,GPU-a", "", "GPU-a,GPU-c")
	f.Add("", "GPU-x", "")
	f.Fuzz(func(t *testing.T, cordon, recorded, mine string) {
		live := map[string]string{allocation.KeyDeviceCordon: cordon, CordonKey: recorded}
		want := normalCordon(strings.Split(mine, ","))
		merged := mergeCordon(live, want)
		for _, u := range want {
			if n := countOf(merged, u); n != 1 {
				t.Fatalf("merge(%q, %q, %q) = %q holds %q %d times", cordon, recorded, mine, merged, u, n)
			}
		}
		ours := splitCordon(recorded)
		var operator []string
		for _, u := range splitCordon(cordon) {
			if !slices.Contains(ours, u) && !slices.Contains(want, u) && !slices.Contains(operator, u) {
				operator = append(operator, u)
			}
		}
		if !slices.Equal(merged[:len(operator)], operator) {
			t.Fatalf("merge(%q, %q, %q) = %q, the operator's %q not first in order", cordon, recorded, mine, merged, operator)
		}
		written := map[string]string{allocation.KeyDeviceCordon: strings.Join(merged, ","), CordonKey: strings.Join(want, ",")}
		if got := observedCordon(written, want); got != strings.Join(want, ",") {
			t.Fatalf("the written values %q are not seen as in place: %q", written, got)
		}
	})
}

func countOf(s []string, v string) int {
	n := 0
	for _, x := range s {
		if x == v {
			n++
		}
	}
	return n
}

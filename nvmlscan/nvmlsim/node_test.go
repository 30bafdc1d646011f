package nvmlsim_test

import (
	"regexp"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/hamireg/hamireg/nvmlscan/nvmlsim"
)

// TestSetUUIDSeed: the same seed gives the same UUIDs in a new node (a restarted program sees
// the same GPUs), another seed other ones; every UUID is well formed, distinct, and found by
// DeviceGetHandleByUUID.
func TestSetUUIDSeed(t *testing.T) {
	t.Parallel()
	uuids := func(seed string) []string {
		n, err := nvmlsim.New("dgxa100")
		if err != nil {
			t.Fatal(err)
		}
		n.SetUUIDSeed(seed)
		var out []string
		for i := range 8 {
			u := n.UUID(i)
			d, ret := n.Server.DeviceGetHandleByUUID(u)
			if ret != nvml.SUCCESS || d != n.Server.Devices[i] {
				t.Errorf("DeviceGetHandleByUUID(%s) = %v, %v; want GPU %d", u, d, ret, i)
			}
			if got, ret := d.GetUUID(); ret != nvml.SUCCESS || got != u {
				t.Errorf("GPU %d GetUUID = %q, %v; want %q", i, got, ret, u)
			}
			out = append(out, u)
		}
		return out
	}
	a, b, other := uuids("node-1"), uuids("node-1"), uuids("node-2")
	shape := regexp.MustCompile(`^GPU-[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	seen := map[string]bool{}
	for i := range a {
		if a[i] != b[i] {
			t.Errorf("GPU %d: %s and %s with the same seed", i, a[i], b[i])
		}
		if a[i] == other[i] {
			t.Errorf("GPU %d: %s with two seeds", i, a[i])
		}
		if !shape.MatchString(a[i]) || seen[a[i]] {
			t.Errorf("GPU %d: UUID %s malformed or repeated", i, a[i])
		}
		seen[a[i]] = true
	}
}

package annotation

import "testing"

// TestEncodeRepeatedStrings checks that devices sharing a model and mode (all GPUs of a node,
// usually) encode exactly as HAMi's encoder writes them.
func TestEncodeRepeatedStrings(t *testing.T) {
	t.Parallel()
	devs := []Device{
		{ID: "a", Type: "NVIDIA <A100>", Mode: "hami-core"},
		{ID: "b", Type: "NVIDIA <A100>", Mode: "hami-core", Index: 1},
		{ID: "c", Type: "", Mode: "mig", Index: 2},
		{ID: "d", Type: "NVIDIA <A100>", Mode: "mig", Index: 3},
	}
	for _, shape := range []Shape{ShapeMaster, ShapeV290} {
		if got, want := EncodeShape(devs, shape), hamiMarshal(devs, shape); got != want {
			t.Errorf("%v:\n got %s\nwant %s", shape, got, want)
		}
	}
}

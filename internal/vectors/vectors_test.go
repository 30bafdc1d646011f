package vectors

import "testing"

func TestOneEntryPerContainer(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		value string
		gpu   []bool
		want  string
		ok    bool
	}{
		"kept already":           {value: "a,NVIDIA,1,1:;;", gpu: []bool{true, false}, want: "a,NVIDIA,1,1:;;", ok: true},
		"dropped, sidecar last":  {value: "a,NVIDIA,1,1:;", gpu: []bool{true, false}, want: "a,NVIDIA,1,1:;;", ok: true},
		"dropped, sidecar first": {value: "a,NVIDIA,1,1:;", gpu: []bool{false, true}, want: ";a,NVIDIA,1,1:;", ok: true},
		"two GPU containers":     {value: "a,NVIDIA,1,1:;b,NVIDIA,1,1:;", gpu: []bool{true, false, true}, want: "a,NVIDIA,1,1:;;b,NVIDIA,1,1:;", ok: true},
		"an entry too many":      {value: "a,NVIDIA,1,1:;b,NVIDIA,1,1:;", gpu: []bool{true, false}, want: "a,NVIDIA,1,1:;;", ok: false},
		"an entry missing":       {value: ";", gpu: []bool{true}, ok: false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got, ok := OneEntryPerContainer(tc.value, tc.gpu)
			if ok != tc.ok || (ok && got != tc.want) {
				t.Errorf("OneEntryPerContainer(%q, %v) = %q, %v; want %q, %v", tc.value, tc.gpu, got, ok, tc.want, tc.ok)
			}
		})
	}
}

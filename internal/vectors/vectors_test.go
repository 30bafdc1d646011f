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

func TestContainerOfEntry(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		value string
		entry int
		gpu   []bool
		want  int
		ok    bool
	}{
		"kept already":           {value: "a:;;b:;", entry: 2, gpu: []bool{true, false, true}, want: 2, ok: true},
		"dropped, sidecar first": {value: "a:;", entry: 0, gpu: []bool{false, true}, want: 1, ok: true},
		"dropped, sidecar last":  {value: "a:;", entry: 0, gpu: []bool{true, false}, want: 0, ok: true},
		"an empty entry":         {value: "a:;;", entry: 1, gpu: []bool{true, false}},
		"out of range":           {value: "a:;", entry: 3, gpu: []bool{true}},
		"no container takes it":  {value: "a:;b:;", entry: 1, gpu: []bool{true, false}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got, ok := ContainerOfEntry(tc.value, tc.entry, tc.gpu)
			if ok != tc.ok || (ok && got != tc.want) {
				t.Errorf("ContainerOfEntry(%q, %d, %v) = %d, %v; want %d, %v", tc.value, tc.entry, tc.gpu, got, ok, tc.want, tc.ok)
			}
		})
	}
}

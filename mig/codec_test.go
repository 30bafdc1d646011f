package mig

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const testGPU = "GPU-0a1b2c3d-0000-1111-2222-333344445555"

func TestDecodeAllocations(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		value   string
		want    []Allocation
		wantErr string // substring of the error; "" = no error
	}{
		"empty":    {value: ""},
		"null":     {value: "null"},
		"[]":       {value: "[]"},
		"not json": {value: "[{", wantErr: "decode hami.io/vgpu-mig-allocations"},
		"object":   {value: `{"containerIndex":0}`, wantErr: "decode"},
		"reservation": {
			value: `[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"` + testGPU + `","profile":"2g.10gb","placement":{"start":2,"size":2}}]`,
			want:  []Allocation{{GPUUUID: testGPU, Profile: "2g.10gb", Placement: Placement{Start: 2, Size: 2}}},
		},
		"realized": {
			value: `[{"containerIndex":1,"deviceIndex":2,"gpuUUID":"G","profile":"1g.5gb","placement":{"start":6,"size":1},"migUUID":"MIG-1","gpuInstanceID":7,"computeInstanceID":0}]`,
			want: []Allocation{{ContainerIndex: 1, DeviceIndex: 2, GPUUUID: "G", Profile: "1g.5gb", Placement: Placement{Start: 6, Size: 1},
				Runtime: &Runtime{MigUUID: "MIG-1", GPUInstanceID: 7}}},
		},
		"unknown fields ignored, case-insensitive keys": {
			value: `[{"ContainerIndex":0,"deviceindex":1,"gpuUUID":"G","profile":"1g.5gb","placement":{"start":0,"size":1},"extra":true}]`,
			want:  []Allocation{{DeviceIndex: 1, GPUUUID: "G", Profile: "1g.5gb", Placement: Placement{Size: 1}}},
		},
		"null runtime fields are absent": {
			value: `[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"G","profile":"1g.5gb","placement":{"start":0,"size":1},"migUUID":"","gpuInstanceID":null,"computeInstanceID":null}]`,
			want:  []Allocation{{GPUUUID: "G", Profile: "1g.5gb", Placement: Placement{Size: 1}}},
		},
		"negative containerIndex": {
			value:   `[{"containerIndex":-1,"deviceIndex":0,"gpuUUID":"G","profile":"1g.5gb","placement":{"start":0,"size":1}}]`,
			wantErr: "MIG allocation 0 has negative containerIndex",
		},
		"negative deviceIndex": {
			value:   `[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"G","profile":"1g.5gb","placement":{"start":0,"size":1}},{"containerIndex":0,"deviceIndex":-2,"gpuUUID":"G","profile":"1g.5gb","placement":{"start":1,"size":1}}]`,
			wantErr: "MIG allocation 1 has negative deviceIndex",
		},
		"empty gpuUUID": {
			value:   `[{"containerIndex":0,"deviceIndex":0,"profile":"1g.5gb","placement":{"start":0,"size":1}}]`,
			wantErr: "MIG allocation 0 has empty gpuUUID",
		},
		"empty profile": {
			value:   `[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"G","profile":"","placement":{"start":0,"size":1}}]`,
			wantErr: "MIG allocation 0 has empty profile",
		},
		"placement size 0": {
			value:   `[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"G","profile":"1g.5gb","placement":{"start":3}}]`,
			wantErr: "MIG allocation 0 has placement size 0",
		},
		"partial runtime identity: migUUID only": {
			value:   `[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"G","profile":"1g.5gb","placement":{"start":6,"size":1},"migUUID":"MIG-x"}]`,
			wantErr: "MIG allocation 0 has partial runtime identity",
		},
		"partial runtime identity: ids only": {
			value:   `[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"G","profile":"1g.5gb","placement":{"start":6,"size":1},"gpuInstanceID":1,"computeInstanceID":0}]`,
			wantErr: "MIG allocation 0 has partial runtime identity",
		},
		"duplicate": {
			value:   `[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"G","profile":"1g.5gb","placement":{"start":6,"size":1}},{"containerIndex":0,"deviceIndex":0,"gpuUUID":"G","profile":"1g.5gb","placement":{"start":5,"size":1}}]`,
			wantErr: "MIG allocation 1 duplicates containerIndex 0 deviceIndex 0 of allocation 0",
		},
		"negative gpuInstanceID": {
			value:   `[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"G","profile":"1g.5gb","placement":{"start":6,"size":1},"migUUID":"M","gpuInstanceID":-1,"computeInstanceID":0}]`,
			wantErr: "MIG allocation 0: json: cannot unmarshal number -1 into Go struct field wireAllocation.gpuInstanceID",
		},
		"fractional index": {
			value:   `[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"G","profile":"1g.5gb","placement":{"start":6,"size":1}},{"containerIndex":0.5,"deviceIndex":0,"gpuUUID":"G","profile":"1g.5gb","placement":{"start":6,"size":1}}]`,
			wantErr: "MIG allocation 1: json: cannot unmarshal number 0.5 into Go struct field wireAllocation.containerIndex",
		},
		"element not an object": {value: `[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"G","profile":"1g.5gb","placement":{"start":6,"size":1}},7]`, wantErr: "MIG allocation 1: json: cannot unmarshal number"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got, err := DecodeAllocations(tt.value)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("DecodeAllocations: %v", err)
				}
				if diff := cmp.Diff(tt.want, got); diff != "" {
					t.Errorf("DecodeAllocations (-want +got):\n%s", diff)
				}
				return
			}
			if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("DecodeAllocations error = %v, want ErrMalformed containing %q", err, tt.wantErr)
			}
			if got != nil {
				t.Errorf("DecodeAllocations returned %v with the error", got)
			}
		})
	}
}

func TestEncodeAllocations(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		allocs []Allocation
		want   string
	}{
		"nil":   {},
		"empty": {allocs: []Allocation{}},
		"reservation": {
			allocs: []Allocation{{GPUUUID: testGPU, Profile: "2g.10gb", Placement: Placement{Start: 2, Size: 2}}},
			want:   `[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"` + testGPU + `","profile":"2g.10gb","placement":{"start":2,"size":2}}]`,
		},
		"realized with zero ids": {
			allocs: []Allocation{{GPUUUID: "G", Profile: "1g.5gb", Placement: Placement{Start: 6, Size: 1}, Runtime: &Runtime{MigUUID: "MIG-1"}}},
			want:   `[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"G","profile":"1g.5gb","placement":{"start":6,"size":1},"migUUID":"MIG-1","gpuInstanceID":0,"computeInstanceID":0}]`,
		},
		"html characters escaped as encoding/json does": {
			allocs: []Allocation{{ContainerIndex: 1, GPUUUID: "<&>", Profile: "1g.5gb+me", Placement: Placement{Size: 1}}},
			want:   `[{"containerIndex":1,"deviceIndex":0,"gpuUUID":"\u003c\u0026\u003e","profile":"1g.5gb+me","placement":{"start":0,"size":1}}]`,
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if got := EncodeAllocations(tt.allocs); got != tt.want {
				t.Errorf("EncodeAllocations = %s, want %s", got, tt.want)
			}
		})
	}
}

func TestFindAndWithRuntime(t *testing.T) {
	t.Parallel()
	allocs := []Allocation{
		{ContainerIndex: 1, DeviceIndex: 1, GPUUUID: "G", Profile: "1g.5gb", Placement: Placement{Start: 5, Size: 1}},
		{ContainerIndex: 0, DeviceIndex: 0, GPUUUID: "G", Profile: "1g.5gb", Placement: Placement{Start: 6, Size: 1}, Runtime: &Runtime{MigUUID: "MIG-0", GPUInstanceID: 1}},
		{ContainerIndex: 1, DeviceIndex: 0, GPUUUID: "G", Profile: "2g.10gb", Placement: Placement{Start: 0, Size: 2}},
	}
	got := Find(allocs, 1)
	if diff := cmp.Diff([]Allocation{allocs[2], allocs[0]}, got); diff != "" {
		t.Errorf("Find(1) (-want +got):\n%s", diff)
	}
	if got := Find(allocs, 5); got != nil {
		t.Errorf("Find(5) = %v, want nil", got)
	}
	if allocs[0].Realized() || !allocs[1].Realized() {
		t.Errorf("Realized = %v, %v, want false, true", allocs[0].Realized(), allocs[1].Realized())
	}

	r := Runtime{MigUUID: "MIG-2", GPUInstanceID: 3, ComputeInstanceID: 0}
	out, ok := WithRuntime(allocs, 1, 0, r)
	if !ok {
		t.Fatal("WithRuntime(1, 0) = false")
	}
	want := []Allocation{allocs[0], allocs[1], allocs[2]}
	want[2].Runtime = &r
	if diff := cmp.Diff(want, out); diff != "" {
		t.Errorf("WithRuntime (-want +got):\n%s", diff)
	}
	if allocs[2].Runtime != nil {
		t.Error("WithRuntime changed its input")
	}
	if out[1].Runtime == allocs[1].Runtime {
		t.Error("WithRuntime shares a Runtime with its input")
	}
	if same, ok := WithRuntime(allocs, 2, 0, r); ok || len(same) != len(allocs) {
		t.Errorf("WithRuntime(2, 0) = %v, %v, want the input and false", same, ok)
	}
}

func FuzzDecodeAllocations(f *testing.F) {
	for _, s := range []string{
		"", "null", "[]", "[{", "{}",
		`[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"G","profile":"2g.10gb","placement":{"start":2,"size":2}}]`,
		`[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"G","profile":"1g.5gb","placement":{"start":6,"size":1},"migUUID":"MIG-1","gpuInstanceID":1,"computeInstanceID":0}]`,
		`[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"G","profile":"1g.5gb","placement":{"start":6,"size":1},"migUUID":"MIG-x"}]`,
		`[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"G","profile":"1g.5gb","placement":{"start":6,"size":1}},{"containerIndex":0,"deviceIndex":0,"gpuUUID":"G","profile":"1g.5gb","placement":{"start":5,"size":1}}]`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, value string) {
		got, err := DecodeAllocations(value)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("DecodeAllocations(%q) error %v is not ErrMalformed", value, err)
			}
			return
		}
		enc := EncodeAllocations(got)
		again, err := DecodeAllocations(enc)
		if err != nil {
			t.Fatalf("DecodeAllocations(EncodeAllocations(%v)) = %v (encoded %s)", got, err, enc)
		}
		if diff := cmp.Diff(got, again); diff != "" {
			t.Fatalf("round trip of %q (-first +second):\n%s", value, diff)
		}
		if enc2 := EncodeAllocations(again); enc2 != enc {
			t.Fatalf("encoding not stable: %s then %s", enc, enc2)
		}
	})
}

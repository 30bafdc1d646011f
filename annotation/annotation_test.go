package annotation

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// maxDepth is the nesting limit of encoding/json, which HAMi's decoder inherits.
const maxDepth = 10000

func TestDecodeErrors(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		value   string
		kind    error
		offset  int
		element int
		field   string
		msg     string
	}{
		"empty":            {"", ErrMalformed, 0, -1, "", "unexpected end of JSON input"},
		"truncated":        {`[{"id":"a","devmem":10`, ErrMalformed, 22, -1, "", "unexpected end of JSON input"},
		"trailing comma":   {`[{"id":"a",},]`, ErrMalformed, 11, -1, "", "looking for beginning of object key string"},
		"trailing garbage": {`[]x`, ErrMalformed, 2, -1, "", "after top-level value"},
		"bom":              {"\ufeff[]", ErrMalformed, 0, -1, "", "looking for beginning of value"},
		"legacy":           {"GPU-1,10,1024,100,T4,0,true:", ErrMalformed, 0, -1, "", "invalid character 'G'"},
		"float":            {`[{"devmem":1.5}]`, ErrMalformed, 11, 0, "devmem", "not an int32"},
		"exponent":         {`[{"count":1e3}]`, ErrMalformed, 10, 0, "count", "not an int32"},
		"overflow":         {`[{},{"devcore":2147483648}]`, ErrMalformed, 15, 1, "devcore", "not an int32"},
		"negative index":   {`[{"index":-1}]`, ErrMalformed, 10, 0, "index", "unsigned"},
		"quoted number":    {`[{"count":"10"}]`, ErrMalformed, 10, 0, "count", "cannot decode string into int32"},
		"health string":    {`[{"health":"true"}]`, ErrMalformed, 11, 0, "health", "cannot decode string into bool"},
		"id number":        {`[{"id":42}]`, ErrMalformed, 7, 0, "id", "cannot decode number into string"},
		"object":           {`{"id":"a"}`, ErrMalformed, 0, -1, "", "cannot decode object into a device list"},
		"element string":   {`["GPU-a"]`, ErrMalformed, 1, 0, "", "cannot decode string into a device"},
		"custominfo array": {`[{"custominfo":[1]}]`, ErrMalformed, 15, 0, "custominfo", "custom info map"},
		"custominfo huge":  {`[{"custominfo":{"a":1e400}}]`, ErrMalformed, 20, 0, "custominfo", "float64"},
		"mig bad":          {`[{"migProfiles":[{"sliceCount":-1}]}]`, ErrMalformed, 31, 0, "migProfiles", "uint32"},
		"null element":     {`[{"id":"a"},null]`, ErrInvalidElement, 12, 1, "", "null element"},
		"syntax beats nil": {`[null,x]`, ErrMalformed, 6, -1, "", "looking for beginning of value"},
		"type beats nil":   {`[null,{"count":1.5}]`, ErrMalformed, 15, 1, "count", "int32"},
		"bad escape":       {`[{"id":"\x"}]`, ErrMalformed, 9, -1, "", "escape"},
		"control char":     {"[{\"id\":\"a\nb\"}]", ErrMalformed, 9, -1, "", "in string literal"},
		"deep":             {strings.Repeat("[", maxDepth+1), ErrMalformed, maxDepth, -1, "", "exceeded max depth"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			devs, err := Decode(tc.value)
			if devs != nil {
				t.Errorf("devices returned with an error: %v", devs)
			}
			if !errors.Is(err, tc.kind) {
				t.Fatalf("err = %v, want %v", err, tc.kind)
			}
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("err %T is not a *DecodeError", err)
			}
			if de.Offset != tc.offset || de.Element != tc.element || de.Field != tc.field || !strings.Contains(de.Msg, tc.msg) {
				t.Errorf("got offset %d element %d field %q msg %q; want %d %d %q ~%q", de.Offset, de.Element, de.Field, de.Msg, tc.offset, tc.element, tc.field, tc.msg)
			}
		})
	}
}

func TestDecodeAccepts(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		value string
		want  []Device
	}{
		"null":         {"null", nil},
		"empty":        {" [ ] ", []Device{}},
		"case and dup": {`[{"ID":"a","id":"b","HEALTH":true,"ſ":1}]`, []Device{{ID: "b", Health: true}}},
		// encoding/json folds the Kelvin sign to k, but not the dotless ı to i: "ınDex" is an
		// unknown key for HAMi (the hand-written decoder this codec replaced read it as index).
		"kelvin":         {"[{\"\u212aey\":1,\"ınDex\":3}]", []Device{{}}},
		"escapes":        {`[{"id":"\u003c\ud83d\ude00\ud800\/"}]`, []Device{{ID: "<😀\uFFFD/"}}},
		"invalid utf8":   {"[{\"type\":\"a\xffb\"}]", []Device{{Type: "a\uFFFDb"}}},
		"null fields":    {`[{"id":null,"count":null,"health":null,"migProfiles":null,"custominfo":null}]`, []Device{{}}},
		"minus zero":     {`[{"count":-0,"numa":-0}]`, []Device{{}}},
		"max index":      {`[{"index":18446744073709551615}]`, []Device{{Index: 1<<64 - 1}}},
		"unknown nested": {`[{"x":{"y":[1,2,{"z":true}]},"id":"a"}]`, []Device{{ID: "a"}}},
		"mig merge": {`[{"migProfiles":[{"name":"a","core":1},{"name":"b"}],"migProfiles":[{"name":"c"}]}]`,
			[]Device{{MIGProfiles: []MigProfile{{Name: "c", Core: 1}}}}},
		"mig empty":   {`[{"migProfiles":[]}]`, []Device{{MIGProfiles: []MigProfile{}}}},
		"pairscore":   {`[{"devicepairscore":"ignored by master"}]`, []Device{{}}},
		"migtemplate": {`[{"migtemplate":[[{"name":"1g","MEMORY":10,"count":7}],null]}]`, []Device{{}}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got, err := Decode(tc.value)
			if err != nil {
				t.Fatal(err)
			}
			if (got == nil) != (tc.want == nil) {
				t.Errorf("nil = %v, want %v", got == nil, tc.want == nil)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
	if _, err := DecodeShape(`[{"devicepairscore":"x"}]`, ShapeV290); !errors.Is(err, ErrMalformed) {
		t.Errorf("v2.9.0 shape accepts a string devicepairscore: %v", err)
	}
	if _, err := DecodeShape(`[{"migProfiles":"x"}]`, ShapeV290); err != nil {
		t.Errorf("v2.9.0 shape rejects migProfiles, which it does not know: %v", err)
	}
}

func TestCanonical(t *testing.T) {
	t.Parallel()
	in := []Device{{ID: "c", Index: 2}, {ID: "b", Index: 0}, {ID: "a", Index: 2}, {ID: "z", Index: 1}}
	got := Canonical(in)
	want := []Device{{ID: "b", Index: 0}, {ID: "z", Index: 1}, {ID: "a", Index: 2}, {ID: "c", Index: 2}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if in[0].ID != "c" {
		t.Error("Canonical modified its input")
	}
	if Canonical(nil) != nil {
		t.Error("Canonical(nil) != nil")
	}
	// Any permutation encodes to the same bytes once sorted.
	perm := []Device{in[3], in[2], in[1], in[0]}
	SortDevices(perm)
	if Encode(perm) != Encode(got) {
		t.Error("sorted permutations encode differently")
	}
}

func TestEncodeMIG(t *testing.T) {
	t.Parallel()
	d := []Device{{ID: "GPU-m", Mode: "mig", Health: true, MIGProfiles: []MigProfile{
		{Name: "1g.10gb", MemoryMB: 9728, Core: 14, SliceCount: 1, Placements: []MigPlacement{{Start: 0, Size: 1}, {Start: 1, Size: 1}}},
		{Name: "7g.80gb", MemoryMB: 80000, Core: 100, SliceCount: 7},
	}}}
	want := `[{"id":"GPU-m","mode":"mig","migProfiles":[{"name":"1g.10gb","memoryMB":9728,"core":14,"sliceCount":1,"placements":[{"start":0,"size":1},{"start":1,"size":1}]},{"name":"7g.80gb","memoryMB":80000,"core":100,"sliceCount":7,"placements":null}],"health":true}]`
	if got := Encode(d); got != want {
		t.Errorf("Encode =\n%s\nwant\n%s", got, want)
	}
	if got := hamiMarshal(d, ShapeMaster); got != want {
		t.Errorf("HAMi's encoder disagrees with the expectation:\n%s", got)
	}
	if got := EncodeShape(d, ShapeV290); strings.Contains(got, "migProfiles") {
		t.Errorf("v2.9.0 shape writes migProfiles: %s", got)
	}
	back, err := Decode(want)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(d, back); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
}

func TestVendors(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for _, v := range Vendors() {
		if seen[v.Name] {
			t.Errorf("duplicate vendor %q", v.Name)
		}
		seen[v.Name] = true
		if (v.Format == FormatJSON || v.Format == FormatLegacy) && v.RegisterKey == "" {
			t.Errorf("%s: decodable vendor without register key", v.Name)
		}
	}
	nv, ok := VendorByName("NVIDIA")
	if !ok || nv.HandshakeKey != "hami.io/node-handshake" || nv.RegisterKey != "hami.io/node-nvidia-register" || nv.ResourceName != "nvidia.com/gpu" {
		t.Errorf("NVIDIA = %+v", nv)
	}
	for name, want := range map[string][2]string{
		"DCU":         {"hami.io/node-dcu-register", "hami.io/node-handshake-dcu"},
		"XPU":         {"hami.io/node-register-xpu", "hami.io/node-handshake-xpu"},
		"Vastai":      {"hami.io/node-va-register", "hami.io/node-handshake-va"},
		"Ascend910B3": {"hami.io/node-register-Ascend910B3", "hami.io/node-handshake-Ascend910B3"},
		"BI-V150":     {"hami.io/node-BI-V150-register", "hami.io/node-handshake-BI-V150"},
		"biren":       {"hami.io/node-biren-register", "hami.io/node-handshake-biren"},
		"AMDGPU":      {"hami.io/node-amd-register", ""},
	} {
		v, ok := VendorByName(name)
		if !ok || v.RegisterKey != want[0] || v.HandshakeKey != want[1] {
			t.Errorf("%s = %+v, want keys %v", name, v, want)
		}
	}
	for name, want := range map[string][2]string{
		"NVIDIA":      {"hami.io/vgpu-devices-to-allocate", "hami.io/vgpu-devices-allocated"},
		"MLU":         {"hami.io/cambricon-mlu-devices-to-allocate", "hami.io/cambricon-mlu-devices-allocated"},
		"DCU":         {"hami.io/dcu-devices-to-allocate", "hami.io/dcu-devices-allocated"},
		"XPU":         {"hami.io/xpu-devices-to-allocate", "hami.io/xpu-devices-allocated"},
		"Ascend910B3": {"hami.io/Ascend910B3-devices-to-allocate", "hami.io/Ascend910B3-devices-allocated"},
		"BI-V150":     {"hami.io/BI-V150-devices-to-allocate", "hami.io/BI-V150-devices-allocated"},
		"kunlun":      {"", "hami.io/kunlun-allocated"},
	} {
		v, _ := VendorByName(name)
		if v.ToAllocateKey != want[0] || v.AllocatedKey != want[1] {
			t.Errorf("%s pod keys = %q, %q, want %v", name, v.ToAllocateKey, v.AllocatedKey, want)
		}
	}
	if _, ok := VendorByName("nope"); ok {
		t.Error("unknown vendor found")
	}
	if len(Vendors()) < 13 {
		t.Errorf("only %d vendors", len(Vendors()))
	}
}

func TestCheckVendors(t *testing.T) {
	t.Parallel()
	vastai, _ := VendorByName("Vastai")
	v := Check(vastai, map[string]string{vastai.RegisterKey: `[{"id":"va-1","devcore":7,"health":true}]`})
	if !v.Registers || v.Devices[0].Devcore != 100 {
		t.Errorf("Vastai devcore not forced to 100: %+v", v)
	}
	dcu, _ := VendorByName("DCU")
	v = Check(dcu, map[string]string{dcu.RegisterKey: `DCU-1,10,1024,100,Z100,0,true,0,hami-core:`})
	if !v.Registers || v.Devices[0].ID != "DCU-1" {
		t.Errorf("DCU legacy: %+v", v)
	}
	v = Check(dcu, map[string]string{dcu.RegisterKey: `[{"id":"DCU-1"}]`})
	if v.Registers || !errors.Is(v.Err, ErrMalformed) || v.HAMiLog != "failed to decode node devices" {
		t.Errorf("DCU with JSON: %+v", v)
	}
	v = Check(dcu, map[string]string{dcu.RegisterKey: `:`})
	if !errors.Is(v.Err, ErrNoDevices) {
		t.Errorf("DCU empty: %+v", v)
	}
	mlu, _ := VendorByName("MLU")
	if v := Check(mlu, nil); !errors.Is(v.Err, ErrUnsupported) {
		t.Errorf("MLU: %+v", v)
	}
	v = Check(NVIDIA(), map[string]string{KeyNVIDIARegister: `[{"id":"a","health":true}]`, KeyNVIDIAScore: `[{"uuid":"a","score":{"b":"high"}}]`})
	if v.Registers || !errors.Is(v.Err, ErrMalformed) || v.HAMiLog != "failed to decode pair scores" || !strings.Contains(v.Err.Error(), KeyNVIDIAScore) {
		t.Errorf("bad score annotation: %+v", v)
	}
	var de *DecodeError
	if v := Check(NVIDIA(), map[string]string{KeyNVIDIARegister: `[`}); !errors.As(v.Err, &de) || de.Key != KeyNVIDIARegister {
		t.Errorf("decode error does not name the key: %v", v.Err)
	}
}

func TestNodeDevices(t *testing.T) {
	t.Parallel()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1", Annotations: map[string]string{
		KeyNVIDIARegister: `[{"id":"GPU-a","count":10,"health":true}]`}}}
	devs, err := NodeDevices(node, NVIDIA())
	if err != nil || len(devs) != 1 || devs[0].ID != "GPU-a" {
		t.Errorf("NodeDevices = %v, %v", devs, err)
	}
	if _, err := NodeDevices(nil, NVIDIA()); !errors.Is(err, ErrAbsent) {
		t.Errorf("nil node: %v", err)
	}
}

func TestLegacy(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		value string
		want  []Device
		err   string
	}{
		"nine fields":  {"G1,10,1024,100,T4,1,true,3,mig:", []Device{{ID: "G1", Count: 10, Devmem: 1024, Devcore: 100, Type: "T4", Numa: 1, Health: true, Index: 3, Mode: "mig"}}, ""},
		"seven fields": {"G1,10,1024,100,T4,0,false:", []Device{{ID: "G1", Count: 10, Devmem: 1024, Devcore: 100, Type: "T4", Mode: "hami-core"}}, ""},
		"only colon":   {":", nil, ""},
		"no separator": {"G1,10", nil, "node annotation missing device separator"},
		"no comma":     {"abc:", nil, `malformed node annotation segment: "abc"`},
		"field count":  {"a,b,c:", nil, "unexpected field count 3 in node annotation"},
		"bad count":    {"G1,x,1024,100,T4,0,true:", nil, "invalid count field"},
		"bad memory":   {"G1,1,99999999999,100,T4,0,true:", nil, "invalid memory field"},
		"bad core":     {"G1,1,1,c,T4,0,true:", nil, "invalid core field"},
		"bad health":   {"G1,1,1,1,T4,0,yes:", nil, "invalid health field"},
		"bad numa":     {"G1,1,1,1,T4,n,true:", nil, "invalid numa field"},
		"bad index":    {"G1,1,1,1,T4,0,true,i,m:", nil, "invalid index field"},
		"negative idx": {"G1,1,1,1,T4,0,true,-2,m:", nil, "index field must not be negative: -2"},
		"one bad of 2": {"G1,1,1,1,T4,0,true:G2,1:", nil, "unexpected field count 2"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got, err := DecodeLegacy(tc.value)
			if tc.err != "" {
				if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want ErrMalformed with %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

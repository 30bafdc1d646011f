package annotation

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// decodeSeeds are starting points for the decoder fuzz targets besides the committed corpus.
var decodeSeeds = []string{
	`[{"id":"GPU-ebe7c3f7-303d-558d-435e-99a160631fe4","count":10,"devmem":7680,"devcore":100,"type":"NVIDIA-Tesla P4","mode":"hami-core","health":true,"devicepairscore":{}}]`,
	`[{"id":"GPU-a","index":1,"count":10,"devmem":81920,"devcore":100,"type":"NVIDIA A100","numa":1,"mode":"mig","migProfiles":[{"name":"1g.10gb","memoryMB":9728,"core":14,"sliceCount":1,"placements":[{"start":0,"size":1}]}],"health":true}]`,
	`[{"ID":"x","DevMem":1,"ſliceCount":2,"K":3,"custominfo":{"a":[1,2.5e3,{"b":null}]},"migtemplate":[[{"Name":"1g","memory":5}]],"devicevendor":"v"}]`,
	`[{"migProfiles":[{"name":"a","placements":[{"start":1}]},{"name":"b"}],"migProfiles":[{"core":1}]}]`,
	`[null]`, `null`, `[]`, ` [ ] `, `{}`, `[{}]`, `[{"id":"\u00e9\ud83d\ude00\ud800x\"\\\/\b\f\n\r\t"}]`,
	`[{"devmem":1e3}]`, `[{"index":-0}]`, `[{"numa":-0}]`, `[{"custominfo":{"x":1e400}}]`, "[{\"id\":\"\xff\"}]",
	`[{"devicepairscore":{"uuid":"a","score":{"b":1}}}]`, `[{"devicepairscore":"x"}]`, `GPU-1,10,1024,100,NVIDIA T4,0,true,0,hami-core:`,
}

// checkClassified fails unless err is nil or one of the package's sentinels through a
// *DecodeError.
func checkClassified(t *testing.T, err error) {
	t.Helper()
	if err == nil {
		return
	}
	var de *DecodeError
	if !errors.As(err, &de) {
		t.Fatalf("error %v (%T) is not a *DecodeError", err, err)
	}
	if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrInvalidElement) && !errors.Is(err, ErrNoDevices) && !errors.Is(err, ErrAbsent) {
		t.Fatalf("error %v is not classified", err)
	}
	if de.Error() == "" {
		t.Fatal("empty error text")
	}
}

// FuzzDecode checks, for any input, that the decoder never panics, classifies every error, agrees
// with encoding/json on HAMi's struct (both shapes) on accept/reject and values, and that what
// it accepts re-encodes byte-identically to HAMi's encoder and decodes back to the same devices.
// The second argument exercises Check's topology-score path.
func FuzzDecode(f *testing.F) {
	for _, s := range decodeSeeds {
		f.Add(s, `[{"uuid":"a","score":{"b":1}}]`)
	}
	f.Fuzz(func(t *testing.T, value, score string) {
		for _, shape := range []Shape{ShapeMaster, ShapeV290} {
			got, err := DecodeShape(value, shape)
			checkClassified(t, err)
			want, hasNil, herr := hamiUnmarshal(value, shape)
			switch {
			case herr != nil:
				if !errors.Is(err, ErrMalformed) {
					t.Fatalf("%v: encoding/json rejects (%v), Decode = %v, %v", shape, herr, got, err)
				}
				continue
			case hasNil:
				if !errors.Is(err, ErrInvalidElement) {
					t.Fatalf("%v: null element, Decode err = %v", shape, err)
				}
				continue
			case err != nil:
				t.Fatalf("%v: encoding/json accepts, Decode = %v", shape, err)
			}
			if (got == nil) != (want == nil) {
				t.Fatalf("%v: Decode nil = %v, encoding/json nil = %v", shape, got == nil, want == nil)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Fatalf("%v: Decode differs from encoding/json (-json +ours):\n%s", shape, diff)
			}
			enc := EncodeShape(got, shape)
			if ref := hamiMarshal(got, shape); enc != ref {
				t.Fatalf("%v: Encode differs from HAMi's encoder:\n ours %s\nhami %s", shape, enc, ref)
			}
			back, err := DecodeShape(enc, shape)
			if err != nil {
				t.Fatalf("%v: decode own encoding %s: %v", shape, enc, err)
			}
			if diff := cmp.Diff(got, back, cmpopts.EquateEmpty()); diff != "" {
				t.Fatalf("%v: round trip (-first +second):\n%s", shape, diff)
			}
		}
		v := Check(NVIDIA(), map[string]string{KeyNVIDIARegister: value, KeyNVIDIAScore: score})
		checkClassified(t, v.Err)
		if v.Registers == (v.Err != nil) {
			t.Fatalf("verdict %+v: Registers and Err disagree", v)
		}
		// The legacy decoder and the other vendors' paths must not panic either.
		if _, err := DecodeLegacy(value); err != nil && !errors.Is(err, ErrMalformed) {
			t.Fatalf("DecodeLegacy error not classified: %v", err)
		}
	})
}

// FuzzRoundTrip builds devices from arbitrary field values: the encoding must equal HAMi's
// encoder's byte for byte in both shapes, and decode back to the same devices.
func FuzzRoundTrip(f *testing.F) {
	f.Add("GPU-ebe7c3f7-303d-558d-435e-99a160631fe4", uint64(0), int32(10), int32(7680), int32(100), "NVIDIA-Tesla P4", int64(0), "hami-core", true, "1g.10gb", uint32(3))
	f.Add("<&>\u2028\u2029\x00\x7f\xff", uint64(1<<63), int32(-1), int32(-1<<31), int32(1<<31-1), "\"\\", int64(-1), "", false, "", uint32(0))
	f.Fuzz(func(t *testing.T, id string, index uint64, count, devmem, devcore int32, typ string, numa int64, mode string, health bool, profile string, slices uint32) {
		dev := Device{ID: id, Index: uint(index), Count: count, Devmem: devmem, Devcore: devcore, Type: typ,
			Numa: int(numa), Mode: mode, Health: health}
		if profile != "" {
			dev.MIGProfiles = []MigProfile{{Name: profile, MemoryMB: devmem, Core: devcore, SliceCount: slices,
				Placements: []MigPlacement{{Start: slices, Size: 1}}}, {Name: id}}
		}
		devs := []Device{dev, {ID: typ, Index: uint(index) + 1}}
		for _, shape := range []Shape{ShapeMaster, ShapeV290} {
			enc := EncodeShape(devs, shape)
			if ref := hamiMarshal(devs, shape); enc != ref {
				t.Fatalf("%v: Encode differs from HAMi's encoder:\n ours %s\nhami %s", shape, enc, ref)
			}
			got, err := DecodeShape(enc, shape)
			if err != nil {
				t.Fatalf("%v: decode %s: %v", shape, enc, err)
			}
			want, _, herr := hamiUnmarshal(enc, shape)
			if herr != nil {
				t.Fatalf("%v: encoding/json cannot read our encoding %s: %v", shape, enc, herr)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Fatalf("%v: decode differs from encoding/json (-json +ours):\n%s", shape, diff)
			}
			if !strings.HasPrefix(enc, "[") || !strings.HasSuffix(enc, "]") {
				t.Fatalf("not a JSON list: %s", enc)
			}
		}
	})
}

// FuzzDecodeLegacy checks the legacy decoder never panics, classifies errors, and that what it
// accepts re-encodes to a value that decodes to the same devices.
func FuzzDecodeLegacy(f *testing.F) {
	f.Add("GPU-1,10,1024,100,NVIDIA T4,0,true,1,hami-core:GPU-2,10,1024,100,NVIDIA T4,1,false:")
	f.Add(":")
	f.Add("a,b:")
	f.Add("GPU-1,10,1024,100,T4,0,true,-1,mig:")
	f.Fuzz(func(t *testing.T, value string) {
		got, err := DecodeLegacy(value)
		checkClassified(t, err)
		if err != nil {
			if got != nil {
				t.Fatalf("devices %v returned with error %v", got, err)
			}
			return
		}
		if len(got) == 0 {
			return
		}
		back, err := DecodeLegacy(EncodeLegacy(got))
		if err != nil {
			t.Fatalf("decode own encoding %q: %v", EncodeLegacy(got), err)
		}
		if diff := cmp.Diff(got, back); diff != "" {
			t.Fatalf("round trip (-first +second):\n%s", diff)
		}
	})
}

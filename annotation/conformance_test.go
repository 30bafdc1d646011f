package annotation

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/hamireg/hamireg/internal/vectors"
)

// vectorDevice is a device as the vector files spell it (every field explicit).
type vectorDevice struct {
	ID          string           `json:"id"`
	Index       uint             `json:"index"`
	Count       int32            `json:"count"`
	Devmem      int32            `json:"devmem"`
	Devcore     int32            `json:"devcore"`
	Type        string           `json:"type"`
	Numa        int              `json:"numa"`
	Mode        string           `json:"mode"`
	Health      bool             `json:"health"`
	MIGProfiles []hamiMigProfile `json:"migProfiles"`
}

func (v *vectorDevice) device() Device {
	return Device{ID: v.ID, Index: v.Index, Count: v.Count, Devmem: v.Devmem, Devcore: v.Devcore,
		Type: v.Type, Numa: v.Numa, Mode: v.Mode, Health: v.Health, MIGProfiles: fromHAMiProfiles(v.MIGProfiles)}
}

// vectorList is a device list; Null marks JSON null, NilElem a null element.
type vectorList struct {
	Null    bool
	NilElem bool
	Devices []Device
}

func (l *vectorList) UnmarshalJSON(b []byte) error {
	var raw []*vectorDevice
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	if raw == nil {
		l.Null = true
		return nil
	}
	l.Devices = []Device{}
	for _, d := range raw {
		if d == nil {
			l.NilElem = true
			l.Devices = append(l.Devices, Device{})
			continue
		}
		l.Devices = append(l.Devices, d.device())
	}
	return nil
}

type encodeFile struct {
	Vectors []struct {
		Name             string         `json:"name"`
		Input            []vectorDevice `json:"input"`
		InputNull        bool           `json:"-"`
		WantOutput       string         `json:"want_output"`
		LegacyOutput     string         `json:"legacy_encode_output"`
		RoundtripDecoded vectorList     `json:"roundtrip_decoded"`
	} `json:"vectors"`
}

func TestConformanceEncode(t *testing.T) {
	t.Parallel()
	for _, folder := range vectors.Folders(t) {
		dir, shape := folder.Dir, vectors.Pick(folder, ShapeMaster, ShapeV290)
		var f encodeFile
		if !folder.Read(t, "encode.json", &f) {
			continue
		}
		n := 0
		for _, v := range f.Vectors {
			var devs []Device
			for _, d := range v.Input {
				devs = append(devs, d.device())
			}
			if got := EncodeShape(devs, shape); got != v.WantOutput {
				t.Errorf("%s %s: EncodeShape(%v)\n got %s\nwant %s", filepath.Base(dir), v.Name, shape, got, v.WantOutput)
			}
			if got := EncodeLegacy(devs); got != v.LegacyOutput {
				t.Errorf("%s %s: EncodeLegacy\n got %q\nwant %q", filepath.Base(dir), v.Name, got, v.LegacyOutput)
			}
			got, err := DecodeShape(v.WantOutput, shape)
			if err != nil {
				t.Errorf("%s %s: decode own output: %v", filepath.Base(dir), v.Name, err)
			} else if diff := cmp.Diff(v.RoundtripDecoded.Devices, got, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("%s %s: round trip (-want +got):\n%s", filepath.Base(dir), v.Name, diff)
			}
			n++
		}
		t.Logf("checked %d vectors from %s (encode.json, shape %v)", n, dir, shape)
	}
}

type decodeFile struct {
	Vectors []struct {
		Name            string     `json:"name"`
		Input           *string    `json:"input"`
		ScoreAnnotation *string    `json:"score_annotation"`
		WantOutput      vectorList `json:"want_output"`
		WantError       string     `json:"want_error"`
		Scheduler       struct {
			WantOutput vectorList `json:"want_output"`
			WantError  string     `json:"want_error"`
			Panic      string     `json:"panic"`
		} `json:"scheduler_get_node_devices"`
		Legacy struct {
			WantOutput vectorList `json:"want_output"`
			WantError  string     `json:"want_error"`
		} `json:"legacy_decoder"`
	} `json:"vectors"`
}

func TestConformanceDecode(t *testing.T) {
	t.Parallel()
	for _, folder := range vectors.Folders(t) {
		dir, shape := folder.Dir, vectors.Pick(folder, ShapeMaster, ShapeV290)
		var f decodeFile
		if !folder.Read(t, "decode.json", &f) {
			continue
		}
		base := filepath.Base(dir)
		n := 0
		for _, v := range f.Vectors {
			n++
			annotations := map[string]string{}
			if v.Input != nil {
				annotations[KeyNVIDIARegister] = *v.Input
			}
			if v.ScoreAnnotation != nil {
				annotations[KeyNVIDIAScore] = *v.ScoreAnnotation
			}

			// 1. The raw decoder (UnMarshalNodeDevices).
			if v.Input != nil {
				got, err := DecodeShape(*v.Input, shape)
				switch {
				case v.WantError != "":
					if !errors.Is(err, ErrMalformed) {
						t.Errorf("%s %s: Decode error = %v, want ErrMalformed (HAMi: %s)", base, v.Name, err, v.WantError)
					}
				case v.WantOutput.NilElem:
					// Deliberate difference: HAMi accepts a null element and its scheduler then
					// crashes on it; this package classifies it instead.
					if !errors.Is(err, ErrInvalidElement) {
						t.Errorf("%s %s: Decode error = %v, want ErrInvalidElement", base, v.Name, err)
					}
				default:
					if err != nil {
						t.Errorf("%s %s: Decode: %v", base, v.Name, err)
						break
					}
					if (got == nil) != v.WantOutput.Null {
						t.Errorf("%s %s: Decode nil = %v, HAMi nil = %v", base, v.Name, got == nil, v.WantOutput.Null)
					}
					if diff := cmp.Diff(v.WantOutput.Devices, got, cmpopts.EquateEmpty()); diff != "" {
						t.Errorf("%s %s: Decode (-want +got):\n%s", base, v.Name, diff)
					}
				}
			}

			// 2. What the scheduler concludes (GetNodeDevices): whether the node registers.
			verdict := Check(NVIDIA(), annotations)
			s := v.Scheduler
			switch {
			case s.Panic != "":
				if !verdict.HAMiCrashes || !errors.Is(verdict.Err, ErrInvalidElement) || verdict.Registers {
					t.Errorf("%s %s: HAMi panics (%s); verdict = %+v, want a classified ErrInvalidElement", base, v.Name, s.Panic, verdict)
				}
			case s.WantError != "":
				want := ErrMalformed
				switch {
				case strings.HasPrefix(s.WantError, "annos not found"):
					want = ErrAbsent
				case s.WantError == "no gpu found on node":
					want = ErrNoDevices
				}
				if verdict.Registers || !errors.Is(verdict.Err, want) {
					t.Errorf("%s %s: verdict = %+v, want not registered with %v (HAMi: %s)", base, v.Name, verdict, want, s.WantError)
				}
				if verdict.HAMiLog == "" {
					t.Errorf("%s %s: verdict has no HAMi log message", base, v.Name)
				}
			default:
				if !verdict.Registers || verdict.Err != nil {
					t.Errorf("%s %s: verdict = %+v, want registered", base, v.Name, verdict)
				} else if diff := cmp.Diff(s.WantOutput.Devices, verdict.Devices, cmpopts.EquateEmpty()); diff != "" {
					t.Errorf("%s %s: verdict devices (-want +got):\n%s", base, v.Name, diff)
				}
			}

			// 3. The legacy decoder: this package follows master's strict rules.
			if v.Input == nil || shape == ShapeV290 {
				continue
			}
			lgot, lerr := DecodeLegacy(*v.Input)
			switch {
			case v.Legacy.WantError != "":
				if !errors.Is(lerr, ErrMalformed) {
					t.Errorf("%s %s: DecodeLegacy error = %v, want ErrMalformed (HAMi: %s)", base, v.Name, lerr, v.Legacy.WantError)
				} else if !strings.Contains(lerr.Error(), v.Legacy.WantError) {
					t.Errorf("%s %s: DecodeLegacy error = %q, want it to contain HAMi's %q", base, v.Name, lerr, v.Legacy.WantError)
				}
			default:
				if lerr != nil {
					t.Errorf("%s %s: DecodeLegacy: %v", base, v.Name, lerr)
				} else if diff := cmp.Diff(v.Legacy.WantOutput.Devices, lgot, cmpopts.EquateEmpty()); diff != "" {
					t.Errorf("%s %s: DecodeLegacy (-want +got):\n%s", base, v.Name, diff)
				}
			}
		}
		t.Logf("checked %d vectors from %s (decode.json, shape %v)", n, dir, shape)
	}
}

// TestConformanceDecodeV290Legacy checks the v2.9.0 legacy vectors where v2.9.0's lenient
// parser and master's strict one agree on accepting; where v2.9.0 accepted garbage (a JSON
// value parsed as zero devices) this package follows master and rejects.
func TestConformanceDecodeV290Legacy(t *testing.T) {
	t.Parallel()
	for _, folder := range vectors.Folders(t) {
		dir, shape := folder.Dir, vectors.Pick(folder, ShapeMaster, ShapeV290)
		if shape != ShapeV290 {
			continue
		}
		var f decodeFile
		if !folder.Read(t, "decode.json", &f) {
			continue
		}
		n := 0
		for _, v := range f.Vectors {
			if v.Input == nil || v.Legacy.WantError != "" || len(v.Legacy.WantOutput.Devices) == 0 {
				continue
			}
			got, err := DecodeLegacy(*v.Input)
			if err != nil {
				t.Errorf("%s: DecodeLegacy: %v", v.Name, err)
			} else if diff := cmp.Diff(v.Legacy.WantOutput.Devices, got, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("%s: DecodeLegacy (-want +got):\n%s", v.Name, diff)
			}
			n++
		}
		t.Logf("checked %d vectors from %s (decode.json legacy, accepted by v2.9.0)", n, dir)
	}
}

package mig

import (
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/hamireg/hamireg/internal/vectors"
)

// partialRuntime reports whether some element of the raw reservation carries one or two of
// HAMi's three runtime fields (migUUID non-empty, gpuInstanceID, computeInstanceID non-null):
// HAMi's rule "the runtime identity is all or none", checked on the raw JSON independently of
// the decoder.
func partialRuntime(t *testing.T, value string) bool {
	t.Helper()
	var elems []map[string]any
	if err := json.Unmarshal([]byte(value), &elems); err != nil {
		return false
	}
	for _, e := range elems {
		n := 0
		if s, _ := e["migUUID"].(string); s != "" {
			n++
		}
		for _, k := range []string{"gpuInstanceID", "computeInstanceID"} {
			if e[k] != nil {
				n++
			}
		}
		if n == 1 || n == 2 {
			return true
		}
	}
	return false
}

// TestConformanceAllocations decodes every hami.io/vgpu-mig-allocations value HAMi master's
// scheduler and device plugin wrote or read in the vectors: it decodes, and encodes back to
// the same bytes, unless it breaks HAMi's all-or-none runtime rule, which HAMi rejects with
// "MIG allocation <i> has partial runtime identity" and so must DecodeAllocations.
func TestConformanceAllocations(t *testing.T) {
	t.Parallel()
	for _, folder := range vectors.Folders(t) {
		n, values, rejected := 0, 0, 0
		for _, file := range []string{"mig-fit.json", "mig-allocate.json"} {
			var doc struct {
				Vectors        []any `json:"vectors"`
				StartupVectors []any `json:"startup_vectors"`
			}
			if !folder.Read(t, file, &doc) {
				continue
			}
			found := map[string]string{}
			for i, v := range append(doc.Vectors, doc.StartupVectors...) {
				before := len(found)
				stringsOf(v, KeyAllocations, file+"/"+strconv.Itoa(i), found)
				if len(found) > before {
					n++
				}
			}
			for path, value := range found {
				values++
				got, err := DecodeAllocations(value)
				if partialRuntime(t, value) {
					rejected++
					if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "has partial runtime identity") {
						t.Errorf("%s %s: DecodeAllocations(%s) error = %v, want HAMi's partial runtime identity rejection", folder.Name(), path, value, err)
					}
					continue
				}
				if err != nil {
					t.Errorf("%s %s: DecodeAllocations(%s): %v", folder.Name(), path, value, err)
					continue
				}
				if enc := EncodeAllocations(got); enc != value {
					t.Errorf("%s %s: EncodeAllocations(DecodeAllocations(v)) =\n%s\nwant\n%s", folder.Name(), path, enc, value)
				}
			}
		}
		if n == 0 && !folder.V290 {
			t.Errorf("%s: no %s value in mig-fit.json or mig-allocate.json", folder.Dir, KeyAllocations)
		}
		t.Logf("checked %d vectors from %s (mig-fit.json, mig-allocate.json: %d %s values, %d rejected by the partial runtime identity rule)",
			n, folder.Dir, values, KeyAllocations, rejected)
	}
}

// registerVector is the part of a mig-register.json vector the allowlist checks read.
type registerVector struct {
	Name  string `json:"name"`
	Input struct {
		Config struct {
			Allowlist Allowlist `json:"mig_profile_allowlist"`
		} `json:"config"`
		NVML struct {
			Devices []struct {
				UUID  string `json:"uuid"`
				Model string `json:"model"`
			} `json:"devices"`
			Models map[string]struct {
				Name string `json:"name"`
				// Profiles is a list for a MIG-capable model, a sentence for another.
				Profiles json.RawMessage `json:"gpu_instance_profiles"`
			} `json:"models"`
		} `json:"nvml"`
	} `json:"input"`
	WantAnnotation string `json:"want_annotation"`
}

// TestConformanceAllowlist checks HAMi master's allowlists of mig-register.json: each
// validates; for each GPU, Match with MatchSubstring picks the entry HAMi picked (the profile
// names the node published are that entry's profiles, and a MIG-capable GPU no entry matches
// is missing from the annotation). Where MatchWord picks another entry, that is by its rule:
// every model of the substring entry that the name contains occurs inside a longer word.
func TestConformanceAllowlist(t *testing.T) {
	t.Parallel()
	for _, folder := range vectors.Folders(t) {
		if folder.V290 {
			t.Logf("%s: v2.9.0 has no migProfileAllowlist, skipped", folder.Dir)
			continue
		}
		var file struct {
			Vectors []registerVector `json:"vectors"`
		}
		if !folder.Read(t, "mig-register.json", &file) {
			continue
		}
		n := 0
		for _, v := range file.Vectors {
			n++
			if err := v.Input.Config.Allowlist.Validate(); err != nil {
				t.Errorf("%s: Validate: %v", v.Name, err)
			}
			var published []struct {
				ID          string `json:"id"`
				MIGProfiles []struct {
					Name string `json:"name"`
				} `json:"migProfiles"`
			}
			if err := json.Unmarshal([]byte(v.WantAnnotation), &published); err != nil {
				t.Fatalf("%s: want_annotation: %v", v.Name, err)
			}
			for _, d := range v.Input.NVML.Devices {
				model := v.Input.NVML.Models[d.Model]
				profiles, entry, _ := v.Input.Config.Allowlist.Match(model.Name, MatchSubstring)
				i := slices.IndexFunc(published, func(p struct {
					ID          string `json:"id"`
					MIGProfiles []struct {
						Name string `json:"name"`
					} `json:"migProfiles"`
				}) bool {
					return p.ID == d.UUID
				})
				switch {
				case entry < 0 || !strings.HasPrefix(string(model.Profiles), "["):
					if i >= 0 {
						t.Errorf("%s: %s (%q) published, but no entry matches (entry %d) or it is not MIG-capable", v.Name, d.UUID, model.Name, entry)
					}
				case i < 0:
					t.Errorf("%s: %s (%q) missing from the annotation, entry %d matches", v.Name, d.UUID, model.Name, entry)
				default:
					var names []string
					for _, p := range published[i].MIGProfiles {
						names = append(names, p.Name)
					}
					if diff := cmp.Diff(profiles, names); diff != "" {
						t.Errorf("%s: %s (%q) entry %d: published profile names (-match +published):\n%s", v.Name, d.UUID, model.Name, entry, diff)
					}
				}
				_, word, _ := v.Input.Config.Allowlist.Match(model.Name, MatchWord)
				if word == entry {
					continue
				}
				for _, m := range v.Input.Config.Allowlist[entry].Models {
					if m != "" && containsWord(model.Name, m) {
						t.Errorf("%s: %q: MatchWord picks entry %d, but model %q of entry %d occurs as a word", v.Name, model.Name, word, m, entry)
					}
				}
				t.Logf("%s: %q: MatchWord picks entry %d where HAMi's substring match picks %d (a model inside a longer word)", v.Name, model.Name, word, entry)
			}
		}
		t.Logf("checked %d vectors from %s (mig-register.json allowlists)", n, folder.Dir)
	}
}

// deviceKeys are the pod annotations in which HAMi v2.9.0 lists a pod's devices, a MIG device
// with its "[t-p]" suffix.
var deviceKeys = []string{"hami.io/vgpu-devices-allocated", "hami.io/vgpu-devices-to-allocate"}

// TestConformanceLegacyUUID parses the device UUID of every device entry in the pod
// annotations of HAMi v2.9.0's mig-fit.json and mig-allocate.json: each parses, the suffixed
// ones format back to the same text, and the template and position are within the bound.
func TestConformanceLegacyUUID(t *testing.T) {
	t.Parallel()
	for _, folder := range vectors.Folders(t) {
		n, uuids, suffixed := 0, 0, 0
		for _, file := range []string{"mig-fit.json", "mig-allocate.json"} {
			var doc struct {
				Vectors []any `json:"vectors"`
			}
			if !folder.Read(t, file, &doc) {
				continue
			}
			for i, v := range doc.Vectors {
				found := map[string]string{}
				for _, key := range deviceKeys {
					stringsOf(v, key, file+"/"+strconv.Itoa(i), found)
				}
				if len(found) > 0 {
					n++
				}
				for path, value := range found {
					for _, c := range strings.Split(value, ";") {
						for _, d := range strings.Split(c, ":") {
							uuid, _, _ := strings.Cut(d, ",")
							if uuid == "" {
								continue
							}
							uuids++
							gpu, tmpl, pos, ok, err := ParseLegacyUUID(uuid)
							if err != nil {
								t.Errorf("%s %s: ParseLegacyUUID(%q): %v", folder.Name(), path, uuid, err)
								continue
							}
							if !ok {
								continue
							}
							suffixed++
							if !folder.V290 {
								t.Errorf("%s %s: master wrote a suffixed UUID %q", folder.Name(), path, uuid)
							}
							if got := FormatLegacyUUID(gpu, tmpl, pos); got != uuid {
								t.Errorf("%s %s: FormatLegacyUUID(ParseLegacyUUID(%q)) = %q", folder.Name(), path, uuid, got)
							}
						}
					}
				}
			}
		}
		t.Logf("checked %d vectors from %s (mig-fit.json, mig-allocate.json: %d device UUIDs, %d with a [t-p] suffix)", n, folder.Dir, uuids, suffixed)
	}
}

// stringsOf collects every string value of key anywhere in v (a decoded vector: existing
// pods, patches, pod annotations after each call), by JSON path.
func stringsOf(v any, key, path string, out map[string]string) {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			if s, ok := e.(string); ok && k == key {
				out[path+"/"+k] = s
				continue
			}
			stringsOf(e, key, path+"/"+k, out)
		}
	case []any:
		for i, e := range v {
			stringsOf(e, key, path+"/"+strconv.Itoa(i), out)
		}
	}
}

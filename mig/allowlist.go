package mig

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"
)

// AllowedProfiles is one migProfileAllowlist entry: the MIG profiles a node publishes for a GPU
// whose NVML name matches one of Models.
type AllowedProfiles struct {
	Models   []string `json:"models"`
	Profiles []string `json:"profiles"`
}

// Allowlist is HAMi master's nvidia.migProfileAllowlist, in order: the first matching entry
// gives a GPU's profiles. It is policy only: memory, cores and placements come from NVML.
type Allowlist []AllowedProfiles

// ParseAllowlist reads an allowlist as it appears in HAMi's device ConfigMap, YAML or JSON:
// either the list under nvidia.migProfileAllowlist, or a whole device-config document
// ({nvidia: {migProfileAllowlist: [...]}}), or the nvidia section alone
// ({migProfileAllowlist: [...]}). It validates the result ([Allowlist.Validate]). An empty
// document, or a document without migProfileAllowlist, gives an empty allowlist. Every error
// wraps [ErrInvalidAllowlist].
func ParseAllowlist(data []byte) (Allowlist, error) {
	j, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidAllowlist, err)
	}
	j = bytes.TrimSpace(j)
	var l Allowlist
	switch {
	case len(j) == 0 || bytes.Equal(j, []byte("null")):
		return nil, nil
	case j[0] == '{':
		var doc struct {
			Nvidia *struct {
				MigProfileAllowlist Allowlist `json:"migProfileAllowlist"`
			} `json:"nvidia"`
			MigProfileAllowlist Allowlist `json:"migProfileAllowlist"`
		}
		if err := json.Unmarshal(j, &doc); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidAllowlist, err)
		}
		l = doc.MigProfileAllowlist
		if doc.Nvidia != nil && doc.Nvidia.MigProfileAllowlist != nil {
			l = doc.Nvidia.MigProfileAllowlist
		}
	default:
		if err := json.Unmarshal(j, &l); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidAllowlist, err)
		}
	}
	if err := l.Validate(); err != nil {
		return nil, err
	}
	return l, nil
}

// Validate applies the rules of HAMi's config loader (which the scheduler and the device
// plugin both run): every entry has at least one model and one profile, and every profile is
// "<N>g.<anything>" (split at the first '.', the part before it at least two characters long
// and ending in 'g'). The error wraps [ErrInvalidAllowlist] and names the entry and the
// value. Validate does not check that N is a number (HAMi does not); [SliceCount] does.
func (l Allowlist) Validate() error {
	for i, e := range l {
		if len(e.Models) == 0 {
			return fmt.Errorf("%w: entry %d has no models", ErrInvalidAllowlist, i)
		}
		if len(e.Profiles) == 0 {
			return fmt.Errorf("%w: entry %d has no profiles", ErrInvalidAllowlist, i)
		}
		for _, p := range e.Profiles {
			if _, ok := sliceKey(p); !ok {
				return fmt.Errorf("%w: entry %d: profile %q is not <N>g.<name>", ErrInvalidAllowlist, i, p)
			}
		}
	}
	return nil
}

// sliceKey returns the text before the first '.' of profile, and whether it passes HAMi's
// rule (at least two characters, ending in 'g').
func sliceKey(profile string) (string, bool) {
	key, _, found := strings.Cut(profile, ".")
	return key, found && len(key) >= 2 && key[len(key)-1] == 'g'
}

// SliceKey returns the slice-count prefix of a profile name ("1g.10gb+me" -> "1g"), the key
// HAMi maps to NVML's base GPU-instance profile. The error wraps [ErrMalformed] when profile
// is not "<N>g.<anything>" as [Allowlist.Validate] checks it.
func SliceKey(profile string) (string, error) {
	key, ok := sliceKey(profile)
	if !ok {
		return "", fmt.Errorf("%w: MIG profile %q is not <N>g.<name>", ErrMalformed, profile)
	}
	return key, nil
}

// maxSliceCount bounds [SliceCount]: no MIG GPU has more than 8 memory slices; the bound only
// keeps the number small and far from overflow.
const maxSliceCount = 1 << 10

// SliceCount returns the number of slices a profile name says ("3g.20gb" -> 3). The error
// wraps [ErrMalformed] when profile is not "<N>g.<anything>" with N a decimal number from 1
// to 1024.
func SliceCount(profile string) (int, error) {
	key, err := SliceKey(profile)
	if err != nil {
		return 0, err
	}
	digits := key[:len(key)-1]
	if strings.TrimLeft(digits, "0123456789") != "" {
		return 0, fmt.Errorf("%w: MIG profile %q: slice count %q is not a number", ErrMalformed, profile, digits)
	}
	n, err := strconv.Atoi(digits)
	if err != nil || n < 1 || n > maxSliceCount {
		return 0, fmt.Errorf("%w: MIG profile %q: slice count %q out of range 1-%d", ErrMalformed, profile, digits, maxSliceCount)
	}
	return n, nil
}

// MatchRule says how an allowlist model is compared with a GPU's NVML name.
type MatchRule int

const (
	// MatchWord is the SDK's default: a model matches when it occurs in the NVML name at word
	// boundaries: the byte before the occurrence (if any) and the byte after it (if any) are
	// not ASCII letters or digits. So "A100-SXM4-40GB" matches "NVIDIA A100-SXM4-40GB" and
	// "Mock NVIDIA A100-SXM4-40GB", "A30" matches "NVIDIA A30-PCIE-24GB", but "H20" does not
	// match "NVIDIA H200" and "H200" does not match "NVIDIA GH200". Case matters, as in HAMi.
	MatchWord MatchRule = iota
	// MatchSubstring is HAMi's rule (strings.Contains): a model matches when the NVML name
	// contains it anywhere, so "H20" matches "NVIDIA H200".
	MatchSubstring
)

// String returns the rule's name.
func (r MatchRule) String() string {
	switch r {
	case MatchWord:
		return "word"
	case MatchSubstring:
		return "substring"
	default:
		return "MatchRule(" + strconv.Itoa(int(r)) + ")"
	}
}

// MarshalText writes the rule's name ("word" or "substring"), so that a rule can be a flag
// (flag.TextVar) or a configuration field.
func (r MatchRule) MarshalText() ([]byte, error) {
	switch r {
	case MatchWord, MatchSubstring:
		return []byte(r.String()), nil
	}
	return nil, fmt.Errorf("%w: unknown match rule %d", ErrInvalidAllowlist, int(r))
}

// UnmarshalText reads "word" or "substring"; anything else is an error that errors.Is
// [ErrInvalidAllowlist] and names both.
func (r *MatchRule) UnmarshalText(text []byte) error {
	switch string(text) {
	case "word":
		*r = MatchWord
	case "substring":
		*r = MatchSubstring
	default:
		return fmt.Errorf("%w: match rule %q is neither word nor substring", ErrInvalidAllowlist, text)
	}
	return nil
}

// Match returns the profiles of the first entry with a model that matches the NVML name under
// rule, that entry's index (-1 and nil profiles when none matches), and the indexes of the
// later entries that match too: more than one match means the allowlist is ambiguous for that
// GPU (HAMi silently takes the first), worth a warning. An unknown rule matches nothing.
func (l Allowlist) Match(name string, rule MatchRule) (profiles []string, entry int, others []int) {
	entry = -1
	for i, e := range l {
		if !e.matches(name, rule) {
			continue
		}
		if entry < 0 {
			entry, profiles = i, e.Profiles
			continue
		}
		others = append(others, i)
	}
	return profiles, entry, others
}

// matches reports whether one of e's models matches name under rule.
func (e AllowedProfiles) matches(name string, rule MatchRule) bool {
	for _, m := range e.Models {
		if m == "" {
			continue
		}
		switch rule {
		case MatchWord:
			if containsWord(name, m) {
				return true
			}
		case MatchSubstring:
			if strings.Contains(name, m) {
				return true
			}
		}
	}
	return false
}

// containsWord reports whether model occurs in name with no ASCII letter or digit right
// before or right after the occurrence.
func containsWord(name, model string) bool {
	for off := 0; off+len(model) <= len(name); {
		i := strings.Index(name[off:], model)
		if i < 0 {
			return false
		}
		start, end := off+i, off+i+len(model)
		if (start == 0 || !isAlnum(name[start-1])) && (end == len(name) || !isAlnum(name[end])) {
			return true
		}
		off = start + 1
	}
	return false
}

func isAlnum(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// ChartAllowlist returns HAMi's chart default migProfileAllowlist verbatim
// (charts/hami/templates/scheduler/device-configmap.yaml at master 4707fb0), a new value on
// every call. Under [MatchSubstring] it gives an H200 the H20 profiles and matches no entry for
// "NVIDIA A100 80GB PCIe" or "NVIDIA H100 80GB HBM3"; [DefaultAllowlist] fixes both.
func ChartAllowlist() Allowlist {
	return Allowlist{
		{Models: []string{"A30"}, Profiles: []string{"1g.6gb", "2g.12gb", "4g.24gb"}},
		{Models: []string{"A100-SXM4-40GB", "A100-40GB-PCIe", "A100-PCIE-40GB"}, Profiles: []string{"1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"}},
		{Models: []string{"A100-SXM4-80GB", "A100-80GB-PCIe", "A100-PCIE-80GB"}, Profiles: []string{"1g.10gb", "2g.20gb", "3g.40gb", "7g.79gb"}},
		{Models: []string{"H100-PCIE-80GB", "H100-SXM5-80GB"}, Profiles: []string{"1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"}},
		{Models: []string{"H100-PCIE-94GB", "H100-SXM5-94GB"}, Profiles: []string{"1g.12gb", "2g.24gb", "3g.47gb", "7g.94gb"}},
		{Models: []string{"H20", "H100 on GH200"}, Profiles: []string{"1g.12gb", "2g.24gb", "3g.48gb", "7g.96gb"}},
		{Models: []string{"H200 NVL", "H200-SXM5"}, Profiles: []string{"1g.18gb", "2g.35gb", "3g.71gb", "7g.141gb"}},
		{Models: []string{"B200"}, Profiles: []string{"1g.23gb", "2g.45gb", "3g.90gb", "7g.180gb"}},
		{Models: []string{"RTX PRO 6000 Blackwell Server Edition"}, Profiles: []string{"1g.24gb", "2g.48gb", "4g.96gb"}},
	}
}

// Entries of [ChartAllowlist] that [DefaultAllowlist] extends.
const (
	chartA100x80GB = 2
	chartH100x80GB = 3
	chartH200      = 6
)

// DefaultAllowlist returns the SDK's default allowlist, meant for [MatchWord]: the entries of
// [ChartAllowlist] in the chart's order, with these models added for NVML names real GPUs
// report and the chart misses:
//
//   - "A100 80GB PCIe" to the A100-80GB entry: the NVML name of the A100 80GB PCIe board is
//     "NVIDIA A100 80GB PCIe", which contains neither "A100-80GB-PCIe" nor "A100-PCIE-80GB".
//   - "H100 80GB HBM3" to the H100-80GB entry: the H100 SXM5 80GB reports "NVIDIA H100 80GB
//     HBM3" (GPU Feature Discovery's product label NVIDIA-H100-80GB-HBM3; go-nvml's dgxh100
//     preset uses the same name), which contains no chart H100 model.
//   - "H200" to the H200 entry: the H200 SXM reports "NVIDIA H200" (the H200 NVL "NVIDIA H200
//     NVL", which the chart's "H200 NVL" matches under MatchWord). Under MatchWord, "H20" no
//     longer matches either, so both get the H200 profiles, not the H20 ones.
//
// The go-nvml presets' names ("Mock NVIDIA A100-SXM4-40GB", "NVIDIA A30-PCIE-24GB",
// "NVIDIA B200 180GB HBM3e", "NVIDIA H200 141GB HBM3e") match their entries under MatchWord
// already. Under [MatchSubstring] the H20 entry still comes first for an H200. A new value
// on every call.
func DefaultAllowlist() Allowlist {
	l := ChartAllowlist()
	l[chartA100x80GB].Models = append(l[chartA100x80GB].Models, "A100 80GB PCIe")
	l[chartH100x80GB].Models = append(l[chartH100x80GB].Models, "H100 80GB HBM3")
	l[chartH200].Models = append(l[chartH200].Models, "H200")
	return l
}

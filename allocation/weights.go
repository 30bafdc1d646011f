package allocation

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// KeyDeviceScoringWeights is the pod annotation of HAMi v2.10.0 that weights slots, cores and
// memory in the score that orders a node's GPUs for the pod, for example
// "slot=1,core=1,memory=3" (see [ParseScoringWeights]). HAMi v2.9.0 does not know it.
const KeyDeviceScoringWeights = "hami.io/device-scoring-weights"

// ErrInvalidScoringWeights is wrapped by every error of [ParseScoringWeights] and
// [PodScoringWeights] (test with errors.Is), through a [*ScoringWeightsError].
var ErrInvalidScoringWeights = errors.New("invalid device scoring weights")

// ScoringWeights weight a GPU's used slots, cores and memory in its score (see
// [ScoringWeights.DeviceScore]). The zero value weights nothing; HAMi's default is
// [DefaultScoringWeights].
type ScoringWeights struct {
	Slot, Core, Memory int64
}

// DefaultScoringWeights are the weights of a pod without [KeyDeviceScoringWeights]: 1, 1, 1.
var DefaultScoringWeights = ScoringWeights{Slot: 1, Core: 1, Memory: 1}

// ScoringWeightsError is an invalid [KeyDeviceScoringWeights] value. Its text is HAMi
// v2.10.0's, word for word. It unwraps to [ErrInvalidScoringWeights].
type ScoringWeightsError struct {
	// Value is the whole annotation value.
	Value string
	// Reason is what is wrong, in HAMi's words, e.g. `duplicate "slot" weight`.
	Reason string
}

// Error implements error: `invalid hami.io/device-scoring-weights annotation "<value>": <reason>`.
func (e *ScoringWeightsError) Error() string {
	return fmt.Sprintf("invalid %s annotation %q: %s", KeyDeviceScoringWeights, e.Value, e.Reason)
}

// Unwrap returns [ErrInvalidScoringWeights].
func (e *ScoringWeightsError) Unwrap() error { return ErrInvalidScoringWeights }

// ParseScoringWeights parses a [KeyDeviceScoringWeights] value as HAMi v2.10.0 does: exactly
// three comma-separated key=value entries, keys slot, core and memory in any order, spaces
// around entries, keys and values ignored, values base-10 integers (a leading "+" allowed)
// that are not negative, at least one of them positive. The first failure wins, in HAMi's
// order: the entry count, then per entry a missing "=", a duplicate key, a value that is not
// an integer, a negative value, an unknown key (after the value checks), and last all three
// zero. An empty value is an error, not the default.
func ParseScoringWeights(value string) (ScoringWeights, error) {
	fail := func(format string, a ...any) (ScoringWeights, error) {
		return ScoringWeights{}, &ScoringWeightsError{Value: value, Reason: fmt.Sprintf(format, a...)}
	}
	parts := strings.Split(value, ",")
	if len(parts) != 3 {
		return fail("expected slot, core, and memory weights")
	}
	var w ScoringWeights
	seen := make(map[string]bool, 3)
	for _, part := range parts {
		key, val, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return fail("expected key=value entries")
		}
		key, val = strings.TrimSpace(key), strings.TrimSpace(val)
		if seen[key] {
			return fail("duplicate %q weight", key)
		}
		seen[key] = true
		n, err := strconv.ParseInt(val, 10, 64)
		if err != nil {
			return fail("%q weight must be an integer", key)
		}
		if n < 0 {
			return fail("%q weight must not be negative", key)
		}
		switch key {
		case "slot":
			w.Slot = n
		case "core":
			w.Core = n
		case "memory":
			w.Memory = n
		default:
			return fail("unknown weight %q", key)
		}
	}
	if w == (ScoringWeights{}) {
		return fail("at least one weight must be positive")
	}
	return w, nil
}

// PodScoringWeights returns the weights a pod's annotations ask for under version v:
// [DefaultScoringWeights] when [KeyDeviceScoringWeights] is absent or v is [VersionV290]
// (which ignores it), else [ParseScoringWeights] of its value (present but empty is an error).
func PodScoringWeights(annotations map[string]string, v Version) (ScoringWeights, error) {
	value, ok := annotations[KeyDeviceScoringWeights]
	if !ok || v == VersionV290 {
		return DefaultScoringWeights, nil
	}
	return ParseScoringWeights(value)
}

// DeviceScore is the score HAMi gives a GPU to order the GPUs of a node for a container:
// 10 × (Slot × used/count + Core × used cores/cores + Memory × used memory/memory) over u,
// in float32 and rounded after each operation as HAMi's Go code on amd64 is, so that the
// order of two GPUs is HAMi's bit for bit. A total of 0 contributes 0 (HAMi divides by it).
func (w ScoringWeights) DeviceScore(d DeviceUsage) float32 {
	term := func(weight, used, total int64) float32 {
		if total == 0 {
			return 0
		}
		r := float32(float32(used) / float32(total))
		return float32(float32(weight) * r) // the conversion keeps the product from being fused
	}
	sum := float32(term(w.Slot, d.Used, int64(d.Count)) + term(w.Core, d.Usedcores, int64(d.Devcore)))
	sum = float32(sum + term(w.Memory, d.Usedmem, int64(d.Devmem)))
	return float32(10 * sum)
}

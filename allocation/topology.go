package allocation

import "strings"

// SetPairScores gives each device its topology pair scores: scores is parallel to devices
// (annotation.ScoresByDevice of the node's register annotation devices and its score
// annotation hami.io/node-nvidia-score), nil when the node has none. Devices without an entry
// keep no scores (every pair scores 0). It returns devices, changed in place; a scores slice
// of another length leaves them as they are.
func SetPairScores(devices []DeviceUsage, scores []map[string]int) []DeviceUsage {
	if len(scores) != len(devices) {
		return devices
	}
	for i := range devices {
		devices[i].PairScores = scores[i]
	}
	return devices
}

// devicePolicyHas reports whether a device policy selects want: v2.9.0 compares the whole
// value ("binpack,topology-aware" is neither and orders as spread); master takes a comma list
// and trims its members ("binpack, topology-aware" is both).
func devicePolicyHas(p, want Policy, v Version) bool {
	if v == VersionV290 {
		return p == want
	}
	for part := range strings.SplitSeq(string(p), ",") {
		if Policy(strings.TrimSpace(part)) == want {
			return true
		}
	}
	return false
}

// topologyPick chooses need of the candidates of one container, which are every GPU that
// passed the checks, in walk order, with len(cands) >= need, as HAMi's topology-aware Fit
// does (both versions, the v2.9.0 bug fixed):
//
//   - exactly need candidates: all of them, in walk order;
//   - need 1: the worst connected candidate, the one whose scores to the other candidates sum
//     lowest (first in walk order on ties), keeping well connected GPUs for larger requests;
//   - need > 1: the best combination, Σ over pairs i < j (in walk order) of the first GPU's
//     score to the second; combinations are enumerated lexicographically in walk order and the
//     first best one wins.
//
// HAMi v2.9.0 starts the best score at 0 and needs a strictly greater one, so when no
// combination scores above 0 (no score annotation, unknown UUIDs, "[]") it returns no GPUs and
// still reports a fit: the pod gets an empty entry and fails at Allocate. Here the first best
// combination wins whatever its score, as in HAMi master; without scores that is the first
// need candidates in walk order.
func topologyPick(devices []DeviceUsage, cands ContainerDevices, need int) ContainerDevices {
	if len(cands) == need {
		return cands
	}
	scores := make([]map[string]int, len(cands))
	for i, c := range cands {
		for j := range devices {
			if devices[j].ID == c.UUID {
				scores[i] = devices[j].PairScores
				break
			}
		}
	}
	if need == 1 {
		worst, worstSum := 0, 0
		for i := range cands {
			sum := 0
			for j := range cands {
				if i != j {
					sum += scores[i][cands[j].UUID]
				}
			}
			if i == 0 || sum < worstSum {
				worst, worstSum = i, sum
			}
		}
		return ContainerDevices{cands[worst]}
	}
	idx := make([]int, need) // the current combination, indexes into cands, increasing
	for i := range idx {
		idx[i] = i
	}
	best := make([]int, need)
	bestScore, found := 0, false
	for {
		score := 0
		for a := range need {
			for b := a + 1; b < need; b++ {
				score += scores[idx[a]][cands[idx[b]].UUID]
			}
		}
		if !found || score > bestScore {
			copy(best, idx)
			bestScore, found = score, true
		}
		// The next combination in lexicographic order.
		k := need - 1
		for k >= 0 && idx[k] == len(cands)-need+k {
			k--
		}
		if k < 0 {
			break
		}
		idx[k]++
		for m := k + 1; m < need; m++ {
			idx[m] = idx[m-1] + 1
		}
	}
	out := make(ContainerDevices, need)
	for i, c := range best {
		out[i] = cands[c]
	}
	return out
}

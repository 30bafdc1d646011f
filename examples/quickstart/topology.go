package main

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/hamireg/hamireg/annotation"
)

// gpuPair is two GPUs of a node by their index, the lower first.
type gpuPair struct{ a, b uint }

func newPair(a, b uint) gpuPair {
	if b < a {
		a, b = b, a
	}
	return gpuPair{a, b}
}

// pairScores reads the topology score annotation value as HAMi's scheduler attaches it to the
// registered devices (each GPU's map, by the peer's UUID) and returns the score of every pair
// of registered GPUs, as the lower-ordered GPU of the register annotation sees it.
func pairScores(devices []annotation.Device, value string) (map[gpuPair]int, error) {
	scores, err := annotation.DecodePairScores(value)
	if err != nil {
		return nil, err
	}
	byDevice := annotation.ScoresByDevice(devices, scores)
	if byDevice == nil {
		return nil, fmt.Errorf("no entry for the %d registered GPUs", len(devices))
	}
	out := map[gpuPair]int{}
	for i := range devices {
		for j := i + 1; j < len(devices); j++ {
			out[newPair(devices[i].Index, devices[j].Index)] = byDevice[i][devices[j].ID]
		}
	}
	return out, nil
}

// scoreSummary says in a few words what the topology score annotation value gives the
// registered devices: the number of pairs and how many have each score, best first. It
// reports false when the value is missing, does not decode or matches no device.
func scoreSummary(devices []annotation.Device, value string) (string, bool) {
	if value == "" {
		return "missing", false
	}
	if len(devices) == 0 {
		return "no registered GPU to attach it to", false
	}
	pairs, err := pairScores(devices, value)
	if err != nil {
		return err.Error(), false
	}
	count := map[int]int{}
	for _, s := range pairs {
		count[s]++
	}
	var parts []string
	for _, s := range slices.Backward(slices.Sorted(maps.Keys(count))) {
		parts = append(parts, fmt.Sprintf("%d ×%d", s, count[s]))
	}
	return fmt.Sprintf("%d pairs scored %s", len(pairs), strings.Join(parts, ", ")), true
}

// topologyChoice describes the GPUs (by UUID) the topology-aware policy took on a node with
// these devices and score annotation: their indexes, the sum of their pair scores, and how it
// compares with the best of the node's combinations of as many GPUs. It fails when the choice
// is not a best one (HAMi's rule: the first best combination in walk order) or the GPUs are
// not registered.
func topologyChoice(devices []annotation.Device, value string, chosen []string) (string, error) {
	pairs, err := pairScores(devices, value)
	if err != nil {
		return "", fmt.Errorf("%s: %w", annotation.KeyNVIDIAScore, err)
	}
	index := map[string]uint{}
	for _, d := range devices {
		index[d.ID] = d.Index
	}
	var idx []uint
	for _, id := range chosen {
		i, ok := index[id]
		if !ok {
			return "", fmt.Errorf("GPU %s is not in %s", id, annotation.KeyNVIDIARegister)
		}
		idx = append(idx, i)
	}
	score := comboScore(pairs, idx)
	all := make([]uint, 0, len(devices))
	for _, d := range devices {
		all = append(all, d.Index)
	}
	slices.Sort(all)
	best, ties, total := 0, 0, 0
	for combo := range combinations(all, len(idx)) {
		total++
		switch s := comboScore(pairs, combo); {
		case s > best:
			best, ties = s, 1
		case s == best:
			ties++
		}
	}
	if score < best {
		return "", fmt.Errorf("the topology-aware policy took GPUs %s scoring %d, the node's best scores %d", joinIndexes(idx), score, best)
	}
	return fmt.Sprintf("GPUs %s, pair score %d: the node's best (%d of its %d choices score %d)",
		joinIndexes(idx), score, ties, total, best), nil
}

// comboScore is HAMi's score of a combination: the sum of its pairs' scores.
func comboScore(pairs map[gpuPair]int, idx []uint) int {
	s := 0
	for i := range idx {
		for j := i + 1; j < len(idx); j++ {
			s += pairs[newPair(idx[i], idx[j])]
		}
	}
	return s
}

// combinations yields every k-subset of items in lexicographic order (the slice is reused).
func combinations(items []uint, k int) func(yield func([]uint) bool) {
	return func(yield func([]uint) bool) {
		if k <= 0 || k > len(items) {
			return
		}
		pos := make([]int, k)
		for i := range pos {
			pos[i] = i
		}
		out := make([]uint, k)
		for {
			for i, p := range pos {
				out[i] = items[p]
			}
			if !yield(out) {
				return
			}
			i := k - 1
			for i >= 0 && pos[i] == len(items)-k+i {
				i--
			}
			if i < 0 {
				return
			}
			pos[i]++
			for j := i + 1; j < k; j++ {
				pos[j] = pos[j-1] + 1
			}
		}
	}
}

// joinIndexes writes GPU indexes sorted: "6 and 7", "1, 2 and 3".
func joinIndexes(idx []uint) string {
	s := slices.Sorted(slices.Values(idx))
	parts := make([]string, len(s))
	for i, v := range s {
		parts[i] = fmt.Sprint(v)
	}
	if len(parts) < 2 {
		return strings.Join(parts, "")
	}
	return strings.Join(parts[:len(parts)-1], ", ") + " and " + parts[len(parts)-1]
}

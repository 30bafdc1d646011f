package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/hamireg/hamireg/annotation"
)

// scoresOf gives devs the scores of a simulated DGX A100 (nvmlsim's nvswitch topology, master
// rules): 12 NVLinks × 100, plus 40 for the pairs 0-1, 2-3, 4-5 and 6-7 (one PCIe switch tree),
// 20 inside a NUMA node (0-3, 4-7) and 10 across.
func scoresOf(devs []annotation.Device) []annotation.PairScore {
	out := make([]annotation.PairScore, len(devs))
	for i, d := range devs {
		out[i] = annotation.PairScore{UUID: d.ID, Scores: map[string]int{}}
		for j, p := range devs {
			switch {
			case i == j:
			case i/2 == j/2:
				out[i].Scores[p.ID] = 1240
			case i/4 == j/4:
				out[i].Scores[p.ID] = 1220
			default:
				out[i].Scores[p.ID] = 1210
			}
		}
	}
	return out
}

func eightGPUs() []annotation.Device {
	devs := make([]annotation.Device, simulatedGPUs)
	for i := range devs {
		devs[i] = annotation.Device{ID: fmt.Sprintf("GPU-%d", i), Index: uint(i), Count: 10, Devmem: 40960, Devcore: 100, Type: "NVIDIA-A100", Health: true}
	}
	return devs
}

func TestScoreSummary(t *testing.T) {
	t.Parallel()
	devs := eightGPUs()
	for name, tc := range map[string]struct {
		devs  []annotation.Device
		value string
		want  string
		ok    bool
	}{
		"dgxa100":       {devs, annotation.EncodePairScores(scoresOf(devs)), "28 pairs scored 1240 ×4, 1220 ×8, 1210 ×16", true},
		"missing":       {devs, "", "missing", false},
		"malformed":     {devs, "[{", "", false},
		"unknown UUIDs": {devs, `[{"uuid":"GPU-x","score":{"GPU-0":1}}]`, "no entry for the 8 registered GPUs", false},
		"no devices":    {nil, "[]", "no registered GPU to attach it to", false},
		// A GPU without an entry scores 0 to every peer, as HAMi reads it.
		"one entry": {devs[:3], annotation.EncodePairScores(scoresOf(devs[:3])[:1]), "3 pairs scored 1240 ×1, 1220 ×1, 0 ×1", true},
	} {
		got, ok := scoreSummary(tc.devs, tc.value)
		if ok != tc.ok || (tc.want != "" && got != tc.want) || got == "" {
			t.Errorf("%s: scoreSummary = %q, %v; want %q, %v", name, got, ok, tc.want, tc.ok)
		}
	}
}

func TestTopologyChoice(t *testing.T) {
	t.Parallel()
	devs := eightGPUs()
	scores := annotation.EncodePairScores(scoresOf(devs))
	for name, tc := range map[string]struct {
		chosen  []string
		want    string
		wantErr string
	}{
		"best pair":  {[]string{"GPU-7", "GPU-6"}, "GPUs 6 and 7, pair score 1240: the node's best (4 of its 28 choices score 1240)", ""},
		"other best": {[]string{"GPU-2", "GPU-3"}, "GPUs 2 and 3, pair score 1240: the node's best (4 of its 28 choices score 1240)", ""},
		"worse pair": {[]string{"GPU-5", "GPU-6"}, "", "took GPUs 5 and 6 scoring 1220, the node's best scores 1240"},
		"unknown":    {[]string{"GPU-9", "GPU-6"}, "", "GPU GPU-9 is not in hami.io/node-nvidia-register"},
		"three":      {[]string{"GPU-0", "GPU-1", "GPU-2"}, "GPUs 0, 1 and 2, pair score 3680: the node's best (8 of its 56 choices score 3680)", ""},
	} {
		got, err := topologyChoice(devs, scores, tc.chosen)
		switch {
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%s: topologyChoice error %v, want one with %q", name, err, tc.wantErr)
		case tc.wantErr == "" && (err != nil || got != tc.want):
			t.Errorf("%s: topologyChoice = %q, %v; want %q", name, got, err, tc.want)
		}
	}
	if _, err := topologyChoice(devs, "[{", []string{"GPU-0"}); err == nil || !strings.Contains(err.Error(), annotation.KeyNVIDIAScore) {
		t.Errorf("topologyChoice(malformed) = %v, want an error naming %s", err, annotation.KeyNVIDIAScore)
	}
}

func TestCombinations(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		n, k int
		want [][]uint
	}{
		"pairs of 3": {3, 2, [][]uint{{0, 1}, {0, 2}, {1, 2}}},
		"all":        {2, 2, [][]uint{{0, 1}}},
		"one":        {2, 1, [][]uint{{0}, {1}}},
		"none":       {2, 3, nil},
		"zero":       {2, 0, nil},
	} {
		items := make([]uint, tc.n)
		for i := range items {
			items[i] = uint(i)
		}
		var got [][]uint
		for c := range combinations(items, tc.k) {
			got = append(got, append([]uint(nil), c...))
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%s: combinations (-want +got):\n%s", name, diff)
		}
	}
	n := 0
	for range combinations([]uint{0, 1, 2, 3}, 2) {
		n++
		break
	}
	if n != 1 {
		t.Errorf("combinations went on after break: %d", n)
	}
}

func TestHAMiLines(t *testing.T) {
	t.Parallel()
	body := `# HELP hami_gpu_memory_allocated_bytes Device memory allocated for a certain GPU
# TYPE hami_gpu_memory_allocated_bytes gauge
hami_gpu_memory_allocated_bytes{device_cores="0",device_index="0",device_type="A100",device_uuid="GPU-0",node="n",zone="vGPU"} 0
hami_gpu_memory_allocated_bytes{device_cores="30",device_index="7",device_type="A100",device_uuid="GPU-7",node="n",zone="vGPU"} 1.073741824e+10
hami_gpu_memory_allocated_bytes{device_cores="30",device_index="6",device_type="A100",device_uuid="GPU-6",node="n",zone="vGPU"} 1.073741824e+10
hami_vgpu_memory_allocated_bytes{container_index="0",device_uuid="GPU-7",namespace="default",node="n",pod="demo",zone="vGPU"} 1.073741824e+10
hami_vgpu_memory_allocated_bytes{container_index="0",device_uuid="GPU-1",namespace="team-a",node="n",pod="demo",zone="vGPU"} 8.388608e+09
hami_resource_quota_used{limit="20000",namespace="team-a",quota_name="nvidia.com/gpumem",zone="vGPU"} 8000
hami_resource_quota_used{limit="1",namespace="default",quota_name="nvidia.com/gpumem",zone="vGPU"} 0
hamireg_filter_duration_seconds_count 3
hami_build_info{version="x",zone="vGPU"} 1
`
	gpu, vgpu, quota, total := hamiLines(body, []string{"GPU-7", "GPU-6"}, "default", "demo", "team-a")
	got := [][]string{gpu, vgpu, quota}
	want := [][]string{{
		`hami_gpu_memory_allocated_bytes{device_cores="30",device_index="6",device_type="A100",device_uuid="GPU-6",node="n",zone="vGPU"} 1.073741824e+10`,
		`hami_gpu_memory_allocated_bytes{device_cores="30",device_index="7",device_type="A100",device_uuid="GPU-7",node="n",zone="vGPU"} 1.073741824e+10`,
	}, {
		`hami_vgpu_memory_allocated_bytes{container_index="0",device_uuid="GPU-7",namespace="default",node="n",pod="demo",zone="vGPU"} 1.073741824e+10`,
	}, {
		`hami_resource_quota_used{limit="20000",namespace="team-a",quota_name="nvidia.com/gpumem",zone="vGPU"} 8000`,
	}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("hamiLines (-want +got):\n%s", diff)
	}
	if total != 8 {
		t.Errorf("hamiLines counted %d hami_ samples, want 8", total)
	}
}

func TestQuotaEvents(t *testing.T) {
	t.Parallel()
	ev := func(reason, msg string) corev1.Event {
		return corev1.Event{Type: corev1.EventTypeWarning, Reason: reason, Message: msg}
	}
	word := ev("FilteringFailed", "1 nodes ResourceQuotaNotFit(n)")
	summary := ev("FilteringFailed", "no available node, 1 nodes do not meet")
	detail := ev("ResourceQuotaNotFit", "namespace team-a over ResourceQuota gpu-quota …")
	other := ev("FailedScheduling", "0/1 nodes are available")
	for name, tc := range map[string]struct {
		in, want []corev1.Event
	}{
		"all, out of order":  {[]corev1.Event{other, detail, summary, word}, []corev1.Event{word, summary, detail}},
		"not yet the detail": {[]corev1.Event{word, summary}, []corev1.Event{word, summary}},
		"other words only":   {[]corev1.Event{ev("FilteringFailed", "1 nodes CardInsufficientMemory(n)"), other}, nil},
	} {
		if diff := cmp.Diff(tc.want, quotaEvents(tc.in)); diff != "" {
			t.Errorf("%s: quotaEvents (-want +got):\n%s", name, diff)
		}
	}
}

func TestPublishesScores(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		args []string
		env  string
		want bool
	}{
		"env":          {[]string{"--device-split-count=10"}, "true", true},
		"env not true": {nil, "1", false},
		"neither":      {nil, "", false},
		"flag":         {[]string{"--topology-score"}, "", true},
		"flag=true":    {[]string{"-topology-score=true"}, "", true},
		"flag off":     {[]string{"--topology-score=false"}, "true", false},
	} {
		if got := publishesScores(tc.args, tc.env); got != tc.want {
			t.Errorf("%s: publishesScores(%q, %q) = %v, want %v", name, tc.args, tc.env, got, tc.want)
		}
	}
}

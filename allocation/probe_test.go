package allocation

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/hamireg/hamireg/annotation"
)

// randomFitCase draws a node (GPUs, what pods hold of them, its annotations), a request and
// the pod's annotations from a small space, so that every check of Fit passes and fails often.
func randomFitCase(rng *rand.Rand) (devs []annotation.Device, used []Usage, req PodRequest, pod, node map[string]string) {
	pick := func(values ...string) string { return values[rng.IntN(len(values))] }
	n := rng.IntN(9)
	devs, used = make([]annotation.Device, n), make([]Usage, n)
	for i := range devs {
		devs[i] = annotation.Device{ID: fmt.Sprintf("GPU-%d", i), Index: uint(i), Count: int32(rng.IntN(4)),
			Devmem: []int32{0, 10000, 24000, 81559}[rng.IntN(4)], Devcore: int32(rng.IntN(3)) * 50,
			Type: pick("NVIDIA-A10", "NVIDIA-H100", "Tesla T4"), Numa: rng.IntN(2), Mode: pick("hami-core", "hami-core", "mig", "mps"),
			Health: rng.IntN(8) != 0}
		if rng.IntN(2) == 0 {
			devs[i].Devmem = int32(rng.IntN(30000))
		}
		if rng.IntN(3) != 0 && devs[i].Count > 0 {
			used[i] = Usage{Used: rng.Int64N(int64(devs[i].Count) + 1), Usedmem: rng.Int64N(int64(devs[i].Devmem) + 1), Usedcores: rng.Int64N(int64(devs[i].Devcore) + 1)}
		}
	}
	containers := 1 + rng.IntN(3)
	req.Init = rng.IntN(containers)
	for range containers {
		r := Request{Type: pick("NVIDIA", "NVIDIA", "NVIDIA", "OTHER"), MemoryPercentage: PercentageUnset, Cores: []int32{0, 0, 10, 50, 100, 120}[rng.IntN(6)]}
		if rng.IntN(3) != 0 || containers == 1 {
			r.Count = int32(rng.IntN(4))
		}
		switch rng.IntN(3) {
		case 0:
			r.Memory = int32(rng.IntN(25000))
		case 1:
			r.MemoryPercentage = int32(rng.IntN(101))
		}
		if rng.IntN(4) == 0 {
			r.Cores = int32(rng.IntN(130))
		}
		req.Containers = append(req.Containers, r)
	}
	pod, node = map[string]string{}, map[string]string{}
	for key, values := range map[string][]string{
		KeyUseGPUType:         {"A10", "h100,a10", "", "T4"},
		KeyNoUseGPUType:       {"H100", "", "a10"},
		KeyVGPUMode:           {"hami-core", "mig", "mps,hami-core"},
		KeyUseGPUUUID:         {"GPU-0", "GPU-1,GPU-2", ""},
		KeyNoUseGPUUUID:       {"GPU-3", "GPU-0,GPU-1", ""},
		KeyGPUSchedulerPolicy: {"binpack", "spread", "binpack,mutex", "mutex", "topology-aware", "other"},
		KeyNUMABind:           {"true", "false", "1", "nope"},
	} {
		if rng.IntN(5) == 0 {
			pod[key] = pick(values...)
		}
	}
	if rng.IntN(4) == 0 {
		node[KeyDeviceCordon] = pick("GPU-0", " GPU-1 , GPU-2", "GPU-0,GPU-3,GPU-5", ",")
	}
	return devs, used, req, pod, node
}

// The Probe gives Fit's yes or no on every request it models, and it models the common ones.
func TestProbeDifferential(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(21, 5000))
	const runs = 50_000
	modelled, fits := 0, 0
	for i := range runs {
		devs, used, req, pod, node := randomFitCase(rng)
		c := Config{Version: []Version{VersionMaster, VersionV290}[i%2], GPUSchedulerPolicy: []Policy{"", PolicyBinpack, "binpack,mutex"}[i%3]}
		usage := map[string]Usage{}
		for j, d := range devs {
			usage[d.ID] = used[j]
		}
		_, reason, want := Fit(WithUsage(devs, usage), req, pod, node, c)
		p, ok := NewProbe(req, pod, c)
		if !ok {
			continue
		}
		modelled++
		if want {
			fits++
		}
		var pn ProbeNode
		pn.Set(devs, usage)
		if score := NodeScore(WithUsage(devs, usage)); pn.Score() != score {
			t.Fatalf("case %d: ProbeNode.Score = %v, NodeScore = %v", i, pn.Score(), score)
		}
		if got := p.Fits(&pn, node[KeyDeviceCordon]); got != want {
			t.Fatalf("case %d: Probe.Fits = %v, Fit = %v (%q)\ndevices %+v\nused %+v\nrequest %+v\npod %v node %v config %+v",
				i, got, want, reason, devs, used, req, pod, node, c)
		}
	}
	t.Logf("%d cases, %d modelled by the probe, %d of those fit", runs, modelled, fits)
	if modelled < runs/4 || fits < modelled/10 || fits > modelled*9/10 {
		t.Errorf("the random cases do not exercise the probe: %d modelled, %d fit", modelled, fits)
	}
}

func TestNewProbeRefuses(t *testing.T) {
	t.Parallel()
	one := Request{Count: 1, Type: annotation.VendorNVIDIA, MemoryPercentage: 100}
	tests := map[string]struct {
		req  PodRequest
		pod  map[string]string
		c    Config
		want bool
	}{
		"one GPU container":                   {req: PodRequest{Containers: []Request{{}, one, {}}, Init: 1}, want: true},
		"two GPU containers":                  {req: PodRequest{Containers: []Request{one, one}}},
		"an init and a regular GPU container": {req: PodRequest{Containers: []Request{one, one}, Init: 1}},
		"NUMA binding":                        {req: PodRequest{Containers: []Request{one}}, pod: map[string]string{KeyNUMABind: "true"}},
		"NUMA binding off":                    {req: PodRequest{Containers: []Request{one}}, pod: map[string]string{KeyNUMABind: "false"}, want: true},
		"topology-aware":                      {req: PodRequest{Containers: []Request{one}}, pod: map[string]string{KeyGPUSchedulerPolicy: string(PolicyTopologyAware)}},
		"topology-aware by the config":        {req: PodRequest{Containers: []Request{one}}, c: Config{GPUSchedulerPolicy: PolicyTopologyAware}},
		"binpack and mutex":                   {req: PodRequest{Containers: []Request{one}}, pod: map[string]string{KeyGPUSchedulerPolicy: "binpack,mutex"}, want: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if _, ok := NewProbe(tc.req, tc.pod, tc.c); ok != tc.want {
				t.Errorf("NewProbe ok = %v, want %v", ok, tc.want)
			}
		})
	}
}

// The probe allocates nothing per node for a plain request.
func TestProbeAllocations(t *testing.T) {
	var node ProbeNode
	node.Set(devicesOf(8), map[string]Usage{"GPU-a": {Used: 1, Usedmem: 1000, Usedcores: 10}})
	p, ok := NewProbe(one(3000, 10), nil, Config{})
	if !ok {
		t.Fatal("not modelled")
	}
	if n := testing.AllocsPerRun(100, func() { p.Fits(&node, "") }); n != 0 {
		t.Errorf("Fits allocates %v times", n)
	}
}

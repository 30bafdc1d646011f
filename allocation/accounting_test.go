package allocation_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	resourcehelper "k8s.io/component-helpers/resource"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
)

var always = corev1.ContainerRestartPolicyAlways

// sidecarPod is a pod whose init containers are sidecars where sidecar[i] is true, and
// apps app containers.
func sidecarPod(sidecar []bool, apps int) *corev1.Pod {
	p := &corev1.Pod{}
	for i, s := range sidecar {
		c := corev1.Container{Name: fmt.Sprintf("init%d", i)}
		if s {
			c.RestartPolicy = &always
		}
		p.Spec.InitContainers = append(p.Spec.InitContainers, c)
	}
	for i := range apps {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: fmt.Sprintf("app%d", i)})
	}
	return p
}

// TestEffectiveUsageIsTheKubernetesRule checks allocation.EffectiveUsage with
// AccountingKubernetes against k8s.io/component-helpers/resource.AggregateContainerRequests
// itself, GPU by GPU, on random pods: for each GPU, a pod whose containers request what
// their entries hold of it (slots, memory, cores as three resources) must be charged what
// EffectiveUsage says the pod holds there.
func TestEffectiveUsageIsTheKubernetesRule(t *testing.T) {
	t.Parallel()
	gpus := []string{"GPU-a", "GPU-b", "GPU-c"}
	const slots, mem, cores = "example.com/slots", "example.com/mem", "example.com/cores"
	cfg := allocation.Config{Accounting: allocation.AccountingKubernetes}
	for seed := range uint64(500) {
		rng := rand.New(rand.NewPCG(seed, 7))
		sidecar := make([]bool, rng.IntN(4))
		for i := range sidecar {
			sidecar[i] = rng.IntN(2) == 0
		}
		pod := sidecarPod(sidecar, 1+rng.IntN(3))
		kinds := allocation.Kinds(pod)
		pd := make(allocation.PodDevices, len(kinds))
		for i := range pd {
			for range rng.IntN(3) {
				pd[i] = append(pd[i], allocation.ContainerDevice{UUID: gpus[rng.IntN(len(gpus))], Type: annotation.VendorNVIDIA,
					Usedmem: rng.Int32N(5000), Usedcores: rng.Int32N(40)})
			}
		}
		got := allocation.EffectiveUsage(pd, kinds, false, cfg)
		for _, gpu := range gpus {
			p := pod.DeepCopy()
			for i := range len(p.Spec.InitContainers) + len(p.Spec.Containers) {
				var u allocation.Usage
				for _, d := range pd[i] {
					if d.UUID == gpu {
						u = u.Add(allocation.Usage{Used: 1, Usedmem: int64(d.Usedmem), Usedcores: int64(d.Usedcores)})
					}
				}
				rl := corev1.ResourceList{slots: *resource.NewQuantity(u.Used, resource.DecimalSI),
					mem: *resource.NewQuantity(u.Usedmem, resource.DecimalSI), cores: *resource.NewQuantity(u.Usedcores, resource.DecimalSI)}
				if i < len(p.Spec.InitContainers) {
					p.Spec.InitContainers[i].Resources.Requests = rl
				} else {
					p.Spec.Containers[i-len(p.Spec.InitContainers)].Resources.Requests = rl
				}
			}
			agg := resourcehelper.AggregateContainerRequests(p, resourcehelper.PodResourcesOptions{})
			q := func(name corev1.ResourceName) int64 { v := agg[name]; return v.Value() }
			want := allocation.Usage{Used: q(slots), Usedmem: q(mem), Usedcores: q(cores)}
			if got[gpu] != want {
				t.Fatalf("seed %d, %s: EffectiveUsage %+v, component-helpers %+v (kinds %v, devices %v)", seed, gpu, got[gpu], want, kinds, pd)
			}
		}
	}
}

func TestEffectiveUsage(t *testing.T) {
	t.Parallel()
	entry := func(gpu string, mem, cores int32) allocation.ContainerDevices {
		return allocation.ContainerDevices{{UUID: gpu, Type: annotation.VendorNVIDIA, Usedmem: mem, Usedcores: cores}}
	}
	// init 12000 (regular), sidecar 2000, app 6000, all on GPU-a; the app also 1000 on GPU-b.
	pd := allocation.PodDevices{entry("GPU-a", 12000, 10), entry("GPU-a", 2000, 5), append(entry("GPU-a", 6000, 20), entry("GPU-b", 1000, 0)...)}
	kinds := []allocation.ContainerKind{allocation.KindInit, allocation.KindSidecar, allocation.KindApp}
	k8s := allocation.Config{}
	hami := allocation.Config{Accounting: allocation.AccountingHAMi}
	v290 := allocation.Config{Version: allocation.VersionV290}
	for name, tc := range map[string]struct {
		cfg      allocation.Config
		initDone bool
		want     map[string]allocation.Usage
	}{
		"kubernetes": {cfg: k8s, want: map[string]allocation.Usage{
			"GPU-a": {Used: 2, Usedmem: 12000, Usedcores: 25}, // max(init 12000 + 0 sidecars, 2000 + 6000); cores 5+20
			"GPU-b": {Used: 1, Usedmem: 1000}}},
		"kubernetes/init done": {cfg: k8s, initDone: true, want: map[string]allocation.Usage{
			"GPU-a": {Used: 2, Usedmem: 8000, Usedcores: 25}, "GPU-b": {Used: 1, Usedmem: 1000}}},
		"hami v2.10.0": {cfg: hami, want: map[string]allocation.Usage{
			"GPU-a": {Used: 1, Usedmem: 12000, Usedcores: 20}, // max(largest init entry, app sum); the sidecar is an init container
			"GPU-b": {Used: 1, Usedmem: 1000}}},
		"hami v2.10.0/init done": {cfg: hami, initDone: true, want: map[string]allocation.Usage{
			"GPU-a": {Used: 1, Usedmem: 6000, Usedcores: 20}, "GPU-b": {Used: 1, Usedmem: 1000}}}, // the sidecar dropped
		"v2.9.0 (default)": {cfg: v290, want: map[string]allocation.Usage{
			"GPU-a": {Used: 3, Usedmem: 20000, Usedcores: 35}, "GPU-b": {Used: 1, Usedmem: 1000}}},
		"v2.9.0 (default)/init done": {cfg: v290, initDone: true, want: map[string]allocation.Usage{
			"GPU-a": {Used: 3, Usedmem: 20000, Usedcores: 35}, "GPU-b": {Used: 1, Usedmem: 1000}}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got := allocation.EffectiveUsage(pd, kinds, tc.initDone, tc.cfg)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			if q := allocation.UsageQuota(got); q.Memory != tc.want["GPU-a"].Usedmem+tc.want["GPU-b"].Usedmem {
				t.Errorf("UsageQuota %+v", q)
			}
		})
	}
	// A GPU held by a finished regular init container only holds nothing.
	if got := allocation.EffectiveUsage(allocation.PodDevices{entry("GPU-c", 100, 0), entry("GPU-a", 1, 0)},
		[]allocation.ContainerKind{allocation.KindInit, allocation.KindApp}, true, k8s); len(got) != 1 {
		t.Errorf("init done: %v, want GPU-a only", got)
	}
}

func TestInitDone(t *testing.T) {
	t.Parallel()
	status := func(name, state string, code int32) corev1.ContainerStatus {
		s := corev1.ContainerStatus{Name: name}
		switch state {
		case "running":
			s.State.Running = &corev1.ContainerStateRunning{}
		case "terminated":
			s.State.Terminated = &corev1.ContainerStateTerminated{ExitCode: code}
		}
		return s
	}
	k8s, hami, v290 := allocation.Config{}, allocation.Config{Accounting: allocation.AccountingHAMi}, allocation.Config{Version: allocation.VersionV290}
	for name, tc := range map[string]struct {
		sidecar           []bool
		statuses          []corev1.ContainerStatus
		wantK8s, wantHAMi bool
	}{
		"no init containers":        {},
		"no statuses yet":           {sidecar: []bool{false}},
		"init running":              {sidecar: []bool{false}, statuses: []corev1.ContainerStatus{status("init0", "running", 0)}},
		"init exited 0":             {sidecar: []bool{false}, statuses: []corev1.ContainerStatus{status("init0", "terminated", 0)}, wantK8s: true, wantHAMi: true},
		"init exited 1":             {sidecar: []bool{false}, statuses: []corev1.ContainerStatus{status("init0", "terminated", 1)}},
		"init done, sidecar runs":   {sidecar: []bool{false, true}, statuses: []corev1.ContainerStatus{status("init0", "terminated", 0), status("init1", "running", 0)}, wantK8s: true},
		"sidecar only, running":     {sidecar: []bool{true}, statuses: []corev1.ContainerStatus{status("init0", "running", 0)}},
		"sidecar only, exited 0":    {sidecar: []bool{true}, statuses: []corev1.ContainerStatus{status("init0", "terminated", 0)}, wantHAMi: true},
		"second init has no status": {sidecar: []bool{false, false}, statuses: []corev1.ContainerStatus{status("init0", "terminated", 0)}, wantHAMi: true},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pod := sidecarPod(tc.sidecar, 1)
			pod.Status.InitContainerStatuses = tc.statuses
			if got := allocation.InitDone(pod, k8s); got != tc.wantK8s {
				t.Errorf("kubernetes: %v, want %v", got, tc.wantK8s)
			}
			if got := allocation.InitDone(pod, hami); got != tc.wantHAMi {
				t.Errorf("hami v2.10.0: %v, want %v", got, tc.wantHAMi)
			}
			if allocation.InitDone(pod, v290) {
				t.Error("v2.9.0 shrinks")
			}
		})
	}
}

// TestFitSidecarDeclaredBeforeInit: 8000 MiB used of 23028; a sidecar of 4000, then a regular
// init container of 12000, then an app of 6000. The Kubernetes rule needs 4000 + 12000 beside
// the other pods: it does not fit; HAMi v2.10.0 fits each init container alone; v2.9.0 sums.
func TestFitSidecarDeclaredBeforeInit(t *testing.T) {
	t.Parallel()
	devs := allocation.WithUsage([]annotation.Device{{ID: "GPU-0", Count: 10, Devmem: 23028, Devcore: 100, Type: "NVIDIA A10", Mode: "hami-core", Health: true}},
		map[string]allocation.Usage{"GPU-0": {Used: 1, Usedmem: 8000}})
	req := allocation.PodRequest{Init: 2, Containers: []allocation.Request{
		{Count: 1, Type: annotation.VendorNVIDIA, Memory: 4000, MemoryPercentage: allocation.PercentageUnset, Sidecar: true},
		{Count: 1, Type: annotation.VendorNVIDIA, Memory: 12000, MemoryPercentage: allocation.PercentageUnset},
		{Count: 1, Type: annotation.VendorNVIDIA, Memory: 6000, MemoryPercentage: allocation.PercentageUnset},
	}}
	for name, tc := range map[string]struct {
		cfg  allocation.Config
		fits bool
	}{
		"kubernetes":   {cfg: allocation.Config{}},
		"hami v2.10.0": {cfg: allocation.Config{Accounting: allocation.AccountingHAMi}, fits: true},
		"hami v2.9.0":  {cfg: allocation.Config{Version: allocation.VersionV290}},
	} {
		_, reason, fits := allocation.Fit(devs, req, nil, nil, tc.cfg)
		if fits != tc.fits {
			t.Errorf("%s: fits %v (%s), want %v", name, fits, reason, tc.fits)
		}
	}
	// 1000 MiB less used: the rule fits (4000 + 12000 + 7000 = 23000), and the regular init
	// container's share is not left behind for the app.
	devs[0].Usedmem = 7000
	pd, reason, fits := allocation.Fit(devs, req, nil, nil, allocation.Config{})
	if !fits || len(pd) != 3 {
		t.Fatalf("fits %v (%s), want the rule to fit", fits, reason)
	}
}

func TestAdmissionQuotaAskKubernetes(t *testing.T) {
	t.Parallel()
	limits := func(mem string) corev1.ResourceRequirements {
		return corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1"), "nvidia.com/gpumem": resource.MustParse(mem)}}
	}
	pod := sidecarPod([]bool{true, false}, 1)
	pod.Spec.InitContainers[0].Resources = limits("4000")
	pod.Spec.InitContainers[1].Resources = limits("12000")
	pod.Spec.Containers[0].Resources = limits("6000")
	for name, tc := range map[string]struct {
		cfg  allocation.Config
		want int64
	}{
		"kubernetes":             {cfg: allocation.Config{}, want: 16000},                                      // max(4000+12000, 4000+6000)
		"hami v2.10.0":           {cfg: allocation.Config{Accounting: allocation.AccountingHAMi}, want: 12000}, // max(6000, max(4000, 12000))
		"hami v2.9.0":            {cfg: allocation.Config{Version: allocation.VersionV290}, want: 6000},        // app containers with one GPU
		"kubernetes with v2.9.0": {cfg: allocation.Config{Version: allocation.VersionV290, Accounting: allocation.AccountingKubernetes}, want: 16000},
	} {
		if got := allocation.AdmissionQuotaAsk(pod, tc.cfg).Memory; got != tc.want {
			t.Errorf("%s: %d MiB, want %d", name, got, tc.want)
		}
		if got := allocation.AskQuota(allocation.Requests(pod, tc.cfg), tc.cfg).Memory; tc.cfg.Version != allocation.VersionV290 && got != tc.want {
			t.Errorf("%s: AskQuota %d MiB, want %d", name, got, tc.want)
		}
	}
}

func TestConfigAccounting(t *testing.T) {
	t.Parallel()
	_, err := allocation.Config{Accounting: "k8s"}.WithDefaults()
	if !errors.Is(err, allocation.ErrInvalidConfig) {
		t.Errorf("unknown accounting: %v, want ErrInvalidConfig", err)
	}
	for _, tc := range []struct {
		cfg  allocation.Config
		want allocation.Accounting
	}{
		{allocation.Config{}, allocation.AccountingKubernetes},
		{allocation.Config{Version: allocation.VersionV290}, allocation.AccountingHAMi},
		{allocation.Config{Version: allocation.VersionV290, Accounting: allocation.AccountingKubernetes}, allocation.AccountingKubernetes},
		{allocation.Config{Accounting: allocation.AccountingHAMi}, allocation.AccountingHAMi},
	} {
		if _, err := tc.cfg.WithDefaults(); err != nil {
			t.Errorf("%+v: %v", tc.cfg, err)
		}
		if got := tc.cfg.EffectiveAccounting(); got != tc.want {
			t.Errorf("%+v: %s, want %s", tc.cfg, got, tc.want)
		}
	}
	if got := allocation.Requests(sidecarPod([]bool{true, false}, 1), allocation.Config{}).Kinds(); !cmp.Equal(got,
		[]allocation.ContainerKind{allocation.KindSidecar, allocation.KindInit, allocation.KindApp}) {
		t.Errorf("Kinds %v", got)
	}
}

// ExampleEffectiveUsage: a native sidecar (10000 MiB) and an app container (10000 MiB) on one
// GPU hold 20000 MiB by the Kubernetes rule; HAMi v2.10.0 counts 10000.
func ExampleEffectiveUsage() {
	pod := sidecarPod([]bool{true}, 1)
	entry := allocation.ContainerDevices{{UUID: "GPU-0", Type: annotation.VendorNVIDIA, Usedmem: 10000}}
	pd := allocation.PodDevices{entry, entry} // init containers first, as on the wire
	for _, mode := range []allocation.Accounting{allocation.AccountingKubernetes, allocation.AccountingHAMi} {
		used := allocation.PodUsage(pd, pod, allocation.Config{Accounting: mode})
		fmt.Printf("%s: %d MiB, %d slots\n", mode, used["GPU-0"].Usedmem, used["GPU-0"].Used)
	}
	// Output:
	// kubernetes: 20000 MiB, 2 slots
	// hami: 10000 MiB, 1 slots
}

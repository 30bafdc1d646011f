package allocation

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hamireg/hamireg/annotation"
)

func TestDecodePodDevices(t *testing.T) {
	t.Parallel()
	a := ContainerDevice{UUID: "GPU-a", Type: "NVIDIA", Usedmem: 1000, Usedcores: 10}
	b := ContainerDevice{UUID: "GPU-b", Type: "NVIDIA", Usedmem: 2000, Usedcores: 20}
	tests := map[string]struct {
		value   string
		version Version
		want    PodDevices
		field   string // of the error; "-" for none
	}{
		"empty":                 {"", VersionMaster, PodDevices{}, "-"},
		"one":                   {"GPU-a,NVIDIA,1000,10:;", VersionMaster, PodDevices{{a}}, "-"},
		"no final separators":   {"GPU-a,NVIDIA,1000,10", VersionMaster, PodDevices{{a}}, "-"},
		"sidecar first":         {";GPU-b,NVIDIA,2000,20:;", VersionMaster, PodDevices{{}, {b}}, "-"},
		"after erase (hamireg)": {";;", VersionMaster, PodDevices{{}, {}}, "-"},
		"after erase (HAMi)":    {";;;;", VersionMaster, PodDevices{{}, {}, {}, {}}, "-"},
		"two devices":           {"GPU-a,NVIDIA,1000,10:GPU-b,NVIDIA,2000,20:;", VersionMaster, PodDevices{{a, b}}, "-"},
		"garbage skipped":       {"junk::GPU-a,NVIDIA,1000,10:;", VersionMaster, PodDevices{{a}}, "-"},
		"extra fields":          {"GPU-a,NVIDIA,1000,10,x,y:;", VersionMaster, PodDevices{{a}}, "-"},
		"three fields":          {"GPU-a,NVIDIA,1000:;", VersionMaster, nil, ""},
		"three fields v2.9.0":   {"GPU-a,NVIDIA,1000:;", VersionV290, nil, ""},
		"bad memory":            {"GPU-a,NVIDIA,abc,10:;", VersionMaster, nil, "memory"},
		"bad cores":             {"GPU-a,NVIDIA,1,1e3:;", VersionMaster, nil, "cores"},
		"bad memory v2.9.0":     {"GPU-a,NVIDIA,abc,10:;", VersionV290, PodDevices{{{UUID: "GPU-a", Type: "NVIDIA", Usedcores: 10}}}, "-"},
		"overflow v2.9.0":       {"GPU-a,NVIDIA,99999999999,-99999999999:;", VersionV290, PodDevices{{{UUID: "GPU-a", Type: "NVIDIA", Usedmem: 1<<31 - 1, Usedcores: -1 << 31}}}, "-"},
		"second entry bad":      {"GPU-a,NVIDIA,1000,10:;GPU-b,NVIDIA,x,1:;", VersionMaster, nil, "memory"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got, err := DecodePodDevices(tc.value, tc.version)
			if tc.field == "-" {
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(tc.want, got, cmpopts.EquateEmpty()); diff != "" {
					t.Errorf("(-want +got):\n%s", diff)
				}
				return
			}
			var de *DecodeError
			if got != nil || !errors.Is(err, ErrMalformed) || !errors.As(err, &de) || de.Field != tc.field {
				t.Fatalf("Decode = %v, %v; want ErrMalformed in field %q", got, err, tc.field)
			}
		})
	}
	_, err := DecodePodDevices("GPU-a,NVIDIA,1000,10:;GPU-b,NVIDIA,x,1:;", VersionMaster)
	var de *DecodeError
	if !errors.As(err, &de) || de.Container != 1 || de.Device != 0 || !strings.Contains(err.Error(), "invalid memory field") {
		t.Errorf("error %v does not locate the bad value", err)
	}
}

// Consuming entries never lengthens the value, unlike HAMi's erase, and keeps the index of
// every other entry.
func TestConsumeDoesNotGrow(t *testing.T) {
	t.Parallel()
	value := "GPU-a,NVIDIA,1000,10:;GPU-b,NVIDIA,2000,20:;"
	var seen []string
	for {
		pd, err := DecodePodDevices(value, VersionMaster)
		if err != nil {
			t.Fatal(err)
		}
		if len(pd) != 2 {
			t.Fatalf("%q decodes to %d entries, want 2", value, len(pd))
		}
		i, ok := pd.Next()
		if !ok {
			break
		}
		next := EncodePodDevices(pd.Consume(i))
		if len(next) > len(value) {
			t.Fatalf("consuming %q gives the longer %q", value, next)
		}
		if pd[i][0].UUID == "" {
			t.Fatal("served an empty entry")
		}
		seen = append(seen, pd[i][0].UUID)
		value = next
	}
	if want := []string{"GPU-a", "GPU-b"}; !cmp.Equal(seen, want) || value != ";;" {
		t.Errorf("served %v ending with %q, want %v and \";;\"", seen, value, want)
	}
	// Consume leaves its receiver alone and ignores an index out of range.
	pd := PodDevices{{{UUID: "x"}}}
	if c := pd.Consume(3); len(c[0]) != 1 || len(pd.Consume(0)[0]) != 0 || len(pd[0]) != 1 {
		t.Error("Consume changed its receiver or an entry out of range")
	}
}

func gpuPod(containers ...corev1.ResourceList) *corev1.Pod {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default"}}
	for _, l := range containers {
		pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{Name: "c", Resources: corev1.ResourceRequirements{Limits: l}})
	}
	return pod
}

func list(kv ...string) corev1.ResourceList {
	out := corev1.ResourceList{}
	for i := 0; i < len(kv); i += 2 {
		out[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
	}
	return out
}

func TestRequests(t *testing.T) {
	t.Parallel()
	const gpu, mem, pct, cores = "nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpumem-percentage", "nvidia.com/gpucores"
	whole := Request{Count: 1, Type: "NVIDIA", MemoryPercentage: 100}
	tests := map[string]struct {
		limits  corev1.ResourceList
		config  Config
		want    Request
		wantOld Request // with VersionV290, when it differs
	}{
		"count only":          {limits: list(gpu, "1"), want: whole},
		"no count":            {limits: list(mem, "1000", cores, "30")},
		"count zero":          {limits: list(gpu, "0", mem, "1000")},
		"memory and cores":    {limits: list(gpu, "2", mem, "3000", cores, "30"), want: Request{Count: 2, Type: "NVIDIA", Memory: 3000, MemoryPercentage: 101, Cores: 30}},
		"percentage":          {limits: list(gpu, "1", pct, "50"), want: Request{Count: 1, Type: "NVIDIA", MemoryPercentage: 50}},
		"percentage over 100": {limits: list(gpu, "1", pct, "150"), want: whole, wantOld: Request{Count: 1, Type: "NVIDIA", MemoryPercentage: 150}},
		"percentage zero":     {limits: list(gpu, "1", pct, "0"), want: whole, wantOld: Request{Count: 1, Type: "NVIDIA"}},
		"fractional memory":   {limits: list(gpu, "1", mem, "1.5"), want: Request{}, wantOld: whole},
		"huge memory":         {limits: list(gpu, "1", mem, "3000000000"), want: Request{}, wantOld: Request{Count: 1, Type: "NVIDIA", Memory: 1<<31 - 1, MemoryPercentage: 101}},
		"huge count":          {limits: list(gpu, "4294967297"), want: Request{Count: 1<<31 - 1, Type: "NVIDIA", MemoryPercentage: 100}},
		"memory factor":       {limits: list(gpu, "1", mem, "10"), config: Config{MemoryFactor: 1024}, want: Request{Count: 1, Type: "NVIDIA", Memory: 10240, MemoryPercentage: 101}},
		"default memory":      {limits: list(gpu, "1"), config: Config{DefaultMemory: 2000, DefaultCores: 10}, want: Request{Count: 1, Type: "NVIDIA", Memory: 2000, MemoryPercentage: 101, Cores: 10}},
		"own resource names":  {limits: list("vendor.com/g", "1", "vendor.com/m", "7"), config: Config{ResourceCount: "vendor.com/g", ResourceMemory: "vendor.com/m"}, want: Request{Count: 1, Type: "NVIDIA", Memory: 7, MemoryPercentage: 101}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			for _, v := range []Version{VersionMaster, VersionV290} {
				c := tc.config
				c.Version = v
				want := tc.want
				if v == VersionV290 && tc.wantOld != (Request{}) {
					want = tc.wantOld
				}
				got := Requests(gpuPod(tc.limits), c)
				if diff := cmp.Diff([]Request{want}, got.Containers); diff != "" {
					t.Errorf("%v (-want +got):\n%s", v, diff)
				}
			}
		})
	}
	// Requests are read from limits first, then requests; init containers come first.
	pod := gpuPod(nil)
	pod.Spec.Containers[0].Resources.Requests = list(gpu, "1", mem, "100")
	pod.Spec.InitContainers = []corev1.Container{{Name: "init", Resources: corev1.ResourceRequirements{Limits: list(gpu, "1", mem, "5"), Requests: list(mem, "6")}}}
	got := Requests(pod, Config{})
	if got.Init != 1 || len(got.Containers) != 2 || got.Containers[0].Memory != 5 || got.Containers[1].Memory != 100 || !got.Any() {
		t.Errorf("Requests = %+v", got)
	}
	if Requests(nil, Config{}).Any() || Requests(gpuPod(nil), Config{}).Any() {
		t.Error("a pod without GPUs asks for some")
	}
}

func TestConfigWithDefaults(t *testing.T) {
	t.Parallel()
	c, err := Config{}.WithDefaults()
	if err != nil || c.ResourceCount != "nvidia.com/gpu" || c.GPUSchedulerPolicy != PolicySpread || c.NodeSchedulerPolicy != PolicyBinpack || c.DefaultGPUNum != 1 || c.MemoryFactor != 1 {
		t.Errorf("defaults = %+v, %v", c, err)
	}
	for name, bad := range map[string]Config{"negative memory": {DefaultMemory: -1}, "cores": {DefaultCores: 101}, "version": {Version: 9}, "factor": {MemoryFactor: -2}} {
		if _, err := bad.WithDefaults(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func devicesOf(n int) []annotation.Device {
	devs := make([]annotation.Device, n)
	for i := range devs {
		devs[i] = annotation.Device{ID: "GPU-" + string(rune('a'+i)), Index: uint(i), Count: 10, Devmem: 10000, Devcore: 100, Type: "NVIDIA A10", Mode: "hami-core", Health: true}
	}
	return devs
}

func one(mem, cores int32) PodRequest {
	return PodRequest{Containers: []Request{{Count: 1, Type: "NVIDIA", Memory: mem, MemoryPercentage: PercentageUnset, Cores: cores}}}
}

func TestFitReasons(t *testing.T) {
	t.Parallel()
	devs := devicesOf(3)
	devs[0].Health = false
	devs[1].Mode = "mig"
	used := map[string]Usage{"GPU-c": {Used: 10}}
	// A MIG GPU without profiles: master places nothing there, v2.9.0 places no MIG at all.
	_, reason, ok := Fit(WithUsage(devs, used), one(100, 10), nil, nil, Config{})
	if ok || reason != "1/3 CardMigTopologyInfeasible, 1/3 CardNotHealth, 1/3 CardTimeSlicingExhausted" {
		t.Errorf("Fit = %v, %q", ok, reason)
	}
	_, reason, ok = Fit(WithUsage(devs, used), one(100, 10), nil, nil, Config{Version: VersionV290})
	if ok || reason != "1/3 CardNotFoundCustomFilterRule, 1/3 CardNotHealth, 1/3 CardTimeSlicingExhausted" {
		t.Errorf("v2.9.0: Fit = %v, %q", ok, reason)
	}
	// Cordoned GPUs: master only.
	node := map[string]string{KeyDeviceCordon: " GPU-a , GPU-b"}
	if _, reason, ok := Fit(WithUsage(devicesOf(2), nil), one(1, 1), nil, node, Config{}); ok || reason != "2/2 CardCordoned" {
		t.Errorf("cordoned: %v %q", ok, reason)
	}
	if _, _, ok := Fit(WithUsage(devicesOf(2), nil), one(1, 1), nil, node, Config{Version: VersionV290}); !ok {
		t.Error("v2.9.0 honours the cordon annotation")
	}
	// master's mutex policy wants an idle GPU.
	pod := map[string]string{KeyGPUSchedulerPolicy: "binpack,mutex"}
	if _, reason, ok := Fit(WithUsage(devicesOf(1), map[string]Usage{"GPU-a": {Used: 1}}), one(1, 1), pod, nil, Config{}); ok || reason != "1/1 ExclusiveDeviceAllocateConflict" {
		t.Errorf("mutex: %v %q", ok, reason)
	}
	// A GPU with no cores or memory at all never divides by zero.
	zero := devicesOf(2)
	zero[0].Devcore, zero[0].Devmem, zero[1].Count = 0, 0, 0
	if _, reason, ok := Fit(WithUsage(zero, nil), one(1, 0), nil, nil, Config{}); ok || reason != "1/2 CardInsufficientMemory, 1/2 CardTimeSlicingExhausted" {
		t.Errorf("zero totals: %v %q", ok, reason)
	}
}

// Fit does not change the devices it is given, and the pod's containers add up.
func TestFitTwoContainers(t *testing.T) {
	t.Parallel()
	devs := WithUsage(devicesOf(2), nil)
	before := append([]DeviceUsage(nil), devs...)
	req := PodRequest{Containers: []Request{one(6000, 0).Containers[0], one(6000, 0).Containers[0]}}
	pd, _, ok := Fit(devs, req, nil, nil, Config{})
	if !ok || pd[0][0].UUID == pd[1][0].UUID {
		t.Fatalf("two 6000 MiB containers on 10000 MiB GPUs: %v %v", ok, pd)
	}
	if diff := cmp.Diff(before, devs); diff != "" {
		t.Errorf("Fit changed its input:\n%s", diff)
	}
}

func TestScheduleTiesAndPolicies(t *testing.T) {
	t.Parallel()
	nodes := func() []Node {
		return []Node{
			{Name: "n3", Devices: WithUsage(devicesOf(1), nil)},
			{Name: "n1", Devices: WithUsage(devicesOf(1), nil)},
			{Name: "busy", Devices: WithUsage(devicesOf(1), map[string]Usage{"GPU-a": {Used: 1, Usedmem: 1000, Usedcores: 10}})},
			{Name: "full", Devices: WithUsage(devicesOf(1), map[string]Usage{"GPU-a": {Used: 10}})},
		}
	}
	d := Schedule(nodes(), one(100, 1), nil, Config{})
	if d.Node != "busy" || d.Failed["full"] != "1/1 CardTimeSlicingExhausted" || len(d.Scores) != 3 {
		t.Errorf("binpack: %+v", d)
	}
	d = Schedule(nodes(), one(100, 1), map[string]string{KeyNodeSchedulerPolicy: "spread"}, Config{})
	if d.Node != "n1" {
		t.Errorf("spread with a tie between n1 and n3 chose %q, want n1 (name order)", d.Node)
	}
	if got := EncodePodDevices(d.Devices); got != "GPU-a,NVIDIA,100,1:;" {
		t.Errorf("devices %q", got)
	}
	if d := Schedule(nil, one(1, 1), nil, Config{}); d.Node != "" {
		t.Errorf("no nodes: %+v", d)
	}
	if s := NodeScore(nil); s != 0 {
		t.Errorf("NodeScore(nil) = %v", s)
	}
}

func TestUsage(t *testing.T) {
	t.Parallel()
	pd := PodDevices{{{UUID: "GPU-a", Usedmem: 10, Usedcores: 5}, {UUID: "GPU-b[1-2]", Usedmem: 1}}, {}, {{UUID: "GPU-a", Usedmem: 2147483647}}}
	got := pd.Usage()
	want := map[string]Usage{"GPU-a": {Used: 2, Usedmem: 2147483657, Usedcores: 5}, "GPU-b": {Used: 1, Usedmem: 1}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if back := got["GPU-a"].Sub(Usage{Used: 2, Usedmem: 2147483657, Usedcores: 5}); back != (Usage{}) {
		t.Errorf("Sub = %+v", back)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{KeyNode: "n1", annotation.KeyNVIDIAAllocated: "GPU-a,NVIDIA,1,1:;"}}}
	for phase, counts := range map[corev1.PodPhase]bool{corev1.PodPending: true, corev1.PodRunning: true, corev1.PodSucceeded: false, corev1.PodFailed: false} {
		pod.Status.Phase = phase
		if node, ok := PodNode(pod); ok != counts || (ok && node != "n1") {
			t.Errorf("%s: PodNode = %q, %v", phase, node, ok)
		}
	}
	if _, ok := PodNode(&corev1.Pod{}); ok {
		t.Error("a pod without hami.io/vgpu-node counts")
	}
	if pd, ok, err := Allocated(pod, annotation.NVIDIA(), VersionMaster); !ok || err != nil || len(pd) != 1 {
		t.Errorf("Allocated = %v %v %v", pd, ok, err)
	}
	if _, ok, _ := Allocated(pod, annotation.Vendor{Name: "x"}, VersionMaster); ok {
		t.Error("a vendor without a key has an allocation")
	}
}

func TestContainerAt(t *testing.T) {
	t.Parallel()
	pod := &corev1.Pod{Spec: corev1.PodSpec{InitContainers: []corev1.Container{{Name: "i"}}, Containers: []corev1.Container{{Name: "a"}, {Name: "b"}}}}
	for i, want := range []string{"i", "a", "b"} {
		if c, ok := ContainerAt(pod, i); !ok || c.Name != want {
			t.Errorf("ContainerAt(%d) = %v, %v", i, c, ok)
		}
	}
	for _, i := range []int{-1, 3} {
		if _, ok := ContainerAt(pod, i); ok {
			t.Errorf("ContainerAt(%d) found a container", i)
		}
	}
}

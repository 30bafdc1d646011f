package allocation_test

import (
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
)

// acmeVendor is a vendor HAMi does not know, with memory and core resources.
func acmeVendor() annotation.Vendor {
	v := annotation.NewVendor("ACME", "acme.example/npu")
	v.ResourceMemoryName, v.ResourceCoreName = "acme.example/npu-memory", "acme.example/npu-cores"
	return v
}

func TestConfigFor(t *testing.T) {
	base := allocation.Config{GPUSchedulerPolicy: allocation.PolicyBinpack, DefaultMemory: 1024, Version: allocation.VersionV290}
	nv, err := allocation.ConfigFor(annotation.NVIDIA(), base)
	want, _ := base.WithDefaults()
	if err != nil || nv != want {
		t.Errorf("ConfigFor(NVIDIA) = %+v, %v; want the base config completed %+v", nv, err, want)
	}
	acme, err := allocation.ConfigFor(acmeVendor(), base)
	if err != nil {
		t.Fatalf("ConfigFor(ACME): %v", err)
	}
	if acme.Vendor != "ACME" || acme.ResourceCount != "acme.example/npu" || acme.ResourceMemory != "acme.example/npu-memory" ||
		acme.ResourceCores != "acme.example/npu-cores" || acme.ResourceMemoryPercentage != "" || acme.DefaultMemory != 0 ||
		acme.GPUSchedulerPolicy != allocation.PolicyBinpack || acme.Version != allocation.VersionV290 {
		t.Errorf("ConfigFor(ACME) = %+v: want ACME's names, base's policies and version, none of NVIDIA's settings", acme)
	}
	// Vendors HAMi fits with rules of their own are refused, never fitted generically.
	dcu := annotation.Vendors()[1]
	for _, v := range []annotation.Vendor{annotation.Ascend("Ascend910B3"), annotation.Iluvatar("BI-V150"), dcu} {
		_, err := allocation.ConfigFor(v, base)
		if !errors.Is(err, allocation.ErrVendorRules) || !strings.Contains(err.Error(), "rules of its own") {
			t.Errorf("ConfigFor(%s) = %v, want ErrVendorRules", v.Name, err)
		}
	}
	if _, err := allocation.ConfigFor(annotation.Vendor{Name: "X"}, base); !errors.Is(err, allocation.ErrInvalidConfig) {
		t.Errorf("ConfigFor(no resource) = %v, want ErrInvalidConfig", err)
	}
	bad := acme
	bad.MemoryFactor = 2
	if _, err := bad.WithDefaults(); !errors.Is(err, allocation.ErrInvalidConfig) {
		t.Errorf("ACME with a memory factor: %v, want ErrInvalidConfig (NVIDIA's setting)", err)
	}
}

func TestGenericRequests(t *testing.T) {
	acme, err := allocation.ConfigFor(acmeVendor(), allocation.Config{})
	if err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{allocation.KeyUseGPUType: "H100"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{
			{Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
				"acme.example/npu": resource.MustParse("2"), "acme.example/npu-memory": resource.MustParse("3000"), "acme.example/npu-cores": resource.MustParse("30"),
			}}},
			{Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"acme.example/npu": resource.MustParse("1")}}},
			{Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1"), "nvidia.com/gpumem": resource.MustParse("10")}}},
		}},
	}
	got := allocation.Requests(pod, acme).Containers
	want := []allocation.Request{
		{Count: 2, Type: "ACME", Memory: 3000, MemoryPercentage: allocation.PercentageUnset, Cores: 30},
		{Count: 1, Type: "ACME", MemoryPercentage: 100}, // no memory asked: the whole device
		{},
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("container %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	// An invalid vendor config asks for nothing; it never reads NVIDIA's names instead.
	if r := allocation.Requests(pod, allocation.Config{Vendor: "ACME"}); r.Any() {
		t.Errorf("invalid ACME config read %+v", r)
	}

	devs := func() []allocation.DeviceUsage {
		return allocation.WithUsage([]annotation.Device{
			{ID: "npu-0", Count: 4, Devmem: 4000, Devcore: 100, Type: "ACME-NPU", Health: true},
			{ID: "npu-1", Count: 4, Devmem: 4000, Devcore: 100, Type: "ACME-NPU", Health: true},
		}, nil)
	}
	// NVIDIA's type selector does not apply to ACME's devices; both containers fit.
	req := allocation.Requests(pod, acme)
	if _, reason, ok := allocation.Fit(devs(), req, pod.Annotations, nil, acme); ok || reason != "2/2 CardInsufficientMemory" {
		t.Errorf("a whole device after 3000 MiB on both: %q, %v; want CardInsufficientMemory", reason, ok)
	}
	req.Containers[1].Memory, req.Containers[1].MemoryPercentage = 1000, allocation.PercentageUnset
	pd, reason, ok := allocation.Fit(devs(), req, pod.Annotations, nil, acme)
	if !ok || len(pd[0]) != 2 || pd[0][0].Type != "ACME" || pd[0][0].Usedmem != 3000 || len(pd[1]) != 1 || pd[1][0].Usedmem != 1000 {
		t.Fatalf("Fit = %v, %q, %v", pd, reason, ok)
	}
	// The common rules: memory, and a cordoned device.
	big := allocation.PodRequest{Containers: []allocation.Request{{Count: 1, Type: "ACME", Memory: 5000, MemoryPercentage: allocation.PercentageUnset}}}
	if _, reason, ok := allocation.Fit(devs(), big, nil, nil, acme); ok || reason != "2/2 CardInsufficientMemory" {
		t.Errorf("5000 MiB on 4000 MiB devices: %q, %v", reason, ok)
	}
	one := allocation.PodRequest{Containers: []allocation.Request{{Count: 1, Type: "ACME", Memory: 100, MemoryPercentage: allocation.PercentageUnset}}}
	pd, _, ok = allocation.Fit(devs(), one, nil, map[string]string{allocation.KeyDeviceCordon: "npu-0,npu-1"}, acme)
	if ok {
		t.Errorf("cordoned devices fitted: %v", pd)
	}
}

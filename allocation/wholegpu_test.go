package allocation_test

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/hamireg/hamireg/allocation"
)

func TestWholeGPUs(t *testing.T) {
	t.Parallel()
	ctr := func(limits ...string) corev1.Container {
		l := corev1.ResourceList{}
		for i := 0; i+1 < len(limits); i += 2 {
			l[corev1.ResourceName(limits[i])] = resource.MustParse(limits[i+1])
		}
		return corev1.Container{Name: "c", Resources: corev1.ResourceRequirements{Limits: l}}
	}
	tests := map[string]struct {
		init, ctrs []corev1.Container
		cfg        allocation.Config
		whole      bool
		shared     string
	}{
		"count only":                 {ctrs: []corev1.Container{ctr("nvidia.com/gpu", "1")}, whole: true},
		"two GPUs":                   {ctrs: []corev1.Container{ctr("nvidia.com/gpu", "2")}, whole: true},
		"webhook's cores 100":        {ctrs: []corev1.Container{ctr("nvidia.com/gpu", "1", "nvidia.com/gpucores", "100")}, whole: true},
		"percentage 100":             {ctrs: []corev1.Container{ctr("nvidia.com/gpu", "1", "nvidia.com/gpumem-percentage", "100")}, whole: true},
		"memory":                     {ctrs: []corev1.Container{ctr("nvidia.com/gpu", "1", "nvidia.com/gpumem", "3000")}, shared: "nvidia.com/gpumem"},
		"cores 30":                   {ctrs: []corev1.Container{ctr("nvidia.com/gpu", "1", "nvidia.com/gpucores", "30")}, shared: "nvidia.com/gpucores"},
		"percentage 100 over memory": {ctrs: []corev1.Container{ctr("nvidia.com/gpu", "1", "nvidia.com/gpumem", "3000", "nvidia.com/gpumem-percentage", "100")}, whole: true},
		"percentage 50":              {ctrs: []corev1.Container{ctr("nvidia.com/gpu", "1", "nvidia.com/gpumem-percentage", "50")}, shared: "nvidia.com/gpumem-percentage"},
		"second container shares":    {ctrs: []corev1.Container{ctr("nvidia.com/gpu", "1"), ctr("nvidia.com/gpu", "1", "nvidia.com/gpumem", "10")}, shared: "nvidia.com/gpumem"},
		"init container shares":      {init: []corev1.Container{ctr("nvidia.com/gpu", "1", "nvidia.com/gpucores", "10")}, ctrs: []corev1.Container{ctr("nvidia.com/gpu", "1")}, shared: "nvidia.com/gpucores"},
		"no GPU":                     {ctrs: []corev1.Container{ctr("cpu", "1")}},
		"memory without a count":     {ctrs: []corev1.Container{ctr("nvidia.com/gpumem", "10"), ctr("nvidia.com/gpu", "1")}, whole: true},
		"count 0":                    {ctrs: []corev1.Container{ctr("nvidia.com/gpu", "0", "nvidia.com/gpumem", "10")}},
		"chart's default memory":     {ctrs: []corev1.Container{ctr("nvidia.com/gpu", "1")}, cfg: allocation.Config{DefaultMemory: 1000}, whole: true},
		"renamed memory resource":    {ctrs: []corev1.Container{ctr("nvidia.com/gpu", "1", "example.com/mem", "10")}, cfg: allocation.Config{ResourceMemory: "example.com/mem"}, shared: "example.com/mem"},
		"requests when no limits":    {ctrs: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1"), "nvidia.com/gpucores": resource.MustParse("50")}}}}, shared: "nvidia.com/gpucores"},
	}
	for name, tc := range tests {
		pod := &corev1.Pod{Spec: corev1.PodSpec{InitContainers: tc.init, Containers: tc.ctrs}}
		whole, shared := allocation.WholeGPUs(pod, tc.cfg)
		if whole != tc.whole || shared != tc.shared {
			t.Errorf("%s: (%t, %q), want (%t, %q)", name, whole, shared, tc.whole, tc.shared)
		}
	}
	if whole, shared := allocation.WholeGPUs(nil, allocation.Config{}); whole || shared != "" {
		t.Errorf("nil pod: (%t, %q)", whole, shared)
	}
}

package monitor_test

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/hamireg/hamireg/monitor"
)

// The priority a pod spec gives a container, which HAMi-core should hold in its region.
func ExampleSpecPriority() {
	high := corev1.Container{Name: "train", Resources: corev1.ResourceRequirements{
		Limits: corev1.ResourceList{"nvidia.com/priority": resource.MustParse("0")}}}
	byEnv := corev1.Container{Name: "batch", Env: []corev1.EnvVar{{Name: monitor.EnvTaskPriority, Value: "2"}}}
	plain := corev1.Container{Name: "web"}
	for _, c := range []corev1.Container{high, byEnv, plain} {
		fmt.Println(c.Name, monitor.SpecPriority(&c))
	}
	// Output:
	// train 0
	// batch 2
	// web 1
}

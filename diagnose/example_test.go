package diagnose_test

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/hamireg/hamireg/diagnose"
)

// A GPU node without the gpu=on label that HAMi's chart puts in the device plugin
// DaemonSet's nodeSelector gets no plugin Pod: case 1, and the fix is one kubectl command.
func ExampleNode() {
	client := fake.NewClientset(
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-7"}},
		pluginDaemonSet(), // the chart's DaemonSet: nodeSelector gpu=on
	)
	r, err := diagnose.Node(context.Background(), client, "gpu-7", diagnose.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(r.Case)
	f, _ := r.Finding(diagnose.CodeNodeSelectorMismatch)
	fmt.Println(f.Fix[0])
	// Output:
	// case 1: device plugin not scheduled on the node
	// kubectl label node gpu-7 gpu=on
}

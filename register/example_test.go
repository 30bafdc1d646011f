package register_test

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/register"
)

func ExampleWriter_Sync() {
	ctx := context.Background()
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name: "gpu-1", Annotations: map[string]string{"owner": "ops"},
	}})
	w, err := register.New(client, "gpu-1", register.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(w.Sync(ctx)) // nothing set yet
	// In a device plugin the devices come from the NVML scan; here two GPUs out of order.
	w.SetDevices([]annotation.Device{
		{ID: "GPU-b", Index: 1, Count: 10, Devmem: 23028, Devcore: 100, Type: "NVIDIA-A10", Mode: "hami-core", Health: true},
		{ID: "GPU-a", Index: 0, Count: 10, Devmem: 23028, Devcore: 100, Type: "NVIDIA-A10", Mode: "hami-core", Health: true},
	})
	for range 3 { // one write, then nothing to do
		if err := w.Sync(ctx); err != nil {
			fmt.Println(err)
			return
		}
	}
	node, _ := client.CoreV1().Nodes().Get(ctx, "gpu-1", metav1.GetOptions{})
	fmt.Println(node.Annotations[w.Key()])
	fmt.Println(node.Annotations["owner"])
	s := w.Stats()
	fmt.Printf("writes=%d noops=%d in sync=%v\n", s.Writes, s.NoOps, w.InSync())
	// Output:
	// sync register annotation of node "gpu-1": no devices set
	// [{"id":"GPU-a","count":10,"devmem":23028,"devcore":100,"type":"NVIDIA-A10","mode":"hami-core","health":true},{"id":"GPU-b","index":1,"count":10,"devmem":23028,"devcore":100,"type":"NVIDIA-A10","mode":"hami-core","health":true}]
	// ops
	// writes=1 noops=2 in sync=true
}

// The package documentation's usage snippet, compiled.
func ExampleNew() {
	run := func(ctx context.Context, clientset kubernetes.Interface, devices []annotation.Device) error {
		// snippet: doc
		name, err := register.NodeNameFromEnv(ctx, nil)
		if err != nil {
			return err // NODE_NAME unset: fix the DaemonSet, do not retry
		}
		w, err := register.New(clientset, name, register.Options{Registerer: prometheus.DefaultRegisterer})
		if err != nil {
			return err
		}
		w.SetDevices(devices) // and again after every scan that may have changed them
		return w.Run(ctx)     // until ctx is done
		// end snippet
	}
	_ = run
}

func ExampleNodeNameFromEnv() {
	env := map[string]string{"NodeName": "gpu-7"} // a chart older than v2.3.10
	name, err := register.NodeNameFromEnv(context.Background(), func(k string) string { return env[k] })
	fmt.Println(name, err)

	_, err = register.NodeNameFromEnv(context.Background(), func(string) string { return "" })
	fmt.Println(err)
	// Output:
	// gpu-7 <nil>
	// resolve node name: neither NODE_NAME nor NodeName is set (set NODE_NAME from the downward API field spec.nodeName): node name not set
}

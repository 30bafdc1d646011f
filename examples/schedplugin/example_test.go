package schedplugin_test

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/examples/schedplugin"
)

// cycleState is the part of the scheduler's CycleState the plugin uses.
type cycleState struct {
	fwk.CycleState
	data map[fwk.StateKey]fwk.StateData
}

func (c *cycleState) Read(k fwk.StateKey) (fwk.StateData, error) {
	if d, ok := c.data[k]; ok {
		return d, nil
	}
	return nil, fwk.ErrNotFound
}

func (c *cycleState) Write(k fwk.StateKey, d fwk.StateData) { c.data[k] = d }

// nodeInfo is the part of the scheduler's NodeInfo the plugin uses.
type nodeInfo struct {
	fwk.NodeInfo
	node *corev1.Node
}

func (n nodeInfo) Node() *corev1.Node { return n.node }

// Example_wire compiles the package documentation's snippet.
func Example_wire() {
	wire := func(client kubernetes.Interface, factory informers.SharedInformerFactory) error {
		// snippet: doc
		p, err := schedplugin.New(client, schedplugin.Options{})
		if err != nil {
			return err
		}
		if _, err := factory.Core().V1().Pods().Informer().AddEventHandler(p.PodHandler()); err != nil {
			return err
		}
		if _, err := factory.Core().V1().ResourceQuotas().Informer().AddEventHandler(p.QuotaHandler()); err != nil {
			return err
		}
		// app.NewSchedulerCommand(app.WithPlugin(schedplugin.Name, func(...) { return p, nil }))
		// end snippet
		return nil
	}
	_ = wire
	// Output:
}

// Example runs one pod through the plugin's extension points under a namespace quota of
// 4000 MiB: the first pod of 3000 MiB is reserved, a second does not fit the quota until the
// first is unreserved.
func Example() {
	ctx := context.Background()
	gpus := []annotation.Device{{ID: "GPU-0", Count: 10, Devmem: 23028, Devcore: 100, Type: "NVIDIA-A10", Mode: "hami-core", Health: true}}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node1", Annotations: map[string]string{annotation.KeyNVIDIARegister: annotation.Encode(gpus)}}}
	pod := func(name string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
				"nvidia.com/gpu": resource.MustParse("1"), "nvidia.com/gpumem": resource.MustParse("3000")}}}}}}
	}
	a, b := pod("a"), pod("b")
	client := fake.NewClientset(node, a, b)
	p, err := schedplugin.New(client, schedplugin.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	p.Tracker().SetQuota(&corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "gpu"},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{"limits.nvidia.com/gpumem": resource.MustParse("4000")}}})

	schedule := func(pod *corev1.Pod) *cycleState {
		cs := &cycleState{data: map[fwk.StateKey]fwk.StateData{}}
		if _, st := p.PreFilter(ctx, cs, pod, nil); !st.IsSuccess() {
			fmt.Println(pod.Name, "prefilter:", st.Reasons())
			return cs
		}
		if st := p.Filter(ctx, cs, pod, nodeInfo{node: node}); !st.IsSuccess() {
			fmt.Println(pod.Name, "filter:", st.Reasons())
			return cs
		}
		if st := p.Reserve(ctx, cs, pod, "node1"); !st.IsSuccess() {
			fmt.Println(pod.Name, "reserve:", st.Reasons())
			return cs
		}
		fmt.Println(pod.Name, "reserved; prebind:", p.PreBind(ctx, cs, pod, "node1").IsSuccess())
		return cs
	}
	csA := schedule(a)
	schedule(b)
	p.Unreserve(ctx, csA, a, "node1") // say a's bind failed
	schedule(b)
	got, _ := client.CoreV1().Pods("team-a").Get(ctx, "b", metav1.GetOptions{})
	fmt.Println(got.Annotations[allocation.KeyNode], got.Annotations[annotation.KeyNVIDIAAllocated])
	// Output:
	// a reserved; prebind: true
	// b filter: [1/1 ResourceQuotaNotFit]
	// b reserved; prebind: true
	// node1 GPU-0,NVIDIA,3000,0:;
}

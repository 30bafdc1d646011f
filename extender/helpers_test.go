package extender

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"
	clocktesting "k8s.io/utils/clock/testing"

	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/schedcache"
)

// TestMain fails the package if any test leaves a goroutine behind: Run joins what it starts.
// The benchmarks' shared cluster is stopped first.
func TestMain(m *testing.M) {
	code := m.Run()
	stopBench()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

var t0 = time.Date(2026, 5, 19, 9, 0, 0, 0, time.UTC)

// gpus returns n GPUs of a node as a device plugin registers them.
func gpus(node string, n int, devmem int32) []annotation.Device {
	out := make([]annotation.Device, n)
	for i := range out {
		out[i] = annotation.Device{ID: fmt.Sprintf("GPU-%s-%d", node, i), Index: uint(i), Count: 10, Devmem: devmem, Devcore: 100,
			Type: "NVIDIA-A10", Mode: "hami-core", Health: true}
	}
	return out
}

// gpuNode is a node with its register annotation set to register ("" = absent) and n GPUs
// allocatable ×10.
func gpuNode(name, register string, n int) *corev1.Node {
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name), Annotations: map[string]string{}},
		Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{
			annotation.ResourceNVIDIAGPU: *resource.NewQuantity(int64(n*10), resource.DecimalSI)}},
	}
	if register != "" {
		node.Annotations[annotation.KeyNVIDIARegister] = register
	}
	return node
}

func registered(name string, n int, devmem int32) *corev1.Node {
	return gpuNode(name, annotation.Encode(gpus(name, n, devmem)), n)
}

// gpuPod is a pending pod whose one container asks for limits.
func gpuPod(name string, limits map[string]string) *corev1.Pod {
	rl := corev1.ResourceList{}
	for k, v := range limits {
		rl[corev1.ResourceName(k)] = resource.MustParse(v)
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("uid-" + name)},
		Spec:       corev1.PodSpec{SchedulerName: DefaultSchedulerName, Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Limits: rl}}}},
		Status:     corev1.PodStatus{Phase: corev1.PodPending},
	}
}

// placedPod is a running pod that HAMi placed on node with the devices value.
func placedPod(name, node, devices string) *corev1.Pod {
	p := gpuPod(name, map[string]string{"nvidia.com/gpu": "1"})
	p.Annotations = map[string]string{allocation.KeyNode: node, "hami.io/vgpu-devices-allocated": devices, "hami.io/vgpu-devices-to-allocate": devices}
	p.Spec.NodeName = node
	p.Status.Phase = corev1.PodRunning
	return p
}

// env is an extender over a fake cluster, running inside the test's synctest bubble.
type env struct {
	t       *testing.T
	ctx     context.Context
	client  *fake.Clientset
	clock   *clocktesting.FakeClock
	rec     *record.FakeRecorder
	cache   *schedcache.Cache
	ext     *Extender
	factory informers.SharedInformerFactory
}

// setup creates the extender without starting anything; add reactors, then call run.
func setup(t *testing.T, opts Options, objs ...runtime.Object) *env {
	t.Helper()
	return setupWith(t, opts, false, objs...)
}

// setupWith is setup; with classes the extender reads the DeviceClasses of the env's factory
// (Options.DeviceClasses).
func setupWith(t *testing.T, opts Options, classes bool, objs ...runtime.Object) *env {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	e := &env{t: t, ctx: ctx, client: fake.NewClientset(objs...), clock: clocktesting.NewFakeClock(t0), rec: record.NewFakeRecorder(100)}
	e.client.PrependReactor("create", "pods", bindingReactor(e.client.Tracker()))
	factory := informers.NewSharedInformerFactory(e.client, 0)
	var vendors []annotation.Vendor // the cache tracks the extender's vendor (nil: NVIDIA)
	if opts.Vendor.Name != "" {
		vendors = []annotation.Vendor{opts.Vendor}
	}
	c, err := schedcache.New(factory.Core().V1().Nodes(), schedcache.Options{Clock: e.clock, Vendors: vendors})
	if err != nil {
		t.Fatal(err)
	}
	e.cache = c
	if opts.Clock == nil {
		opts.Clock = e.clock
	}
	if opts.EventRecorder == nil {
		opts.EventRecorder = e.rec
	}
	opts.Pods = factory.Core().V1().Pods()
	if opts.Nodes == nil {
		opts.Nodes = factory.Core().V1().Nodes().Lister()
	}
	if classes {
		opts.DeviceClasses = factory.Resource().V1().DeviceClasses()
	}
	if e.ext, err = New(e.client, c, opts); err != nil {
		t.Fatal(err)
	}
	e.factory = factory
	return e
}

// run starts the informers, the cache and the extender, and waits until the extender is ready.
// Reactors must be added before: the fake clientset does not synchronise them with its use.
func (e *env) run() {
	e.t.Helper()
	ctx, cancel := context.WithCancel(e.ctx)
	e.ctx = ctx
	done := make(chan error, 2)
	e.factory.Start(ctx.Done())
	go func() { done <- e.cache.Run(ctx) }()
	go func() { done <- e.ext.Run(ctx) }()
	e.t.Cleanup(func() {
		cancel()
		for range 2 {
			if err := <-done; err != nil {
				e.t.Errorf("Run: %v", err)
			}
		}
		e.factory.Shutdown()
	})
	e.ready()
}

// start is setup and run.
func start(t *testing.T, opts Options, objs ...runtime.Object) *env {
	t.Helper()
	e := setup(t, opts, objs...)
	e.run()
	return e
}

// ready lets fake time pass until the extender is ready (the informers' first sync).
func (e *env) ready() {
	e.t.Helper()
	select {
	case <-e.ext.Ready():
	case <-time.After(10 * time.Second):
		e.t.Fatal("extender not ready after 10 s of the bubble's time")
	}
	synctest.Wait()
}

func (e *env) filter(pod *corev1.Pod, nodes ...string) *extenderFilterResult {
	e.t.Helper()
	return e.ext.Filter(e.ctx, &extenderArgs{Pod: pod, NodeNames: &nodes})
}

// pod returns a pod as the API has it.
func (e *env) pod(name string) *corev1.Pod {
	e.t.Helper()
	p, err := e.client.CoreV1().Pods("default").Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return p
}

// create adds a pod through the API and waits for the informer.
func (e *env) create(p *corev1.Pod) {
	e.t.Helper()
	if _, err := e.client.CoreV1().Pods(p.Namespace).Create(e.ctx, p, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	synctest.Wait()
}

// actions lists the fake clientset's writes as "verb resource[/sub] name body".
func (e *env) writes() []string {
	var out []string
	for _, a := range e.client.Actions() {
		switch a := a.(type) {
		case k8stesting.PatchAction:
			out = append(out, fmt.Sprintf("patch %s %s %s", a.GetResource().Resource, a.GetName(), a.GetPatch()))
		case k8stesting.CreateAction:
			res := a.GetResource().Resource
			if a.GetSubresource() != "" {
				res += "/" + a.GetSubresource()
			}
			obj, _ := json.Marshal(a.GetObject())
			if b, ok := a.GetObject().(*corev1.Binding); ok {
				obj = []byte(b.Name + "->" + b.Target.Name)
				if len(b.Annotations) > 0 {
					ann, _ := json.Marshal(b.Annotations)
					obj = append(append(obj, ' '), ann...)
				}
			}
			out = append(out, fmt.Sprintf("create %s %s", res, obj))
		}
	}
	return out
}

func (e *env) events() []string {
	var out []string
	for {
		select {
		case ev := <-e.rec.Events:
			out = append(out, ev)
		default:
			return out
		}
	}
}

type (
	extenderArgs         = extenderv1.ExtenderArgs
	extenderFilterResult = extenderv1.ExtenderFilterResult
)

type bindingArgs = extenderv1.ExtenderBindingArgs

var metaGet = metav1.GetOptions{}

func newNodeInformer(client *fake.Clientset) coreinformers.NodeInformer {
	return informers.NewSharedInformerFactory(client, 0).Core().V1().Nodes()
}

var errBindingFails = errors.New("binding refused")

// bindingReactor does what the API server does with a pods/binding: it sets the pod's
// spec.nodeName and merges the Binding's annotations into the pod's.
func bindingReactor(tracker k8stesting.ObjectTracker) k8stesting.ReactionFunc {
	return func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "binding" {
			return false, nil, nil
		}
		b, ok := a.(k8stesting.CreateAction).GetObject().(*corev1.Binding)
		if !ok {
			return true, nil, fmt.Errorf("binding of type %T", a.(k8stesting.CreateAction).GetObject())
		}
		gvr := corev1.SchemeGroupVersion.WithResource("pods")
		obj, err := tracker.Get(gvr, b.Namespace, b.Name)
		if err != nil {
			return true, nil, err
		}
		pod := obj.(*corev1.Pod).DeepCopy()
		if pod.Spec.NodeName != "" {
			return true, nil, apierrors.NewConflict(gvr.GroupResource(), b.Name, fmt.Errorf("pod %s is already assigned to node %q", b.Name, pod.Spec.NodeName))
		}
		pod.Spec.NodeName = b.Target.Name
		if len(b.Annotations) > 0 && pod.Annotations == nil {
			pod.Annotations = map[string]string{}
		}
		maps.Copy(pod.Annotations, b.Annotations)
		return true, b, tracker.Update(gvr, pod, b.Namespace)
	}
}

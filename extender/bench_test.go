package extender

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	goruntime "runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/schedcache"
)

const (
	benchGPUs = 8
	// benchPodsPerNode pods are placed per node before the benchmark: 20,000 on 5000 nodes.
	benchPodsPerNode = 4
)

// benchSizes are the cluster sizes the benchmarks run on, in nodes.
var benchSizes = []int{5000, 15000}

// benchNode is a GPU node as a real cluster stores it (kubelet labels and annotations, managed
// fields, conditions, 50 images) with 8 H100s registered: what HAMi's informer holds and copies.
func benchNode(name string) *corev1.Node {
	devs := make([]annotation.Device, benchGPUs)
	for i := range devs {
		devs[i] = annotation.Device{ID: fmt.Sprintf("GPU-%s-%04d-5c4e-8c3d-2f1a9b7c%04d", name, i, i), Index: uint(i), Count: 10,
			Devmem: 81559, Devcore: 100, Type: "NVIDIA-NVIDIA H100 80GB HBM3", Numa: i / 4, Mode: "hami-core", Health: true}
	}
	images := make([]corev1.ContainerImage, 50)
	for i := range images {
		images[i] = corev1.ContainerImage{Names: []string{
			fmt.Sprintf("registry.example.com/team-%02d/service-image@sha256:%064x", i, i*7919),
			fmt.Sprintf("registry.example.com/team-%02d/service-image:v1.%d.0", i, i)}, SizeBytes: int64(100_000_000 + i)}
	}
	var conditions []corev1.NodeCondition
	for _, c := range []corev1.NodeConditionType{"MemoryPressure", "DiskPressure", "PIDPressure", corev1.NodeReady} {
		conditions = append(conditions, corev1.NodeCondition{Type: c, Status: corev1.ConditionFalse, Reason: "Kubelet" + string(c),
			Message: "kubelet reports " + string(c), LastHeartbeatTime: metav1.Time{Time: t0}, LastTransitionTime: metav1.Time{Time: t0}})
	}
	fields := metav1.ManagedFieldsEntry{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1",
		FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(`{"f:metadata":{"f:annotations":{}},"f:status":{"f:conditions":{},"f:images":{}}}`)}
	res := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("192"), corev1.ResourceMemory: resource.MustParse("2063937500Ki"),
		corev1.ResourcePods: resource.MustParse("110"), annotation.ResourceNVIDIAGPU: *resource.NewQuantity(benchGPUs*10, resource.DecimalSI)}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name), ResourceVersion: "123456789",
			Labels: map[string]string{"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "node.kubernetes.io/instance-type": "p5.48xlarge",
				"topology.kubernetes.io/zone": "eu-west-1a", "nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
			Annotations: map[string]string{annotation.KeyNVIDIARegister: annotation.Encode(devs),
				annotation.KeyNVIDIAHandshake: "Requesting_2026-05-19 08:59:50", "node.alpha.kubernetes.io/ttl": "0",
				"volumes.kubernetes.io/controller-managed-attach-detach": "true", "csi.volume.kubernetes.io/nodeid": `{"ebs.csi.aws.com":"i-0123456789abcdef0"}`},
			ManagedFields: []metav1.ManagedFieldsEntry{fields, fields, fields}},
		Status: corev1.NodeStatus{Capacity: res, Allocatable: res.DeepCopy(), Conditions: conditions, Images: images,
			Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.12.34"}, {Type: corev1.NodeHostName, Address: name}}},
	}
}

// benchCluster is the benchmark's cluster of one size, built once: the nodes, 4 pods per node
// placed on them (one GPU slot, 3000 MiB and 10 % each, spread round robin), a node cache and
// an extender that have synced, with the Node lister examples/extender gives it, and the
// candidate list kube-scheduler sends (every node).
type benchCluster struct {
	nodes []*corev1.Node
	pods  []*corev1.Pod
	names []string
	ext   *Extender
	ctx   context.Context
	wg    sync.WaitGroup
	stop  func()
	// heap is what the informers, the node cache and the extender hold once synced: the live
	// heap after a GC less what it was with the fake API server's objects alone.
	heap int64
}

// stopBench stops the benchmark cluster's goroutines, if one was built.
func stopBench() {
	if bench != nil {
		bench.stop()
		bench = nil
	}
}

// bench is the cluster the running benchmark uses; one size at a time is kept.
var bench *benchCluster

func benchPod(i, nodes int, node *corev1.Node) *corev1.Pod {
	p := gpuPod(fmt.Sprintf("placed-%05d", i), map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "10"})
	devs, _ := annotation.Decode(node.Annotations[annotation.KeyNVIDIARegister])
	v := fmt.Sprintf("%s,NVIDIA,3000,10:;", devs[(i/nodes)%benchGPUs].ID)
	p.Annotations = map[string]string{allocation.KeyNode: node.Name, "hami.io/vgpu-devices-allocated": v, "hami.io/vgpu-devices-to-allocate": v}
	p.Spec.NodeName, p.Status.Phase = node.Name, corev1.PodRunning
	return p
}

// liveHeap is the live heap after a full GC.
func liveHeap() int64 {
	goruntime.GC()
	var m goruntime.MemStats
	goruntime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

func setupBench(b *testing.B, nodes int) *benchCluster {
	b.Helper()
	if bench != nil && len(bench.nodes) == nodes {
		return bench
	}
	stopBench()
	{
		bc := &benchCluster{}
		pods := nodes * benchPodsPerNode
		objs := make([]runtime.Object, 0, nodes+pods)
		for i := range nodes {
			n := benchNode(fmt.Sprintf("gpu-%05d", i))
			bc.nodes = append(bc.nodes, n)
			bc.names = append(bc.names, n.Name)
			objs = append(objs, n)
		}
		for i := range pods {
			p := benchPod(i, nodes, bc.nodes[i%nodes])
			bc.pods = append(bc.pods, p)
			objs = append(objs, p)
		}
		client := fake.NewClientset(objs...)
		before := liveHeap()
		// The filter's patch is accepted without touching the tracker: the benchmark measures
		// the extender, not the fake API server (nor a real one).
		client.PrependReactor("patch", "pods", func(k8stesting.Action) (bool, runtime.Object, error) { return true, &corev1.Pod{}, nil })
		factory := informers.NewSharedInformerFactory(client, 0)
		c, err := schedcache.New(factory.Core().V1().Nodes(), schedcache.Options{})
		if err != nil {
			b.Fatal(err)
		}
		if bc.ext, err = New(client, c, Options{Pods: factory.Core().V1().Pods(), Nodes: factory.Core().V1().Nodes().Lister()}); err != nil {
			b.Fatal(err)
		}
		// Shared by the sub-benchmarks; TestMain stops it.
		ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), klog.Background().V(10)))
		bc.ctx = ctx
		factory.Start(ctx.Done())
		bc.wg.Go(func() { _ = c.Run(ctx) })
		bc.wg.Go(func() { _ = bc.ext.Run(ctx) })
		bc.stop = func() {
			cancel()
			bc.wg.Wait()
			factory.Shutdown()
		}
		select {
		case <-bc.ext.Ready():
		case <-time.After(5 * time.Minute):
			b.Fatal("extender not ready")
		}
		bc.heap = liveHeap() - before
		bench = bc
	}
	return bench
}

func benchRequest(i int) *corev1.Pod {
	return gpuPod(fmt.Sprintf("new-%07d", i), map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "10"})
}

// BenchmarkFilter measures one /filter decision over every node of a cluster of 5000 and of
// 15,000 nodes with 8 GPUs each and 4 pods placed per node, without HTTP and with a patch the
// fake client accepts at no cost: each call places a new pod, which counts for the next one.
//
//   - hamireg: Extender.Filter, as the /filter route runs it: one snapshot of the node cache,
//     usage kept per node from pod events, a node's fit reused while its usage and the request
//     are the same, the pod assumed on its node.
//   - hamireg-nomemo: hamireg with a different request on every call, so that no fit is reused.
//   - hami-way: what HAMi's Filter does per call (spec §5.2, registration spec §5.5): deep-copy
//     every cached Node and its device list, recompute every node's usage from every pod in the
//     pod cache (decoded once, when the pod was added, as HAMi does), fit every node with the
//     same allocation.Schedule, add the pod to the pod cache, and patch it.
//
// ns/filter is the mean time per call and filter-p99-ms the 99th percentile of the calls; the
// ratio of hamireg to hami-way is the figure. heap-bytes-per-node is what the informers, the
// node cache and the extender hold once synced (the live heap after a GC, less the fake API
// server's objects), per node; for hami-way, that plus its own node and pod caches.
func BenchmarkFilter(b *testing.B) {
	for _, nodes := range benchSizes {
		b.Run(fmt.Sprintf("%dnodes/hamireg", nodes), func(b *testing.B) {
			bc := setupBench(b, nodes)
			i := 0
			benchCalls(b, bc.heap, nodes, func() {
				pod := benchRequest(i)
				i++
				res := bc.ext.Filter(bc.ctx, &extenderArgs{Pod: pod, NodeNames: &bc.names})
				if res.Error != "" || res.NodeNames == nil {
					b.Fatalf("filter: %+v", res)
				}
			})
		})
		// The same with every call asking a different amount of memory than the one before, so
		// that no node's fit is reused: what the incremental usage alone buys.
		b.Run(fmt.Sprintf("%dnodes/hamireg-nomemo", nodes), func(b *testing.B) {
			bc := setupBench(b, nodes)
			i := 0
			benchCalls(b, bc.heap, nodes, func() {
				pod := benchRequest(2_000_000 + i)
				pod.Spec.Containers[0].Resources.Limits["nvidia.com/gpumem"] = *resource.NewQuantity(int64(1000+i%1000), resource.DecimalSI)
				i++
				res := bc.ext.Filter(bc.ctx, &extenderArgs{Pod: pod, NodeNames: &bc.names})
				if res.Error != "" || res.NodeNames == nil {
					b.Fatalf("filter: %+v", res)
				}
			})
		})
		b.Run(fmt.Sprintf("%dnodes/hami-way", nodes), func(b *testing.B) {
			bc := setupBench(b, nodes)
			before := liveHeap()
			h := newHAMiWay(bc)
			heap := bc.heap + liveHeap() - before
			i := 0
			benchCalls(b, heap, nodes, func() {
				if node := h.filter(bc.ctx, benchRequest(1_000_000+i), bc.names); node == "" {
					b.Fatal("no node")
				}
				i++
			})
		})
	}
}

// benchCalls calls filter once, then in b's loop, and reports the first call's time
// (first-filter-ms), and of the calls in the loop the mean (ns/filter) and the 99th percentile
// (filter-p99-ms), and heap over nodes (heap-bytes-per-node).
func benchCalls(b *testing.B, heap int64, nodes int, filter func()) {
	b.Helper()
	start := time.Now()
	filter() // the first call after start fills what later ones reuse: reported on its own
	first := time.Since(start)
	goruntime.GC() // the garbage of the setup is not the filters'
	var took []time.Duration
	for b.Loop() {
		start := time.Now()
		filter()
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/filter")
	b.ReportMetric(float64(took[(len(took)*99-1)/100])/float64(time.Millisecond), "filter-p99-ms")
	b.ReportMetric(float64(heap)/float64(nodes), "heap-bytes-per-node")
	b.ReportMetric(float64(first)/float64(time.Millisecond), "first-filter-ms")
}

// hamiWay is HAMi v2.9.0's filter data path: a node cache of informer Node pointers with
// decoded devices, and a pod cache of decoded device lists.
type hamiWay struct {
	ext   *Extender // for its fake client and config only
	nodes map[string]*hamiNode
	pods  map[types.UID]hamiPod
}

type hamiNode struct {
	node    *corev1.Node
	devices []annotation.Device
}

type hamiPod struct {
	node    string
	devices allocation.PodDevices
}

func newHAMiWay(bc *benchCluster) *hamiWay {
	h := &hamiWay{ext: bc.ext, nodes: map[string]*hamiNode{}, pods: map[types.UID]hamiPod{}}
	for _, n := range bc.nodes {
		devs, _ := annotation.Decode(n.Annotations[annotation.KeyNVIDIARegister])
		h.nodes[n.Name] = &hamiNode{node: n, devices: devs}
	}
	for _, p := range bc.pods { // onAddPod: decoded once
		pd, _, _ := allocation.Allocated(p, annotation.NVIDIA(), allocation.VersionMaster)
		h.pods[p.UID] = hamiPod{node: p.Annotations[allocation.KeyNode], devices: pd}
	}
	return h
}

func (h *hamiWay) filter(ctx context.Context, pod *corev1.Pod, names []string) string {
	cfg := h.ext.opts.Config
	// ListNodes: a deep copy of every cached Node and device list.
	type copied struct {
		node    *corev1.Node
		devices []allocation.DeviceUsage
	}
	nodes := map[string]*copied{}
	for name, n := range h.nodes {
		c := &copied{node: n.node.DeepCopy()}
		for _, d := range n.devices {
			c.devices = append(c.devices, allocation.DeviceUsage{Device: d})
		}
		nodes[name] = c
	}
	// getNodesUsage: every pod in the pod cache, every device, matched by UUID.
	for _, p := range h.pods {
		n, ok := nodes[p.node]
		if !ok {
			continue
		}
		for _, ctr := range p.devices {
			for _, d := range ctr {
				for i := range n.devices {
					if n.devices[i].ID == d.GPU() {
						n.devices[i].Usage = n.devices[i].Add(allocation.Usage{Used: 1, Usedmem: int64(d.Usedmem), Usedcores: int64(d.Usedcores)})
					}
				}
			}
		}
	}
	var candidates []allocation.Node
	for _, name := range names {
		if n, ok := nodes[name]; ok {
			candidates = append(candidates, allocation.Node{Name: name, Devices: n.devices, Annotations: n.node.Annotations})
		}
	}
	slices.SortFunc(candidates, func(a, b allocation.Node) int { return cmp.Compare(a.Name, b.Name) })
	d := allocation.Schedule(candidates, allocation.Requests(pod, cfg), pod.Annotations, cfg)
	if d.Node == "" {
		return ""
	}
	h.pods[pod.UID] = hamiPod{node: d.Node, devices: d.Devices} // added before the patch
	value := allocation.EncodePodDevices(d.Devices)
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
		allocation.KeyNode: d.Node, allocation.KeyTime: "0", "hami.io/vgpu-devices-to-allocate": value, "hami.io/vgpu-devices-allocated": value},
		"labels": map[string]string{allocation.KeyNode: d.Node}}})
	if _, err := h.ext.client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return ""
	}
	return strings.Clone(d.Node)
}

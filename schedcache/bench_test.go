package schedcache

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/klog/v2"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/handshake"
	"github.com/hamireg/hamireg/internal/hamiwire"
)

// realisticNode is a GPU node as a real cluster stores it: kubelet labels and annotations, four
// field managers, conditions, node info, 50 images, and the register annotation of 8 GPUs
// with a handshake stamped an hour ago (the steady state: nobody refreshes it).
func realisticNode(name string) *corev1.Node {
	const gpus = 8
	q := resource.MustParse
	labelSet := map[string]string{
		"kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux", "kubernetes.io/hostname": name,
		"beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
		"node.kubernetes.io/instance-type": "p5.48xlarge", "topology.kubernetes.io/region": "eu-west-1",
		"topology.kubernetes.io/zone": "eu-west-1a", "nvidia.com/gpu.present": "true",
		"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": fmt.Sprint(gpus),
		"gpu": "on", "node-role.kubernetes.io/worker": "", "feature.node.kubernetes.io/cpu-model.vendor_id": "Intel",
		"kubernetes.azure.com/agentpool": "gpupool",
	}
	fields := func(n int) metav1.ManagedFieldsEntry {
		var b strings.Builder
		b.WriteString(`{"f:metadata":{"f:annotations":{`)
		for i := range n {
			fmt.Fprintf(&b, `"f:example.com/field-%03d":{},`, i)
		}
		b.WriteString(`".":{}}},"f:status":{"f:conditions":{"k:{\"type\":\"Ready\"}":{"f:lastHeartbeatTime":{},"f:status":{}}}}}`)
		return metav1.ManagedFieldsEntry{Manager: fmt.Sprintf("manager-%d", n), Operation: metav1.ManagedFieldsOperationUpdate,
			APIVersion: "v1", Time: &metav1.Time{Time: t0}, FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(b.String())}
	}
	images := make([]corev1.ContainerImage, 50)
	for i := range images {
		images[i] = corev1.ContainerImage{
			Names: []string{
				fmt.Sprintf("registry.example.com/team-%02d/service-image@sha256:%064x", i, i*7919),
				fmt.Sprintf("registry.example.com/team-%02d/service-image:v1.%d.0", i, i),
			},
			SizeBytes: int64(100_000_000 + i*1_000_000),
		}
	}
	conditions := []corev1.NodeCondition{}
	for _, c := range []corev1.NodeConditionType{"MemoryPressure", "DiskPressure", "PIDPressure", corev1.NodeReady, "NetworkUnavailable"} {
		conditions = append(conditions, corev1.NodeCondition{Type: c, Status: corev1.ConditionFalse, Reason: "Kubelet" + string(c),
			Message: "kubelet reports " + string(c) + " as expected", LastHeartbeatTime: metav1.Time{Time: t0}, LastTransitionTime: metav1.Time{Time: t0}})
	}
	resources := corev1.ResourceList{
		corev1.ResourceCPU: q("192"), corev1.ResourceMemory: q("2063937500Ki"), corev1.ResourceEphemeralStorage: q("7499999Mi"),
		"hugepages-1Gi": q("0"), "hugepages-2Mi": q("0"), corev1.ResourcePods: q("110"),
		corev1.ResourceName(annotation.ResourceNVIDIAGPU): *resource.NewQuantity(int64(gpus*10), resource.DecimalSI),
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, UID: types.UID("0d4a8f7e-" + name), ResourceVersion: "123456789", CreationTimestamp: metav1.Time{Time: t0},
			Labels: labelSet,
			Annotations: map[string]string{
				annotation.KeyNVIDIARegister:                              annotation.Encode(devices(gpus, name)),
				annotation.KeyNVIDIAHandshake:                             requesting(t0.Add(-time.Hour)),
				"node.alpha.kubernetes.io/ttl":                            "0",
				"volumes.kubernetes.io/controller-managed-attach-detach":  "true",
				"csi.volume.kubernetes.io/nodeid":                         `{"ebs.csi.aws.com":"i-0123456789abcdef0"}`,
				"kubeadm.alpha.kubernetes.io/cri-socket":                  "unix:///run/containerd/containerd.sock",
				"projectcalico.org/IPv4Address":                           "10.0.12.34/20",
				"nfd.node.kubernetes.io/feature-labels":                   "cpu-model.vendor_id,pci-10de.present",
				"cluster.x-k8s.io/machine":                                "gpupool-" + name,
				"alpha.kubernetes.io/provided-node-ip":                    "10.0.12.34",
				"flannel.alpha.coreos.com/public-ip":                      "10.0.12.34",
				"node.kubernetes.io/exclude-from-external-load-balancers": "true",
			},
			ManagedFields: []metav1.ManagedFieldsEntry{fields(12), fields(24), fields(6), fields(40)},
		},
		Spec: corev1.NodeSpec{PodCIDR: "10.244.3.0/24", PodCIDRs: []string{"10.244.3.0/24"}, ProviderID: "aws:///eu-west-1a/i-0123456789abcdef0",
			Taints: []corev1.Taint{{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule}}},
		Status: corev1.NodeStatus{
			Capacity: resources, Allocatable: resources.DeepCopy(), Conditions: conditions,
			Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.12.34"}, {Type: corev1.NodeHostName, Address: name}},
			NodeInfo: corev1.NodeSystemInfo{MachineID: "ec2b4c8d2f0e4d6b9a1c3e5f7a9b1c3d", SystemUUID: "ec2b4c8d-2f0e-4d6b-9a1c-3e5f7a9b1c3d",
				BootID: "5a6b7c8d-9e0f-1a2b-3c4d-5e6f7a8b9c0d", KernelVersion: "6.8.0-1015-aws", OSImage: "Ubuntu 24.04.1 LTS",
				ContainerRuntimeVersion: "containerd://2.0.2", KubeletVersion: "v1.37.2", OperatingSystem: "linux", Architecture: "amd64"},
			DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: 10250}},
			Images:          images,
		},
	}
}

// newBenchCache returns a cache whose informer store holds the nodes (not started: the store is
// filled directly) and into which every node was applied once.
func newBenchCache(tb testing.TB, nodes []*corev1.Node) (*Cache, context.Context, corev1listers.NodeLister) {
	tb.Helper()
	client := fake.NewClientset()
	factory := informers.NewSharedInformerFactory(client, 0)
	ni := factory.Core().V1().Nodes()
	c, err := New(ni, Options{Clock: clocktesting.NewFakeClock(t0), Handshake: handshake.Options{Location: time.UTC}})
	if err != nil {
		tb.Fatal(err)
	}
	store := ni.Informer().GetIndexer()
	for _, n := range nodes {
		if err := store.Add(n); err != nil {
			tb.Fatal(err)
		}
	}
	ctx := klog.NewContext(tb.Context(), logr.Discard())
	c.fullSync(ctx)
	c.cycle(ctx) // the first cycle publishes the steady reasons ("handshake expired, allocatable present")
	runtime.GC()
	return c, ctx, ni.Lister()
}

// hamiDevice is HAMi's wire struct: encoding/json on it is "the way HAMi decodes".
type hamiDevice = hamiwire.DeviceMaster

// hamiCycle is what HAMi's register loop does for NVIDIA each cycle with nothing changed: list
// the nodes from the informer, decode every annotation with encoding/json, tag the devices, run
// the handshake check (parse the time, compare) and the allocatable bookkeeping under a mutex.
// It leaves out the 12 other vendor probes and the legacy re-encoding for a V(5) log, which HAMi
// also does: the baseline is generous to HAMi.
type hamiCycle struct {
	mu       sync.Mutex
	reported map[string]int64
	cache    map[string][]*hamiDevice
}

func (h *hamiCycle) run(lister corev1listers.NodeLister, now time.Time) int {
	nodes, _ := lister.List(labels.Everything())
	registered := 0
	for _, n := range nodes {
		raw, ok := n.Annotations[annotation.KeyNVIDIARegister]
		if !ok {
			continue
		}
		var devs []*hamiDevice
		if err := json.Unmarshal([]byte(raw), &devs); err != nil || len(devs) == 0 {
			continue
		}
		for _, d := range devs {
			d.DeviceVendor = annotation.VendorNVIDIA
		}
		hs := n.Annotations[annotation.KeyNVIDIAHandshake]
		healthy := true
		if strings.Contains(hs, "Requesting") {
			_, rest, _ := strings.Cut(hs, "_")
			ts, _ := time.ParseInLocation(handshake.Layout, rest, time.UTC)
			if !now.Before(ts.Add(handshake.DefaultWindow)) {
				q := n.Status.Allocatable[corev1.ResourceName(annotation.ResourceNVIDIAGPU)]
				healthy = q.Value() > 0
			}
		}
		q := n.Status.Allocatable[corev1.ResourceName(annotation.ResourceNVIDIAGPU)]
		h.mu.Lock()
		needUpdate := h.reported[n.Name] != q.Value()
		h.reported[n.Name] = q.Value()
		h.mu.Unlock()
		if healthy {
			registered++
			if needUpdate {
				h.cache[n.Name] = devs
			}
		}
	}
	return registered
}

// BenchmarkSteadyCycle compares one steady-state cycle over 5,000 8-GPU nodes with nothing
// changed: hamireg re-evaluates the handshakes on what it decoded before; decode-all does what
// HAMi's register loop does every 15 s.
func BenchmarkSteadyCycle(b *testing.B) {
	const n = 5000
	nodes := make([]*corev1.Node, n)
	for i := range nodes {
		node := realisticNode(fmt.Sprintf("gpu-%05d", i))
		_, _ = TrimNode(node)
		nodes[i] = node
	}
	c, ctx, lister := newBenchCache(b, nodes)
	if got := c.Snapshot().Len(); got != n {
		b.Fatalf("registered %d of %d nodes", got, n)
	}
	b.Run(fmt.Sprintf("%dnodes/hamireg", n), func(b *testing.B) {
		b.ReportAllocs()
		decodes := c.Stats().Decodes
		for b.Loop() {
			c.cycle(ctx)
		}
		if c.Stats().Decodes != decodes {
			b.Fatal("the steady cycle decoded")
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/node")
	})
	b.Run(fmt.Sprintf("%dnodes/decode-all", n), func(b *testing.B) {
		b.ReportAllocs()
		h := &hamiCycle{reported: map[string]int64{}, cache: map[string][]*hamiDevice{}}
		now := t0
		for b.Loop() {
			if got := h.run(lister, now); got != n {
				b.Fatalf("registered %d of %d nodes", got, n)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/node")
	})
}

// BenchmarkHeapPerNode measures the heap that caching one realistic 8-GPU node costs: the Node
// object as the informer stores it (decoded from JSON like a watch event, trimmed by TrimNode
// or not) plus the cache's own entry. bytes/node is the total, cache-bytes/node the cache's part.
func BenchmarkHeapPerNode(b *testing.B) {
	const n = 1000
	raw := make([][]byte, n)
	for i := range raw {
		var err error
		if raw[i], err = json.Marshal(realisticNode(fmt.Sprintf("gpu-%05d", i))); err != nil {
			b.Fatal(err)
		}
	}
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	for _, trim := range []bool{true, false} {
		name := "untrimmed"
		if trim {
			name = "trimmed"
		}
		b.Run(name, func(b *testing.B) {
			var total, own float64
			for b.Loop() {
				before := heap()
				nodes := make([]*corev1.Node, n)
				for i := range nodes {
					nodes[i] = &corev1.Node{}
					if err := json.Unmarshal(raw[i], nodes[i]); err != nil {
						b.Fatal(err)
					}
					if trim {
						_, _ = TrimNode(nodes[i])
					}
				}
				client := fake.NewClientset()
				ni := informers.NewSharedInformerFactory(client, 0).Core().V1().Nodes()
				c, err := New(ni, Options{Clock: clocktesting.NewFakeClock(t0), Handshake: handshake.Options{Location: time.UTC}})
				if err != nil {
					b.Fatal(err)
				}
				for _, node := range nodes {
					if err := ni.Informer().GetIndexer().Add(node); err != nil {
						b.Fatal(err)
					}
				}
				stored := heap()
				c.fullSync(klog.NewContext(b.Context(), logr.Discard()))
				if c.Snapshot().Len() != n {
					b.Fatal("nodes not registered")
				}
				after := heap()
				total += float64(after-before) / n
				own += float64(after-stored) / n
				runtime.KeepAlive(c)
			}
			b.ReportMetric(total/float64(b.N), "bytes/node")
			b.ReportMetric(own/float64(b.N), "cache-bytes/node")
		})
	}
}

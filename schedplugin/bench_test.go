package schedplugin

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/extender"
)

const (
	benchGPUs        = 8
	benchPodsPerNode = 4
)

// BenchmarkFilterPerNode measures one pod's Filter over every node of a cluster of 5000 and of
// 15,000 nodes with 8 GPUs each and 4 pods placed per node (ns/node: the time per node).
//
//   - plugin: PreFilter, then Filter on each node's NodeInfo (its 4 pods), serially: a node's
//     fit is reused while its NodeInfo generation, registration, reservations and the request
//     are the same (the NodeInfos do not change between calls here).
//   - plugin-nomemo: every call asks a different amount of memory, so every node is fitted:
//     usage summed from the pods' annotations (decoded once per pod and resourceVersion).
//   - extender, extender-nomemo: the SDK's extender's Filter with NodeNames on the same cluster
//     (the baseline), with the same requests: its usage is kept incrementally and a node's fit
//     is reused while the node's usage and the request are the same; each call places the pod
//     (the patch is accepted by the fake client at no cost), which changes one node.
//
// kube-scheduler runs Filter on 16 goroutines; this runs it on one, as the extender's decision
// runs on one.
func BenchmarkFilterPerNode(b *testing.B) {
	request := func(i int, vary bool) *corev1.Pod {
		mem := "3000"
		if vary {
			mem = fmt.Sprint(1000 + i%1000)
		}
		return gpuPod(fmt.Sprintf("new-%07d", i), map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": mem, "nvidia.com/gpucores": "10"})
	}
	for _, nodes := range []int{5000, 15000} {
		objs, infos, names := benchCluster(nodes)
		for _, vary := range []bool{false, true} {
			suffix := ""
			if vary {
				suffix = "-nomemo"
			}
			b.Run(fmt.Sprintf("%dnodes/plugin%s", nodes, suffix), func(b *testing.B) {
				e := newEnvWith(b, nil, fake.NewClientset(objs...))
				all := make([]fwk.NodeInfo, len(infos))
				for i, ni := range infos {
					all[i] = ni
				}
				warm := request(0, false)
				for _, ni := range infos { // decode every pod once, as a running scheduler has
					e.p.Filter(e.ctx, e.preFilter(warm), warm, ni)
				}
				i := 0
				start := time.Now()
				for b.Loop() {
					pod := request(i, vary)
					i++
					cs := e.preFilterOn(pod, all)
					fits := 0
					for _, ni := range infos {
						if e.p.Filter(e.ctx, cs, pod, ni).IsSuccess() {
							fits++
						}
					}
					if fits != nodes {
						b.Fatalf("%d of %d nodes fit", fits, nodes)
					}
				}
				b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(i*nodes), "ns/node")
			})
			b.Run(fmt.Sprintf("%dnodes/extender%s", nodes, suffix), func(b *testing.B) {
				ctx, ext := benchExtender(b, objs)
				i := 0
				start := time.Now()
				for b.Loop() {
					pod := request(i, vary)
					i++
					res := ext.Filter(ctx, &extenderv1.ExtenderArgs{Pod: pod, NodeNames: &names})
					if res.Error != "" || res.NodeNames == nil {
						b.Fatalf("filter: %+v", res)
					}
				}
				b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(i*nodes), "ns/node")
			})
		}
	}
}

// benchCluster is nodes registered with 8 GPUs and 4 placed pods each, as API objects and as
// NodeInfos.
func benchCluster(nodes int) ([]runtime.Object, []*fakeNodeInfo, []string) {
	objs := make([]runtime.Object, 0, nodes*(1+benchPodsPerNode))
	infos := make([]*fakeNodeInfo, 0, nodes)
	names := make([]string, 0, nodes)
	for i := range nodes {
		name := fmt.Sprintf("gpu-%05d", i)
		devs := gpus(name, benchGPUs, 81559)
		node := gpuNode(name, devs, nil)
		ni := nodeInfo(node)
		objs = append(objs, node)
		for j := range benchPodsPerNode {
			p := placedPod(fmt.Sprintf("placed-%05d-%d", i, j), name, fmt.Sprintf("%s,NVIDIA,3000,10:;", devs[j%benchGPUs].ID))
			p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1"),
				"nvidia.com/gpumem": resource.MustParse("3000"), "nvidia.com/gpucores": resource.MustParse("10")}
			objs = append(objs, p)
			ni.pods = append(ni.pods, &fakePodInfo{pod: p})
		}
		infos = append(infos, ni)
		names = append(names, name)
	}
	return objs, infos, names
}

// benchExtender runs the SDK's extender on objs; the pod patch of its filter is accepted at no
// cost.
func benchExtender(b *testing.B, objs []runtime.Object) (context.Context, *extender.Extender) {
	b.Helper()
	client := fake.NewClientset(objs...)
	client.PrependReactor("patch", "pods", func(k8stesting.Action) (bool, runtime.Object, error) { return true, &corev1.Pod{}, nil })
	return runExtender(b, b.Context(), client, allocation.Config{}, 5*time.Minute)
}

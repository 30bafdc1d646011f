package extender

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
)

// TestFilterDifferential checks Filter, with its probes, memos and incremental usage,
// against allocation.Schedule over the same cluster with the usage recomputed from every pod
// the API holds: on random clusters (registered, unregistered and cordoned nodes, GPUs of
// every state) and random pods (one or several GPU containers, memory percentages, the pod
// annotations that steer the fit, requests no node fits, pods filtered again), the same node,
// the same devices, the same reasons and the same Events; and the probe never disagrees with
// Fit.
func TestFilterDifferential(t *testing.T) {
	t.Parallel()
	for _, version := range []allocation.Version{allocation.VersionMaster, allocation.VersionV290} {
		for seed := range uint64(3) {
			t.Run(fmt.Sprintf("%s/seed%d", version, seed), func(t *testing.T) {
				t.Parallel()
				synctest.Test(t, func(t *testing.T) { differential(t, version, seed) })
			})
		}
	}
}

func differential(t *testing.T, version allocation.Version, seed uint64) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, uint64(version)+21))
	pick := func(values ...string) string { return values[rng.IntN(len(values))] }
	cfg := allocation.Config{Version: version}
	var objs []runtime.Object
	var names, uuids []string
	nodes := map[string][]annotation.Device{}
	for i := range 4 + rng.IntN(10) {
		name := fmt.Sprintf("n%02d", i)
		names = append(names, name)
		if rng.IntN(6) == 0 {
			objs = append(objs, gpuNode(name, pick("", "[{", "[]"), 1))
			continue
		}
		devs := make([]annotation.Device, 1+rng.IntN(4))
		for j := range devs {
			devs[j] = annotation.Device{ID: fmt.Sprintf("GPU-%s-%d", name, j), Index: uint(j), Count: int32(1 + rng.IntN(10)),
				Devmem: []int32{10000, 23028, 81559}[rng.IntN(3)], Devcore: []int32{100, 100, 50}[rng.IntN(3)],
				Type: pick("NVIDIA-A10", "NVIDIA-H100"), Numa: rng.IntN(2), Mode: pick("hami-core", "hami-core", "hami-core", "mig"), Health: rng.IntN(10) != 0}
			uuids = append(uuids, devs[j].ID)
		}
		nodes[name] = devs
		n := gpuNode(name, annotation.Encode(devs), len(devs))
		if rng.IntN(5) == 0 {
			n.Annotations[allocation.KeyDeviceCordon] = devs[rng.IntN(len(devs))].ID
		}
		objs = append(objs, n)
	}
	for i := range rng.IntN(3 * len(nodes)) {
		name := names[rng.IntN(len(names))]
		devs := nodes[name]
		if devs == nil {
			continue
		}
		d := devs[rng.IntN(len(devs))]
		value := allocation.EncodePodDevices(allocation.PodDevices{{{UUID: d.ID, Type: annotation.VendorNVIDIA,
			Usedmem: rng.Int32N(d.Devmem/2 + 1), Usedcores: rng.Int32N(d.Devcore/2 + 1)}}})
		objs = append(objs, placedPod(fmt.Sprintf("placed-%d", i), name, value))
	}
	e := start(t, Options{Config: cfg}, objs...)

	var filtered []string
	probed, placed, none := 0, 0, 0
	for i := range 60 {
		var pod *corev1.Pod
		if len(filtered) > 0 && rng.IntN(8) == 0 { // filtered again: it does not count against itself
			pod = e.pod(filtered[rng.IntN(len(filtered))])
		} else {
			pod = differentialPod(rng, fmt.Sprintf("p%03d", i), uuids)
			e.create(pod)
			filtered = append(filtered, pod.Name)
		}
		req := allocation.Requests(pod, e.ext.opts.Config)
		if !req.Any() {
			continue
		}
		if _, ok := allocation.NewProbe(req, pod.Annotations, e.ext.opts.Config); ok {
			probed++
		}
		candidates := append(slices.Clone(names), "unknown")
		rng.Shuffle(len(candidates), func(a, b int) { candidates[a], candidates[b] = candidates[b], candidates[a] })
		want := scheduleFromAPI(t, e, pod, req, candidates, nodes)
		e.events()
		res := e.filter(pod, candidates...)
		if res.Error != "" {
			t.Fatalf("%s: Error = %q", pod.Name, res.Error)
		}
		events := e.events()
		if want.Node == "" {
			none++
			failed := map[string]string{} // the two maps together are HAMi's FailedNodes
			maps.Copy(failed, res.FailedNodes)
			maps.Copy(failed, res.FailedAndUnresolvableNodes)
			if res.NodeNames != nil || len(failed) != len(candidates) {
				t.Fatalf("%s: no node fits, Filter = %+v", pod.Name, res)
			}
			for _, n := range candidates {
				if w, ok := want.Failed[n]; ok && failed[n] != w {
					t.Errorf("%s: reason on %s = %q, Schedule %q", pod.Name, n, failed[n], w)
				} else if !ok && !strings.HasPrefix(failed[n], ReasonNodeUnregistered) {
					t.Errorf("%s: reason on unregistered %s = %q", pod.Name, n, failed[n])
				}
				if _, in := res.FailedAndUnresolvableNodes[n]; in != allocation.Unresolvable(failed[n]) {
					t.Errorf("%s: %s in FailedAndUnresolvableNodes = %t, reason %q", pod.Name, n, in, failed[n])
				}
			}
			continue
		}
		placed++
		if diff := cmp.Diff(&[]string{want.Node}, res.NodeNames); diff != "" {
			t.Fatalf("%s: NodeNames (-Schedule +Filter):\n%s", pod.Name, diff)
		}
		if got, w := e.pod(pod.Name).Annotations[annotation.KeyNVIDIAAllocated], allocation.EncodePodDevices(want.Devices); got != w {
			t.Errorf("%s: devices %q, Schedule %q", pod.Name, got, w)
		}
		wantEvent := fmt.Sprintf("Normal %s find fit node(%s), %d nodes not fit, %d nodes fit(%s)", EventFilteringSucceed,
			want.Node, len(candidates)-len(want.Scores), len(want.Scores), formatScores(want.Scores))
		if diff := cmp.Diff([]string{wantEvent}, events); diff != "" {
			t.Errorf("%s: Events (-want +got):\n%s", pod.Name, diff)
		}
	}
	if n := e.ext.probeMismatches.Load(); n != 0 {
		t.Errorf("Fit disagreed with the probe in %d filters", n)
	}
	t.Logf("%d nodes, %d filters placed, %d fit nowhere, %d probed", len(names), placed, none, probed)
	if probed == 0 || placed == 0 || none == 0 {
		t.Error("the random pods do not exercise the filter")
	}
}

// differentialPod is a pod with one to three containers (the first maybe an init container)
// asking for random GPU shares, and a random choice of the annotations that steer the fit.
func differentialPod(rng *rand.Rand, name string, uuids []string) *corev1.Pod {
	pick := func(values ...string) string { return values[rng.IntN(len(values))] }
	pod := gpuPod(name, nil)
	containers := 1
	if rng.IntN(4) == 0 {
		containers += 1 + rng.IntN(2)
	}
	pod.Spec.Containers = nil
	for c := range containers {
		limits := corev1.ResourceList{}
		if c == 0 || rng.IntN(2) == 0 {
			limits["nvidia.com/gpu"] = *resource.NewQuantity(int64(1+rng.IntN(2)), resource.DecimalSI)
		}
		switch rng.IntN(8) {
		case 0, 1, 2:
			limits["nvidia.com/gpumem"] = *resource.NewQuantity(int64(rng.IntN(12000)), resource.DecimalSI)
		case 3, 4:
			limits["nvidia.com/gpumem-percentage"] = *resource.NewQuantity(int64(rng.IntN(60)), resource.DecimalSI)
		case 5:
			limits["nvidia.com/gpumem"] = resource.MustParse("200000") // fits nowhere
		}
		if rng.IntN(2) == 0 {
			limits["nvidia.com/gpucores"] = *resource.NewQuantity(int64([]int{0, 5, 10, 30, 100}[rng.IntN(5)]), resource.DecimalSI)
		}
		ctr := corev1.Container{Name: fmt.Sprintf("c%d", c), Resources: corev1.ResourceRequirements{Limits: limits}}
		if c == 0 && containers > 1 && rng.IntN(2) == 0 {
			pod.Spec.InitContainers = append(pod.Spec.InitContainers, ctr)
		} else {
			pod.Spec.Containers = append(pod.Spec.Containers, ctr)
		}
	}
	pod.Annotations = map[string]string{}
	for key, values := range map[string][]string{
		allocation.KeyUseGPUType:          {"A10", "h100", "A10,H100"},
		allocation.KeyNoUseGPUType:        {"H100"},
		allocation.KeyVGPUMode:            {"hami-core", "mig"},
		allocation.KeyUseGPUUUID:          {uuids[rng.IntN(len(uuids))], ""},
		allocation.KeyNoUseGPUUUID:        {uuids[rng.IntN(len(uuids))]},
		allocation.KeyNUMABind:            {"true", "false"},
		allocation.KeyGPUSchedulerPolicy:  {"binpack", "spread", "binpack,mutex", "topology-aware"},
		allocation.KeyNodeSchedulerPolicy: {"binpack", "spread"},
	} {
		if rng.IntN(6) == 0 {
			pod.Annotations[key] = pick(values...)
		}
	}
	return pod
}

// scheduleFromAPI is allocation.Schedule over the registered candidates, with the usage of
// every pod the API holds but pod itself, as HAMi recomputes it.
func scheduleFromAPI(t *testing.T, e *env, pod *corev1.Pod, req allocation.PodRequest, candidates []string, devices map[string][]annotation.Device) allocation.Decision {
	t.Helper()
	pods, err := e.client.CoreV1().Pods("").List(e.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]map[string]allocation.Usage{}
	for i := range pods.Items {
		p := &pods.Items[i]
		node, ok := allocation.PodNode(p)
		if !ok || p.Name == pod.Name {
			continue
		}
		pd, ok, err := allocation.Allocated(p, annotation.NVIDIA(), e.ext.opts.Config.Version)
		if err != nil || !ok {
			continue
		}
		if used[node] == nil {
			used[node] = map[string]allocation.Usage{}
		}
		for gpu, u := range allocation.PodUsage(pd, p, e.ext.opts.Config) { // what the tracker stores
			used[node][gpu] = used[node][gpu].Add(u)
		}
	}
	var nodes []allocation.Node
	for _, name := range candidates {
		devs, ok := devices[name]
		if !ok {
			continue
		}
		n, err := e.client.CoreV1().Nodes().Get(e.ctx, name, metaGet)
		if err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, allocation.Node{Name: name, Devices: allocation.WithUsage(devs, used[name]), Annotations: n.Annotations})
	}
	return allocation.Schedule(nodes, req, pod.Annotations, e.ext.opts.Config)
}

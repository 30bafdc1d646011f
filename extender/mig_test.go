package extender

import (
	"fmt"
	"strings"
	"testing"
	"testing/synctest"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/mig"
)

// migNode is a node with one idle A100-40GB in MIG mode, as HAMi master registers it.
func migNode(name string) *corev1.Node {
	ones := make([]mig.Placement, 7)
	for i := range ones {
		ones[i] = mig.Placement{Start: uint32(i), Size: 1}
	}
	d := annotation.Device{ID: "GPU-" + name + "-mig", Count: 7, Devmem: 40960, Devcore: 100, Type: "NVIDIA A100-SXM4-40GB", Mode: allocation.ModeMIG, Health: true,
		MIGProfiles: []mig.Profile{
			{Name: "1g.5gb", MemoryMB: 4864, Core: 15, SliceCount: 1, Placements: ones},
			{Name: "2g.10gb", MemoryMB: 9856, Core: 29, SliceCount: 2, Placements: []mig.Placement{{Start: 0, Size: 2}, {Start: 2, Size: 2}, {Start: 4, Size: 2}}},
		}}
	return gpuNode(name, annotation.Encode([]annotation.Device{d}), 1)
}

// TestFilterMIGSequence fills a MIG GPU through the filter with the informer delivering each
// patch: every pod gets the next 1g placement, the probe is not used on the MIG node (no
// mismatch), a re-filtered pod does not block itself, and its reservation moves with it.
func TestFilterMIGSequence(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var pods []*corev1.Pod
		for i := range 8 {
			pods = append(pods, gpuPod(fmt.Sprint("p", i), map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000"}))
		}
		e := start(t, Options{}, migNode("n1"), registered("n2", 1, 20000), pods[0], pods[1], pods[2], pods[3], pods[4], pods[5], pods[6], pods[7])
		for i, p := range pods[:7] {
			res := e.filter(p, "n1")
			if res.Error != "" || res.NodeNames == nil || len(*res.NodeNames) != 1 {
				t.Fatalf("pod %d: %+v", i, res)
			}
			synctest.Wait()
			got := e.pod(p.Name).Annotations[mig.KeyAllocations]
			want := fmt.Sprintf(`[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-n1-mig","profile":"1g.5gb","placement":{"start":%d,"size":1}}]`, 6-i)
			if got != want {
				t.Fatalf("pod %d: reservation %s, want %s", i, got, want)
			}
		}
		if res := e.filter(pods[7], "n1"); res.FailedNodes["n1"] != "1/1 "+allocation.ReasonCardTimeSlicingExhausted {
			t.Errorf("eighth pod: %+v", res)
		}
		// Re-filtered, p6 (at {0,1}) fits where it is: its own placement does not count.
		again := e.pod("p6")
		if res := e.filter(again, "n1"); res.Error != "" || res.NodeNames == nil || len(*res.NodeNames) != 1 {
			t.Fatalf("re-filter: %+v", res)
		}
		synctest.Wait()
		if got := e.pod("p6").Annotations[mig.KeyAllocations]; got != `[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-n1-mig","profile":"1g.5gb","placement":{"start":0,"size":1}}]` {
			t.Errorf("re-filtered reservation %s", got)
		}
		// Re-filtered onto a hami-core GPU, the old reservation goes.
		if res := e.filter(e.pod("p6"), "n2"); res.Error != "" {
			t.Fatal(res.Error)
		}
		synctest.Wait()
		if v, ok := e.pod("p6").Annotations[mig.KeyAllocations]; ok {
			t.Errorf("stale reservation kept: %s", v)
		}
		if n := e.ext.probeMismatches.Load(); n != 0 {
			t.Errorf("%d probe mismatches", n)
		}
	})
}

// TestFilterMIGInvalidReservation: a pod whose reservation does not decode occupies the whole
// MIG GPU (CardMigTopologyInfeasible, not CardNotHealth) and gets a Warning Event; deleting
// it frees the GPU.
func TestFilterMIGInvalidReservation(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		bad := placedPod("bad", "n1", "GPU-n1-mig,NVIDIA,4864,15:;")
		bad.Annotations[mig.KeyAllocations] = `[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-n1-mig","profile":"1g.5gb","placement":{"start":6,"size":0}}]`
		p := gpuPod("p", map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000"})
		e := start(t, Options{}, migNode("n1"), bad, p)
		if res := e.filter(p, "n1"); res.FailedNodes["n1"] != "1/1 "+allocation.ReasonCardMigTopologyInfeasible {
			t.Errorf("with the bad reservation: %+v", res)
		}
		found := false
		for _, ev := range e.events() {
			found = found || strings.Contains(ev, EventMIGReservationInvalid)
		}
		if !found {
			t.Errorf("no %s Event", EventMIGReservationInvalid)
		}
		if err := e.client.CoreV1().Pods("default").Delete(e.ctx, "bad", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if res := e.filter(p, "n1"); res.NodeNames == nil || len(*res.NodeNames) != 1 {
			t.Errorf("after the delete: %+v", res)
		}
	})
}

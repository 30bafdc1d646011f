package nodeagent

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/mig"
	"github.com/hamireg/hamireg/nodelock"
)

// FuzzMIGAllocate: whatever a pod's MIG reservations and to-allocate list hold on a node of
// MIG GPUs (one of them holding a MIG device of a finished pod, one of a running pod), and
// whatever ids the kubelet sends, Allocate never fails the agent, every error is one of the
// classes, no two MIG devices ever overlap, a failed Allocate leaves no device it created and
// the running pod's device is never destroyed, and a served container gets MIG UUIDs of
// devices that exist.
func FuzzMIGAllocate(f *testing.F) {
	f.Add(`[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-mig-0","profile":"2g.10gb","placement":{"start":0,"size":2}}]`, "GPU-mig-0,NVIDIA,9856,29:;", "GPU-mig-0-0")
	f.Add(`[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-mig-0","profile":"1g.5gb","placement":{"start":6,"size":1}},{"containerIndex":0,"deviceIndex":1,"gpuUUID":"GPU-mig-0","profile":"1g.5gb","placement":{"start":6,"size":1}}]`, "GPU-mig-0,NVIDIA,1,1:GPU-mig-0,NVIDIA,1,1:;", "GPU-mig-0-0,GPU-mig-0-1")
	f.Add(`[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-mig-1","profile":"3g.20gb","placement":{"start":0,"size":4}}]`, "GPU-mig-1,NVIDIA,1,1:;", "GPU-mig-1-2")
	f.Add(`[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-mig-1","profile":"3g.20gb","placement":{"start":4,"size":4}}]`, "GPU-mig-1,NVIDIA,1,1:;", "GPU-mig-1-2")
	f.Add(`[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-mig-0","profile":"7g.40gb","placement":{"start":0,"size":8},"migUUID":"MIG-x","gpuInstanceID":1,"computeInstanceID":0}]`, "GPU-mig-0,NVIDIA,1,1:;", "GPU-mig-0-0")
	f.Add(`{`, "GPU-mig-0,NVIDIA,1,1:GPU-plain,NVIDIA,1,1:;", "GPU-mig-0-0,GPU-plain-1")
	classes := []error{ErrNoBindingPod, ErrPodGone, ErrNoPendingEntry, ErrDeviceCountMismatch, ErrMalformed, ErrAPI, ErrHost, ErrAllocator, ErrMIG}
	f.Fuzz(func(t *testing.T, reservations, toAllocate, ids string) {
		// Proto strings are UTF-8: the kubelet's ids are. A to-allocate value that is not is
		// refused as an answer gRPC cannot carry (ErrAllocator).
		ids = strings.ToValidUTF8(ids, "?")
		fm := newFakeMIG(migGPU0, migGPU1)
		finished := fm.add(migGPU0, "1g.5gb", mig.Placement{Start: 6, Size: 1}, 1)
		running := fm.add(migGPU1, "3g.20gb", mig.Placement{Start: 4, Size: 4}, 1)
		pod := migPod("p", corev1.PodPending)
		pod.Annotations = map[string]string{mig.KeyAllocations: reservations, annotation.KeyNVIDIAToAllocate: toAllocate, allocation.KeyBindPhase: string(allocation.PhaseAllocating)}
		f := newMIGFixture(t, fm, Options{}, pod,
			migPod("done", corev1.PodSucceeded, withRuntime(res(0, 0, migGPU0, "1g.5gb", 6, 1), finished)),
			migPod("run", corev1.PodRunning, withRuntime(res(0, 0, migGPU1, "3g.20gb", 4, 4), running)))
		if _, err := f.cs.CoreV1().Nodes().Patch(f.ctx, testNode, "application/merge-patch+json",
			[]byte(`{"metadata":{"annotations":{"`+nodelock.Key+`":"2026-12-01T10:00:00Z,default,p"}}}`), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		before := fm.state()
		r, err := f.call(strings.Split(ids, ",")...)
		after := fm.state()
		if oerr := fm.noOverlap(); oerr != nil {
			t.Errorf("overlapping MIG devices: %v", oerr)
		}
		if !slices.Contains(after, running) {
			t.Errorf("the running pod's MIG device %s was destroyed", running.MigUUID)
		}
		if err != nil {
			msg := message(err)
			if !slices.ContainsFunc(classes, func(c error) bool { return strings.HasPrefix(msg, c.Error()) }) {
				t.Errorf("error %q is of no class", msg)
			}
			for _, in := range after {
				if !slices.Contains(before, in) {
					t.Errorf("failed Allocate left MIG device %s", in.MigUUID)
				}
			}
			return
		}
		for _, u := range strings.Split(r.GetEnvs()["NVIDIA_VISIBLE_DEVICES"], ",") {
			if strings.HasPrefix(u, "MIG-") && !slices.ContainsFunc(after, func(in mig.Instance) bool { return in.MigUUID == u }) {
				t.Errorf("served MIG UUID %s names no device", u)
			}
		}
	})
}

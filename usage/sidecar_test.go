package usage

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/hamireg/hamireg/allocation"
)

// sidecarPlaced is a running pod with a regular init container (12000 MiB), a native sidecar
// (2000 MiB) and an app container (6000 MiB) on GPU g0, with the init containers' states.
func sidecarPlaced(initState, sidecarState string) *corev1.Pod {
	p := placed("s", "g0,NVIDIA,12000,0:;g0,NVIDIA,2000,0:;g0,NVIDIA,6000,0:;")
	always := corev1.ContainerRestartPolicyAlways
	p.Spec.InitContainers = []corev1.Container{{Name: "init"}, {Name: "sidecar", RestartPolicy: &always}}
	p.Spec.Containers = []corev1.Container{{Name: "app"}}
	state := func(s string) corev1.ContainerState {
		switch s {
		case "running":
			return corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
		case "done":
			return corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{}}
		}
		return corev1.ContainerState{}
	}
	if initState != "" {
		p.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: "init", State: state(initState)}, {Name: "sidecar", State: state(sidecarState)}}
	}
	return p
}

// TestTrackerSidecar: what the tracker stores for a pod with an init container and a sidecar,
// and how it follows the init phase, in each accounting mode; every update that changes it is
// one Changed reports.
func TestTrackerSidecar(t *testing.T) {
	t.Parallel()
	pending := sidecarPlaced("", "")
	initRuns := sidecarPlaced("running", "")
	sidecarRuns := sidecarPlaced("done", "running")
	sidecarRestarts := sidecarPlaced("done", "done")
	for name, tc := range map[string]struct {
		cfg   allocation.Config
		steps []*corev1.Pod
		want  []int64 // MiB on g0 after each step
	}{
		"kubernetes": {cfg: allocation.Config{}, steps: []*corev1.Pod{pending, initRuns, sidecarRuns, sidecarRestarts, sidecarRuns},
			want: []int64{12000, 12000, 8000, 8000, 8000}},
		"kubernetes: added after the init phase": {cfg: allocation.Config{}, steps: []*corev1.Pod{sidecarRuns}, want: []int64{8000}},
		// HAMi v2.10.0: the gate waits for every status, a running sidecar keeps it shut; a
		// sidecar that exits 0 once opens it and its share is dropped for good.
		"hami v2.10.0": {cfg: allocation.Config{Accounting: allocation.AccountingHAMi}, steps: []*corev1.Pod{pending, initRuns, sidecarRuns, sidecarRestarts, sidecarRuns},
			want: []int64{12000, 12000, 12000, 6000, 6000}},
		"hami v2.10.0: no shrink on an add": {cfg: allocation.Config{Accounting: allocation.AccountingHAMi}, steps: []*corev1.Pod{sidecarRestarts, sidecarRestarts},
			want: []int64{12000, 6000}},
		"hami v2.9.0": {cfg: allocation.Config{Version: allocation.VersionV290}, steps: []*corev1.Pod{pending, sidecarRestarts}, want: []int64{20000, 20000}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			tr := New(Options{Config: tc.cfg})
			var prev *corev1.Pod
			for i, p := range tc.steps {
				before := tr.Node("n1")["g0"].Usedmem
				if prev != nil && !tr.Changed(prev, p) {
					if i > 0 && tc.want[i] != before {
						t.Fatalf("step %d: Changed is false, but the usage moves from %d to %d MiB", i, before, tc.want[i])
					}
					prev = p
					continue
				}
				tr.Observe(p)
				prev = p
				if got := tr.Node("n1")["g0"].Usedmem; got != tc.want[i] {
					t.Errorf("step %d: %d MiB on g0, want %d", i, got, tc.want[i])
				}
				if used, _ := tr.NamespaceUsage("team-a"); used.Memory != tc.want[i] {
					t.Errorf("step %d: quota %d MiB, want %d", i, used.Memory, tc.want[i])
				}
			}
		})
	}
}

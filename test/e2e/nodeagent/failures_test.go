package nodeagent_test

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// TestAllocateFailures admits pods whose allocation cannot succeed: the kubelet gets an
// error that says what happened, the pod (where it exists) gets bind-phase failed, the node
// lock is gone, and the plugin keeps running and serves the next pod.
func TestAllocateFailures(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	tests := map[string]struct {
		ctrs    []harness.Ctr
		devices func() allocation.PodDevices
		// between runs after the bind, before Allocate.
		between func(t *testing.T, pod *corev1.Pod)
		wantErr string
		// phase is the bind-phase wanted afterwards; "" when the pod is gone.
		phase allocation.BindPhase
	}{
		"entry count mismatch": {
			ctrs: []harness.Ctr{{Name: "cuda", GPUs: 1}},
			devices: func() allocation.PodDevices {
				return allocation.PodDevices{{f.Share(0, 1000, 10), f.Share(1, 1000, 10)}}
			},
			wantErr: "device number not matched",
			phase:   allocation.PhaseFailed,
		},
		"malformed to-allocate annotation": {
			ctrs:    []harness.Ctr{{Name: "cuda", GPUs: 1}},
			devices: func() allocation.PodDevices { return allocation.PodDevices{{f.Share(0, 1000, 10)}} },
			between: func(t *testing.T, pod *corev1.Pod) {
				t.Helper()
				cp.PatchPodAnnotation(t, pod, annotation.KeyNVIDIAToAllocate, f.ByIndex[0]+",NVIDIA,1000:;")
			},
			wantErr: "malformed",
			phase:   allocation.PhaseFailed,
		},
		"pod deleted between bind and Allocate": {
			ctrs:    []harness.Ctr{{Name: "cuda", GPUs: 1}},
			devices: func() allocation.PodDevices { return allocation.PodDevices{{f.Share(2, 1000, 10)}} },
			between: func(t *testing.T, pod *corev1.Pod) {
				t.Helper()
				if err := cp.AdminClient().CoreV1().Pods(pod.Namespace).Delete(t.Context(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))}); err != nil {
					t.Fatal(err)
				}
			},
			wantErr: "pod of the node lock not found",
		},
	}
	for name, tc := range tests { // sequential: one pod at a time holds the node lock
		t.Run(name, func(t *testing.T) {
			podName := strings.ToLower(strings.ReplaceAll(name, " ", "-"))
			pod := f.Schedule(t, f.CreatePod(t, podName, tc.ctrs...), tc.devices())
			if tc.between != nil {
				tc.between(t, pod)
			}
			_, err := f.DM.Allocate(t.Context(), pod, harness.GPUContainers(pod)[0])
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Allocate: %s, want an error containing %q", describe(err), tc.wantErr)
			}
			t.Logf("the kubelet got: %v", err)
			if tc.phase == "" {
				if _, ok := f.Pod(t, podName); ok {
					t.Errorf("pod %s exists", podName)
				}
			}
			f.WantProtocolEnd(t, podName, tc.phase)
		})
	}

	t.Run("pod not bound by a HAMi scheduler", func(t *testing.T) {
		pod := f.CreatePod(t, "foreign", harness.Ctr{Name: "cuda", GPUs: 1})
		cp.Bind(t, pod, f.Name)
		_, err := f.DM.Allocate(t.Context(), pod, "cuda")
		if err == nil || !strings.Contains(err.Error(), "no binding pod found on node "+f.Name) {
			t.Fatalf("Allocate: %s, want no binding pod found", describe(err))
		}
		p, _ := f.Pod(t, "foreign")
		if ph, ok := p.Annotations[allocation.KeyBindPhase]; ok {
			t.Errorf("a pod the protocol does not know got %s %q", allocation.KeyBindPhase, ph)
		}
		f.WantProtocolEnd(t, "foreign", "")
	})

	t.Run("next pod", func(t *testing.T) {
		pod := f.Schedule(t, f.CreatePod(t, "next", harness.Ctr{Name: "cuda", GPUs: 1}), allocation.PodDevices{{f.Share(3, 1000, 10)}})
		if _, err := f.DM.Allocate(t.Context(), pod, "cuda"); err != nil {
			t.Fatalf("Allocate after the failures: %v", err)
		}
		f.WantProtocolEnd(t, "next", allocation.PhaseSuccess)
	})
}

// TestAllocateAcrossAPIServerRestart takes kube-apiserver away between the bind and the
// kubelet's Allocate, and then restarts it while an Allocate is in flight. An Allocate that
// cannot reach the API server fails (after a few seconds of retries) and, once the server is
// back, the plugin sets bind-phase failed and removes the lock by itself; one that reaches it
// in time succeeds. Either way no lock is left behind and the plugin keeps running. Not
// parallel: the apiserver is shared.
func TestAllocateAcrossAPIServerRestart(t *testing.T) {
	f := newFixture(t)

	t.Run("down during Allocate", func(t *testing.T) {
		pod := f.Schedule(t, f.CreatePod(t, "outage", harness.Ctr{Name: "cuda", GPUs: 1}), allocation.PodDevices{{f.Share(0, 1000, 10)}})
		if err := cp.StopAPIServer(); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_, err := f.DM.Allocate(t.Context(), pod, "cuda")
		took := time.Since(start)
		if serr := cp.StartAPIServer(t.Context()); serr != nil {
			t.Fatal(serr)
		}
		if err == nil {
			t.Fatal("Allocate succeeded without an API server")
		}
		t.Logf("Allocate failed after %v: %v", took.Round(time.Millisecond), err)
		harness.Eventually(t, "bind-phase failed and the lock gone after the restart", 60*time.Second, func() bool {
			p, ok := f.Pod(t, "outage")
			return ok && p.Annotations[allocation.KeyBindPhase] == string(allocation.PhaseFailed) && f.Lock(t) == ""
		})
		f.WantProtocolEnd(t, "outage", allocation.PhaseFailed)
	})

	t.Run("restart during Allocate", func(t *testing.T) {
		pod := f.Schedule(t, f.CreatePod(t, "restart", harness.Ctr{Name: "cuda", GPUs: 1}), allocation.PodDevices{{f.Share(1, 1000, 10)}})
		res := make(chan error, 1)
		go func() {
			_, err := f.DM.Allocate(t.Context(), pod, "cuda")
			res <- err
		}()
		if err := cp.RestartAPIServer(t.Context()); err != nil {
			t.Fatal(err)
		}
		err := <-res
		want := allocation.PhaseSuccess
		if err != nil {
			want = allocation.PhaseFailed
		}
		t.Logf("Allocate across the restart: %s", describe(err))
		harness.Eventually(t, "bind-phase "+string(want)+" and the lock gone", 60*time.Second, func() bool {
			p, ok := f.Pod(t, "restart")
			return ok && p.Annotations[allocation.KeyBindPhase] == string(want) && f.Lock(t) == ""
		})
		f.WantProtocolEnd(t, "restart", want)
	})

	t.Run("next pod", func(t *testing.T) {
		pod := f.Schedule(t, f.CreatePod(t, "after", harness.Ctr{Name: "cuda", GPUs: 1}), allocation.PodDevices{{f.Share(2, 1000, 10)}})
		if _, err := f.DM.Allocate(t.Context(), pod, "cuda"); err != nil {
			t.Fatalf("Allocate after the restarts: %v", err)
		}
		f.WantProtocolEnd(t, "after", allocation.PhaseSuccess)
	})
}

package extender

import (
	"strings"
	"sync"
	"testing"
	"testing/synctest"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/hamireg/hamireg/allocation"
)

func gpuQuota(ns, name string, hard map[string]string) *corev1.ResourceQuota {
	q := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{}}}
	for k, v := range hard {
		q.Spec.Hard[corev1.ResourceName(k)] = resource.MustParse(v)
	}
	return q
}

// TestQuotaConcurrentFilters filters pods of one namespace at once: the quota admits exactly
// as many as fit, whatever the order, and the pods of another namespace are not limited.
func TestQuotaConcurrentFilters(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := start(t, Options{}, registered("n", 4, 23028), gpuQuota("default", "gpu", map[string]string{"limits.nvidia.com/gpumem": "10000"}))
		var wg sync.WaitGroup
		var mu sync.Mutex
		passed, refused := 0, 0
		for i := range 8 {
			pod := gpuPod("p"+string(rune('a'+i)), map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"})
			e.create(pod)
			wg.Go(func() {
				res := e.filter(pod, "n")
				mu.Lock()
				defer mu.Unlock()
				switch {
				case res.NodeNames != nil && len(*res.NodeNames) == 1:
					passed++
				case strings.HasPrefix(res.FailedNodes["n"], "4/4 ResourceQuotaNotFit; namespace default over ResourceQuota gpu limits.nvidia.com/gpumem 10000: 9000 MiB used by default/p"):
					refused++
				default:
					t.Errorf("unexpected answer %+v", res)
				}
			})
		}
		wg.Wait()
		if passed != 3 || refused != 5 {
			t.Errorf("passed %d, refused %d; want 3 and 5", passed, refused)
		}
		other := gpuPod("other", map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"})
		other.Namespace = "team-b"
		e.create(other)
		if res := e.filter(other, "n"); res.NodeNames == nil {
			t.Errorf("another namespace is limited: %+v", res)
		}
	})
}

// TestQuotaUndo checks that a failed patch gives the quota back, and that after a failed bind
// the pod keeps its quota until it is filtered again (HAMi's count of its annotations), which
// counts it once.
func TestQuotaUndo(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := setup(t, Options{}, registered("n", 2, 23028), gpuQuota("default", "gpu", map[string]string{"limits.nvidia.com/gpumem": "4000"}))
		fail := true
		var mu sync.Mutex
		e.client.PrependReactor("patch", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
			mu.Lock()
			defer mu.Unlock()
			if fail && a.(k8stesting.PatchAction).GetName() == "a" {
				return true, nil, errBindingFails
			}
			return false, nil, nil
		})
		e.client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
			if a.GetSubresource() == "binding" {
				return true, nil, errBindingFails
			}
			return false, nil, nil
		})
		e.run()
		a := gpuPod("a", map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"})
		b := gpuPod("b", map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"})
		e.create(a)
		e.create(b)
		if res := e.filter(a, "n"); res.Error == "" {
			t.Fatalf("patch did not fail: %+v", res)
		}
		mu.Lock()
		fail = false
		mu.Unlock()
		if res := e.filter(b, "n"); res.NodeNames == nil {
			t.Fatalf("b refused after a's failed patch: %+v", res)
		}
		synctest.Wait()
		if err := e.ext.Bind(e.ctx, &bindingArgs{PodName: "b", PodNamespace: "default", Node: "n"}); err == nil {
			t.Fatal("bind did not fail")
		}
		synctest.Wait()
		if res := e.filter(a, "n"); res.NodeNames != nil || !strings.Contains(res.FailedNodes["n"], allocation.ReasonResourceQuotaNotFit) {
			t.Fatalf("a after b's failed bind (b still holds 3000 of 4000 MiB): %+v", res)
		}
		if res := e.filter(b, "n"); res.NodeNames == nil {
			t.Fatalf("b refused when filtered again (it must not count against itself): %+v", res)
		}
	})
}

// TestQuotaWarningEvents checks the Warning Event on a ResourceQuota with keys HAMi ignores,
// recorded once however often the object is updated.
func TestQuotaWarningEvents(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		q := gpuQuota("default", "gpu", map[string]string{"requests.nvidia.com/gpumem": "1000", "limits.nvidia.com/gpu": "2"})
		e := start(t, Options{}, registered("n", 1, 23028), q)
		q = q.DeepCopy()
		q.Labels = map[string]string{"x": "y"}
		if _, err := e.client.CoreV1().ResourceQuotas("default").Update(e.ctx, q, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		evs := e.events()
		if len(evs) != 2 || !strings.Contains(evs[0], "Warning GPUQuotaWarning resource quota gpu: limits.nvidia.com/gpu: 2: quota key ignored") ||
			!strings.Contains(evs[1], "requests.nvidia.com/gpumem") {
			t.Errorf("events %q", evs)
		}
	})
}

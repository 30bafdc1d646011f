package allocationtest_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/allocation/allocationtest"
	"github.com/hamireg/hamireg/internal/vectors"
	"github.com/hamireg/hamireg/nodelock"
)

var now = time.Date(2026, 12, 1, 7, 9, 37, 0, time.UTC)

func objects() (*corev1.Pod, *corev1.Node) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "gpu-pod", UID: "uid-1"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c0"}}}}
	return pod, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node1"}}
}

// write is a patch or create the helper sent, with its body decoded.
type write struct {
	Verb, Resource string
	Body           any
}

func writes(cs *fake.Clientset) []write {
	var out []write
	for _, a := range cs.Actions() {
		res := a.GetResource().Resource
		if a.GetSubresource() != "" {
			res += "/" + a.GetSubresource()
		}
		switch a := a.(type) {
		case k8stesting.PatchAction:
			var body any
			_ = json.Unmarshal(a.GetPatch(), &body)
			out = append(out, write{"patch", res, body})
		case k8stesting.CreateAction:
			out = append(out, write{"create", res, nil})
		}
	}
	return out
}

// The helper's writes are HAMi's: the filter patch of fit.json, and the lock, bind-phase and
// Binding of allocate.json's scheduler_bind_sequence for a free node.
func TestScheduleWritesWhatHAMiWrites(t *testing.T) {
	t.Parallel()
	n := 0
	for _, folder := range vectors.Folders(t) {
		var f struct {
			Sequence []struct {
				Name  string `json:"name"`
				Input struct {
					BindingCallFails bool   `json:"binding_call_fails"`
					NodeLockBefore   string `json:"node_lock_before"`
					PodRequestsGPU   bool   `json:"pod_requests_gpu"`
				} `json:"input"`
				Patches []struct {
					Body     any    `json:"body"`
					Resource string `json:"resource"`
				} `json:"patches"`
				APICalls []string `json:"api_calls"`
			} `json:"scheduler_bind_sequence"`
		}
		if !folder.Read(t, "allocate.json", &f) {
			continue
		}
		for _, v := range f.Sequence {
			// The helper's case, by its inputs: a GPU pod bound to a free node.
			if in := v.Input; in.NodeLockBefore != "" || !in.PodRequestsGPU || in.BindingCallFails {
				continue
			}
			n++
			pod, node := objects()
			cs := fake.NewClientset(pod, node)
			clk := testingclock.NewFakeClock(now)
			devs := allocation.PodDevices{{{UUID: "GPU-0a1b2c3d-0000-1111-2222-333344445555", Type: "NVIDIA", Usedmem: 3000, Usedcores: 30}}}
			s := allocationtest.NewScheduler(cs, allocationtest.Options{Clock: clk})
			if _, err := s.Filter(t.Context(), pod, "node1", devs); err != nil {
				t.Fatal(err)
			}
			filterWrites := writes(cs)
			cs.ClearActions()
			bound, err := s.Bind(t.Context(), pod, "node1")
			if err != nil {
				t.Fatal(err)
			}

			// The filter patch, as fit.json records it.
			unixNow := strconv.FormatInt(now.Unix(), 10)
			value := "GPU-0a1b2c3d-0000-1111-2222-333344445555,NVIDIA,3000,30:;"
			wantFilter := []write{{"patch", "pods", map[string]any{"metadata": map[string]any{
				"annotations": map[string]any{"hami.io/vgpu-devices-allocated": value, "hami.io/vgpu-devices-to-allocate": value, "hami.io/vgpu-node": "node1", "hami.io/vgpu-time": unixNow},
				"labels":      map[string]any{"hami.io/vgpu-node": "node1"},
			}}}}
			if diff := cmp.Diff(wantFilter, filterWrites); diff != "" {
				t.Errorf("filter writes (-HAMi +got):\n%s", diff)
			}
			// The bind writes, in HAMi's order and with its bodies.
			placeholders := strings.NewReplacer("{rfc3339_now}", now.Format(time.RFC3339), "{unix_now}", unixNow)
			var want []write
			for _, p := range v.Patches {
				raw, _ := json.Marshal(p.Body)
				var body any
				_ = json.Unmarshal([]byte(placeholders.Replace(string(raw))), &body)
				want = append(want, write{"patch", p.Resource, body})
			}
			want = append(want, write{"create", "pods/binding", nil})
			got := writes(cs)
			if len(got) > len(want) {
				got = got[:len(want)] // the fake clientset's stand-in for the Binding follows
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("%s: bind writes (-HAMi +got):\n%s", folder.Name(), diff)
			}
			if bound.Spec.NodeName != "node1" || bound.Annotations[allocation.KeyBindPhase] != "allocating" || bound.Labels[allocation.KeyNode] != "node1" {
				t.Errorf("bound pod: %+v", bound.ObjectMeta)
			}
			n1, _ := cs.CoreV1().Nodes().Get(t.Context(), "node1", metav1.GetOptions{})
			if n1.Annotations[nodelock.Key] != now.Format(time.RFC3339)+",default,gpu-pod" {
				t.Errorf("lock = %q", n1.Annotations[nodelock.Key])
			}
		}
	}
	if n == 0 {
		t.Fatal("no bind_success_unlocked_node vector")
	}
	t.Logf("checked %d vectors (allocate.json scheduler_bind_sequence)", n)
}

// A node locked by another live pod fails the bind with HAMi's words, as HAMi's bind fails,
// and nothing else is written; Schedule fails the test with it.
func TestBindOnLockedNodeFails(t *testing.T) {
	t.Parallel()
	pod, node := objects()
	node.Annotations = map[string]string{nodelock.Key: now.Add(-time.Minute).Format(time.RFC3339) + ",default,other"}
	other := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "other"}}
	cs := fake.NewClientset(pod, node, other)
	_, err := allocationtest.NewScheduler(cs, allocationtest.Options{Clock: testingclock.NewFakeClock(now)}).Bind(t.Context(), pod, "node1")
	if !errors.Is(err, nodelock.ErrLocked) || !strings.Contains(err.Error(), "node node1 has been locked within 5m0s") {
		t.Errorf("Bind = %v, want HAMi's lock message", err)
	}
	for _, a := range cs.Actions() {
		if a.GetVerb() == "create" || (a.GetVerb() == "patch" && a.GetResource().Resource == "pods") {
			t.Errorf("wrote %s %s although the node is locked", a.GetVerb(), a.GetResource().Resource)
		}
	}
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		allocationtest.Schedule(r, cs, pod, "node1", allocation.PodDevices{{}}, allocationtest.Options{Clock: testingclock.NewFakeClock(now)})
	}()
	<-done
	if !strings.Contains(r.msg, "has been locked") {
		t.Errorf("Schedule failed the test with %q", r.msg)
	}
}

// recorder is a testing.TB whose Fatalf records the message and ends the goroutine.
type recorder struct {
	testing.TB
	mu  sync.Mutex
	msg string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	r.mu.Lock()
	r.msg = fmt.Sprintf(format, args...)
	r.mu.Unlock()
	runtime.Goexit()
}

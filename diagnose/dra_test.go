package diagnose_test

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/diagnose"
)

// TestCountWithheldForDRA: GPUs the node agent cordoned for DRA (allocation.KeyAgentDeviceCordon) are not
// offered to the kubelet: the count check subtracts them, and a node whose GPUs are all DRA's
// has a rightly empty count.
func TestCountWithheldForDRA(t *testing.T) {
	t.Parallel()
	const node = "gpu-a"
	ids := func(idx ...int) string {
		var out []string
		for _, i := range idx {
			out = append(out, gpus(8)[i].ID)
		}
		return strings.Join(out, ",")
	}
	for name, tc := range map[string]struct {
		withheld    string
		allocatable string // "": none
		wantState   diagnose.ChannelState
		wantCode    string // a finding that must be there; "" none of the count's
		wantText    string
	}{
		"two DRA GPUs, count right":  {withheld: ids(1, 5), allocatable: "60", wantState: diagnose.StateOK},
		"two DRA GPUs, count wrong":  {withheld: ids(1, 5), allocatable: "80", wantState: diagnose.StateWarning, wantCode: diagnose.CodeAllocatableMismatch, wantText: "2 of them DRA's"},
		"no DRA GPUs, count smaller": {withheld: "", allocatable: "60", wantState: diagnose.StateWarning, wantCode: diagnose.CodeAllocatableMismatch, wantText: "8 device(s) × split 10 = 80"},
		"all DRA's, no count":        {withheld: ids(0, 1, 2, 3, 4, 5, 6, 7), allocatable: "", wantState: diagnose.StateOK},
		"all DRA's, spaces":          {withheld: " " + strings.ReplaceAll(ids(0, 1, 2, 3, 4, 5, 6, 7), ",", " , "), allocatable: "0", wantState: diagnose.StateOK},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			n := gpuNode(node)
			if tc.withheld != "" {
				n.Annotations[allocation.KeyAgentDeviceCordon] = tc.withheld
			}
			n.Status.Allocatable, n.Status.Capacity = corev1.ResourceList{}, corev1.ResourceList{}
			if tc.allocatable != "" {
				q := resource.MustParse(tc.allocatable)
				n.Status.Allocatable["nvidia.com/gpu"], n.Status.Capacity["nvidia.com/gpu"] = q, q
			}
			r, err := diagnose.Node(t.Context(), fakeClient(true, replace(healthyObjects(node), n)...), node, opts())
			if err != nil {
				t.Fatal(err)
			}
			if r.Count.State != tc.wantState {
				t.Errorf("count state %v, want %v (%+v)", r.Count.State, tc.wantState, r.Count)
			}
			for _, code := range []string{diagnose.CodeAllocatableMismatch, diagnose.CodeNoAllocatable} {
				f, ok := r.Finding(code)
				switch {
				case code == tc.wantCode && !ok:
					t.Errorf("no finding %s in %s", code, dump(r))
				case code == tc.wantCode && !strings.Contains(findingText(f), tc.wantText):
					t.Errorf("finding %s lacks %q:\n%s", code, tc.wantText, findingText(f))
				case code != tc.wantCode && ok:
					t.Errorf("finding %s: %s", code, findingText(f))
				}
			}
		})
	}
}

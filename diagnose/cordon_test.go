package diagnose_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/diagnose"
	"github.com/hamireg/hamireg/dra"
)

// draSlice is the node's ResourceSlice of profile p with the GPUs at idx (uuid and the
// profile's device names).
func draSlice(node string, p dra.Profile, idx ...int) *resourcev1.ResourceSlice {
	s := &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: node + "-" + p.Name},
		Spec: resourcev1.ResourceSliceSpec{Driver: p.Driver, NodeName: &node,
			Pool: resourcev1.ResourcePool{Name: node, ResourceSliceCount: 1}},
	}
	for _, i := range idx {
		uuid := gpus(8)[i].ID
		s.Spec.Devices = append(s.Spec.Devices, resourcev1.Device{Name: p.DeviceName(uint(i)),
			Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{"uuid": {StringValue: &uuid}}})
	}
	return s
}

func cordonOf(t *testing.T, c *fake.Clientset, node string) []string {
	t.Helper()
	n, err := c.CoreV1().Nodes().Get(t.Context(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	v := n.Annotations[allocation.KeyDeviceCordon]
	if v == "" {
		return nil
	}
	return strings.Split(v, ",")
}

func rulesOf(t *testing.T, c *fake.Clientset) []resourcev1.DeviceTaintRule {
	t.Helper()
	l, err := c.ResourceV1().DeviceTaintRules().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}

// TestCordon: cordon adds the GPUs to hami.io/device-cordon beside an operator's entry and
// writes one DeviceTaintRule per DRA device; a repeat changes nothing; uncordon removes both
// and keeps the node agent's entry.
func TestCordon(t *testing.T) {
	t.Parallel()
	const node = "gpu-a"
	g := gpus(8)
	n := gpuNode(node)
	n.Annotations[allocation.KeyDeviceCordon] = "GPU-operator"
	n.Annotations[allocation.KeyAgentDeviceCordon] = g[2].ID
	n.Annotations[allocation.KeyDeviceCordon] += "," + g[2].ID
	c := fake.NewClientset(n, draSlice(node, dra.SDKProfile(), 2, 3), draSlice("gpu-b", dra.SDKProfile(), 2))
	ctx := t.Context()

	res, err := diagnose.Cordon(ctx, c, node, []string{"1", g[3].ID, "2"}, diagnose.CordonOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := cordonOf(t, c, node), []string{"GPU-operator", g[2].ID, g[1].ID, g[3].ID}; !slices.Equal(got, want) {
		t.Errorf("device-cordon = %v, want %v", got, want)
	}
	wantActions := []string{diagnose.CordonAdded, diagnose.CordonAdded, diagnose.CordonUnchanged}
	for i, gc := range res.GPUs {
		if gc.Annotation != wantActions[i] {
			t.Errorf("GPU %s annotation action %q, want %q", gc.GPU, gc.Annotation, wantActions[i])
		}
	}
	if res.GPUs[0].UUID != g[1].ID || res.GPUs[0].Index != 1 || len(res.GPUs[0].Rules) != 0 {
		t.Errorf("GPU 1 (device plugin's, no slice) = %+v", res.GPUs[0])
	}
	rules := rulesOf(t, c)
	if len(rules) != 2 {
		t.Fatalf("%d DeviceTaintRules, want 2 (gpu-2, gpu-3 of node %s): %+v", len(rules), node, rules)
	}
	for _, r := range rules {
		s := r.Spec.DeviceSelector
		if s == nil || *s.Driver != dra.SDKDriver || *s.Pool != node || (*s.Device != "gpu-2" && *s.Device != "gpu-3") {
			t.Errorf("rule %s selects %+v", r.Name, s)
		}
		if r.Spec.Taint.Key != dra.SDKDriver+"/cordoned" || r.Spec.Taint.Effect != resourcev1.DeviceTaintEffectNoSchedule {
			t.Errorf("rule %s taint %+v", r.Name, r.Spec.Taint)
		}
		if r.Name != diagnose.CordonRuleName(dra.SDKDriver, node, *s.Device) {
			t.Errorf("rule name %s", r.Name)
		}
	}

	// Again: nothing changes.
	before := len(c.Actions())
	res, err = diagnose.Cordon(ctx, c, node, []string{"1", g[3].ID, "2"}, diagnose.CordonOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range c.Actions()[before:] {
		if a.GetVerb() != "get" && a.GetVerb() != "list" {
			t.Errorf("repeated cordon wrote: %s %s", a.GetVerb(), a.GetResource().Resource)
		}
	}
	for _, gc := range res.GPUs {
		if gc.Annotation != diagnose.CordonUnchanged || slices.ContainsFunc(gc.Rules, func(r diagnose.CordonChange) bool { return r.Action != diagnose.CordonUnchanged }) {
			t.Errorf("repeated cordon of %s: %+v", gc.GPU, gc)
		}
	}

	res, err = diagnose.Uncordon(ctx, c, node, []string{"1", "3", g[2].ID}, diagnose.CordonOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := cordonOf(t, c, node), []string{"GPU-operator", g[2].ID}; !slices.Equal(got, want) {
		t.Errorf("device-cordon after uncordon = %v, want %v (operator's and the agent's kept)", got, want)
	}
	if res.GPUs[2].Annotation != diagnose.CordonKeptByAgent {
		t.Errorf("GPU 2 annotation action %q, want %q", res.GPUs[2].Annotation, diagnose.CordonKeptByAgent)
	}
	if rules := rulesOf(t, c); len(rules) != 0 {
		t.Errorf("rules left after uncordon: %+v", rules)
	}
}

// TestCordonHAMiProfile: a GPU published by HAMi-DRA's driver only (not in the register
// annotation) is found by its uuid attribute and index and tainted under that driver's key.
func TestCordonHAMiProfile(t *testing.T) {
	t.Parallel()
	const node = "gpu-h"
	n := gpuNode(node)
	delete(n.Annotations, annotation.KeyNVIDIARegister)
	c := fake.NewClientset(n, draSlice(node, dra.HAMiProfile(), 4))
	res, err := diagnose.Cordon(t.Context(), c, node, []string{"4"}, diagnose.CordonOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.GPUs[0].UUID != gpus(8)[4].ID || len(res.GPUs[0].Rules) != 1 || res.GPUs[0].Rules[0].Device != "hami-gpu-4" {
		t.Fatalf("result %+v", res.GPUs[0])
	}
	r := rulesOf(t, c)
	if len(r) != 1 || r[0].Spec.Taint.Key != dra.HAMiDriver+"/cordoned" {
		t.Fatalf("rules %+v", r)
	}
}

// TestCordonErrors: an unknown GPU, a missing node and a Forbidden write are classified, name
// the fix, and an unknown GPU writes nothing.
func TestCordonErrors(t *testing.T) {
	t.Parallel()
	const node = "gpu-e"
	forbid := func(verb, resource string) func(*fake.Clientset) {
		return func(c *fake.Clientset) {
			c.PrependReactor(verb, resource, func(k8stesting.Action) (bool, runtime.Object, error) {
				return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "resource.k8s.io", Resource: resource}, "", errors.New("RBAC: access denied"))
			})
		}
	}
	for name, tc := range map[string]struct {
		node    string
		gpus    []string
		react   func(*fake.Clientset)
		want    error
		wantMsg string
	}{
		"unknown GPU":     {node: node, gpus: []string{"0", "9"}, want: diagnose.ErrGPUNotFound, wantMsg: "0=GPU-00000000"},
		"unknown UUID":    {node: node, gpus: []string{"GPU-x"}, want: diagnose.ErrGPUNotFound},
		"negative index":  {node: node, gpus: []string{"-1"}, want: diagnose.ErrGPUNotFound},
		"no node":         {node: "nope", gpus: []string{"0"}, want: diagnose.ErrNodeNotFound},
		"no GPU":          {node: node, want: diagnose.ErrInvalidOptions},
		"rules forbidden": {node: node, gpus: []string{"0"}, react: forbid("create", "devicetaintrules"), want: diagnose.ErrForbidden, wantMsg: "resources: [devicetaintrules], verbs: [create]"},
		"slices forbidden": {node: node, gpus: []string{"0"}, react: forbid("list", "resourceslices"), want: diagnose.ErrForbidden,
			wantMsg: "resources: [resourceslices], verbs: [list]"},
		"node patch forbidden": {node: node, gpus: []string{"0"}, react: forbid("patch", "nodes"), want: diagnose.ErrForbidden, wantMsg: `apiGroups: [""], resources: [nodes], verbs: [patch]`},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := fake.NewClientset(gpuNode(node), draSlice(node, dra.SDKProfile(), 0))
			if tc.react != nil {
				tc.react(c)
			}
			_, err := diagnose.Cordon(t.Context(), c, tc.node, tc.gpus, diagnose.CordonOptions{})
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.wantMsg) {
				t.Fatalf("err = %v, want %v containing %q", err, tc.want, tc.wantMsg)
			}
			if errors.Is(err, diagnose.ErrGPUNotFound) {
				if got := cordonOf(t, c, node); len(got) != 0 {
					t.Errorf("device-cordon written on an error: %v", got)
				}
			}
		})
	}
}

// TestCordonDryRun: with DryRun every write carries dryRun=All.
func TestCordonDryRun(t *testing.T) {
	t.Parallel()
	const node = "gpu-d"
	c := fake.NewClientset(gpuNode(node), draSlice(node, dra.SDKProfile(), 0))
	var writes int
	c.PrependReactor("*", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		var dry []string
		switch a := a.(type) {
		case k8stesting.CreateActionImpl:
			dry = a.CreateOptions.DryRun
		case k8stesting.PatchActionImpl:
			dry = a.PatchOptions.DryRun
		case k8stesting.UpdateActionImpl:
			dry = a.UpdateOptions.DryRun
		case k8stesting.DeleteActionImpl:
			dry = a.DeleteOptions.DryRun
		default:
			return false, nil, nil
		}
		writes++
		if !slices.Equal(dry, []string{metav1.DryRunAll}) {
			t.Errorf("%s %s without dryRun=All", a.GetVerb(), a.GetResource().Resource)
		}
		return true, nil, nil // the server's dry run stores nothing
	})
	res, err := diagnose.Cordon(t.Context(), c, node, []string{"0"}, diagnose.CordonOptions{DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if !res.DryRun || res.GPUs[0].Annotation != diagnose.CordonAdded || len(res.GPUs[0].Rules) != 1 || res.GPUs[0].Rules[0].Action != diagnose.CordonAdded {
		t.Errorf("dry-run result %+v", res)
	}
	if writes != 2 {
		t.Errorf("%d writes, want 2 (node patch, rule create)", writes)
	}
	if got := cordonOf(t, c, node); len(got) != 0 {
		t.Errorf("device-cordon = %v after a dry run", got)
	}
}

// TestCordonRuleName: names are DNS subdomains, differ per driver, and a name too long for
// the readable form falls back to the hash.
func TestCordonRuleName(t *testing.T) {
	t.Parallel()
	a := diagnose.CordonRuleName(dra.SDKDriver, "node-1", "gpu-0")
	b := diagnose.CordonRuleName(dra.HAMiDriver, "node-1", "gpu-0")
	long := diagnose.CordonRuleName(dra.SDKDriver, strings.Repeat("n", 250), "gpu-0")
	odd := diagnose.CordonRuleName(dra.SDKDriver, "Node_1", "gpu-0")
	if a == b || !strings.HasPrefix(a, "hamireg-cordon-node-1-gpu-0-") {
		t.Errorf("names %q, %q", a, b)
	}
	for _, n := range []string{a, b, long, odd} {
		if len(n) > 253 || strings.ToLower(n) != n || strings.Contains(n, "_") {
			t.Errorf("name %q is not a DNS subdomain", n)
		}
	}
}

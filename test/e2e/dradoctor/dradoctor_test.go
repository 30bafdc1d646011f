package dradoctor_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/diagnose"
	"github.com/hamireg/hamireg/dra"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// device is the one device allocated to claim c.
func device(t *testing.T, c *resourcev1.ResourceClaim) string {
	t.Helper()
	r := c.Status.Allocation.Devices.Results
	if len(r) != 1 {
		t.Fatalf("claim %s: %d results, want 1", c.Name, len(r))
	}
	return r[0].Device
}

// diagnosePod runs the doctor's pod diagnosis (no node monitor).
func diagnosePod(t *testing.T, ns, name string) *diagnose.PodReport {
	t.Helper()
	r, err := diagnose.Pod(harness.Context(t), cp.AdminClient(), ns, name, diagnose.Options{MonitorPort: -1})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func reportText(r *diagnose.PodReport) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s %s: %s\n", r.Stage, r.StageText, r.Case, r.Reason)
	for _, c := range r.Claims {
		fmt.Fprintf(&b, "claim %+v\n", c)
	}
	for _, f := range r.Findings {
		fmt.Fprintf(&b, "[%s] %s %s: %s | %s | %s\n", f.Severity, f.Case, f.Code, f.Summary, strings.Join(f.Evidence, " ; "), strings.Join(f.Fix, " ; "))
	}
	return b.String()
}

// TestCordonAndDiagnose: the slice carries the standard resource.kubernetes.io/numaNode; the
// doctor's cordon of a DRA-owned GPU writes a DeviceTaintRule
// that kube-scheduler honours (a new claim that would have got the GPU gets another, one that
// wants only that GPU stays unschedulable, the claim already on it keeps it) and its uncordon
// gives the GPU back; the doctor's pod diagnosis tells each stage of a claim-based pod on the
// way: unallocatable with kube-scheduler's message, bound and not prepared, prepared and
// healthy, and prepared on a GPU that turned unhealthy.
func TestCordonAndDiagnose(t *testing.T) {
	t.Parallel()
	n := startDRANode(t)
	ns, class := n.name, n.profile.Driver
	w := cp.WatchSlices(t, class, n.name)
	slice := w.WaitFor(t, "the node's slice with 8 devices", func(s []*resourcev1.ResourceSlice) bool {
		return len(s) == 1 && len(s[0].Spec.Devices) == harness.SimulatedGPUs
	})[0]
	// The standard NUMA attribute, from the scan's sysfs (the simulated A100 has GPUs 0-3 on
	// node 0, 4-7 on node 1).
	for i, d := range slice.Spec.Devices {
		if a := d.Attributes[dra.AttributeNUMANode]; a.IntValue == nil || *a.IntValue != int64(i/4) {
			t.Errorf("%s %s = %+v, want %d", d.Name, dra.AttributeNUMANode, a, i/4)
		}
	}

	// A claim on the first-fit GPU.
	req := harness.ClaimRequest{Memory: "4Gi", Cores: "10"}
	cp.CreateClaimPod(t, n.name, "first", harness.Claim(ns, "first", class, req))
	first := device(t, cp.WaitForAllocation(t, ns, "first"))
	index, ok := n.profile.IndexOf(first)
	if !ok {
		t.Fatalf("claim first got %s, not a device of profile %s", first, n.profile.Name)
	}

	// Cordon it with the doctor.
	ctx := harness.Context(t)
	gpu := fmt.Sprint(index)
	res, err := diagnose.Cordon(ctx, cp.AdminClient(), n.name, []string{gpu}, diagnose.CordonOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rule := diagnose.CordonRuleName(class, n.name, first)
	if len(res.GPUs) != 1 || len(res.GPUs[0].Rules) != 1 || res.GPUs[0].Rules[0].Rule != rule || res.GPUs[0].Rules[0].Action != diagnose.CordonAdded {
		t.Fatalf("cordon result %+v", res)
	}
	uuid := res.GPUs[0].UUID
	// The agent keeps every DRA-owned GPU in hami.io/device-cordon already.
	if a := res.GPUs[0].Annotation; a != diagnose.CordonUnchanged {
		t.Errorf("annotation action %q, want %q (the agent cordons DRA's GPUs)", a, diagnose.CordonUnchanged)
	}
	r, err := cp.AdminClient().ResourceV1().DeviceTaintRules().Get(ctx, rule, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("DeviceTaintRule %s: %v", rule, err)
	}
	if s := r.Spec.DeviceSelector; s == nil || *s.Driver != class || *s.Pool != n.name || *s.Device != first ||
		r.Spec.Taint.Key != class+"/cordoned" || r.Spec.Taint.Effect != resourcev1.DeviceTaintEffectNoSchedule {
		t.Errorf("DeviceTaintRule %s = %+v", rule, r.Spec)
	}
	if again, err := diagnose.Cordon(ctx, cp.AdminClient(), n.name, []string{uuid}, diagnose.CordonOptions{}); err != nil || again.GPUs[0].Rules[0].Action != diagnose.CordonUnchanged {
		t.Errorf("cordon again: %v %+v", err, again)
	}

	// A new claim that would have got the GPU gets another; the first keeps it.
	cp.CreateClaimPod(t, n.name, "second", harness.Claim(ns, "second", class, req))
	if got := device(t, cp.WaitForAllocation(t, ns, "second")); got == first {
		t.Errorf("claim second got the cordoned %s", got)
	}
	if c, err := cp.AdminClient().ResourceV1().ResourceClaims(ns).Get(ctx, "first", metav1.GetOptions{}); err != nil || c.Status.Allocation == nil || device(t, c) != first {
		t.Errorf("claim first lost its device: %v %+v", err, c)
	}

	// A claim that wants only that GPU stays unschedulable; the doctor says why.
	only := req
	only.Selectors = []string{fmt.Sprintf("device.attributes[%q].index == %d", class, index)}
	cp.CreateClaimPod(t, n.name, "only", harness.Claim(ns, "only", class, only))
	msg := cp.WaitForUnschedulable(t, ns, "only")
	rep := diagnosePod(t, ns, "only")
	f, found := rep.Finding(diagnose.CodeClaimUnallocatable)
	if rep.Case != diagnose.P10ClaimUnallocatable || rep.Stage != diagnose.StageAdmitted || !found ||
		!strings.Contains(f.Summary, msg) || !slices.ContainsFunc(f.Evidence, func(e string) bool {
		return strings.Contains(e, first+" ("+class+"/cordoned:NoSchedule by DeviceTaintRule "+rule+")")
	}) {
		t.Errorf("diagnosis of the unschedulable pod (scheduler: %q):\n%s", msg, reportText(rep))
	}

	// Bound, not prepared yet.
	cp.WaitForBound(t, ns, "second")
	rep = diagnosePod(t, ns, "second")
	if rep.Stage != diagnose.StageBound || rep.Case != diagnose.Healthy || len(rep.Claims) != 1 || rep.Claims[0].State != diagnose.ClaimStateReserved {
		t.Errorf("diagnosis of the bound pod:\n%s", reportText(rep))
	}

	// Prepared and running (the test plays the kubelet), healthy.
	pod := cp.WaitForBound(t, ns, "first")
	if err := n.dra.Prepare(ctx, pod); err != nil {
		t.Fatalf("prepare pod first: %v", err)
	}
	pod.Status.Phase = corev1.PodRunning
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "cuda", Ready: true, Image: "registry.invalid/cuda:0",
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}}}
	if _, err := cp.AdminClient().CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	rep = diagnosePod(t, ns, "first")
	if rep.Stage != diagnose.StageRunning || rep.Case != diagnose.Healthy || len(rep.Claims) != 1 || len(rep.Claims[0].Devices) != 1 ||
		rep.Claims[0].Devices[0].Device != first {
		t.Errorf("diagnosis of the running pod:\n%s", reportText(rep))
	}
	if _, cordoned := rep.Finding(diagnose.CodeDeviceCordoned); !cordoned {
		t.Errorf("the running pod's device is cordoned, the diagnosis does not say so:\n%s", reportText(rep))
	}

	// Uncordon: the rule goes, the annotation keeps the agent's entry, and the claim that
	// wants only that GPU gets it (kube-scheduler retries it on the rule's deletion).
	res, err = diagnose.Uncordon(ctx, cp.AdminClient(), n.name, []string{uuid}, diagnose.CordonOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if g := res.GPUs[0]; g.Annotation != diagnose.CordonKeptByAgent || len(g.Rules) != 1 || g.Rules[0].Action != diagnose.CordonRemoved {
		t.Errorf("uncordon result %+v", g)
	}
	if _, err := cp.AdminClient().ResourceV1().DeviceTaintRules().Get(ctx, rule, metav1.GetOptions{}); err == nil {
		t.Errorf("DeviceTaintRule %s stayed after uncordon", rule)
	}
	if node := cp.GetNode(t, n.name); !slices.Contains(strings.Split(node.Annotations[allocation.KeyDeviceCordon], ","), uuid) {
		t.Errorf("%s = %q lost the agent's %s", allocation.KeyDeviceCordon, node.Annotations[allocation.KeyDeviceCordon], uuid)
	}
	if got := device(t, cp.WaitForAllocation(t, ns, "only")); got != first {
		t.Errorf("claim only got %s after the uncordon, want %s", got, first)
	}

	// Its GPU turns unhealthy: the slice taints it, the doctor names it.
	n.sim.XID(int(index), 79)
	w.WaitFor(t, first+" tainted unhealthy", func(s []*resourcev1.ResourceSlice) bool {
		return len(s) == 1 && slices.ContainsFunc(s[0].Spec.Devices, func(d resourcev1.Device) bool {
			return d.Name == first && slices.ContainsFunc(d.Taints, func(t resourcev1.DeviceTaint) bool { return t.Key == n.profile.UnhealthyTaint() })
		})
	})
	rep = diagnosePod(t, ns, "first")
	f, found = rep.Finding(diagnose.CodeDeviceUnhealthy)
	if rep.Case != diagnose.P12DeviceUnhealthy || !found || !strings.Contains(f.Summary, uuid) ||
		!slices.ContainsFunc(f.Fix, func(s string) bool { return strings.Contains(s, "cordon "+n.name+" "+uuid) }) {
		t.Errorf("diagnosis of the pod on the unhealthy GPU:\n%s", reportText(rep))
	}

}

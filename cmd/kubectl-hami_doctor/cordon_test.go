package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/diagnose"
	"github.com/hamireg/hamireg/dra"
)

// draGPUNode is node gpu-7 with two registered GPUs, GPU 1 published by the SDK's DRA driver.
func draGPUNode() (*corev1.Node, *resourcev1.ResourceSlice) {
	devs := []annotation.Device{{ID: "GPU-a", Index: 0, Count: 10, Devmem: 1000, Devcore: 100, Health: true},
		{ID: "GPU-b", Index: 1, Count: 10, Devmem: 1000, Devcore: 100, Health: true}}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-7", Annotations: map[string]string{
		annotation.KeyNVIDIARegister: annotation.Encode(devs)}}}
	name, uuid := "gpu-7", "GPU-b"
	slice := &resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "gpu-7-sdk"},
		Spec: resourcev1.ResourceSliceSpec{Driver: dra.SDKDriver, NodeName: &name, Pool: resourcev1.ResourcePool{Name: name, ResourceSliceCount: 1},
			Devices: []resourcev1.Device{{Name: "gpu-1", Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{"uuid": {StringValue: &uuid}}}}}}
	return node, slice
}

// TestCordonVerbs runs cordon and uncordon with --yes on the fake clientset: the annotation and
// the DeviceTaintRule appear and go.
func TestCordonVerbs(t *testing.T) {
	t.Parallel()
	kc := kubeconfig(t)
	node, slice := draGPUNode()
	h := newHarness(node, slice)
	out, errOut, code := h.run(t, "cordon", "gpu-7", "0", "GPU-b", "--yes", "--kubeconfig", kc)
	rule := diagnose.CordonRuleName(dra.SDKDriver, "gpu-7", "gpu-1")
	if code != exitHealthy || !strings.Contains(out, rule+" (gpu.hamireg.io/gpu-7/gpu-1): added") || !strings.Contains(out, `"" -> "GPU-a,GPU-b"`) ||
		!strings.Contains(out, "- (not published by a DRA driver)") || strings.Contains(out, "Dry run") {
		t.Errorf("cordon: exit %d\n%s%s", code, out, errOut)
	}
	n, _ := h.client.CoreV1().Nodes().Get(t.Context(), "gpu-7", metav1.GetOptions{})
	if n.Annotations[allocation.KeyDeviceCordon] != "GPU-a,GPU-b" {
		t.Errorf("device-cordon = %q", n.Annotations[allocation.KeyDeviceCordon])
	}
	if _, err := h.client.ResourceV1().DeviceTaintRules().Get(t.Context(), rule, metav1.GetOptions{}); err != nil {
		t.Errorf("rule: %v", err)
	}

	out, errOut, code = h.run(t, "uncordon", "gpu-7", "0", "1", "--yes", "--kubeconfig", kc, "-o", "json")
	var res struct {
		Kind string `json:"kind"`
		diagnose.CordonResult
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || code != exitHealthy || res.Kind != "CordonResult" || res.After != "" ||
		len(res.GPUs) != 2 || res.GPUs[1].Rules[0].Action != diagnose.CordonRemoved {
		t.Errorf("uncordon: exit %d %v %+v\n%s%s", code, err, res, out, errOut)
	}
	if _, err := h.client.ResourceV1().DeviceTaintRules().Get(t.Context(), rule, metav1.GetOptions{}); err == nil {
		t.Error("the rule stayed after uncordon")
	}
}

// TestCordonVerbDryRun: without --yes the verb asks for a dry run and says how to write.
func TestCordonVerbDryRun(t *testing.T) {
	t.Parallel()
	h := newHarness()
	var got diagnose.CordonOptions
	h.api.cordon = func(_ context.Context, _ kubernetes.Interface, node string, gpus []string, opts diagnose.CordonOptions) (*diagnose.CordonResult, error) {
		got = opts
		return &diagnose.CordonResult{Node: node, DryRun: opts.DryRun, After: "GPU-a",
			GPUs: []diagnose.GPUCordon{{GPU: gpus[0], UUID: "GPU-a", Index: 0, Annotation: diagnose.CordonAdded}}}, nil
	}
	out, errOut, code := h.run(t, "cordon", "gpu-7", "0", "--kubeconfig", kubeconfig(t))
	if !got.DryRun || code != exitHealthy || !strings.Contains(out, "Dry run: nothing stored") || !strings.Contains(out, "doctor cordon gpu-7 0 --yes") {
		t.Errorf("exit %d, opts %+v\n%s%s", code, got, out, errOut)
	}
	_, errOut, code = h.run(t, "uncordon", "gpu-7", "--kubeconfig", kubeconfig(t))
	if code != exitError || !strings.Contains(errOut, "at least one GPU") {
		t.Errorf("no GPU: exit %d %q", code, errOut)
	}
	_, errOut, code = newHarness().run(t, "cordon", "gpu-9", "0", "--yes", "--kubeconfig", kubeconfig(t))
	if code != exitError || !strings.Contains(errOut, "gpu-9") || !strings.Contains(errOut, "node not found") {
		t.Errorf("unknown node: exit %d %q", code, errOut)
	}
}

// TestPodClaimOutput: the pod verb shows a claim-based pod's stage, claims and devices with
// the kubelet's health, and exits 1 on an unhealthy device.
func TestPodClaimOutput(t *testing.T) {
	t.Parallel()
	node, slice := draGPUNode()
	claimName, msg := "train-gpu", "XID 79: GPU has fallen off the bus"
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-b", Name: "train", UID: "uid-train"},
		Spec: corev1.PodSpec{NodeName: "gpu-7", ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claimName}},
			Containers: []corev1.Container{{Name: "cuda", Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{Name: "cuda",
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
			AllocatedResourcesStatus: []corev1.ResourceStatus{{Name: "claim:gpu/gpu", Resources: []corev1.ResourceHealth{
				{ResourceID: "gpu.hamireg.io/gpu-7/gpu-1", Health: corev1.ResourceHealthStatusUnhealthy, Message: &msg}}}}}}}}
	claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "team-b", Name: claimName},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{Name: "gpu",
			Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: dra.SDKDriver}}}}},
		Status: resourcev1.ResourceClaimStatus{
			Allocation: &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{Results: []resourcev1.DeviceRequestAllocationResult{
				{Request: "gpu", Driver: dra.SDKDriver, Pool: "gpu-7", Device: "gpu-1"}}}},
			ReservedFor: []resourcev1.ResourceClaimConsumerReference{{Resource: "pods", Name: "train", UID: "uid-train"}}}}
	h := newHarness(node, slice, pod, claim, dra.DeviceClass(dra.SDKProfile()))
	out, errOut, code := h.run(t, "pod", "team-b/train", "--kubeconfig", kubeconfig(t), "--monitor-port", "-1")
	for _, want := range []string{"Pod team-b/train: P12-DeviceUnhealthy", "stage      S4 running (DRA)", "Claims (DRA)",
		"gpu        train-gpu      gpu.hamireg.io  reserved", "gpu/gpu: gpu.hamireg.io/gpu-7/gpu-1  health Unhealthy (" + msg + ")",
		"doctor cordon gpu-7 GPU-b --yes", "DRADeviceUnhealthy"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if code != exitCase {
		t.Errorf("exit %d, want %d", code, exitCase)
	}
	if t.Failed() {
		t.Logf("output:\n%s%s", out, errOut)
	}
}

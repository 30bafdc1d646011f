package diagnose_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/hamireg/hamireg/diagnose"
	"github.com/hamireg/hamireg/dra"
)

const draNS = "team-d"

// claimPod is pod draNS/train using ResourceClaim "train-gpu" through pod claim "gpu".
func claimPod() *corev1.Pod {
	name := "train-gpu"
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: draNS, Name: "train", UID: "uid-train", CreationTimestamp: metav1.NewTime(now.Add(-10 * time.Minute))},
		Spec: corev1.PodSpec{
			SchedulerName:  "default-scheduler",
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &name}},
			Containers: []corev1.Container{{Name: "cuda", Resources: corev1.ResourceRequirements{
				Claims: []corev1.ResourceClaim{{Name: "gpu"}}}}},
		},
		Status: corev1.PodStatus{Phase: corev1.PodPending},
	}
}

// gpuClaim is ResourceClaim train-gpu of class; allocated to device (of node gpu-a) when
// device is not "", and reserved for the pod when reserved.
func gpuClaim(class, driver, device string, reserved bool) *resourcev1.ResourceClaim {
	c := &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: draNS, Name: "train-gpu"},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{Name: "gpu",
			Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 1}}}}},
	}
	if device != "" {
		c.Status.Allocation = &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{Results: []resourcev1.DeviceRequestAllocationResult{{
			Request: "gpu", Driver: driver, Pool: "gpu-a", Device: device,
			ConsumedCapacity: map[resourcev1.QualifiedName]resource.Quantity{"memory": resource.MustParse("10Gi"), "cores": resource.MustParse("0")}}}}}
	}
	if reserved {
		c.Status.ReservedFor = []resourcev1.ResourceClaimConsumerReference{{Resource: "pods", Name: "train", UID: "uid-train"}}
	}
	return c
}

func draEvidence(pod *corev1.Pod, claim *resourcev1.ResourceClaim, slice *resourcev1.ResourceSlice) diagnose.PodEvidence {
	ev := diagnose.PodEvidence{Pod: pod,
		DeviceClasses: []resourcev1.DeviceClass{*dra.DeviceClass(dra.SDKProfile()), *dra.DeviceClass(dra.HAMiProfile())}}
	if claim != nil {
		ev.Claims = []resourcev1.ResourceClaim{*claim}
	}
	if slice != nil {
		ev.ResourceSlices = []resourcev1.ResourceSlice{*slice}
	}
	return ev
}

func boundDRA(p *corev1.Pod, ago time.Duration) *corev1.Pod {
	p.Spec.NodeName = "gpu-a"
	p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionTrue,
		LastTransitionTime: metav1.NewTime(now.Add(-ago))})
	return p
}

func unschedulablePod(msg string) *corev1.Pod {
	p := claimPod()
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse,
		Reason: corev1.PodReasonUnschedulable, Message: msg}}
	return p
}

func running(p *corev1.Pod, health corev1.ResourceHealthStatus, resourceID string) *corev1.Pod {
	p = boundDRA(p, time.Minute)
	p.Status.Phase = corev1.PodRunning
	msg := "XID 79"
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "cuda",
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
		AllocatedResourcesStatus: []corev1.ResourceStatus{{Name: "claim:gpu/gpu", Resources: []corev1.ResourceHealth{
			{ResourceID: corev1.ResourceID(resourceID), Health: health, Message: &msg}}}}}}
	return p
}

func taintedSlice(taints ...resourcev1.DeviceTaint) *resourcev1.ResourceSlice {
	s := draSlice("gpu-a", dra.SDKProfile(), 0, 1)
	s.Spec.Devices[1].Taints = taints
	return s
}

// TestClaimPods: a pod whose GPU comes from a claim of the SDK's or HAMi-DRA's driver is
// recognised, and its stage and case say where it stops.
func TestClaimPods(t *testing.T) {
	t.Parallel()
	sdk, hami := dra.SDKDriver, dra.HAMiDriver
	unhealthy := resourcev1.DeviceTaint{Key: dra.SDKProfile().UnhealthyTaint(), Effect: resourcev1.DeviceTaintEffectNoSchedule}
	failed := corev1.Event{Reason: "FailedPrepareDynamicResources", Type: corev1.EventTypeWarning,
		Message: "Failed to prepare dynamic resources: prepare dynamic resources: NodePrepareResources failed for ResourceClaim train-gpu: no such GPU"}
	cdiID := "k8s.gpu.hamireg.io/gpu=" + "uid-claim-gpu-1"
	for name, tc := range map[string]struct {
		ev        diagnose.PodEvidence
		stage     diagnose.Stage
		caseWant  diagnose.Case
		code      string
		text      string // in the finding with code, or in the reason
		wantState string // of the first claim
	}{
		"claim missing": {ev: draEvidence(claimPod(), nil, nil), stage: diagnose.StageAdmitted,
			caseWant: "", code: "", text: ""}, // no claim to tell the driver: not a DRA pod of ours
		"pending, young": {ev: func() diagnose.PodEvidence {
			p := claimPod()
			p.CreationTimestamp = metav1.NewTime(now.Add(-5 * time.Second))
			return draEvidence(p, gpuClaim(sdk, "", "", false), nil)
		}(), stage: diagnose.StageAdmitted, caseWant: diagnose.Healthy, code: diagnose.CodePodWaiting, text: "waiting for kube-scheduler", wantState: diagnose.ClaimStatePending},
		"pending, old": {ev: draEvidence(claimPod(), gpuClaim(sdk, "", "", false), nil), stage: diagnose.StageAdmitted,
			caseWant: diagnose.P9ClaimPending, code: diagnose.CodeClaimPending, text: "not allocated 10m0s after", wantState: diagnose.ClaimStatePending},
		"unallocatable": {ev: draEvidence(unschedulablePod("0/1 nodes are available: 1 cannot allocate all claims. still not schedulable"),
			gpuClaim(sdk, "", "", false), taintedSlice(unhealthy)), stage: diagnose.StageAdmitted,
			caseWant: diagnose.P10ClaimUnallocatable, code: diagnose.CodeClaimUnallocatable, text: "cannot allocate all claims", wantState: diagnose.ClaimStatePending},
		"unallocatable, HAMi class": {ev: draEvidence(unschedulablePod("0/1 nodes are available: 1 cannot allocate all claims."),
			gpuClaim(hami, "", "", false), nil), stage: diagnose.StageAdmitted,
			caseWant: diagnose.P10ClaimUnallocatable, code: diagnose.CodeClaimUnallocatable, text: "no ResourceSlice of driver " + hami},
		"allocated, not bound": {ev: draEvidence(claimPod(), gpuClaim(sdk, sdk, "gpu-1", true), nil), stage: diagnose.StageFiltered,
			caseWant: diagnose.Healthy, code: diagnose.CodePodWaiting, wantState: diagnose.ClaimStateReserved},
		"bound, prepare failed": {ev: func() diagnose.PodEvidence {
			ev := draEvidence(boundDRA(claimPod(), 30*time.Second), gpuClaim(sdk, sdk, "gpu-1", true), taintedSlice())
			ev.Events = []corev1.Event{failed}
			return ev
		}(), stage: diagnose.StageBound, caseWant: diagnose.P11ClaimNotPrepared, code: diagnose.CodePrepareFailed, text: "no such GPU"},
		"bound, not prepared, late": {ev: draEvidence(boundDRA(claimPod(), 5*time.Minute), gpuClaim(sdk, sdk, "gpu-1", true), nil),
			stage: diagnose.StageBound, caseWant: diagnose.P11ClaimNotPrepared, code: diagnose.CodeClaimNotPrepared, text: "node gpu-a has no ResourceSlice of driver gpu.hamireg.io"},
		"bound, not prepared, young": {ev: draEvidence(boundDRA(claimPod(), 5*time.Second), gpuClaim(sdk, sdk, "gpu-1", true), taintedSlice()),
			stage: diagnose.StageBound, caseWant: diagnose.Healthy, code: diagnose.CodePodWaiting},
		"running, healthy": {ev: draEvidence(running(claimPod(), corev1.ResourceHealthStatusHealthy, sdk+"/gpu-a/gpu-1"), gpuClaim(sdk, sdk, "gpu-1", true), taintedSlice()),
			stage: diagnose.StageRunning, caseWant: diagnose.Healthy, text: "S4 running (DRA)"},
		"running, kubelet says unhealthy": {ev: draEvidence(running(claimPod(), corev1.ResourceHealthStatusUnhealthy, sdk+"/gpu-a/gpu-1"), gpuClaim(sdk, sdk, "gpu-1", true), taintedSlice()),
			stage: diagnose.StageRunning, caseWant: diagnose.P12DeviceUnhealthy, code: diagnose.CodeDeviceUnhealthy, text: "Unhealthy in the pod's allocatedResourcesStatus: XID 79"},
		"running, unhealthy by CDI ID": {ev: draEvidence(running(claimPod(), corev1.ResourceHealthStatusUnhealthy, cdiID), gpuClaim(sdk, sdk, "gpu-1", true), taintedSlice()),
			stage: diagnose.StageRunning, caseWant: diagnose.P12DeviceUnhealthy, code: diagnose.CodeDeviceUnhealthy, text: gpus(8)[1].ID},
		"running, slice taint": {ev: draEvidence(running(claimPod(), corev1.ResourceHealthStatusUnknown, sdk+"/gpu-a/gpu-1"), gpuClaim(sdk, sdk, "gpu-1", true), taintedSlice(unhealthy)),
			stage: diagnose.StageRunning, caseWant: diagnose.P12DeviceUnhealthy, code: diagnose.CodeDeviceUnhealthy, text: "has the taint gpu.hamireg.io/unhealthy:NoSchedule"},
		"running, rule taint": {ev: func() diagnose.PodEvidence {
			ev := draEvidence(running(claimPod(), corev1.ResourceHealthStatusHealthy, sdk+"/gpu-a/gpu-1"), gpuClaim(sdk, sdk, "gpu-1", true), taintedSlice())
			driver, pool, dev := sdk, "gpu-a", "gpu-1"
			ev.DeviceTaintRules = []resourcev1.DeviceTaintRule{{ObjectMeta: metav1.ObjectMeta{Name: "broken"},
				Spec: resourcev1.DeviceTaintRuleSpec{DeviceSelector: &resourcev1.DeviceTaintSelector{Driver: &driver, Pool: &pool, Device: &dev},
					Taint: resourcev1.DeviceTaint{Key: sdk + "/unhealthy", Effect: resourcev1.DeviceTaintEffectNoExecute}}}}
			return ev
		}(), stage: diagnose.StageRunning, caseWant: diagnose.P12DeviceUnhealthy, code: diagnose.CodeDeviceUnhealthy, text: "by DeviceTaintRule broken"},
		"running, cordoned": {ev: draEvidence(running(claimPod(), corev1.ResourceHealthStatusHealthy, sdk+"/gpu-a/gpu-1"), gpuClaim(sdk, sdk, "gpu-1", true),
			taintedSlice(resourcev1.DeviceTaint{Key: sdk + "/cordoned", Effect: resourcev1.DeviceTaintEffectNoSchedule})),
			stage: diagnose.StageRunning, caseWant: diagnose.Healthy, code: diagnose.CodeDeviceCordoned, text: "the pod keeps it"},
		"extended resource through DRA": {ev: func() diagnose.PodEvidence {
			p := gpuPodAsking()
			p = running(p, corev1.ResourceHealthStatusHealthy, sdk+"/gpu-a/gpu-1")
			p.Status.ContainerStatuses[0].AllocatedResourcesStatus[0].Name = "claim:container-0-request-0"
			p.Status.ExtendedResourceClaimStatus = &corev1.PodExtendedResourceClaimStatus{ResourceClaimName: "train-gpu"}
			return draEvidence(p, gpuClaim(sdk, sdk, "gpu-1", true), taintedSlice())
		}(), stage: diagnose.StageRunning, caseWant: diagnose.Healthy},
		"extended resource, class maps it, pending": {ev: func() diagnose.PodEvidence {
			ev := draEvidence(gpuPodAsking(), nil, nil)
			ev.DeviceClasses[0].Spec.ExtendedResourceName = new("nvidia.com/gpu")
			ev.Pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable, Message: "0/1 nodes are available: 1 cannot allocate all claims."}}
			return ev
		}(), stage: diagnose.StageAdmitted, caseWant: diagnose.P10ClaimUnallocatable, code: diagnose.CodeClaimUnallocatable, wantState: diagnose.ClaimStateNotYet},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r, err := diagnose.AnalyzePod(tc.ev, opts())
			if err != nil {
				t.Fatal(err)
			}
			b, _ := json.MarshalIndent(r, "", "  ")
			if tc.caseWant == "" { // not ours: the HAMi path, no claims
				if len(r.Claims) != 0 {
					t.Fatalf("claims %+v for a pod whose claim's driver is unknown\n%s", r.Claims, b)
				}
				return
			}
			if len(r.Claims) == 0 {
				t.Fatalf("not recognised as a claim-based pod\n%s", b)
			}
			if r.Stage != tc.stage || r.Case != tc.caseWant || !strings.Contains(r.StageText, "(DRA)") {
				t.Errorf("stage %v (%q), case %v; want %v, %v\n%s", r.Stage, r.StageText, r.Case, tc.stage, tc.caseWant, b)
			}
			if tc.wantState != "" && r.Claims[0].State != tc.wantState {
				t.Errorf("claim state %q, want %q", r.Claims[0].State, tc.wantState)
			}
			if tc.code != "" {
				f, ok := r.Finding(tc.code)
				if !ok {
					t.Fatalf("no finding %s\n%s", tc.code, b)
				}
				if !strings.Contains(findingText(f)+r.Reason, tc.text) {
					t.Errorf("finding %s lacks %q:\n%s", tc.code, tc.text, findingText(f))
				}
				if f.Severity == diagnose.SeverityError && len(f.Fix) == 0 {
					t.Errorf("error finding %s has no fix", tc.code)
				}
			} else if !strings.Contains(r.Reason, tc.text) {
				t.Errorf("reason %q lacks %q", r.Reason, tc.text)
			}
		})
	}
}

// gpuPodAsking is draNS/train asking nvidia.com/gpu: 1 (no claims), created 10 min ago.
func gpuPodAsking() *corev1.Pod {
	p := claimPod()
	p.Spec.ResourceClaims = nil
	p.Spec.Containers[0].Resources = corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}}
	return p
}

// TestClaimMissing: a pod claim naming a ResourceClaim that does not exist is P9 when its
// template says the driver, and a template whose claim was not generated yet waits.
func TestClaimMissing(t *testing.T) {
	t.Parallel()
	p := claimPod()
	tmpl := "train-tmpl"
	p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: &tmpl}}
	p.Status.ResourceClaimStatuses = []corev1.PodResourceClaimStatus{{Name: "gpu", ResourceClaimName: new("train-gpu-x7k2")}}
	ev := draEvidence(p, nil, nil)
	ev.ClaimTemplates = []resourcev1.ResourceClaimTemplate{{ObjectMeta: metav1.ObjectMeta{Namespace: draNS, Name: tmpl},
		Spec: resourcev1.ResourceClaimTemplateSpec{Spec: gpuClaim(dra.SDKDriver, "", "", false).Spec}}}
	r, err := diagnose.AnalyzePod(ev, opts())
	if err != nil {
		t.Fatal(err)
	}
	f, ok := r.Finding(diagnose.CodeClaimMissing)
	if r.Case != diagnose.P9ClaimPending || !ok || !strings.Contains(f.Summary, "train-gpu-x7k2") || r.Claims[0].Template != tmpl {
		t.Errorf("case %v, finding %+v, claims %+v", r.Case, f, r.Claims)
	}
}

// TestClaimPodThroughTheClientset: Pod reads the claims, slices, classes and rules, and a
// forbidden read says which RBAC rule is missing.
func TestClaimPodThroughTheClientset(t *testing.T) {
	t.Parallel()
	objs := []runtime.Object{running(claimPod(), corev1.ResourceHealthStatusUnhealthy, dra.SDKDriver+"/gpu-a/gpu-1"),
		gpuClaim(dra.SDKDriver, dra.SDKDriver, "gpu-1", true), taintedSlice(), dra.DeviceClass(dra.SDKProfile())}
	r, err := diagnose.Pod(t.Context(), fake.NewClientset(objs...), draNS, "train", opts())
	if err != nil {
		t.Fatal(err)
	}
	if r.Case != diagnose.P12DeviceUnhealthy || len(r.Claims) != 1 || r.Claims[0].Devices[0].Health != "Unhealthy" {
		t.Errorf("case %v, claims %+v", r.Case, r.Claims)
	}

	c := fake.NewClientset(objs...)
	c.PrependReactor("list", "resourceclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceclaims"}, "", errors.New("RBAC"))
	})
	r, err = diagnose.Pod(t.Context(), c, draNS, "train", opts())
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, f := range r.Findings {
		if f.Code == diagnose.CodePodNotChecked && strings.Contains(f.Summary, "resourceclaims") &&
			strings.Contains(strings.Join(f.Fix, "\n"), "resources: [resourceclaims], verbs: [get, list]") {
			found = true
		}
	}
	if !found {
		t.Errorf("no NotChecked finding naming the rule on resourceclaims: %+v", r.Findings)
	}
	rules := diagnose.PodClusterRoleRules()
	for _, res := range []string{"resourceclaims", "resourceslices", "deviceclasses", "devicetaintrules"} {
		ok := false
		for _, rule := range rules {
			if len(rule.APIGroups) == 1 && rule.APIGroups[0] == "resource.k8s.io" && strings.Contains(strings.Join(rule.Resources, ","), res) {
				ok = true
			}
		}
		if !ok {
			t.Errorf("PodClusterRoleRules has no rule on %s", res)
		}
	}
}

// TestPodsListsClaimPods: Pods lists a Pending claim-based pod, not a pod whose claims are
// another driver's.
func TestPodsListsClaimPods(t *testing.T) {
	t.Parallel()
	c := fake.NewClientset(unschedulablePod("0/1 nodes are available: 1 cannot allocate all claims."), gpuClaim(dra.SDKDriver, "", "", false), dra.DeviceClass(dra.SDKProfile()))
	nic := unschedulablePod("0/1 nodes are available: 1 cannot allocate all claims.")
	nic.Name, nic.UID = "nic", "uid-nic"
	nicClaim := gpuClaim("nic.example.com", "", "", false)
	nicClaim.Name = "nic-claim"
	nic.Spec.ResourceClaims[0].ResourceClaimName = &nicClaim.Name
	if _, err := c.CoreV1().Pods(draNS).Create(t.Context(), nic, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ResourceV1().ResourceClaims(draNS).Create(t.Context(), nicClaim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rs, err := diagnose.Pods(t.Context(), c, draNS, opts())
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 1 || rs[0].Name != "train" || rs[0].Case != diagnose.P10ClaimUnallocatable {
		t.Errorf("reports %+v, want train alone (nic's claim is another driver's)", rs)
	}
}

// TestParseClaimResourceName and TestParseDeviceResourceID: the kubelet's forms.
func TestParseClaimResourceName(t *testing.T) {
	t.Parallel()
	for in, want := range map[string][3]string{
		"claim:gpu":         {"gpu", "", "ok"},
		"claim:gpu/req":     {"gpu", "req", "ok"},
		"claim:gpu/req/sub": {"gpu", "req/sub", "ok"},
		"nvidia.com/gpu":    {"", "", ""},
		"claim:":            {"", "", ""},
		"claim:/x":          {"", "", ""},
		"claimgpu":          {"", "", ""},
	} {
		c, r, ok := diagnose.ParseClaimResourceName(in)
		if c != want[0] || r != want[1] || ok != (want[2] == "ok") {
			t.Errorf("ParseClaimResourceName(%q) = %q, %q, %v; want %v", in, c, r, ok, want)
		}
	}
	for in, want := range map[string][4]string{
		"gpu.hamireg.io/node-1/gpu-0":      {"gpu.hamireg.io", "node-1", "gpu-0", "ok"},
		"gpu.hamireg.io/a/b/gpu-0":         {"gpu.hamireg.io", "a/b", "gpu-0", "ok"},
		"k8s.gpu.hamireg.io/gpu=uid-gpu-0": {"", "", "", ""},
		"gpu.hamireg.io/gpu-0":             {"", "", "", ""},
		"gpu.hamireg.io//gpu-0":            {"", "", "", ""},
		"/node/gpu-0":                      {"", "", "", ""},
		"gpu.hamireg.io/node/":             {"", "", "", ""},
	} {
		d, p, dev, ok := diagnose.ParseDeviceResourceID(in)
		if d != want[0] || p != want[1] || dev != want[2] || ok != (want[3] == "ok") {
			t.Errorf("ParseDeviceResourceID(%q) = %q, %q, %q, %v; want %v", in, d, p, dev, ok, want)
		}
	}
}

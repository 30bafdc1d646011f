package diagnose_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/diagnose"
)

func opts() diagnose.Options {
	return diagnose.Options{Clock: clocktesting.NewFakePassiveClock(now), Location: time.UTC}
}

// replace swaps the object of the same kind and name in objs.
func replace(objs []runtime.Object, with ...runtime.Object) []runtime.Object {
	out := append([]runtime.Object(nil), objs...)
	for _, w := range with {
		for i, o := range out {
			if sameObject(o, w) {
				out[i] = w
			}
		}
	}
	return out
}

func sameObject(a, b runtime.Object) bool {
	ma, err1 := meta.Accessor(a)
	mb, err2 := meta.Accessor(b)
	return err1 == nil && err2 == nil && reflect.TypeOf(a) == reflect.TypeOf(b) && ma.GetName() == mb.GetName()
}

func without(objs []runtime.Object, drop func(runtime.Object) bool) []runtime.Object {
	var out []runtime.Object
	for _, o := range objs {
		if !drop(o) {
			out = append(out, o)
		}
	}
	return out
}

func isPod(o runtime.Object) bool {
	p, ok := o.(*corev1.Pod)
	return ok && p.Spec.NodeName != ""
}

func TestNodeCases(t *testing.T) {
	t.Parallel()
	const node = "gpu-a"
	healthy := healthyObjects(node)
	noLabel := gpuNode(node)
	delete(noLabel.Labels, "gpu")
	tainted := gpuNode(node)
	tainted.Spec.Taints = []corev1.Taint{{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule},
		{Key: corev1.TaintNodeNotReady, Effect: corev1.TaintEffectNoExecute}} // the second one is tolerated by every DaemonSet
	notReady := gpuNode(node)
	notReady.Spec.Taints = []corev1.Taint{{Key: corev1.TaintNodeNotReady, Effect: corev1.TaintEffectNoSchedule}}
	notReady.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionFalse, Reason: "KubeletNotReady", Message: "container runtime network not ready"}}
	noAlloc := gpuNode(node)
	noAlloc.Status.Allocatable, noAlloc.Status.Capacity = nil, nil
	noAnno := gpuNode(node)
	delete(noAnno.Annotations, annotation.KeyNVIDIARegister)
	legacyEnv := crashingPod(node, "E1130 10:00:00 register.go:196] Node name is empty\nget node error nodename is empty")
	legacyEnv.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "NodeName", ValueFrom: legacyEnv.Spec.Containers[0].Env[0].ValueFrom}}
	tests := map[string]struct {
		objs       []runtime.Object
		allowPatch bool
		wantCase   diagnose.Case
		wantCode   string
		want       []string // in the finding's text
	}{
		"healthy": {objs: healthy, allowPatch: true, wantCase: diagnose.Healthy, wantCode: diagnose.CodeFollowerLogQuiet,
			want: []string{"hami-scheduler-7d9f8b6c5-x2x4q", "a quiet follower log proves nothing"}},
		"label missing": {objs: without(replace(healthy, noLabel), isPod), allowPatch: true, wantCase: diagnose.CasePluginNotScheduled,
			wantCode: diagnose.CodeNodeSelectorMismatch, want: []string{"kubectl label node gpu-a gpu=on", "nodeSelector: gpu=on"}},
		"taint": {objs: without(replace(healthy, tainted), isPod), allowPatch: true, wantCase: diagnose.CasePluginNotScheduled,
			wantCode: diagnose.CodeUntoleratedTaint, want: []string{"nvidia.com/gpu=present:NoSchedule", `"path":"/spec/template/spec/tolerations","value":[{"key":"nvidia.com/gpu","operator":"Equal","value":"present","effect":"NoSchedule"}]`, "kubectl taint node gpu-a nvidia.com/gpu=present:NoSchedule-"}},
		"not ready": {objs: without(replace(healthy, notReady), isPod), allowPatch: true, wantCase: diagnose.CasePluginNotScheduled,
			wantCode: diagnose.CodeUntoleratedTaint, want: []string{"Kubernetes sets from a node condition", "node condition Ready=False: KubeletNotReady", "kubectl describe node gpu-a", "journalctl -u kubelet"}},
		"panic": {objs: replace(healthy, crashingPod(node, "goroutine 1 [running]:\npanic: runtime error: index out of range [0] with length 0\n\ngoroutine 1:\nmain.main()\n\t/go/src/main.go:12 +0x1d\nexit status 2")), allowPatch: true,
			wantCase: diagnose.CasePluginNotRunning, wantCode: diagnose.CodePluginCrashing, want: []string{"panic: runtime error: index out of range", "CrashLoopBackOff"}},
		"nvml crash": {objs: replace(healthy, crashingPod(node, "nvml Init err: ERROR_LIBRARY_NOT_FOUND\npanic: 0")), allowPatch: true,
			wantCase: diagnose.CasePluginNotRunning, wantCode: diagnose.CodeNVMLUnavailable,
			want: []string{"no runtimeClassName", `"runtimeClassName":"nvidia"`, "/etc/containerd/config.toml", "7 restarts"}},
		"legacy NodeName": {objs: replace(healthy, legacyEnv), allowPatch: true, wantCase: diagnose.CasePluginNotRunning,
			wantCode: diagnose.CodeNodeNameEnv, want: []string{"legacy variable NodeName but not NODE_NAME", "spec.nodeName"}},
		"no allocatable": {objs: replace(healthy, noAlloc), allowPatch: true, wantCase: diagnose.CaseNoAllocatable,
			wantCode: diagnose.CodeNoAllocatable, want: []string{"--root-dir", "systemctl restart kubelet", "allocatable should be 80"}},
		"annotation missing, RBAC ok": {objs: replace(healthy, noAnno), allowPatch: true, wantCase: diagnose.CaseNoAnnotation,
			wantCode: diagnose.CodeAnnotationMissing, want: []string{"Updating node annotations"}},
		"annotation missing, no RBAC": {objs: replace(healthy, noAnno), allowPatch: false, wantCase: diagnose.CaseNoAnnotation,
			wantCode: diagnose.CodePatchForbidden, want: []string{"kubectl create clusterrolebinding hami-device-plugin-nodes --clusterrole=hami-device-plugin-nodes --serviceaccount=kube-system:hami-device-plugin", "no RBAC policy matched"}},
		"selector": {objs: replace(healthy, schedulerDeployment("--node-label-selector", "gpu-pool=hami,zone=a")), allowPatch: true,
			wantCase: diagnose.CaseSchedulerExcludes, wantCode: diagnose.CodeLabelSelectorExcludes,
			want: []string{"kubectl label node gpu-a gpu-pool=hami", "kubectl label node gpu-a zone=a", "gpu-pool=hami,zone=a"}},
		"lease expired": {objs: replace(healthy, lease("hami-scheduler-7d9f8b6c5-x2x4q_1", now.Add(-10*time.Minute))), allowPatch: true,
			wantCase: diagnose.CaseSchedulerExcludes, wantCode: diagnose.CodeNoLeader, want: []string{"last renewed 10m0s ago"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r, err := diagnose.Node(t.Context(), fakeClient(tc.allowPatch, tc.objs...), node, opts())
			if err != nil {
				t.Fatal(err)
			}
			if r.Case != tc.wantCase {
				t.Errorf("case = %v (%s), want %v", r.Case, r.Reason, tc.wantCase)
			}
			f, ok := r.Finding(tc.wantCode)
			if !ok {
				t.Fatalf("no finding %s in %s", tc.wantCode, dump(r))
			}
			text := findingText(f)
			for _, w := range tc.want {
				if !strings.Contains(text, w) {
					t.Errorf("finding %s lacks %q:\n%s", tc.wantCode, w, text)
				}
			}
			if tc.wantCase != diagnose.Healthy && f.Case == tc.wantCase && f.Severity == diagnose.SeverityError && r.Reason != f.Summary {
				t.Errorf("reason %q, want the finding's summary", r.Reason)
			}
		})
	}
}

func findingText(f diagnose.Finding) string {
	return strings.Join(append(append(append([]string{f.Summary}, f.Evidence...), f.Fix...), f.OnNode...), "\n")
}

func dump(r *diagnose.Report) string {
	b, _ := json.MarshalIndent(r, "", "  ")
	return string(b)
}

// With no NVML error in the termination message, the previous log is searched.
func TestNVMLErrorInLog(t *testing.T) {
	t.Parallel()
	objs := replace(healthyObjects("gpu-1"), crashingPod("gpu-1", ""))
	r, err := diagnose.Node(t.Context(), fakeClient(true, objs...), "gpu-1", opts())
	if err != nil {
		t.Fatal(err)
	}
	// The fake clientset's log is "fake logs": no NVML text, so a generic crash finding.
	if f, ok := r.Finding(diagnose.CodePluginCrashing); !ok || r.Case != diagnose.CasePluginNotRunning || !strings.Contains(findingText(f), "--previous") {
		t.Errorf("case %v, findings %s", r.Case, dump(r))
	}
}

func TestNodeNotFound(t *testing.T) {
	t.Parallel()
	_, err := diagnose.Node(t.Context(), fakeClient(true), "nope", opts())
	if !errors.Is(err, diagnose.ErrNodeNotFound) || !strings.Contains(err.Error(), "kubectl get nodes") {
		t.Errorf("err = %v", err)
	}
}

func TestInvalidOptions(t *testing.T) {
	t.Parallel()
	o := opts()
	o.PluginSelector = "a in (b"
	if _, err := diagnose.Node(t.Context(), fakeClient(true), "x", o); !errors.Is(err, diagnose.ErrInvalidOptions) {
		t.Errorf("err = %v", err)
	}
}

// What the caller may not read is reported, not fatal.
func TestForbiddenReadsAreFindings(t *testing.T) {
	t.Parallel()
	c := fakeClient(true, healthyObjects("gpu-1")...)
	forbid := func(a k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: a.GetResource().Resource}, "", errors.New("RBAC"))
	}
	c.PrependReactor("get", "leases", forbid)
	c.PrependReactor("create", "subjectaccessreviews", forbid)
	r, err := diagnose.Node(t.Context(), c, "gpu-1", opts())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range r.Findings {
		if f.Code == diagnose.CodeNotChecked {
			n++
		}
	}
	if n != 2 || r.Case != diagnose.Healthy {
		t.Errorf("%d NotChecked findings, case %v: %s", n, r.Case, dump(r))
	}
}

func TestNodesListsGPUNodesOnly(t *testing.T) {
	t.Parallel()
	plain := &corev1.Node{}
	plain.Name = "cpu-1"
	labelled := &corev1.Node{}
	labelled.Name, labelled.Labels = "gpu-2", map[string]string{"gpu": "on"}
	capacity := &corev1.Node{}
	capacity.Name = "gpu-3"
	capacity.Status.Capacity = corev1.ResourceList{annotation.ResourceNVIDIAGPU: resource.MustParse("0")}
	objs := append(healthyObjects("gpu-1"), plain, labelled, capacity)
	reports, err := diagnose.Nodes(t.Context(), fakeClient(true, objs...), opts())
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range reports {
		got = append(got, r.Node+":"+r.Case.Short())
	}
	want := "gpu-1:healthy gpu-2:case 1 gpu-3:case 1"
	if strings.Join(got, " ") != want {
		t.Errorf("nodes = %v, want %s", got, want)
	}
}

func TestHandshakeInterpretation(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		value    *string
		wantCase diagnose.Case
		wantCode string
	}{
		"old stamp is normal":       {value: ptrTo("Requesting_2026-11-30 10:00:00"), wantCase: diagnose.Healthy, wantCode: diagnose.CodeHandshakeOld},
		"absent":                    {value: nil, wantCase: diagnose.CaseSchedulerExcludes, wantCode: diagnose.CodeHandshakeMissing},
		"reported (pre-2.8)":        {value: ptrTo("Reported 2024-01-23 04:30:04"), wantCase: diagnose.CaseSchedulerExcludes, wantCode: diagnose.CodeHandshakeMissing},
		"no underscore":             {value: ptrTo("Requesting"), wantCase: diagnose.Healthy, wantCode: diagnose.CodeHandshakeBroken},
		"dot layout":                {value: ptrTo("Requesting_2024.05.27 09:48:48"), wantCase: diagnose.Healthy, wantCode: diagnose.CodeHandshakeBroken},
		"deleted, devices are back": {value: ptrTo("Deleted_2026-11-30 11:59:00"), wantCase: diagnose.Healthy, wantCode: diagnose.CodeHandshakeDeleted},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			n := gpuNode("gpu-1")
			delete(n.Annotations, annotation.KeyNVIDIAHandshake)
			if tc.value != nil {
				n.Annotations[annotation.KeyNVIDIAHandshake] = *tc.value
			}
			r, err := diagnose.Node(t.Context(), fakeClient(true, replace(healthyObjects("gpu-1"), n)...), "gpu-1", opts())
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := r.Finding(tc.wantCode); !ok || r.Case != tc.wantCase {
				t.Errorf("case %v, want %v with %s: %s", r.Case, tc.wantCase, tc.wantCode, dump(r))
			}
		})
	}
}

func ptrTo(s string) *string { return &s }

// The legacy NVIDIA handshake key is explained, not blamed.
func TestLegacyHandshakeKey(t *testing.T) {
	t.Parallel()
	n := gpuNode("gpu-1")
	n.Annotations["hami.io/node-handshake-nvidia"] = "Reported 2024-01-23 04:30:04.434037031 +0000 UTC m=+1104711.777756895"
	r, err := diagnose.Node(t.Context(), fakeClient(true, replace(healthyObjects("gpu-1"), n)...), "gpu-1", opts())
	if err != nil {
		t.Fatal(err)
	}
	if f, ok := r.Finding(diagnose.CodeHandshakeVendorKey); !ok || f.Severity != diagnose.SeverityInfo || r.Case != diagnose.Healthy {
		t.Errorf("%s", dump(r))
	}
}

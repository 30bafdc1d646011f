package diagnose_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/diagnose"
	"github.com/hamireg/hamireg/handshake"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// expect is a finding the report must carry: its code and severity, and text that its
// summary, every one of its evidence lines, fixes and node commands must contain (each
// string in one of them). {node}, {ns}, {pod}, {scheduler} and {rc} stand for the scenario's
// node, namespace, device plugin Pod, scheduler Pod and RuntimeClass.
type expect struct {
	code     string
	severity diagnose.Severity
	summary  []string
	evidence []string
	fix      []string
	onNode   []string
}

// channels are the expected channel states; "" is not checked.
type channels struct {
	plugin, count, spec, handshake diagnose.ChannelState
}

// scenario is one cluster state and what the diagnosis of its GPU node must say.
type scenario struct {
	install install
	// node edits the registered GPU node (gpuNode) before it is created.
	node func(n *corev1.Node)
	// plugin writes the status of the DaemonSet's Pod on the node; nil: no Pod.
	plugin   func(p *corev1.Pod)
	want     diagnose.Case
	channels channels
	findings []expect
	// absent lists codes the report must not carry.
	absent []string
	// check makes further assertions.
	check func(t *testing.T, e *env, r *diagnose.Report)
}

// env is a scenario's cluster.
type env struct {
	h    *hami
	node string
	pod  *corev1.Pod // nil without a device plugin Pod
}

func (e *env) expand(s string) string {
	pod := ""
	if e.pod != nil {
		pod = e.pod.Name
	}
	return strings.NewReplacer("{node}", e.node, "{ns}", e.h.ns, "{pod}", pod, "{scheduler}", e.h.schedulerPod,
		"{rc}", e.h.runtimeClass).Replace(s)
}

func runScenarios(t *testing.T, scenarios map[string]scenario) {
	t.Helper()
	for name, sc := range scenarios {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			h := installHAMi(t, sc.install)
			n := gpuNode(harness.UniqueName("gpu"), h.now)
			if sc.node != nil {
				sc.node(n)
			}
			createNode(t, n)
			e := &env{h: h, node: n.Name}
			if sc.plugin != nil {
				e.pod = h.addPluginPod(t, n.Name, sc.plugin)
			}
			r := h.diagnose(t, n.Name)
			e.verify(t, &sc, r)
		})
	}
}

func (e *env) verify(t *testing.T, sc *scenario, r *diagnose.Report) {
	t.Helper()
	if r.Node != e.node || r.Vendor != annotation.VendorNVIDIA {
		t.Errorf("report of %s/%s, want %s/NVIDIA", r.Node, r.Vendor, e.node)
	}
	if r.Case != sc.want {
		t.Errorf("case = %v (%s), want %v", r.Case, r.Reason, sc.want)
	}
	errs := r.Errors()
	switch {
	case sc.want == diagnose.Healthy && len(errs) > 0:
		t.Errorf("healthy, but with errors: %v", codes(errs))
	case sc.want != diagnose.Healthy && len(errs) == 0:
		t.Errorf("no error finding, want one of %v", sc.want)
	case sc.want != diagnose.Healthy && (errs[0].Summary != r.Reason || errs[0].Case != r.Case):
		t.Errorf("reason %q (case %v) is not the first error %q (case %v)", r.Reason, r.Case, errs[0].Summary, errs[0].Case)
	}
	for _, c := range []struct {
		name      string
		got, want diagnose.ChannelState
	}{
		{"plugin", r.Plugin.State, sc.channels.plugin},
		{"count", r.Count.State, sc.channels.count},
		{"spec", r.Spec.State, sc.channels.spec},
		{"handshake", r.Handshake.State, sc.channels.handshake},
	} {
		if c.want != "" && c.got != c.want {
			t.Errorf("%s channel %s, want %s", c.name, c.got, c.want)
		}
	}
	for _, want := range sc.findings {
		e.expectFinding(t, r, sc.want, want)
	}
	for _, code := range sc.absent {
		if f, ok := r.Finding(code); ok {
			t.Errorf("unexpected finding %s: %s", code, f.Summary)
		}
	}
	if sc.check != nil {
		sc.check(t, e, r)
	}
}

// expectFinding checks one finding; an error finding must belong to the report's case.
func (e *env) expectFinding(t *testing.T, r *diagnose.Report, cs diagnose.Case, want expect) {
	t.Helper()
	f, ok := r.Finding(want.code)
	if !ok {
		t.Errorf("no finding %s; findings: %v", want.code, codes(r.Findings))
		return
	}
	if f.Severity != want.severity {
		t.Errorf("%s: severity %s, want %s", want.code, f.Severity, want.severity)
	}
	if f.Severity == diagnose.SeverityError && f.Case != cs {
		t.Errorf("%s: error in %v, want %v", want.code, f.Case, cs)
	}
	for _, part := range []struct {
		name  string
		got   []string
		wants []string
	}{
		{"summary", []string{f.Summary}, want.summary},
		{"evidence", f.Evidence, want.evidence},
		{"fix", f.Fix, want.fix},
		{"onNode", f.OnNode, want.onNode},
	} {
		for _, w := range part.wants {
			w = e.expand(w)
			if !slices.ContainsFunc(part.got, func(s string) bool { return strings.Contains(s, w) }) {
				t.Errorf("%s: no %s line contains %q:\n\t%s", want.code, part.name, w, strings.Join(part.got, "\n\t"))
			}
		}
	}
}

func codes(fs []diagnose.Finding) []string {
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = string(f.Severity) + " " + f.Code
	}
	return out
}

// fixPatch is a `kubectl -n NS patch daemonset NAME --type=T -p 'PATCH'` command in a fix.
var fixPatch = regexp.MustCompile(`kubectl -n (\S+) patch daemonset (\S+) --type=(json|merge|strategic) -p '(.*)'$`)

// applyFix sends the DaemonSet patch of the finding's fixes (the first one that has one) to
// the API server, as kubectl would, and returns the patched DaemonSet: the command must be
// one the API server accepts.
func applyFix(t *testing.T, e *env, f diagnose.Finding) *appsv1.DaemonSet {
	t.Helper()
	for _, fix := range f.Fix {
		m := fixPatch.FindStringSubmatch(fix)
		if m == nil {
			continue
		}
		if m[1] != e.h.ns || m[2] != pluginName {
			t.Fatalf("fix patches daemonset %s/%s, want %s/%s", m[1], m[2], e.h.ns, pluginName)
		}
		pt := map[string]types.PatchType{"json": types.JSONPatchType, "merge": types.MergePatchType, "strategic": types.StrategicMergePatchType}[m[3]]
		ds, err := cp.AdminClient().AppsV1().DaemonSets(m[1]).Patch(t.Context(), m[2], pt, []byte(m[4]), metav1.PatchOptions{})
		if err != nil {
			t.Fatalf("apply the fix %q: %v", fix, err)
		}
		return ds
	}
	t.Fatalf("%s: no daemonset patch among the fixes %q", f.Code, f.Fix)
	return nil
}

// TestDiagnoseHealthy: registered nodes are healthy, with the notes the guide asks for.
func TestDiagnoseHealthy(t *testing.T) {
	t.Parallel()
	allOK := channels{diagnose.StateOK, diagnose.StateOK, diagnose.StateOK, diagnose.StateOK}
	runScenarios(t, map[string]scenario{
		"chart defaults": {
			plugin:   running,
			want:     diagnose.Healthy,
			channels: allOK,
			findings: []expect{{
				code: diagnose.CodeFollowerLogQuiet, severity: diagnose.SeverityInfo,
				summary:  []string{"the leader is Pod {scheduler}: only the leader's extender registers nodes"},
				evidence: []string{`Lease {ns}/hami-scheduler holder "{scheduler}_`},
				fix:      []string{"kubectl -n {ns} logs {scheduler} -c vgpu-scheduler-extender | grep -E '{node}|Scheduler is not leader'"},
			}},
			check: func(t *testing.T, e *env, r *diagnose.Report) {
				t.Helper()
				if got := codes(r.Findings); !cmp.Equal(got, []string{"info " + diagnose.CodeFollowerLogQuiet}) {
					t.Errorf("findings %v, want only the follower note", got)
				}
				if want := "nvidia.com/gpu 80 allocatable, 8 healthy device(s) in hami.io/node-nvidia-register, handshake requesting"; r.Reason != want {
					t.Errorf("reason %q, want %q", r.Reason, want)
				}
				wantPods := []diagnose.PodState{{Name: e.pod.Name, Phase: "Running", Ready: true}}
				if r.Plugin.DaemonSet != e.h.ns+"/"+pluginName || !cmp.Equal(r.Plugin.Pods, wantPods) {
					t.Errorf("plugin channel %+v, want daemonset %s/%s and pods %+v", r.Plugin, e.h.ns, pluginName, wantPods)
				}
				wantCount := diagnose.CountChannel{State: diagnose.StateOK, Resource: "nvidia.com/gpu", Allocatable: 80, Capacity: 80, Physical: 8, Split: 10, Expected: 80}
				if r.Count != wantCount {
					t.Errorf("count channel %+v, want %+v", r.Count, wantCount)
				}
				if !r.Spec.Present || len(r.Spec.Devices) != 8 || r.Spec.Unhealthy != 0 || r.Spec.Devices[0].Type != h100 || !r.Spec.Verdict().Registers {
					t.Errorf("spec channel %+v", r.Spec)
				}
				h := r.Handshake
				if h.Key != annotation.KeyNVIDIAHandshake || !h.Present || h.Parsed != "requesting" || !h.Healthy || h.Age < 0 || h.Age > time.Minute {
					t.Errorf("handshake channel %+v", h)
				}
				s := r.Scheduler
				ref := e.h.ns + "/" + schedulerName
				if s.Deployment != ref || s.Lease != ref || s.LeaderPod != e.h.schedulerPod || !strings.HasPrefix(s.Leader, e.h.schedulerPod+"_") ||
					!s.LeaseValid || !cmp.Equal(s.NodeLabelSelector, map[string]string{poolLabel: poolValue}) {
					t.Errorf("scheduler %+v", s)
				}
			},
		},
		"old Requesting_ handshake is normal": {
			node: func(n *corev1.Node) {
				n.Annotations[annotation.KeyNVIDIAHandshake] = handshake.Requesting(time.Now().Add(-time.Hour), time.Local)
			},
			plugin:   running,
			want:     diagnose.Healthy,
			channels: allOK,
			findings: []expect{{
				code: diagnose.CodeHandshakeOld, severity: diagnose.SeverityInfo,
				summary:  []string{"that is normal; since HAMi 2.8 nobody refreshes it, and allocatable > 0 keeps the node registered"},
				evidence: []string{`hami.io/node-handshake="Requesting_`, "nvidia.com/gpu = 80"},
			}},
			check: func(t *testing.T, _ *env, r *diagnose.Report) {
				t.Helper()
				if h := r.Handshake; !h.Healthy || h.Age < 59*time.Minute || h.Age > 62*time.Minute ||
					h.Reason != "Handshake expired but Allocatable still present, skipping NodeCleanUp" {
					t.Errorf("handshake channel %+v", h)
				}
			},
		},
		"legacy hami.io/node-handshake-nvidia key": {
			node: func(n *corev1.Node) {
				n.Annotations["hami.io/node-handshake-nvidia"] = "Reported 2024-05-27 09:48:48"
			},
			plugin:   running,
			want:     diagnose.Healthy,
			channels: allOK,
			findings: []expect{{
				code: diagnose.CodeHandshakeVendorKey, severity: diagnose.SeverityInfo,
				summary:  []string{"hami.io/node-handshake-nvidia does not exist for NVIDIA: the NVIDIA handshake is hami.io/node-handshake (no suffix)"},
				evidence: []string{`hami.io/node-handshake-nvidia="Reported 2024-05-27 09:48:48"`},
				fix:      []string{"kubectl annotate node {node} hami.io/node-handshake-nvidia-"},
			}},
		},
		"allocatable below the annotation's count": {
			node:     func(n *corev1.Node) { setGPUs(n, 40) },
			plugin:   running,
			want:     diagnose.Healthy,
			channels: channels{diagnose.StateOK, diagnose.StateWarning, diagnose.StateOK, diagnose.StateOK},
			findings: []expect{{
				code: diagnose.CodeAllocatableMismatch, severity: diagnose.SeverityWarning,
				summary:  []string{"allocatable nvidia.com/gpu is 40, but the annotation lists 8 device(s) × split 10 = 80"},
				evidence: []string{"node {node} status.allocatable[nvidia.com/gpu] = 40"},
				fix:      []string{"kubectl get pods -A -o wide --field-selector spec.nodeName={node}"},
			}},
		},
		"one device unhealthy": {
			node: func(n *corev1.Node) {
				devs := h100s()
				devs[3].Health = false
				n.Annotations[annotation.KeyNVIDIARegister] = annotation.Encode(devs)
			},
			plugin:   running,
			want:     diagnose.Healthy,
			channels: channels{diagnose.StateOK, diagnose.StateOK, diagnose.StateWarning, diagnose.StateOK},
			findings: []expect{{
				code: diagnose.CodeDevicesUnhealthy, severity: diagnose.SeverityWarning,
				summary:  []string{"1 of 8 device(s) in hami.io/node-nvidia-register are unhealthy"},
				evidence: []string{"device 3 GPU-", ": health false or missing"},
				onNode:   []string{"dmesg -T | grep -i xid"},
			}},
			check: func(t *testing.T, _ *env, r *diagnose.Report) {
				t.Helper()
				if r.Spec.Unhealthy != 1 || !strings.Contains(r.Reason, "7 healthy device(s)") {
					t.Errorf("unhealthy %d, reason %q", r.Spec.Unhealthy, r.Reason)
				}
			},
		},
	})
}

// TestDiagnosePluginNotScheduled: case 1, no device plugin Pod on the node.
func TestDiagnosePluginNotScheduled(t *testing.T) {
	t.Parallel()
	notScheduled := channels{diagnose.StateBroken, diagnose.StateBroken, diagnose.StateBroken, diagnose.StateBroken}
	// consequences of case 1 that must not be repeated as findings of their own
	consequences := []string{diagnose.CodeNoAllocatable, diagnose.CodeAnnotationMissing, diagnose.CodeHandshakeMissing}
	runScenarios(t, map[string]scenario{
		"node lacks gpu=on": {
			node: func(n *corev1.Node) {
				withoutPlugin(n)
				delete(n.Labels, gpuLabel)
			},
			want:     diagnose.CasePluginNotScheduled,
			channels: notScheduled,
			findings: []expect{{
				code: diagnose.CodeNodeSelectorMismatch, severity: diagnose.SeverityError,
				summary:  []string{"node {node} lacks the label gpu=on that DaemonSet {ns}/hami-device-plugin selects, so no device plugin Pod is scheduled there"},
				evidence: []string{"DaemonSet {ns}/hami-device-plugin nodeSelector: gpu=on", "node {node} has no label gpu"},
			}},
			absent: append([]string{diagnose.CodePluginPodMissing, diagnose.CodeUntoleratedTaint}, consequences...),
			check: func(t *testing.T, e *env, r *diagnose.Report) {
				t.Helper()
				f, _ := r.Finding(diagnose.CodeNodeSelectorMismatch)
				if want := []string{"kubectl label node " + e.node + " gpu=on"}; !cmp.Equal(f.Fix, want) {
					t.Errorf("fix %q, want %q", f.Fix, want)
				}
			},
		},
		"node labelled gpu=off": {
			node: func(n *corev1.Node) {
				withoutPlugin(n)
				n.Labels[gpuLabel] = "off"
			},
			want:     diagnose.CasePluginNotScheduled,
			channels: notScheduled,
			findings: []expect{{
				code: diagnose.CodeNodeSelectorMismatch, severity: diagnose.SeverityError,
				evidence: []string{"node {node} label gpu=off"},
				fix:      []string{"kubectl label node {node} gpu=on --overwrite"},
			}},
			absent: consequences,
		},
		"untolerated taint": {
			node: func(n *corev1.Node) {
				withoutPlugin(n)
				n.Spec.Taints = []corev1.Taint{{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule}}
			},
			want:     diagnose.CasePluginNotScheduled,
			channels: notScheduled,
			findings: []expect{{
				code: diagnose.CodeUntoleratedTaint, severity: diagnose.SeverityError,
				summary: []string{"node {node} has the taint nvidia.com/gpu=present:NoSchedule, which DaemonSet {ns}/hami-device-plugin does not tolerate"},
				evidence: []string{
					"node {node} taint nvidia.com/gpu=present:NoSchedule",
					"DaemonSet {ns}/hami-device-plugin tolerations: CriticalAddonsOnly exists",
				},
				fix: []string{
					`kubectl -n {ns} patch daemonset hami-device-plugin --type=json -p '[{"op":"add","path":"/spec/template/spec/tolerations/-","value":{"key":"nvidia.com/gpu","operator":"Equal","value":"present","effect":"NoSchedule"}}]'`,
					"kubectl taint node {node} nvidia.com/gpu=present:NoSchedule-",
				},
			}},
			absent: append([]string{diagnose.CodeNodeSelectorMismatch, diagnose.CodePluginPodMissing}, consequences...),
			check: func(t *testing.T, e *env, r *diagnose.Report) {
				t.Helper()
				// With the toleration patched in, the taint no longer keeps the plugin away
				// (no DaemonSet controller runs here, so the Pod is still missing).
				f, _ := r.Finding(diagnose.CodeUntoleratedTaint)
				applyFix(t, e, f)
				again := e.h.diagnose(t, e.node)
				if _, ok := again.Finding(diagnose.CodeUntoleratedTaint); ok {
					t.Errorf("taint still not tolerated after the fix: %v", codes(again.Findings))
				}
				if _, ok := again.Finding(diagnose.CodePluginPodMissing); !ok || again.Case != diagnose.CasePluginNotScheduled {
					t.Errorf("after the fix: %v %v, want PluginPodMissing", again.Case, codes(again.Findings))
				}
			},
		},
		"selected and tolerated, but no Pod": {
			install: install{DaemonSet: func(ds *appsv1.DaemonSet) {
				ds.Spec.Template.Spec.Tolerations = append(ds.Spec.Template.Spec.Tolerations,
					corev1.Toleration{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule})
			}},
			node: func(n *corev1.Node) {
				withoutPlugin(n)
				// tolerated: by the DaemonSet, by every daemon Pod (cordoned), not a hard taint
				n.Spec.Unschedulable = true
				n.Spec.Taints = []corev1.Taint{
					{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule},
					{Key: corev1.TaintNodeUnschedulable, Effect: corev1.TaintEffectNoSchedule},
					{Key: "gpu-type", Value: "h100", Effect: corev1.TaintEffectPreferNoSchedule},
				}
			},
			want:     diagnose.CasePluginNotScheduled,
			channels: notScheduled,
			findings: []expect{{
				code: diagnose.CodePluginPodMissing, severity: diagnose.SeverityError,
				summary:  []string{"no device plugin Pod on node {node} although DaemonSet {ns}/hami-device-plugin selects and tolerates it"},
				evidence: []string{"DaemonSet {ns}/hami-device-plugin status: desired 0, current 0, ready 0, misscheduled 0"},
				fix: []string{
					"kubectl -n {ns} describe daemonset hami-device-plugin",
					"kubectl -n {ns} get events --field-selector involvedObject.name=hami-device-plugin",
				},
			}},
			absent: append([]string{diagnose.CodeUntoleratedTaint, diagnose.CodeNodeSelectorMismatch}, consequences...),
		},
		"no DaemonSet": {
			install:  install{NoDaemonSet: true},
			node:     withoutPlugin,
			want:     diagnose.CasePluginNotScheduled,
			channels: notScheduled,
			findings: []expect{{
				code: diagnose.CodeDaemonSetNotFound, severity: diagnose.SeverityError,
				summary:  []string{"device plugin DaemonSet {ns}/hami-device-plugin not found, and no device plugin Pod runs on the node"},
				evidence: []string{`no Pod matching "app.kubernetes.io/component=hami-device-plugin" on node {node} in namespace {ns}`},
				fix:      []string{"kubectl get daemonsets -A -l app.kubernetes.io/component=hami-device-plugin", "helm list -A | grep -i hami"},
			}},
			absent: consequences,
			check: func(t *testing.T, _ *env, r *diagnose.Report) {
				t.Helper()
				if r.Plugin.DaemonSet != "" {
					t.Errorf("daemonset %q, want none", r.Plugin.DaemonSet)
				}
			},
		},
	})
}

// TestDiagnosePluginNotRunning: case 2, the device plugin Pod is there but does not run.
func TestDiagnosePluginNotRunning(t *testing.T) {
	t.Parallel()
	consequences := []string{diagnose.CodeNoAllocatable, diagnose.CodeAnnotationMissing, diagnose.CodeHandshakeMissing}
	runScenarios(t, map[string]scenario{
		"NVML cannot load, no runtimeClassName": {
			node:     withoutPlugin,
			plugin:   crashLoop(255, nvmlLog, 6),
			want:     diagnose.CasePluginNotRunning,
			channels: channels{plugin: diagnose.StateBroken},
			findings: []expect{{
				code: diagnose.CodeNVMLUnavailable, severity: diagnose.SeverityError,
				summary: []string{"device plugin Pod {pod} crashes because NVML cannot be loaded"},
				evidence: []string{
					"Pod {ns}/{pod}: container device-plugin waiting (CrashLoopBackOff: back-off 5m0s restarting failed container=device-plugin pod={pod}_{ns}",
					"6 restarts",
					"last termination message: ",
					"nvml Init err: ERROR_LIBRARY_NOT_FOUND",
					"could not load NVML library: libnvidia-ml.so.1: cannot open shared object file",
					"the Pod has no runtimeClassName: it runs with containerd's default runtime",
				},
				fix: []string{
					"kind: RuntimeClass\nmetadata:\n  name: nvidia\nhandler: nvidia",
					`kubectl -n {ns} patch daemonset hami-device-plugin --type=merge -p '{"spec":{"template":{"spec":{"runtimeClassName":"nvidia"}}}}'`,
					"--set devicePlugin.runtimeClassName=nvidia",
				},
				onNode: []string{
					"grep -nE 'default_runtime_name|runtimes.nvidia' /etc/containerd/config.toml",
					"sudo nvidia-ctk runtime configure --runtime=containerd --set-as-default && sudo systemctl restart containerd",
				},
			}},
			absent: append([]string{diagnose.CodePluginCrashing, diagnose.CodeNodeNameEnv, diagnose.CodeRuntimeClassMissing}, consequences...),
			check: func(t *testing.T, e *env, r *diagnose.Report) {
				t.Helper()
				if p := r.Plugin.Pods; len(p) != 1 || p[0].Reason != "CrashLoopBackOff" || p[0].Restarts != 6 || p[0].Ready ||
					p[0].Phase != "Running" || !strings.HasPrefix(p[0].Message, "I0527 09:48:47.938491") {
					t.Errorf("plugin pods %+v", p)
				}
				f, _ := r.Finding(diagnose.CodeNVMLUnavailable)
				if ds := applyFix(t, e, f); ds.Spec.Template.Spec.RuntimeClassName == nil || *ds.Spec.Template.Spec.RuntimeClassName != "nvidia" {
					t.Errorf("runtimeClassName after the fix: %v", ds.Spec.Template.Spec.RuntimeClassName)
				}
			},
		},
		"NVML cannot load under an nvidia RuntimeClass": {
			install:  install{RuntimeClass: "nvidia"},
			node:     withoutPlugin,
			plugin:   crashLoop(1, nvmlShortLog, 3),
			want:     diagnose.CasePluginNotRunning,
			channels: channels{plugin: diagnose.StateBroken},
			findings: []expect{{
				code: diagnose.CodeNVMLUnavailable, severity: diagnose.SeverityError,
				summary:  []string{"device plugin Pod {pod} crashes because NVML cannot be loaded, although it runs with RuntimeClass {rc} (handler nvidia)"},
				evidence: []string{"3 restarts", "nvml Init err: ERROR_LIBRARY_NOT_FOUND", "the Pod runs with RuntimeClass {rc} (handler nvidia)"},
				fix:      []string{"kubectl get runtimeclass {rc} -o yaml"},
				onNode:   []string{"nvidia-smi", "grep -n -A6 'runtimes.nvidia' /etc/containerd/config.toml"},
			}},
			absent: append([]string{diagnose.CodeRuntimeClassMissing, diagnose.CodePluginCrashing}, consequences...),
			check: func(t *testing.T, _ *env, r *diagnose.Report) {
				t.Helper()
				// The runtime is nvidia already: neither may the summary say it is not, nor
				// may a fix switch to another RuntimeClass with the same handler.
				f, _ := r.Finding(diagnose.CodeNVMLUnavailable)
				if strings.Contains(f.Summary, "the runtime is not nvidia") {
					t.Errorf("summary contradicts the evidence: %q", f.Summary)
				}
				if slices.ContainsFunc(f.Fix, func(s string) bool { return strings.Contains(s, "runtimeClassName") }) {
					t.Errorf("fix switches the RuntimeClass: %q", f.Fix)
				}
			},
		},
		"NVML cannot load, beside a native sidecar": {
			install:  install{DaemonSet: logForwarder},
			node:     withoutPlugin,
			plugin:   withSidecar(crashLoop(255, nvmlLog, 2)),
			want:     diagnose.CasePluginNotRunning,
			channels: channels{plugin: diagnose.StateBroken},
			findings: []expect{{
				code: diagnose.CodeNVMLUnavailable, severity: diagnose.SeverityError,
				evidence: []string{"2 restarts", "libnvidia-ml.so.1", "the Pod has no runtimeClassName"},
			}},
			// a started sidecar holds nothing
			absent: append([]string{diagnose.CodePluginPending, diagnose.CodeToolkitNotReady}, consequences...),
			check: func(t *testing.T, _ *env, r *diagnose.Report) {
				t.Helper()
				if p := r.Plugin.Pods; len(p) != 1 || p[0].Reason != "CrashLoopBackOff" {
					t.Errorf("plugin pods %+v, want reason CrashLoopBackOff", p)
				}
			},
		},
		"init container waits for toolkit-ready": {
			install:  install{DaemonSet: toolkitValidation},
			node:     withoutPlugin,
			plugin:   waitingInInit,
			want:     diagnose.CasePluginNotRunning,
			channels: channels{plugin: diagnose.StateBroken},
			findings: []expect{{
				code: diagnose.CodeToolkitNotReady, severity: diagnose.SeverityError,
				summary: []string{"device plugin Pod {pod} waits in init container toolkit-validation for toolkit-ready"},
				evidence: []string{
					"Pod {ns}/{pod}: init container toolkit-validation running",
					"init container toolkit-validation command: sh -c until [ -f /run/nvidia/validations/toolkit-ready ]; do",
				},
				fix:    []string{`kubectl -n {ns} patch daemonset hami-device-plugin --type=json -p '[{"op":"remove","path":"/spec/template/spec/initContainers/0"}]'`},
				onNode: []string{"ls -l /run/nvidia/validations/"},
			}},
			absent: append([]string{diagnose.CodePluginPending}, consequences...),
			check: func(t *testing.T, e *env, r *diagnose.Report) {
				t.Helper()
				if p := r.Plugin.Pods; len(p) != 1 || p[0].Phase != "Pending" || p[0].Reason != "Init:toolkit-validation" {
					t.Errorf("plugin pods %+v", p)
				}
				f, _ := r.Finding(diagnose.CodeToolkitNotReady)
				if ds := applyFix(t, e, f); len(ds.Spec.Template.Spec.InitContainers) != 0 {
					t.Errorf("init containers after the fix: %v", ds.Spec.Template.Spec.InitContainers)
				}
			},
		},
		"legacy NodeName variable": {
			install:  install{DaemonSet: legacyNodeNameEnv},
			node:     withoutPlugin,
			plugin:   crashLoop(255, nodeNameLog, 4),
			want:     diagnose.CasePluginNotRunning,
			channels: channels{plugin: diagnose.StateBroken},
			findings: []expect{{
				code: diagnose.CodeNodeNameEnv, severity: diagnose.SeverityError,
				summary:  []string{"device plugin Pod {pod} does not know its node: HAMi's plugin reads the node name from NODE_NAME (container device-plugin sets the legacy variable NodeName but not NODE_NAME)"},
				evidence: []string{"container device-plugin sets the legacy variable NodeName but not NODE_NAME", "Node name is empty", "4 restarts"},
				fix: []string{
					"kubectl -n {ns} set env daemonset/hami-device-plugin -c device-plugin NODE_NAME- NodeName-",
					`"env":[{"name":"NODE_NAME","valueFrom":{"fieldRef":{"fieldPath":"spec.nodeName"}}}]`,
					"current HAMi charts set NODE_NAME from spec.nodeName",
				},
			}},
			absent: append([]string{diagnose.CodeNVMLUnavailable, diagnose.CodePluginCrashing}, consequences...),
			check: func(t *testing.T, e *env, r *diagnose.Report) {
				t.Helper()
				f, _ := r.Finding(diagnose.CodeNodeNameEnv)
				ds := applyFix(t, e, f)
				c := pluginContainerOf(&ds.Spec.Template.Spec)
				if i := slices.IndexFunc(c.Env, func(v corev1.EnvVar) bool { return v.Name == "NODE_NAME" }); i < 0 ||
					c.Env[i].ValueFrom == nil || c.Env[i].ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
					t.Errorf("env after the fix: %+v", c.Env)
				}
			},
		},
		"crash with an unknown message": {
			node:     withoutPlugin,
			plugin:   crashLoop(2, panicLog, 3),
			want:     diagnose.CasePluginNotRunning,
			channels: channels{plugin: diagnose.StateBroken},
			findings: []expect{{
				code: diagnose.CodePluginCrashing, severity: diagnose.SeverityError,
				summary: []string{"device plugin Pod {pod} is not running: container device-plugin is CrashLoopBackOff"},
				evidence: []string{
					"last termination message: panic: runtime error: invalid memory address or nil pointer dereference",
					// no kubelet serves the node's logs here
					"previous log not readable here (",
					"): run kubectl -n {ns} logs {pod} -c device-plugin --previous",
				},
				fix: []string{"kubectl -n {ns} logs {pod} -c device-plugin --previous", "kubectl -n {ns} describe pod {pod}"},
			}},
			absent: append([]string{diagnose.CodeNVMLUnavailable, diagnose.CodeNodeNameEnv}, consequences...),
		},
		"image pull back-off": {
			node:     withoutPlugin,
			plugin:   imagePullBackOff,
			want:     diagnose.CasePluginNotRunning,
			channels: channels{plugin: diagnose.StateBroken},
			findings: []expect{{
				code: diagnose.CodePluginPending, severity: diagnose.SeverityError,
				summary: []string{"device plugin Pod {pod} has not started (ImagePullBackOff)"},
				evidence: []string{
					"Pod {ns}/{pod}: phase Pending",
					"condition Ready: ContainersNotReady: containers with unready status",
					`container device-plugin waiting (ImagePullBackOff: Back-off pulling image "docker.io/projecthami/hami:v2.8.0"`,
				},
				fix: []string{"kubectl -n {ns} describe pod {pod}", "kubectl -n {ns} get events --field-selector involvedObject.name={pod}"},
			}},
			absent: consequences,
		},
	})
}

// TestDiagnoseNoAllocatable: case 3, the plugin runs but the kubelet publishes no devices.
func TestDiagnoseNoAllocatable(t *testing.T) {
	t.Parallel()
	noCount := channels{diagnose.StateOK, diagnose.StateBroken, diagnose.StateOK, diagnose.StateOK}
	runScenarios(t, map[string]scenario{
		"allocatable absent": {
			node: func(n *corev1.Node) {
				delete(n.Status.Capacity, resourceGPU)
				delete(n.Status.Allocatable, resourceGPU)
			},
			plugin:   running,
			want:     diagnose.CaseNoAllocatable,
			channels: noCount,
			findings: []expect{{
				code: diagnose.CodeNoAllocatable, severity: diagnose.SeverityError,
				summary: []string{"the device plugin is running but the kubelet reports no nvidia.com/gpu"},
				evidence: []string{
					"node {node} status.allocatable[nvidia.com/gpu] = 0, capacity 0",
					"device plugin Pod {ns}/{pod} is running",
					"the plugin's socket folder on the host (DaemonSet hostPath): /var/lib/kubelet/device-plugins",
					"the annotation lists 8 device(s), so allocatable should be 80",
				},
				fix: []string{
					"kubectl -n {ns} logs {pod} -c device-plugin | grep -iE 'regist|kubelet.sock|socket'",
					"--set devicePlugin.pluginPath=<root-dir>/device-plugins",
					"kubectl -n {ns} delete pod {pod}",
				},
				onNode: []string{"--root-dir", "sudo systemctl restart kubelet", "ls -l /var/lib/kubelet/device-plugins/"},
			}},
			absent: []string{diagnose.CodeAllocatableMismatch, diagnose.CodeHandshakeMissing},
			check: func(t *testing.T, _ *env, r *diagnose.Report) {
				t.Helper()
				f, _ := r.Finding(diagnose.CodeNoAllocatable)
				if slices.ContainsFunc(f.Evidence, func(s string) bool { return strings.Contains(s, "not the kubelet's default") }) {
					t.Errorf("the chart's hostPath called non-default: %q", f.Evidence)
				}
			},
		},
		"allocatable 0 with a non-default device-plugins hostPath": {
			install:  install{DaemonSet: func(ds *appsv1.DaemonSet) { setPluginHostPath(ds, "/data/kubelet/device-plugins") }},
			node:     func(n *corev1.Node) { setGPUs(n, 0) },
			plugin:   running,
			want:     diagnose.CaseNoAllocatable,
			channels: noCount,
			findings: []expect{{
				code: diagnose.CodeNoAllocatable, severity: diagnose.SeverityError,
				evidence: []string{
					"node {node} status.allocatable[nvidia.com/gpu] = 0, capacity 0",
					"the plugin's socket folder on the host (DaemonSet hostPath): /data/kubelet/device-plugins",
					"that is not the kubelet's default /var/lib/kubelet/device-plugins: it must be <kubelet --root-dir>/device-plugins",
				},
				onNode: []string{"ls -l /data/kubelet/device-plugins/", "--root-dir", "systemctl restart kubelet"},
			}},
		},
	})
}

// malformedDevmem writes a fractional devmem into the first device, as a hand edit might.
func malformedDevmem(n *corev1.Node) {
	raw := n.Annotations[annotation.KeyNVIDIARegister]
	n.Annotations[annotation.KeyNVIDIARegister] = strings.Replace(raw, fmt.Sprintf(`"devmem":%d`, h100MiB), fmt.Sprintf(`"devmem":%d.5`, h100MiB), 1)
}

// TestDiagnoseAnnotation: case 4, the device count is there, the register annotation is not
// usable.
func TestDiagnoseAnnotation(t *testing.T) {
	t.Parallel()
	noSpec := channels{diagnose.StateOK, diagnose.StateOK, diagnose.StateBroken, ""}
	missing := func(n *corev1.Node) {
		delete(n.Annotations, annotation.KeyNVIDIARegister)
		delete(n.Annotations, annotation.KeyNVIDIAHandshake) // the scheduler skips the node
	}
	missingFinding := expect{
		code: diagnose.CodeAnnotationMissing, severity: diagnose.SeverityError,
		summary:  []string{"annotation hami.io/node-nvidia-register is missing: the device plugin has not written the device list, so HAMi's scheduler skips the node"},
		evidence: []string{"node {node} has no annotation hami.io/node-nvidia-register", "allocatable nvidia.com/gpu = 80: the kubelet channel works"},
		fix:      []string{"kubectl -n {ns} logs {pod} -c device-plugin | grep -E 'Updating node annotations|patch node|get node error|Node name is empty'"},
	}
	removeAndRestart := []string{"kubectl annotate node {node} hami.io/node-nvidia-register-", "kubectl -n {ns} delete pod {pod}"}
	runScenarios(t, map[string]scenario{
		"missing, the plugin may patch nodes": {
			node:     missing,
			plugin:   running,
			want:     diagnose.CaseNoAnnotation,
			channels: channels{diagnose.StateOK, diagnose.StateOK, diagnose.StateBroken, diagnose.StateBroken},
			findings: []expect{missingFinding},
			absent:   []string{diagnose.CodePatchForbidden, diagnose.CodeHandshakeMissing, diagnose.CodeNodeNameEnv},
		},
		"missing, the plugin may not patch nodes": {
			install:  install{NoNodeRBAC: true},
			node:     missing,
			plugin:   running,
			want:     diagnose.CaseNoAnnotation,
			channels: noSpec,
			findings: []expect{missingFinding, {
				code: diagnose.CodePatchForbidden, severity: diagnose.SeverityError,
				summary:  []string{"ServiceAccount {ns}:hami-device-plugin may not patch nodes, so the device plugin cannot write hami.io/node-nvidia-register"},
				evidence: []string{"SubjectAccessReview for system:serviceaccount:{ns}:hami-device-plugin, verb patch, resource nodes: denied"},
				fix: []string{
					"kubectl create clusterrole hami-device-plugin-nodes --verb=get,list,watch,patch --resource=nodes",
					"kubectl create clusterrolebinding hami-device-plugin-nodes --clusterrole=hami-device-plugin-nodes --serviceaccount={ns}:hami-device-plugin",
					"kubectl auth can-i patch nodes --as=system:serviceaccount:{ns}:hami-device-plugin",
				},
			}},
			check: func(t *testing.T, e *env, r *diagnose.Report) {
				t.Helper()
				if r.Reason != r.Findings[0].Summary || r.Findings[0].Code != diagnose.CodePatchForbidden {
					t.Errorf("reason %q, want the missing permission first: it is why the annotation is missing", r.Reason)
				}
				// Run the fix (as the two kubectl create commands do) and diagnose again.
				applyRBACFix(t, e)
				again := e.h.diagnose(t, e.node)
				if _, ok := again.Finding(diagnose.CodePatchForbidden); ok {
					t.Errorf("still forbidden after the fix: %v", codes(again.Findings))
				}
			},
		},
		"malformed: fractional devmem": {
			node:     malformedDevmem,
			plugin:   running,
			want:     diagnose.CaseNoAnnotation,
			channels: noSpec,
			findings: []expect{{
				code: diagnose.CodeAnnotationMalformed, severity: diagnose.SeverityError,
				summary: []string{"annotation hami.io/node-nvidia-register is malformed at byte ", ": HAMi's scheduler cannot decode it and skips the node"},
				evidence: []string{
					`(device 0, field "devmem"): number 81559.5 is not an int32`,
					"HAMi's scheduler logs (error): failed to decode node devices",
					`at: "`,
				},
				fix: append(removeAndRestart, "legacy colon format"),
			}},
			absent: []string{diagnose.CodePatchForbidden},
			check: func(t *testing.T, e *env, r *diagnose.Report) {
				t.Helper()
				raw := cp.GetNode(t, e.node).Annotations[annotation.KeyNVIDIARegister]
				at := strings.Index(raw, "81559.5")
				f, _ := r.Finding(diagnose.CodeAnnotationMalformed)
				if want := fmt.Sprintf("malformed at byte %d:", at); !strings.Contains(f.Summary, want) {
					t.Errorf("summary %q, want %q", f.Summary, want)
				}
				if r.Spec.HAMiLog != "failed to decode node devices" || !strings.Contains(r.Spec.Error, fmt.Sprintf("at offset %d", at)) {
					t.Errorf("spec channel error %q, HAMi log %q", r.Spec.Error, r.Spec.HAMiLog)
				}
			},
		},
		"malformed: truncated": {
			node: func(n *corev1.Node) {
				raw := n.Annotations[annotation.KeyNVIDIARegister]
				n.Annotations[annotation.KeyNVIDIARegister] = raw[:len(raw)/2]
			},
			plugin:   running,
			want:     diagnose.CaseNoAnnotation,
			channels: noSpec,
			findings: []expect{{
				code: diagnose.CodeAnnotationMalformed, severity: diagnose.SeverityError,
				summary:  []string{"is malformed at byte "},
				evidence: []string{"unexpected end of JSON input", "failed to decode node devices"},
				fix:      removeAndRestart,
			}},
			check: func(t *testing.T, e *env, r *diagnose.Report) {
				t.Helper()
				raw := cp.GetNode(t, e.node).Annotations[annotation.KeyNVIDIARegister]
				f, _ := r.Finding(diagnose.CodeAnnotationMalformed)
				if want := fmt.Sprintf("malformed at byte %d:", len(raw)); !strings.Contains(f.Summary, want) {
					t.Errorf("summary %q, want %q", f.Summary, want)
				}
			},
		},
		"empty list": {
			node:     func(n *corev1.Node) { n.Annotations[annotation.KeyNVIDIARegister] = "[]" },
			plugin:   running,
			want:     diagnose.CaseNoAnnotation,
			channels: noSpec,
			findings: []expect{{
				code: diagnose.CodeAnnotationEmpty, severity: diagnose.SeverityError,
				summary:  []string{`annotation hami.io/node-nvidia-register lists no devices: HAMi logs "no nvidia gpu device found" and skips the node`},
				evidence: []string{`value "[]"`},
				fix:      []string{"kubectl -n {ns} exec {pod} -c device-plugin -- nvidia-smi -L"},
			}},
		},
		"null element": {
			node: func(n *corev1.Node) {
				raw := n.Annotations[annotation.KeyNVIDIARegister]
				n.Annotations[annotation.KeyNVIDIARegister] = strings.TrimSuffix(raw, "]") + ",null]"
			},
			plugin:   running,
			want:     diagnose.CaseNoAnnotation,
			channels: noSpec,
			findings: []expect{{
				code: diagnose.CodeAnnotationNullElement, severity: diagnose.SeverityError,
				summary:  []string{"contains a null device: HAMi's scheduler crashes on it (nil pointer) and restarts"},
				evidence: []string{"null element", "(device 8)"},
				fix:      removeAndRestart,
			}},
		},
		"devices without a health key": {
			node: func(n *corev1.Node) {
				n.Annotations[annotation.KeyNVIDIARegister] = devicesWithoutHealth(h100s())
			},
			plugin:   running,
			want:     diagnose.CaseNoAnnotation,
			channels: channels{diagnose.StateOK, diagnose.StateOK, diagnose.StateBroken, diagnose.StateOK},
			findings: []expect{{
				code: diagnose.CodeDevicesUnhealthy, severity: diagnose.SeverityError,
				summary: []string{"all 8 device(s) in hami.io/node-nvidia-register are unhealthy: the node registers but HAMi places no Pod on it"},
				evidence: []string{
					"device 0 GPU-", ": health false or missing", "… and 4 more",
					`no device has a "health" key: a missing key means unhealthy (HAMi writes health only when true)`,
				},
				fix: []string{
					"kubectl -n {ns} exec {pod} -c device-plugin -- nvidia-smi -q -d ECC,PAGE_RETIREMENT",
					"after the GPU is repaired: kubectl -n {ns} delete pod {pod}",
				},
				onNode: []string{"sudo dmesg -T | grep -i xid"},
			}},
			check: func(t *testing.T, _ *env, r *diagnose.Report) {
				t.Helper()
				if r.Spec.Unhealthy != 8 || len(r.Spec.Devices) != 8 || !r.Spec.Verdict().Registers {
					t.Errorf("spec channel: %d of %d unhealthy, registers %v", r.Spec.Unhealthy, len(r.Spec.Devices), r.Spec.Verdict().Registers)
				}
			},
		},
	})
}

// applyRBACFix does what the PatchNodesForbidden fix says (kubectl create clusterrole and
// clusterrolebinding hami-device-plugin-nodes; one scenario only, the names are
// cluster-wide) and waits until the API server allows it.
func applyRBACFix(t *testing.T, e *env) {
	t.Helper()
	ctx := t.Context()
	bindClusterRole(t, "hami-device-plugin-nodes", e.h.ns, pluginName,
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch", "patch"}})
	// The RBAC authorizer sees the binding through its informers, a moment later.
	harness.Eventually(t, "the RBAC fix to take effect", 30*time.Second, func() bool {
		r, err := diagnose.Node(ctx, cp.AdminClient(), e.node, diagnose.Options{Namespace: e.h.ns})
		if err != nil {
			t.Fatal(err)
		}
		_, forbidden := r.Finding(diagnose.CodePatchForbidden)
		return !forbidden
	})
}

// TestDiagnoseScheduler: case 5, the channels are set but HAMi's scheduler does not take the
// node.
func TestDiagnoseScheduler(t *testing.T) {
	t.Parallel()
	leaseFix := []string{
		"kubectl -n {ns} get pods -l app.kubernetes.io/component=hami-scheduler -o wide",
		"kubectl -n {ns} logs deployment/hami-scheduler -c kube-scheduler | grep -i -E 'leader|lease'",
	}
	noHandshake := func(n *corev1.Node) { delete(n.Annotations, annotation.KeyNVIDIAHandshake) }
	runScenarios(t, map[string]scenario{
		"node-label-selector excludes the node": {
			node: func(n *corev1.Node) {
				delete(n.Labels, poolLabel)
				noHandshake(n) // the scheduler never lists the node
			},
			plugin:   running,
			want:     diagnose.CaseSchedulerExcludes,
			channels: channels{diagnose.StateOK, diagnose.StateOK, diagnose.StateOK, diagnose.StateBroken},
			findings: []expect{{
				code: diagnose.CodeLabelSelectorExcludes, severity: diagnose.SeverityError,
				summary:  []string{"node {node} does not match the scheduler's node label selector gpu-pool=hami: HAMi's scheduler never lists it"},
				evidence: []string{"--node-label-selector of Deployment {ns}/hami-scheduler: gpu-pool=hami", "node {node} has no label gpu-pool"},
				fix:      []string{"or change scheduler.nodeLabelSelector in the Helm values"},
			}, {
				// explained by the selector
				code: diagnose.CodeHandshakeMissing, severity: diagnose.SeverityInfo,
				summary: []string{"handshake hami.io/node-handshake is absent"},
			}},
			check: func(t *testing.T, e *env, r *diagnose.Report) {
				t.Helper()
				f, _ := r.Finding(diagnose.CodeLabelSelectorExcludes)
				if want := "kubectl label node " + e.node + " gpu-pool=hami"; len(f.Fix) == 0 || f.Fix[0] != want {
					t.Errorf("fix %q, want %q first", f.Fix, want)
				}
				if !cmp.Equal(r.Scheduler.NodeLabelSelector, map[string]string{poolLabel: poolValue}) {
					t.Errorf("node label selector %v", r.Scheduler.NodeLabelSelector)
				}
			},
		},
		"Lease expired": {
			install: install{Lease: leaseExpired},
			node: func(n *corev1.Node) {
				n.Annotations[annotation.KeyNVIDIAHandshake] = handshake.Requesting(time.Now().Add(-10*time.Minute), time.Local)
			},
			plugin: running,
			want:   diagnose.CaseSchedulerExcludes,
			findings: []expect{{
				code: diagnose.CodeNoLeader, severity: diagnose.SeverityError,
				summary:  []string{`no HAMi scheduler leads: Lease {ns}/hami-scheduler is held by "{scheduler}_`, "last renewed 10m", "(duration 15s)"},
				evidence: []string{`Lease {ns}/hami-scheduler holder "{scheduler}_`, "leaseDurationSeconds 15"},
				fix:      leaseFix,
			}},
			absent: []string{diagnose.CodeFollowerLogQuiet},
			check: func(t *testing.T, e *env, r *diagnose.Report) {
				t.Helper()
				if s := r.Scheduler; s.LeaseValid || s.LeaderPod != "" || !strings.HasPrefix(s.Leader, e.h.schedulerPod+"_") {
					t.Errorf("scheduler %+v", s)
				}
			},
		},
		"Lease missing": {
			install:  install{Lease: leaseMissing},
			node:     noHandshake,
			plugin:   running,
			want:     diagnose.CaseSchedulerExcludes,
			channels: channels{handshake: diagnose.StateBroken},
			findings: []expect{{
				code: diagnose.CodeNoLeader, severity: diagnose.SeverityError,
				summary:  []string{"Lease {ns}/hami-scheduler not found: kube-scheduler in HAMi's scheduler Pod has never led, so no extender registers nodes"},
				evidence: []string{"kubectl -n {ns} get lease hami-scheduler: not found"},
				fix:      leaseFix,
			}, {
				code: diagnose.CodeHandshakeMissing, severity: diagnose.SeverityInfo,
			}},
			absent: []string{diagnose.CodeFollowerLogQuiet},
		},
		"Lease held by no scheduler Pod": {
			install: install{Lease: leaseForeign},
			plugin:  running,
			want:    diagnose.CaseSchedulerExcludes,
			findings: []expect{{
				code: diagnose.CodeLeaderUnknown, severity: diagnose.SeverityError,
				summary:  []string{`Lease {ns}/hami-scheduler is held by "hami-scheduler-5f7b8c9d4-`, "which is none of the scheduler Pods ({scheduler})"},
				evidence: []string{"scheduler Pods (app.kubernetes.io/component=hami-scheduler): {scheduler}"},
				fix:      leaseFix,
			}},
			absent: []string{diagnose.CodeFollowerLogQuiet, diagnose.CodeNoLeader},
		},
		"scheduler not installed": {
			install:  install{NoScheduler: true},
			node:     noHandshake,
			plugin:   running,
			want:     diagnose.CaseSchedulerExcludes,
			channels: channels{diagnose.StateOK, diagnose.StateOK, diagnose.StateOK, diagnose.StateBroken},
			findings: []expect{{
				code: diagnose.CodeSchedulerNotFound, severity: diagnose.SeverityError,
				summary:  []string{"HAMi's scheduler Deployment {ns}/hami-scheduler not found: nothing registers GPU nodes"},
				evidence: []string{"kubectl -n {ns} get deployment hami-scheduler: not found"},
				fix:      []string{"kubectl get deployments -A -l app.kubernetes.io/component=hami-scheduler"},
			}, {
				code: diagnose.CodeNoLeader, severity: diagnose.SeverityError,
			}, {
				code: diagnose.CodeHandshakeMissing, severity: diagnose.SeverityInfo,
			}},
			check: func(t *testing.T, _ *env, r *diagnose.Report) {
				t.Helper()
				if f := r.Errors(); f[0].Code != diagnose.CodeSchedulerNotFound || r.Scheduler.Deployment != "" {
					t.Errorf("first error %s, deployment %q; want SchedulerNotFound and none", f[0].Code, r.Scheduler.Deployment)
				}
			},
		},
		"extender without leader election": {
			install: install{Lease: leaseMissing, Scheduler: func(d *appsv1.Deployment) {
				for i := range d.Spec.Template.Spec.Containers {
					c := &d.Spec.Template.Spec.Containers[i]
					if c.Name == extenderContainer {
						c.Command[slices.Index(c.Command, "--leader-elect=true")] = "--leader-elect=false"
					}
				}
			}},
			plugin:   running,
			want:     diagnose.Healthy,
			channels: channels{diagnose.StateOK, diagnose.StateOK, diagnose.StateOK, diagnose.StateOK},
			absent:   []string{diagnose.CodeNoLeader, diagnose.CodeFollowerLogQuiet, diagnose.CodeLeaderUnknown},
			check: func(t *testing.T, _ *env, r *diagnose.Report) {
				t.Helper()
				if s := r.Scheduler; s.Lease != "" || s.Leader != "" {
					t.Errorf("scheduler %+v: no Lease is read without leader election", s)
				}
			},
		},
		"handshake missing": {
			node:     noHandshake,
			plugin:   running,
			want:     diagnose.CaseSchedulerExcludes,
			channels: channels{diagnose.StateOK, diagnose.StateOK, diagnose.StateOK, diagnose.StateBroken},
			findings: []expect{{
				code: diagnose.CodeHandshakeMissing, severity: diagnose.SeverityError,
				summary:  []string{"handshake hami.io/node-handshake is absent: HAMi's scheduler has not processed this node"},
				evidence: []string{"a leading scheduler stamps Requesting_<time> within 15 s of seeing a node with devices"},
				fix:      []string{"kubectl -n {ns} logs {scheduler} -c vgpu-scheduler-extender | grep {node}"},
			}},
			absent: []string{diagnose.CodeNoLeader, diagnose.CodeLabelSelectorExcludes},
		},
		"handshake with a pre-2.8 value": {
			node: func(n *corev1.Node) {
				n.Annotations[annotation.KeyNVIDIAHandshake] = "Reported 2024-05-27 09:48:48"
			},
			plugin:   running,
			want:     diagnose.CaseSchedulerExcludes,
			channels: channels{handshake: diagnose.StateWarning},
			findings: []expect{{
				code: diagnose.CodeHandshakeMissing, severity: diagnose.SeverityError,
				summary: []string{`handshake hami.io/node-handshake is "Reported 2024-05-27 09:48:48", which the scheduler replaces with Requesting_<time> on its next cycle`},
			}},
		},
	})
}

// TestDiagnoseNodes: Nodes reports the GPU-looking nodes only, each as Node would.
func TestDiagnoseNodes(t *testing.T) {
	t.Parallel()
	t.Run("GPU nodes only, as Node reports them", func(t *testing.T) {
		t.Parallel()
		h := installHAMi(t, install{})
		prefix := harness.UniqueName("fleet")
		healthy := gpuNode(prefix+"-a", h.now)
		noCount := gpuNode(prefix+"-b", h.now)
		delete(noCount.Status.Capacity, resourceGPU)
		delete(noCount.Status.Allocatable, resourceGPU)
		noPod := gpuNode(prefix+"-c", h.now) // labelled gpu=on, nothing else
		withoutPlugin(noPod)
		unlabelled := gpuNode(prefix+"-d", h.now) // a stale annotation, no label
		delete(unlabelled.Labels, gpuLabel)
		withoutPlugin(unlabelled)
		unlabelled.Annotations[annotation.KeyNVIDIARegister] = annotation.Encode(h100s())
		cpu := gpuNode(prefix+"-cpu", h.now)
		withoutPlugin(cpu)
		delete(cpu.Labels, gpuLabel)
		delete(cpu.Labels, poolLabel)
		cpu.Labels["node.kubernetes.io/instance-type"] = "m6i.4xlarge"
		for _, n := range []*corev1.Node{healthy, noCount, noPod, unlabelled, cpu} {
			createNode(t, n)
		}
		h.addPluginPod(t, healthy.Name, running)
		h.addPluginPod(t, noCount.Name, running)

		h.renewLease(t)
		reports, err := diagnose.Nodes(t.Context(), cp.AdminClient(), diagnose.Options{Namespace: h.ns})
		if err != nil {
			t.Fatal(err)
		}
		// Nodes lists the whole cluster; other tests' nodes run in parallel.
		mine := slices.DeleteFunc(reports, func(r diagnose.Report) bool { return !strings.HasPrefix(r.Node, prefix+"-") })
		logOnFailure(t, mine)
		type summary struct {
			Node string
			Case diagnose.Case
		}
		var got []summary
		for _, r := range mine {
			got = append(got, summary{r.Node, r.Case})
		}
		want := []summary{
			{healthy.Name, diagnose.Healthy},
			{noCount.Name, diagnose.CaseNoAllocatable},
			{noPod.Name, diagnose.CasePluginNotScheduled},
			{unlabelled.Name, diagnose.CasePluginNotScheduled},
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("nodes and cases (-want +got):\n%s", diff)
		}
		if f := mine[2].Errors(); len(f) == 0 || f[0].Code != diagnose.CodePluginPodMissing {
			t.Errorf("%s: errors %v, want PluginPodMissing", noPod.Name, codes(f))
		}
		if f := mine[3].Errors(); len(f) == 0 || f[0].Code != diagnose.CodeNodeSelectorMismatch {
			t.Errorf("%s: errors %v, want NodeSelectorMismatch", unlabelled.Name, codes(f))
		}
		for _, r := range mine {
			one := h.diagnose(t, r.Node)
			if diff := cmp.Diff(codes(one.Findings), codes(r.Findings)); diff != "" || one.Reason != r.Reason {
				t.Errorf("%s: Nodes and Node differ: reason %q vs %q, findings (-Node +Nodes):\n%s", r.Node, one.Reason, r.Reason, diff)
			}
		}
	})
}

// TestDiagnoseErrors: what cannot be diagnosed at all is an error, not a finding.
func TestDiagnoseErrors(t *testing.T) {
	t.Parallel()
	t.Run("unknown node", func(t *testing.T) {
		t.Parallel()
		h := installHAMi(t, install{})
		name := harness.UniqueName("nowhere")
		r, err := diagnose.Node(t.Context(), cp.AdminClient(), name, diagnose.Options{Namespace: h.ns})
		if !errors.Is(err, diagnose.ErrNodeNotFound) || r != nil {
			t.Fatalf("Node(%s) = %v, %v; want ErrNodeNotFound", name, r, err)
		}
		if !strings.Contains(err.Error(), name) {
			t.Errorf("error %q does not name the node", err)
		}
	})
	t.Run("invalid plugin selector", func(t *testing.T) {
		t.Parallel()
		_, err := diagnose.Nodes(t.Context(), cp.AdminClient(), diagnose.Options{PluginSelector: "app in (hami"})
		if !errors.Is(err, diagnose.ErrInvalidOptions) {
			t.Fatalf("err = %v, want ErrInvalidOptions", err)
		}
	})
}

// doctorRole grants diagnose.ClusterRoleRules, the access Node documents; leave drops resources.
func doctorRole(name string, leave ...string) *rbacv1.ClusterRole {
	rules := slices.DeleteFunc(diagnose.ClusterRoleRules(), func(r rbacv1.PolicyRule) bool { return slices.Contains(leave, r.Resources[0]) })
	return &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}
}

// TestDiagnoseDoctorPermissions: the permissions Node documents are enough; what the caller
// may not read becomes a NotChecked finding.
func TestDiagnoseDoctorPermissions(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		leave      []string
		notChecked []string // summaries of the NotChecked findings
	}{
		"documented permissions": {},
		"no leases, no subjectaccessreviews": {
			leave: []string{"leases", "subjectaccessreviews"},
			notChecked: []string{
				"could not read whether ServiceAccount {ns}:hami-device-plugin may patch nodes (SubjectAccessReview)",
				"could not read Lease {ns}/hami-scheduler",
			},
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			h := installHAMi(t, install{})
			n := gpuNode(harness.UniqueName("gpu"), h.now)
			createNode(t, n)
			e := &env{h: h, node: n.Name}
			e.pod = h.addPluginPod(t, n.Name, running)

			rbac := cp.AdminClient().RbacV1()
			role := doctorRole(h.ns+"-doctor", tc.leave...)
			if _, err := rbac.ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			doctor, err := cp.ServiceAccountClient(ctx, h.ns, "hami-doctor", role.Name)
			t.Cleanup(func() {
				ctx := context.WithoutCancel(ctx)
				_ = rbac.ClusterRoleBindings().Delete(ctx, "e2e:"+h.ns+":hami-doctor:"+role.Name, metav1.DeleteOptions{})
				_ = rbac.ClusterRoles().Delete(ctx, role.Name, metav1.DeleteOptions{})
			})
			if err != nil {
				t.Fatal(err)
			}
			h.renewLease(t)
			r, err := diagnose.Node(ctx, doctor, n.Name, diagnose.Options{Namespace: h.ns})
			if err != nil {
				t.Fatal(err)
			}
			logOnFailure(t, r)
			if r.Case != diagnose.Healthy {
				t.Errorf("case %v: %s", r.Case, r.Reason)
			}
			var got []string
			for _, f := range r.Findings {
				if f.Code == diagnose.CodeNotChecked {
					got = append(got, f.Summary)
					if f.Severity != diagnose.SeverityInfo || len(f.Fix) == 0 || !strings.HasPrefix(f.Fix[0], "grant the doctor's identity read access: kubectl auth can-i") {
						t.Errorf("NotChecked %q: severity %s, fix %q", f.Summary, f.Severity, f.Fix)
					}
				}
			}
			var want []string
			for _, s := range tc.notChecked {
				want = append(want, e.expand(s))
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("NotChecked findings (-want +got):\n%s", diff)
			}
			if len(tc.notChecked) == 0 {
				admin := h.diagnose(t, n.Name)
				if diff := cmp.Diff(codes(admin.Findings), codes(r.Findings)); diff != "" {
					t.Errorf("the doctor's report differs from the admin's (-admin +doctor):\n%s", diff)
				}
			}
		})
	}
}

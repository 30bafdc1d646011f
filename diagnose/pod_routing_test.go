package diagnose_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"
	testingclock "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/diagnose"
)

const (
	rtNS  = "team-a"
	rtPod = "cuda-job"
	// rtLeader is the scheduler Pod that holds the Lease in the healthy evidence.
	rtLeader = "hami-scheduler-7d9f8b6c5-x2x4q"
)

// rtGPUPod is a Pending pod asking one GPU with 3000 MiB, scheduled by schedulerName.
func rtGPUPod(schedulerName string) *corev1.Pod {
	lim := corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1"), "nvidia.com/gpumem": resource.MustParse("3000")}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: rtPod, Namespace: rtNS, UID: "0c1d2e3f", CreationTimestamp: metav1.NewTime(now.Add(-5 * time.Minute))},
		Spec: corev1.PodSpec{SchedulerName: schedulerName, Containers: []corev1.Container{{Name: "cuda", Image: "nvidia/cuda:12.4.0-base-ubuntu22.04",
			Resources: corev1.ResourceRequirements{Limits: lim}}}},
		Status: corev1.PodStatus{Phase: corev1.PodPending},
	}
}

// rtRunning is rtGPUPod scheduled by HAMi and running on node with HAMi's annotations.
func rtRunning(node string) *corev1.Pod {
	p := rtGPUPod(diagnose.DefaultSchedulerName)
	p.Spec.NodeName = node
	p.Annotations = map[string]string{
		"hami.io/vgpu-node": node, "hami.io/bind-phase": "success",
		annotation.KeyNVIDIAAllocated: "GPU-00000000-1111-2222-3333-444455556666,NVIDIA,3000,0:;",
	}
	p.Status.Phase = corev1.PodRunning
	return p
}

// rtWebhook is the chart's MutatingWebhookConfiguration with failurePolicy Ignore.
func rtWebhook() admissionregistrationv1.MutatingWebhookConfiguration {
	notIgnored := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
		{Key: "hami.io/webhook", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"ignore"}}}}
	return admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "hami-webhook"},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name: "vgpu.hami.io",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{
				Namespace: ns, Name: "hami-scheduler", Path: ptr.To("/webhook")}},
			Rules: []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}}}},
			FailurePolicy:     ptr.To(admissionregistrationv1.Ignore),
			NamespaceSelector: notIgnored, ObjectSelector: notIgnored.DeepCopy(),
		}},
	}
}

// rtSlice is the scheduler Service's EndpointSlice with one endpoint.
func rtSlice(ready bool) discoveryv1.EndpointSlice {
	return discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "hami-scheduler-abcde", Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: "hami-scheduler"}},
		Endpoints:  []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.7"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(ready)}}},
	}
}

// rtReadySchedulerPod is the scheduler Pod, Ready.
func rtReadySchedulerPod() corev1.Pod {
	p := schedulerPod()
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	return *p
}

// rtSchedulerConfig is the chart's KubeSchedulerConfiguration with the extender at urlPrefix.
func rtSchedulerConfig(data string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: diagnose.DefaultSchedulerConfigMap, Namespace: ns},
		Data: map[string]string{"config.yaml": data}}
}

func rtConfigYAML(urlPrefix string) string {
	return `apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection:
  leaderElect: true
  resourceName: hami-scheduler
  resourceNamespace: kube-system
profiles:
- schedulerName: hami-scheduler
extenders:
- urlPrefix: "` + urlPrefix + `"
  filterVerb: filter
  bindVerb: bind
  enableHTTPS: true
  nodeCacheCapable: true
  weight: 1
  httpTimeout: 30s
`
}

// rtEvidence is a healthy installation around pod: the webhook with a ready endpoint, a Ready
// scheduler that leads, its configuration, the device plugin on gpu-1.
func rtEvidence(pod *corev1.Pod) diagnose.PodEvidence {
	return diagnose.PodEvidence{
		Pod:             pod,
		Namespace:       &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: rtNS, Labels: map[string]string{"kubernetes.io/metadata.name": rtNS}}},
		Nodes:           []corev1.Node{*gpuNode("gpu-1"), *gpuNode("gpu-2")},
		Webhooks:        []admissionregistrationv1.MutatingWebhookConfiguration{rtWebhook()},
		EndpointSlices:  []discoveryv1.EndpointSlice{rtSlice(true)},
		Scheduler:       schedulerDeployment(),
		SchedulerPods:   []corev1.Pod{rtReadySchedulerPod()},
		Lease:           lease(rtLeader+"_2b1c0f7e-5f1d-4e7a-9a57-0c3f1f0b6d11", now.Add(-2*time.Second)),
		SchedulerConfig: rtSchedulerConfig(rtConfigYAML("https://127.0.0.1:443")),
		PluginDaemonSet: pluginDaemonSet(),
		PluginPods:      []corev1.Pod{*runningPod("gpu-1")},
	}
}

// rtEvent is an Event on the pod from component.
func rtEvent(reason, component, message string, age time.Duration) corev1.Event {
	t := metav1.NewTime(now.Add(-age))
	return corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: rtPod + "." + reason, Namespace: rtNS},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: rtNS, Name: rtPod},
		Reason:         reason, Message: message, Type: corev1.EventTypeWarning,
		Source: corev1.EventSource{Component: component}, FirstTimestamp: t, LastTimestamp: t,
	}
}

// rtNodeReport is a node diagnosis with the case.
func rtNodeReport(node string, c diagnose.Case, reason string) diagnose.Report {
	r := diagnose.Report{Node: node, Case: c, Reason: reason}
	if c != diagnose.Healthy {
		r.Findings = []diagnose.Finding{{Case: c, Severity: diagnose.SeverityError, Code: "NoAllocatable", Summary: reason,
			Fix: []string{"kubectl -n kube-system logs hami-device-plugin-" + node + " -c device-plugin"}}}
	}
	return r
}

const connRefused = `0/3 nodes are available: Post "https://127.0.0.1:443/filter": dial tcp 127.0.0.1:443: connect: connection refused`

func TestPodRouting(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		ev func() diagnose.PodEvidence
		// want: case, stage and a finding with the code and severity; its evidence has a line
		// containing evidence, and, unless noFix, a fix line with the pod's namespace and name.
		wantCase     diagnose.Case
		wantStage    diagnose.Stage
		code         string
		severity     diagnose.Severity
		evidence     string
		reason       string
		noFix        bool
		wantNodes    int
		absent       []string
		checkSummary string
		// fixHas is a text one fix line of the finding contains.
		fixHas string
		// caseByOthers: the case is the fit's (P3), not this file's; only the stage is checked.
		caseByOthers bool
	}{
		"P1 webhook missing": {
			ev: func() diagnose.PodEvidence {
				ev := rtEvidence(rtGPUPod("default-scheduler"))
				ev.Webhooks = nil
				ev.Events = []corev1.Event{rtEvent("FailedScheduling", "default-scheduler", "0/3 nodes are available: 3 Insufficient nvidia.com/gpumem.", time.Minute)}
				return ev
			},
			wantCase: diagnose.P1NotRoutedToHAMi, wantStage: diagnose.StageNotAdmitted, code: diagnose.CodeWebhookMissing,
			severity: diagnose.SeverityError, evidence: "mutatingwebhookconfigurations: none",
		},
		"P1 scheduler name named with the default scheduler's FailedScheduling": {
			ev: func() diagnose.PodEvidence {
				ev := rtEvidence(rtGPUPod("default-scheduler"))
				ev.Webhooks = nil
				ev.Events = []corev1.Event{rtEvent("FailedScheduling", "default-scheduler", "0/3 nodes are available: 3 Insufficient nvidia.com/gpumem.", time.Minute)}
				return ev
			},
			wantCase: diagnose.P1NotRoutedToHAMi, wantStage: diagnose.StageNotAdmitted, code: diagnose.CodeOtherScheduler,
			severity: diagnose.SeverityError, evidence: `Event FailedScheduling from default-scheduler: "0/3 nodes are available: 3 Insufficient nvidia.com/gpumem."`,
			reason: `spec.schedulerName is "default-scheduler", not "hami-scheduler"`,
		},
		"P1 namespaceSelector excludes the namespace": {
			ev: func() diagnose.PodEvidence {
				ev := rtEvidence(rtGPUPod(""))
				ev.Webhooks[0].Webhooks[0].NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"hami.io/enabled": "true"}}
				return ev
			},
			wantCase: diagnose.P1NotRoutedToHAMi, wantStage: diagnose.StageNotAdmitted, code: diagnose.CodeWebhookExcludes,
			severity: diagnose.SeverityError, evidence: "namespace team-a: labels kubernetes.io/metadata.name=team-a",
			checkSummary: "namespaceSelector",
		},
		"P1 objectSelector excludes the pod": {
			ev: func() diagnose.PodEvidence {
				ev := rtEvidence(rtGPUPod("default-scheduler"))
				ev.Webhooks[0].Webhooks[0].ObjectSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"gpu-pod": "yes"}}
				return ev
			},
			wantCase: diagnose.P1NotRoutedToHAMi, wantStage: diagnose.StageNotAdmitted, code: diagnose.CodeWebhookExcludes,
			severity: diagnose.SeverityError, evidence: "mutatingwebhookconfiguration hami-webhook webhook vgpu.hami.io: objectSelector gpu-pod=yes",
			fixHas: `.metadata.labels["gpu-pod"]="yes"`,
		},
		"P1 webhook rules leave pods out": {
			ev: func() diagnose.PodEvidence {
				ev := rtEvidence(rtGPUPod("default-scheduler"))
				ev.Webhooks[0].Webhooks[0].Rules[0].Operations = []admissionregistrationv1.OperationType{admissionregistrationv1.Update}
				return ev
			},
			wantCase: diagnose.P1NotRoutedToHAMi, wantStage: diagnose.StageNotAdmitted, code: diagnose.CodeWebhookExcludes,
			severity: diagnose.SeverityError, evidence: "rules UPDATE pods",
		},
		"P1 failurePolicy Fail without endpoints is a warning": {
			ev: func() diagnose.PodEvidence {
				ev := rtEvidence(rtGPUPod("default-scheduler"))
				ev.Webhooks[0].Webhooks[0].FailurePolicy = ptr.To(admissionregistrationv1.Fail)
				ev.EndpointSlices = nil
				return ev
			},
			wantCase: diagnose.P1NotRoutedToHAMi, wantStage: diagnose.StageNotAdmitted, code: diagnose.CodeWebhookNoEndpoints,
			severity: diagnose.SeverityWarning, evidence: "0 endpoints, none ready", noFix: true,
			reason: "HAMi's webhook would route it now",
		},
		"P1 pod names another scheduler itself": {
			ev: func() diagnose.PodEvidence {
				ev := rtEvidence(rtGPUPod("volcano"))
				ev.Webhooks = nil
				return ev
			},
			wantCase: diagnose.P1NotRoutedToHAMi, wantStage: diagnose.StageNotAdmitted, code: diagnose.CodeOtherScheduler,
			severity: diagnose.SeverityError, evidence: `spec.schedulerName "volcano"`,
			reason: "HAMi's webhook leaves such a pod unchanged", absent: []string{diagnose.CodeWebhookMissing},
		},
		"P1 hami.io/webhook=ignore on the pod": {
			ev: func() diagnose.PodEvidence {
				p := rtGPUPod("default-scheduler")
				p.Labels = map[string]string{"hami.io/webhook": "ignore", "app": "train"}
				return rtEvidence(p)
			},
			wantCase: diagnose.P1NotRoutedToHAMi, wantStage: diagnose.StageNotAdmitted, code: diagnose.CodeWebhookIgnoreLabel,
			severity: diagnose.SeverityError, evidence: "pod team-a/cuda-job: labels app=train,hami.io/webhook=ignore",
		},
		"P1 failurePolicy Ignore and no ready endpoint": {
			ev: func() diagnose.PodEvidence {
				ev := rtEvidence(rtGPUPod("default-scheduler"))
				ev.EndpointSlices = []discoveryv1.EndpointSlice{rtSlice(false)}
				return ev
			},
			wantCase: diagnose.P1NotRoutedToHAMi, wantStage: diagnose.StageNotAdmitted, code: diagnose.CodeWebhookNoEndpoints,
			severity: diagnose.SeverityError, evidence: "endpointslices of Service kube-system/hami-scheduler: 1 endpoints, none ready",
		},
		"P1 spec.nodeName at creation": {
			ev: func() diagnose.PodEvidence {
				p := rtGPUPod("default-scheduler")
				p.Spec.NodeName = "gpu-1"
				return rtEvidence(p)
			},
			wantCase: diagnose.P1NotRoutedToHAMi, wantStage: diagnose.StageNotAdmitted, code: diagnose.CodeNodeNameAtCreation,
			severity: diagnose.SeverityError, evidence: "pod team-a/cuda-job: spec.nodeName gpu-1, no Scheduled Event",
		},
		"P1 placed by the default scheduler": {
			ev: func() diagnose.PodEvidence {
				p := rtGPUPod("default-scheduler")
				p.Spec.NodeName = "gpu-1"
				ev := rtEvidence(p)
				ev.Events = []corev1.Event{rtEvent("Scheduled", "default-scheduler", "Successfully assigned team-a/cuda-job to gpu-1", 2*time.Minute)}
				return ev
			},
			wantCase: diagnose.P1NotRoutedToHAMi, wantStage: diagnose.StageNotAdmitted, code: diagnose.CodeDefaultScheduled,
			severity: diagnose.SeverityError, evidence: `pod team-a/cuda-job: Event Scheduled from default-scheduler: "Successfully assigned team-a/cuda-job to gpu-1"`,
		},
		"P1 failed with no binding pod found": {
			ev: func() diagnose.PodEvidence {
				p := rtGPUPod("default-scheduler")
				p.Spec.NodeName = "gpu-1"
				p.Status = corev1.PodStatus{Phase: corev1.PodFailed, Reason: "UnexpectedAdmissionError",
					Message: "Pod Allocate failed due to rpc error: code = Unknown desc = no binding pod found on node gpu-1, which is unexpected"}
				ev := rtEvidence(p)
				ev.Events = []corev1.Event{rtEvent("Scheduled", "default-scheduler", "Successfully assigned team-a/cuda-job to gpu-1", 2*time.Minute)}
				return ev
			},
			wantCase: diagnose.P1NotRoutedToHAMi, wantStage: diagnose.StageNotAdmitted, code: diagnose.CodeOtherScheduler,
			severity: diagnose.SeverityError, evidence: "status.reason UnexpectedAdmissionError",
			reason: `UnexpectedAdmissionError "no binding pod found on node"`, checkSummary: "#653, #710",
		},
		"P2 extender unreachable": {
			ev: func() diagnose.PodEvidence {
				ev := rtEvidence(rtGPUPod("hami-scheduler"))
				ev.Events = []corev1.Event{rtEvent("FailedScheduling", "hami-scheduler", connRefused, time.Minute)}
				return ev
			},
			wantCase: diagnose.P2SchedulerUnreachable, wantStage: diagnose.StageAdmitted, code: diagnose.CodeExtenderUnreachable,
			severity: diagnose.SeverityError, evidence: "Event FailedScheduling from hami-scheduler: " + `"` + connRefused + `"`,
			absent: []string{diagnose.CodeNoEvents},
		},
		"P2 an old connection refused before the extender answered is not P2": {
			ev: func() diagnose.PodEvidence {
				ev := rtEvidence(rtGPUPod("hami-scheduler"))
				ev.Events = []corev1.Event{
					rtEvent("FailedScheduling", "hami-scheduler", connRefused, 10*time.Minute),
					rtEvent("FilteringFailed", "hami-scheduler", "no available node, 2 nodes do not meet", time.Minute),
				}
				return ev
			},
			wantStage: diagnose.StageAdmitted, caseByOthers: true,
			absent: []string{diagnose.CodeExtenderUnreachable, diagnose.CodeNoEvents, diagnose.CodeHandOver},
		},
		"P2 no scheduler Pod Ready and no event": {
			ev: func() diagnose.PodEvidence {
				ev := rtEvidence(rtGPUPod("hami-scheduler"))
				sp := schedulerPod()
				sp.Status = corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{{Name: "vgpu-scheduler-extender",
					State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff"}}}}}
				ev.SchedulerPods = []corev1.Pod{*sp}
				ev.Scheduler.Status.Replicas = 1
				return ev
			},
			wantCase: diagnose.P2SchedulerUnreachable, wantStage: diagnose.StageAdmitted, code: diagnose.CodeSchedulerNotReady,
			severity: diagnose.SeverityError, evidence: "container vgpu-scheduler-extender waiting: ImagePullBackOff",
		},
		"P2 Lease expired and no event": {
			ev: func() diagnose.PodEvidence {
				ev := rtEvidence(rtGPUPod("hami-scheduler"))
				ev.Lease = lease(rtLeader+"_2b1c0f7e", now.Add(-10*time.Minute))
				return ev
			},
			wantCase: diagnose.P2SchedulerUnreachable, wantStage: diagnose.StageAdmitted, code: diagnose.CodeSchedulerLease,
			severity: diagnose.SeverityError, evidence: "lease kube-system/hami-scheduler: holderIdentity",
		},
		"P2 Lease held by a gone Pod, extender failing": {
			ev: func() diagnose.PodEvidence {
				ev := rtEvidence(rtGPUPod("hami-scheduler"))
				ev.Lease = lease("hami-scheduler-5c4b3a291-old00_77", now.Add(-3*time.Second))
				ev.Events = []corev1.Event{rtEvent("FailedScheduling", "hami-scheduler", connRefused, time.Minute)}
				return ev
			},
			wantCase: diagnose.P2SchedulerUnreachable, wantStage: diagnose.StageAdmitted, code: diagnose.CodeSchedulerLease,
			severity: diagnose.SeverityError, evidence: `holderIdentity "hami-scheduler-5c4b3a291-old00_77"`,
		},
		"P2 extender URL does not match the extender's port": {
			ev: func() diagnose.PodEvidence {
				ev := rtEvidence(rtGPUPod("hami-scheduler"))
				ev.SchedulerConfig = rtSchedulerConfig(rtConfigYAML("http://127.0.0.1:80"))
				ev.Events = []corev1.Event{rtEvent("FailedScheduling", "hami-scheduler",
					`Post "http://127.0.0.1:80/filter": dial tcp 127.0.0.1:80: connect: connection refused`, 30*time.Second)}
				return ev
			},
			wantCase: diagnose.P2SchedulerUnreachable, wantStage: diagnose.StageAdmitted, code: diagnose.CodeExtenderURL,
			severity: diagnose.SeverityError, evidence: "deployment kube-system/hami-scheduler container vgpu-scheduler-extender: --http_bind 0.0.0.0:443",
		},
		"P2 no event with a healthy scheduler is a note": {
			ev:       func() diagnose.PodEvidence { return rtEvidence(rtGPUPod("hami-scheduler")) },
			wantCase: diagnose.Healthy, wantStage: diagnose.StageAdmitted, code: diagnose.CodeNoEvents,
			severity: diagnose.SeverityInfo, evidence: "pod team-a/cuda-job: 0 Events",
		},
		"P2 garbled KubeSchedulerConfiguration never panics": {
			ev: func() diagnose.PodEvidence {
				ev := rtEvidence(rtGPUPod("hami-scheduler"))
				ev.SchedulerConfig = rtSchedulerConfig("kind: KubeSchedulerConfiguration\nextenders: [urlPrefix: {{ \x00\xff\n  - : :")
				ev.Events = []corev1.Event{rtEvent("FailedScheduling", "hami-scheduler", connRefused, time.Minute)}
				return ev
			},
			wantCase: diagnose.P2SchedulerUnreachable, wantStage: diagnose.StageAdmitted, code: diagnose.CodePodNotChecked,
			severity: diagnose.SeverityWarning, evidence: "configmap kube-system/hami-scheduler-newversion key config.yaml", noFix: true,
		},
		"P2 an extender urlPrefix that is not a URL": {
			ev: func() diagnose.PodEvidence {
				ev := rtEvidence(rtGPUPod("hami-scheduler"))
				ev.SchedulerConfig = rtSchedulerConfig(`{"kind": "KubeSchedulerConfiguration", "extenders": [{"urlPrefix": 42}, {"urlPrefix": "::"}]}`)
				ev.Events = []corev1.Event{rtEvent("FailedScheduling", "hami-scheduler", connRefused, time.Minute)}
				return ev
			},
			wantCase: diagnose.P2SchedulerUnreachable, wantStage: diagnose.StageAdmitted, code: diagnose.CodeExtenderURL,
			severity: diagnose.SeverityError, evidence: `extenders[].urlPrefix "42"`,
		},
		"hand-over: no GPU node registers": {
			ev: func() diagnose.PodEvidence {
				ev := rtEvidence(rtGPUPod("hami-scheduler"))
				ev.NodeReports = []diagnose.Report{
					rtNodeReport("gpu-1", diagnose.CaseNoAllocatable, "the kubelet reports no nvidia.com/gpu"),
					rtNodeReport("gpu-2", diagnose.CasePluginNotScheduled, "no device plugin Pod on the node"),
				}
				return ev
			},
			wantCase: diagnose.P0NodeNotRegistered, wantStage: diagnose.StageAdmitted, code: diagnose.CodeHandOver,
			severity: diagnose.SeverityError, evidence: "node gpu-1: case 3",
			reason: "no GPU node registers with HAMi's scheduler: gpu-1 case 3: the kubelet reports no nvidia.com/gpu; gpu-2 case 1", wantNodes: 2,
		},
		"hand-over: one node healthy attaches nothing": {
			ev: func() diagnose.PodEvidence {
				ev := rtEvidence(rtGPUPod("hami-scheduler"))
				ev.NodeReports = []diagnose.Report{
					rtNodeReport("gpu-1", diagnose.CaseNoAllocatable, "the kubelet reports no nvidia.com/gpu"),
					rtNodeReport("gpu-2", diagnose.Healthy, "all three channels are set"),
				}
				return ev
			},
			wantCase: diagnose.Healthy, wantStage: diagnose.StageAdmitted, code: diagnose.CodeNoEvents,
			severity: diagnose.SeverityInfo, evidence: "pod team-a/cuda-job", absent: []string{diagnose.CodeHandOver},
		},
		"P8 CUDA_DISABLE_CONTROL": {
			ev: func() diagnose.PodEvidence {
				p := rtRunning("gpu-1")
				p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "CUDA_DISABLE_CONTROL", Value: "true"}}
				return rtEvidence(p)
			},
			wantCase: diagnose.P8RunningWithoutLimits, wantStage: diagnose.StageRunning, code: diagnose.CodeControlDisabled,
			severity: diagnose.SeverityError, evidence: `pod team-a/cuda-job container cuda: env CUDA_DISABLE_CONTROL="true"`,
		},
		"P8 never went through HAMi": {
			ev: func() diagnose.PodEvidence {
				p := rtGPUPod("default-scheduler")
				p.Spec.NodeName, p.Status.Phase = "gpu-1", corev1.PodRunning
				return rtEvidence(p)
			},
			wantCase: diagnose.P8RunningWithoutLimits, wantStage: diagnose.StageRunning, code: diagnose.CodeLimitsNotEnforced,
			severity: diagnose.SeverityError, evidence: "no annotation hami.io/vgpu-devices-allocated",
		},
		"P8 another device plugin on the node": {
			ev:       func() diagnose.PodEvidence { return rtEvidence(rtRunning("gpu-2")) },
			wantCase: diagnose.P8RunningWithoutLimits, wantStage: diagnose.StageRunning, code: diagnose.CodeForeignPlugin,
			severity: diagnose.SeverityError, evidence: "daemonset kube-system/hami-device-plugin: no Running Pod on node gpu-2",
		},
		"S4 healthy": {
			ev: func() diagnose.PodEvidence {
				p := rtRunning("gpu-1")
				p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "CUDA_DISABLE_CONTROL", Value: "false"}}
				return rtEvidence(p)
			},
			wantCase: diagnose.Healthy, wantStage: diagnose.StageRunning, reason: "S4 running",
		},
		"no GPU": {
			ev: func() diagnose.PodEvidence {
				p := rtGPUPod("default-scheduler")
				p.Spec.Containers[0].Resources = corev1.ResourceRequirements{}
				return rtEvidence(p)
			},
			wantCase: diagnose.Healthy, wantStage: diagnose.StageNotAdmitted, code: diagnose.CodePodNoGPU,
			severity: diagnose.SeverityInfo, evidence: "pod team-a/cuda-job: no container has a nvidia.com/gpu limit", noFix: true,
			absent: []string{diagnose.CodeOtherScheduler},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			opts := diagnose.Options{Clock: testingclock.NewFakePassiveClock(now)}
			r, err := diagnose.AnalyzePod(tc.ev(), opts)
			if err != nil {
				t.Fatalf("AnalyzePod: %v", err)
			}
			dump := func() string {
				var b strings.Builder
				for _, f := range r.Findings {
					b.WriteString("\n  " + string(f.Severity) + " " + f.Code + " (" + string(f.Case) + "): " + f.Summary)
					for _, e := range f.Evidence {
						b.WriteString("\n    evidence: " + e)
					}
					for _, x := range f.Fix {
						b.WriteString("\n    fix: " + x)
					}
				}
				return b.String()
			}
			if (!tc.caseByOthers && r.Case != tc.wantCase) || r.Stage != tc.wantStage {
				t.Errorf("case %v stage %v, want %v %v; reason %q; findings:%s", r.Case, r.Stage, tc.wantCase, tc.wantStage, r.Reason, dump())
			}
			if tc.reason != "" && !strings.Contains(r.Reason, tc.reason) {
				t.Errorf("reason %q, want it to contain %q", r.Reason, tc.reason)
			}
			if len(r.Nodes) != tc.wantNodes {
				t.Errorf("report hands over to %d nodes, want %d", len(r.Nodes), tc.wantNodes)
			}
			for _, code := range tc.absent {
				if _, ok := r.Finding(code); ok {
					t.Errorf("finding %s present, want none; findings:%s", code, dump())
				}
			}
			if tc.code == "" {
				if errs := r.Errors(); len(errs) > 0 && !tc.caseByOthers {
					t.Errorf("errors %v, want none", errs)
				}
				return
			}
			f, ok := r.Finding(tc.code)
			if !ok {
				t.Fatalf("no finding %s; findings:%s", tc.code, dump())
			}
			if f.Severity != tc.severity {
				t.Errorf("finding %s severity %s, want %s", tc.code, f.Severity, tc.severity)
			}
			if tc.checkSummary != "" && !strings.Contains(f.Summary, tc.checkSummary) {
				t.Errorf("finding %s summary %q, want it to contain %q", tc.code, f.Summary, tc.checkSummary)
			}
			if !containsLine(f.Evidence, tc.evidence) {
				t.Errorf("finding %s evidence %q, want a line containing %q", tc.code, f.Evidence, tc.evidence)
			}
			if tc.fixHas != "" && !containsLine(f.Fix, tc.fixHas) {
				t.Errorf("finding %s fix %q, want a line containing %q", tc.code, f.Fix, tc.fixHas)
			}
			if !tc.noFix && !slices.ContainsFunc(f.Fix, func(s string) bool { return strings.Contains(s, "-n "+rtNS) && strings.Contains(s, rtPod) }) {
				t.Errorf("finding %s fix %q, want a command naming -n %s and %s", tc.code, f.Fix, rtNS, rtPod)
			}
		})
	}
}

func containsLine(lines []string, sub string) bool {
	return slices.ContainsFunc(lines, func(s string) bool { return strings.Contains(s, sub) })
}

// TestPodRoutingFixes checks the commands of the webhook and scheduler fixes.
func TestPodRoutingFixes(t *testing.T) {
	t.Parallel()
	opts := diagnose.Options{Clock: testingclock.NewFakePassiveClock(now)}

	ev := rtEvidence(rtGPUPod("default-scheduler"))
	ev.EndpointSlices = nil
	r, err := diagnose.AnalyzePod(ev, opts)
	if err != nil {
		t.Fatal(err)
	}
	f, ok := r.Finding(diagnose.CodeWebhookNoEndpoints)
	if !ok {
		t.Fatalf("no %s in %+v", diagnose.CodeWebhookNoEndpoints, r.Findings)
	}
	for _, want := range []string{
		"kubectl -n kube-system get endpointslices -l kubernetes.io/service-name=hami-scheduler",
		"kubectl -n kube-system rollout restart deployment hami-scheduler",
		`.spec.schedulerName="hami-scheduler"`,
	} {
		if !containsLine(f.Fix, want) {
			t.Errorf("fix %q, want a line containing %q", f.Fix, want)
		}
	}

	ev = rtEvidence(rtGPUPod("hami-scheduler"))
	ev.Events = []corev1.Event{rtEvent("FailedScheduling", "hami-scheduler", connRefused, time.Minute)}
	r, err = diagnose.AnalyzePod(ev, opts)
	if err != nil {
		t.Fatal(err)
	}
	f, _ = r.Finding(diagnose.CodeExtenderUnreachable)
	for _, want := range []string{
		"kubectl -n kube-system get lease hami-scheduler -o yaml",
		"kubectl -n kube-system logs " + rtLeader + " -c vgpu-scheduler-extender",
	} {
		if !containsLine(f.Fix, want) {
			t.Errorf("fix %q, want a line containing %q", f.Fix, want)
		}
	}
	if !strings.Contains(r.Reason, connRefused) {
		t.Errorf("reason %q does not quote kube-scheduler's message", r.Reason)
	}
}

// TestPodRoutingReadErrors: what could not be read is not reported as missing.
func TestPodRoutingReadErrors(t *testing.T) {
	t.Parallel()
	forbidden := apierrors.NewForbidden(schema.GroupResource{Group: "admissionregistration.k8s.io", Resource: "mutatingwebhookconfigurations"}, "", errors.New("no RBAC policy matched"))
	ev := rtEvidence(rtGPUPod("default-scheduler"))
	ev.Webhooks = nil
	ev.ReadErrors = map[string]error{"mutatingwebhookconfigurations": forbidden}
	r, err := diagnose.AnalyzePod(ev, diagnose.Options{Clock: testingclock.NewFakePassiveClock(now)})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := r.Finding(diagnose.CodeWebhookMissing); ok {
		t.Errorf("an unreadable webhook list is reported missing")
	}
	if _, ok := r.Finding(diagnose.CodePodNotChecked); !ok {
		t.Errorf("no NotChecked finding for the unreadable webhooks")
	}
	if r.Case != diagnose.P1NotRoutedToHAMi {
		t.Errorf("case %v, want P1 (the schedulerName is read)", r.Case)
	}
}

// TestPodGathersSchedulerReadErrors: through Pod, a Lease the identity may not read is a
// NotChecked finding, not an expired Lease.
func TestPodGathersSchedulerReadErrors(t *testing.T) {
	t.Parallel()
	sp := rtReadySchedulerPod()
	objs := []runtime.Object{gpuNode("gpu-1"), pluginDaemonSet(), runningPod("gpu-1"), schedulerDeployment(), &sp,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: rtNS}}, rtGPUPod("hami-scheduler")}
	c := fakeClient(true, objs...)
	c.PrependReactor("get", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}, "hami-scheduler", errors.New("denied"))
	})
	r, err := diagnose.Pod(t.Context(), c, rtNS, rtPod, diagnose.Options{Clock: testingclock.NewFakePassiveClock(now)})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := r.Finding(diagnose.CodeSchedulerLease); ok {
		t.Errorf("a forbidden Lease read is reported as a Lease problem: %+v", r.Findings)
	}
	found := false
	for _, f := range r.Findings {
		found = found || (f.Code == diagnose.CodePodNotChecked && strings.Contains(f.Summary, "lease kube-system/hami-scheduler"))
	}
	if !found {
		t.Errorf("no NotChecked finding for the Lease: %+v", r.Findings)
	}
}

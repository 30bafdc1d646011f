package diagnose

import (
	"cmp"
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
)

// Tolerations the DaemonSet controller adds to every daemon Pod (and network-unavailable for
// host-network Pods): taints with these keys never keep a DaemonSet off a node.
var daemonTolerations = []corev1.Toleration{
	{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
	{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
	{Key: corev1.TaintNodeDiskPressure, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
	{Key: corev1.TaintNodeMemoryPressure, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
	{Key: corev1.TaintNodePIDPressure, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
	{Key: corev1.TaintNodeUnschedulable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
}

// nvmlPattern matches what a device plugin prints when NVML cannot be loaded or initialised in
// its container (no driver libraries injected: the runtime is not nvidia).
var nvmlPattern = regexp.MustCompile(`(?i)(nvml[^\n]{0,40}(init|load|library|driver|not found|not supported))|libnvidia-ml\.so|ERROR_LIBRARY_NOT_FOUND|ERROR_DRIVER_NOT_LOADED|could not load NVML`)

// nodeNamePattern matches HAMi's plugin complaining about an empty node name.
var nodeNamePattern = regexp.MustCompile(`(?i)node ?name is empty`)

func (a *analysis) dsRef() string { return a.c.opts.Namespace + "/" + a.c.opts.DaemonSet }

// checkPlugin looks at the device plugin Pods on the node (cases 1 and 2).
func (a *analysis) checkPlugin(ctx context.Context) {
	ch := &a.r.Plugin
	if a.c.ds != nil {
		ch.DaemonSet = a.dsRef()
	}
	if a.c.podsErr != nil {
		ch.State = StateUnknown
		a.add(notChecked("the device plugin Pods", "pods", a.c.podsErr))
		return
	}
	a.pods = a.c.podsOn(a.node.Name)
	for i := range a.pods {
		ch.Pods = append(ch.Pods, a.podState(&a.pods[i]))
	}
	if len(a.pods) == 0 {
		ch.State = StateBroken
		a.whyNoPod()
		return
	}
	for i := range a.pods {
		if cs := a.pluginStatus(&a.pods[i]); cs != nil && cs.State.Running != nil {
			a.running = true
			if cs.Ready {
				ch.State = StateOK
				return
			}
		}
	}
	if a.running {
		ch.State = StateWarning
		p := a.pods[len(a.pods)-1]
		a.add(Finding{Case: CasePluginNotRunning, Severity: SeverityWarning, Code: CodePluginNotReady,
			Summary:  fmt.Sprintf("device plugin Pod %s runs but is not ready", p.Name),
			Evidence: []string{fmt.Sprintf("Pod %s/%s: phase %s, container %s running, not ready", p.Namespace, p.Name, p.Status.Phase, a.c.opts.PluginContainer)},
			Fix:      []string{fmt.Sprintf("kubectl -n %s describe pod %s", p.Namespace, p.Name)}})
		return
	}
	a.notRunning = true
	ch.State = StateBroken
	a.whyNotRunning(ctx, &a.pods[len(a.pods)-1])
}

func (a *analysis) podState(p *corev1.Pod) PodState {
	s := PodState{Name: p.Name, Phase: string(p.Status.Phase)}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			s.Ready = true
		}
	}
	for _, st := range slices.Concat(p.Status.InitContainerStatuses, p.Status.ContainerStatuses) {
		s.Restarts += st.RestartCount
		if s.Reason != "" {
			continue
		}
		switch {
		case st.State.Waiting != nil:
			s.Reason = st.State.Waiting.Reason
		case st.State.Terminated != nil && st.State.Terminated.ExitCode != 0:
			s.Reason = st.State.Terminated.Reason
		case st.State.Running != nil && !startedSidecar(p, &st) &&
			slices.ContainsFunc(p.Status.InitContainerStatuses, func(i corev1.ContainerStatus) bool { return i.Name == st.Name }):
			s.Reason = "Init:" + st.Name
		}
	}
	if cs := a.pluginStatus(p); cs != nil {
		s.Message = trim(terminationMessage(cs), 300)
	}
	return s
}

// startedSidecar reports whether the status is that of a native sidecar (an init container
// with restartPolicy Always) that has started: it runs beside the containers for the Pod's
// whole life and holds nothing back.
func startedSidecar(p *corev1.Pod, st *corev1.ContainerStatus) bool {
	i := slices.IndexFunc(p.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == st.Name })
	return i >= 0 && p.Spec.InitContainers[i].RestartPolicy != nil &&
		*p.Spec.InitContainers[i].RestartPolicy == corev1.ContainerRestartPolicyAlways &&
		st.State.Running != nil && st.Started != nil && *st.Started
}

// pluginStatus is the status of the plugin container (the first container when none has its
// name).
func (a *analysis) pluginStatus(p *corev1.Pod) *corev1.ContainerStatus {
	for i := range p.Status.ContainerStatuses {
		if p.Status.ContainerStatuses[i].Name == a.c.opts.PluginContainer {
			return &p.Status.ContainerStatuses[i]
		}
	}
	if len(p.Status.ContainerStatuses) > 0 {
		return &p.Status.ContainerStatuses[0]
	}
	return nil
}

// pluginContainer is the plugin container's spec, from the Pod or else the DaemonSet.
func (a *analysis) pluginContainer(p *corev1.Pod) *corev1.Container {
	var spec *corev1.PodSpec
	switch {
	case p != nil:
		spec = &p.Spec
	case a.c.ds != nil:
		spec = &a.c.ds.Spec.Template.Spec
	default:
		return nil
	}
	for i := range spec.Containers {
		if spec.Containers[i].Name == a.c.opts.PluginContainer {
			return &spec.Containers[i]
		}
	}
	if len(spec.Containers) > 0 {
		return &spec.Containers[0]
	}
	return nil
}

func terminationMessage(cs *corev1.ContainerStatus) string {
	if t := cs.LastTerminationState.Terminated; t != nil && t.Message != "" {
		return t.Message
	}
	if t := cs.State.Terminated; t != nil {
		return t.Message
	}
	return ""
}

// whyNoPod explains a node without a device plugin Pod (case 1).
func (a *analysis) whyNoPod() {
	o := a.c.opts
	if a.c.ds == nil {
		if apierrors.IsNotFound(a.c.dsErr) {
			a.add(Finding{Case: CasePluginNotScheduled, Severity: SeverityError, Code: CodeDaemonSetNotFound,
				Summary:  fmt.Sprintf("device plugin DaemonSet %s not found, and no device plugin Pod runs on the node", a.dsRef()),
				Evidence: []string{fmt.Sprintf("no Pod matching %q on node %s in namespace %s", o.PluginSelector, a.node.Name, o.Namespace)},
				Fix: []string{
					"kubectl get daemonsets -A -l " + DefaultPluginSelector,
					"helm list -A | grep -i hami",
					"if HAMi is installed under another name or namespace: kubectl hami-doctor node " + a.node.Name + " --hami-namespace <ns> --daemonset <name>",
				}})
			return
		}
		a.add(notChecked("DaemonSet "+a.dsRef(), "daemonsets", a.c.dsErr))
		a.add(Finding{Case: CasePluginNotScheduled, Severity: SeverityError, Code: CodePluginPodMissing,
			Summary:  "no device plugin Pod on the node",
			Evidence: []string{fmt.Sprintf("no Pod matching %q on node %s in namespace %s", o.PluginSelector, a.node.Name, o.Namespace)},
			Fix:      []string{fmt.Sprintf("kubectl -n %s describe daemonset %s", o.Namespace, o.DaemonSet)}})
		return
	}
	spec := &a.c.ds.Spec.Template.Spec
	found := false
	if missing := matchesSelector(a.node.Labels, spec.NodeSelector); len(missing) > 0 {
		found = true
		f := Finding{Case: CasePluginNotScheduled, Severity: SeverityError, Code: CodeNodeSelectorMismatch,
			Summary: fmt.Sprintf("node %s lacks the label %s that DaemonSet %s selects, so no device plugin Pod is scheduled there",
				a.node.Name, strings.Join(missing, ","), a.dsRef()),
			Evidence: []string{fmt.Sprintf("DaemonSet %s nodeSelector: %s", a.dsRef(), selectorString(spec.NodeSelector))}}
		a.addLabelFixes(&f, missing)
		a.add(f)
	}
	if req, mismatch, err := requiredAffinityMismatch(a.node, spec); mismatch {
		found = true
		f := Finding{Case: CasePluginNotScheduled, Severity: SeverityError, Code: CodeNodeSelectorMismatch,
			Summary:  fmt.Sprintf("node %s does not match the required node affinity of DaemonSet %s", a.node.Name, a.dsRef()),
			Evidence: []string{"required node affinity: " + describeNodeSelector(req)},
			Fix:      []string{fmt.Sprintf("kubectl -n %s get daemonset %s -o jsonpath='{.spec.template.spec.affinity}'", o.Namespace, o.DaemonSet)}}
		if err != nil {
			f.Evidence = append(f.Evidence, "the scheduler cannot evaluate it, so it matches no node: "+err.Error())
		}
		a.add(f)
	}
	tolerations := slices.Concat(spec.Tolerations, daemonTolerations)
	if spec.HostNetwork {
		tolerations = append(tolerations, corev1.Toleration{Key: corev1.TaintNodeNetworkUnavailable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule})
	}
	for _, taint := range a.node.Spec.Taints {
		if taint.Effect == corev1.TaintEffectPreferNoSchedule || corev1helpers.TolerationsTolerateTaint(logr.Discard(), tolerations, &taint, false) {
			continue
		}
		found = true
		a.add(a.taintFinding(spec, taint))
	}
	if spec.RuntimeClassName != nil && a.c.runtimeClasses != nil {
		if _, ok := a.c.runtimeClasses[*spec.RuntimeClassName]; !ok {
			found = true
			a.add(runtimeClassFinding(CasePluginNotScheduled, *spec.RuntimeClassName,
				fmt.Sprintf("DaemonSet %s asks for RuntimeClass %q, which does not exist: the API server rejects its Pods", a.dsRef(), *spec.RuntimeClassName)))
		}
	}
	if !found {
		st := a.c.ds.Status
		a.add(Finding{Case: CasePluginNotScheduled, Severity: SeverityError, Code: CodePluginPodMissing,
			Summary: fmt.Sprintf("no device plugin Pod on node %s although DaemonSet %s selects and tolerates it", a.node.Name, a.dsRef()),
			Evidence: []string{fmt.Sprintf("DaemonSet %s status: desired %d, current %d, ready %d, misscheduled %d",
				a.dsRef(), st.DesiredNumberScheduled, st.CurrentNumberScheduled, st.NumberReady, st.NumberMisscheduled)},
			Fix: []string{
				fmt.Sprintf("kubectl -n %s describe daemonset %s", o.Namespace, o.DaemonSet),
				fmt.Sprintf("kubectl -n %s get events --field-selector involvedObject.name=%s", o.Namespace, o.DaemonSet),
			}})
	}
}

// addLabelFixes adds, for each missing key=value, the node's current label as evidence and the
// kubectl label command (with --overwrite when the key has another value) as a fix.
func (a *analysis) addLabelFixes(f *Finding, missing []string) {
	for _, kv := range missing {
		k, v, _ := strings.Cut(kv, "=")
		overwrite := ""
		if got, ok := a.node.Labels[k]; ok {
			f.Evidence = append(f.Evidence, fmt.Sprintf("node %s label %s=%s", a.node.Name, k, got))
			overwrite = " --overwrite"
		} else {
			f.Evidence = append(f.Evidence, fmt.Sprintf("node %s has no label %s", a.node.Name, k))
		}
		f.Fix = append(f.Fix, fmt.Sprintf("kubectl label node %s %s=%s%s", a.node.Name, k, v, overwrite))
	}
}

func (a *analysis) taintFinding(spec *corev1.PodSpec, taint corev1.Taint) Finding {
	o := a.c.opts
	if strings.HasPrefix(taint.Key, "node.kubernetes.io/") {
		// Kubernetes keeps these taints in step with node conditions: tolerating or removing
		// them hides the cause.
		return Finding{Case: CasePluginNotScheduled, Severity: SeverityError, Code: CodeUntoleratedTaint,
			Summary: fmt.Sprintf("node %s has the taint %s, which Kubernetes sets from a node condition (the node is not ready or under pressure), so no device plugin Pod is scheduled there",
				a.node.Name, taint.ToString()),
			Evidence: append([]string{fmt.Sprintf("node %s taint %s", a.node.Name, taint.ToString())}, a.conditionEvidence()...),
			Fix: []string{
				fmt.Sprintf("kubectl describe node %s   # Conditions: fix the one behind the taint; the taint then goes by itself", a.node.Name),
			},
			OnNode: []string{"systemctl status kubelet containerd", "journalctl -u kubelet --since '-15 min' | tail -n 50"},
		}
	}
	tol := corev1.Toleration{Key: taint.Key, Operator: corev1.TolerationOpEqual, Value: taint.Value, Effect: taint.Effect}
	if taint.Value == "" {
		tol.Operator, tol.Value = corev1.TolerationOpExists, ""
	}
	value := fmt.Sprintf(`{"key":%q,"operator":%q,"effect":%q}`, tol.Key, tol.Operator, tol.Effect)
	if tol.Value != "" {
		value = fmt.Sprintf(`{"key":%q,"operator":%q,"value":%q,"effect":%q}`, tol.Key, tol.Operator, tol.Value, tol.Effect)
	}
	patch := fmt.Sprintf(`[{"op":"add","path":"/spec/template/spec/tolerations/-","value":%s}]`, value)
	if len(spec.Tolerations) == 0 {
		patch = fmt.Sprintf(`[{"op":"add","path":"/spec/template/spec/tolerations","value":[%s]}]`, value)
	}
	tols := "none"
	if len(spec.Tolerations) > 0 {
		var parts []string
		for _, t := range spec.Tolerations {
			parts = append(parts, describeToleration(t))
		}
		tols = strings.Join(parts, "; ")
	}
	return Finding{Case: CasePluginNotScheduled, Severity: SeverityError, Code: CodeUntoleratedTaint,
		Summary: fmt.Sprintf("node %s has the taint %s, which DaemonSet %s does not tolerate, so no device plugin Pod is scheduled there",
			a.node.Name, taint.ToString(), a.dsRef()),
		Evidence: []string{
			fmt.Sprintf("node %s taint %s", a.node.Name, taint.ToString()),
			fmt.Sprintf("DaemonSet %s tolerations: %s", a.dsRef(), tols),
		},
		Fix: []string{
			fmt.Sprintf("kubectl -n %s patch daemonset %s --type=json -p '%s'", o.Namespace, o.DaemonSet, patch),
			"with Helm, add the toleration to devicePlugin.tolerations in the values and run helm upgrade",
			fmt.Sprintf("or, if the taint is not wanted: kubectl taint node %s %s-", a.node.Name, taint.ToString()),
		}}
}

// conditionEvidence lists the node's conditions that are not as a healthy node has them.
func (a *analysis) conditionEvidence() []string {
	var out []string
	for _, c := range a.node.Status.Conditions {
		bad := c.Status != corev1.ConditionFalse
		if c.Type == corev1.NodeReady {
			bad = c.Status != corev1.ConditionTrue
		}
		if bad {
			out = append(out, fmt.Sprintf("node condition %s=%s: %s %s", c.Type, c.Status, c.Reason, trim(c.Message, 160)))
		}
	}
	if len(a.node.Status.Conditions) == 0 {
		out = append(out, "the node reports no conditions: its kubelet has never posted status")
	}
	return out
}

func describeToleration(t corev1.Toleration) string {
	s := cmp.Or(t.Key, "*")
	if t.Operator == corev1.TolerationOpExists {
		s += " exists"
	} else {
		s += "=" + t.Value
	}
	if t.Effect != "" {
		s += ":" + string(t.Effect)
	}
	return s
}

func runtimeClassFinding(cs Case, name, summary string) Finding {
	return Finding{Case: cs, Severity: SeverityError, Code: CodeRuntimeClassMissing,
		Summary:  summary,
		Evidence: []string{fmt.Sprintf("kubectl get runtimeclass %s: not found", name)},
		Fix: []string{
			fmt.Sprintf("kubectl apply -f - <<'EOF'\napiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata:\n  name: %s\nhandler: nvidia\nEOF", name),
		},
		OnNode: []string{"grep -n -A3 'runtimes.nvidia' /etc/containerd/config.toml   # the handler must exist in containerd"},
	}
}

// whyNotRunning explains a device plugin Pod that does not run (case 2).
func (a *analysis) whyNotRunning(ctx context.Context, p *corev1.Pod) {
	o := a.c.opts
	ref := p.Namespace + "/" + p.Name
	describe := fmt.Sprintf("kubectl -n %s describe pod %s", p.Namespace, p.Name)

	// An init container that has not completed holds the Pod.
	for _, st := range p.Status.InitContainerStatuses {
		if (st.State.Terminated != nil && st.State.Terminated.ExitCode == 0) || startedSidecar(p, &st) {
			continue
		}
		i := slices.IndexFunc(p.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == st.Name })
		var text string
		if i >= 0 {
			c := p.Spec.InitContainers[i]
			text = strings.Join(slices.Concat(c.Command, c.Args), " ")
			for _, e := range c.Env {
				text += " " + e.Value
			}
		}
		evidence := []string{fmt.Sprintf("Pod %s: init container %s %s", ref, st.Name, describeState(st.State))}
		if strings.Contains(text, "toolkit-ready") {
			evidence = append(evidence, fmt.Sprintf("init container %s command: %s", st.Name, trim(text, 200)))
			a.add(Finding{Case: CasePluginNotRunning, Severity: SeverityError, Code: CodeToolkitNotReady,
				Summary:  fmt.Sprintf("device plugin Pod %s waits in init container %s for toolkit-ready: the toolkit validation gate is on, but no NVIDIA Container Toolkit (GPU Operator) writes that file on this node", p.Name, st.Name),
				Evidence: evidence,
				Fix: []string{
					"install the GPU Operator (its toolkit validator creates /run/nvidia/validations/toolkit-ready), or turn the gate off:",
					"with Helm, disable the device plugin's toolkit validation in the values and run helm upgrade",
					fmt.Sprintf(`or: kubectl -n %s patch daemonset %s --type=json -p '[{"op":"remove","path":"/spec/template/spec/initContainers/%d"}]'`, o.Namespace, o.DaemonSet, max(i, 0)),
				},
				OnNode: []string{"ls -l /run/nvidia/validations/   # toolkit-ready appears once the NVIDIA Container Toolkit is installed"}})
			return
		}
		a.add(Finding{Case: CasePluginNotRunning, Severity: SeverityError, Code: CodePluginPending,
			Summary:  fmt.Sprintf("device plugin Pod %s is held by init container %s", p.Name, st.Name),
			Evidence: append(evidence, "command: "+trim(text, 200)),
			Fix:      []string{describe, fmt.Sprintf("kubectl -n %s logs %s -c %s", p.Namespace, p.Name, st.Name)}})
		return
	}

	cs := a.pluginStatus(p)
	ctr := a.pluginContainer(p)
	envIssue := nodeNameEnvIssue(ctr, a.node.Name)
	if cs == nil || (cs.RestartCount == 0 && cs.LastTerminationState.Terminated == nil && cs.State.Terminated == nil) {
		ev := []string{fmt.Sprintf("Pod %s: phase %s", ref, p.Status.Phase)}
		for _, c := range p.Status.Conditions {
			if c.Status != corev1.ConditionTrue && c.Message != "" {
				ev = append(ev, fmt.Sprintf("condition %s: %s: %s", c.Type, c.Reason, c.Message))
			}
		}
		reason := string(p.Status.Phase)
		if cs != nil {
			ev = append(ev, fmt.Sprintf("container %s %s", cs.Name, describeState(cs.State)))
			if cs.State.Waiting != nil {
				reason = cs.State.Waiting.Reason
			}
		}
		a.add(Finding{Case: CasePluginNotRunning, Severity: SeverityError, Code: CodePluginPending,
			Summary:  fmt.Sprintf("device plugin Pod %s has not started (%s)", p.Name, reason),
			Evidence: ev,
			Fix:      []string{describe, fmt.Sprintf("kubectl -n %s get events --field-selector involvedObject.name=%s", p.Namespace, p.Name)}})
		return
	}

	state := fmt.Sprintf("Pod %s: container %s %s, %d restarts", ref, cs.Name, describeState(cs.State), cs.RestartCount)
	msg := terminationMessage(cs)
	evidence := []string{state}
	if msg != "" {
		evidence = append(evidence, "last termination message: "+trim(telling(msg), 400))
	}
	text := msg
	logCmd := fmt.Sprintf("kubectl -n %s logs %s -c %s --previous", p.Namespace, p.Name, cs.Name)
	if !nvmlPattern.MatchString(msg) && !nodeNamePattern.MatchString(msg) {
		log, err := a.c.readLog(ctx, p, cs.Name)
		if err != nil {
			evidence = append(evidence, "previous log not readable here ("+trim(err.Error(), 160)+"): run "+logCmd)
		} else if strings.TrimSpace(log) != "" {
			evidence = append(evidence, "previous log: "+trim(telling(log), 400))
			text += "\n" + log
		}
	}
	switch {
	case nvmlPattern.MatchString(text):
		a.add(a.nvmlFinding(p, evidence))
	case envIssue != "" || nodeNamePattern.MatchString(text):
		a.add(a.nodeNameFinding(CasePluginNotRunning, p, envIssue, evidence))
	default:
		a.add(Finding{Case: CasePluginNotRunning, Severity: SeverityError, Code: CodePluginCrashing,
			Summary:  fmt.Sprintf("device plugin Pod %s is not running: container %s is %s", p.Name, cs.Name, waitingReason(cs)),
			Evidence: evidence,
			Fix:      []string{logCmd, describe}})
	}
	if name := p.Spec.RuntimeClassName; name != nil && a.c.runtimeClasses != nil {
		if _, ok := a.c.runtimeClasses[*name]; !ok {
			a.add(runtimeClassFinding(CasePluginNotRunning, *name, fmt.Sprintf("device plugin Pod %s names RuntimeClass %q, which does not exist", p.Name, *name)))
		}
	}
}

// nvmlFinding: the plugin cannot load NVML. Without a RuntimeClass whose handler is nvidia the
// runtime does not inject the driver, and the fix is such a RuntimeClass; with one, switching
// to a RuntimeClass "nvidia" changes nothing: the nvidia runtime runs and has no driver to
// inject, so the fix is on the node.
func (a *analysis) nvmlFinding(p *corev1.Pod, evidence []string) Finding {
	o := a.c.opts
	rc := "the Pod has no runtimeClassName: it runs with containerd's default runtime"
	handler := ""
	if name := p.Spec.RuntimeClassName; name != nil {
		h, ok := a.c.runtimeClasses[*name]
		switch {
		case ok:
			rc, handler = fmt.Sprintf("the Pod runs with RuntimeClass %s (handler %s)", *name, h), h
		case a.c.runtimeClasses != nil:
			rc = fmt.Sprintf("the Pod names RuntimeClass %s, which does not exist", *name)
		default:
			rc = fmt.Sprintf("the Pod names RuntimeClass %s", *name)
		}
	}
	evidence = append(evidence, rc)
	if strings.Contains(handler, "nvidia") {
		name := *p.Spec.RuntimeClassName
		return Finding{Case: CasePluginNotRunning, Severity: SeverityError, Code: CodeNVMLUnavailable,
			Summary: fmt.Sprintf("device plugin Pod %s crashes because NVML cannot be loaded, although it runs with RuntimeClass %s (handler %s): the nvidia runtime on the node does not inject the driver (no working driver on the host, or the handler is not the NVIDIA Container Runtime)",
				p.Name, name, handler),
			Evidence: evidence,
			Fix: []string{
				fmt.Sprintf("kubectl get runtimeclass %s -o yaml", name),
				"the RuntimeClass is already nvidia: the driver or the runtime on the node is at fault (see the commands to run on the node)",
			},
			OnNode: []string{
				"nvidia-smi   # the driver must work on the host first",
				fmt.Sprintf("grep -n -A6 'runtimes.%s' /etc/containerd/config.toml   # its BinaryName must be nvidia-container-runtime", handler),
				"nvidia-container-cli info   # the NVIDIA Container Toolkit must find the driver",
			}}
	}
	fix := []string{}
	if _, ok := a.c.runtimeClasses["nvidia"]; !ok && a.c.runtimeClasses != nil {
		fix = append(fix, "kubectl apply -f - <<'EOF'\napiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata:\n  name: nvidia\nhandler: nvidia\nEOF")
	}
	fix = append(fix,
		fmt.Sprintf(`kubectl -n %s patch daemonset %s --type=merge -p '{"spec":{"template":{"spec":{"runtimeClassName":"nvidia"}}}}'`, o.Namespace, o.DaemonSet),
		"with Helm: helm upgrade <release> <chart> -n "+o.Namespace+" --reuse-values --set devicePlugin.runtimeClassName=nvidia",
		"or make nvidia containerd's default runtime on the node (see the commands to run on the node)")
	return Finding{Case: CasePluginNotRunning, Severity: SeverityError, Code: CodeNVMLUnavailable,
		Summary:  fmt.Sprintf("device plugin Pod %s crashes because NVML cannot be loaded: the container runtime does not inject the NVIDIA driver (the runtime is not nvidia)", p.Name),
		Evidence: evidence,
		Fix:      fix,
		OnNode: []string{
			"nvidia-smi   # the driver must work on the host first",
			"grep -nE 'default_runtime_name|runtimes.nvidia' /etc/containerd/config.toml",
			"sudo nvidia-ctk runtime configure --runtime=containerd --set-as-default && sudo systemctl restart containerd",
		}}
}

// nodeNameFinding: the plugin does not know its node (NODE_NAME missing, or the legacy
// NodeName set instead).
func (a *analysis) nodeNameFinding(cs Case, p *corev1.Pod, envIssue string, evidence []string) Finding {
	o := a.c.opts
	if envIssue != "" {
		evidence = append([]string{envIssue}, evidence...)
	}
	return Finding{Case: cs, Severity: SeverityError, Code: CodeNodeNameEnv,
		Summary:  fmt.Sprintf("device plugin Pod %s does not know its node: HAMi's plugin reads the node name from NODE_NAME (%s)", p.Name, cmp.Or(envIssue, "it logs \"Node name is empty\"")),
		Evidence: evidence,
		Fix: []string{
			fmt.Sprintf(`kubectl -n %s set env daemonset/%s -c %s NODE_NAME- NodeName-`, o.Namespace, o.DaemonSet, o.PluginContainer),
			fmt.Sprintf(`kubectl -n %s patch daemonset %s --type=strategic -p '{"spec":{"template":{"spec":{"containers":[{"name":%q,"env":[{"name":"NODE_NAME","valueFrom":{"fieldRef":{"fieldPath":"spec.nodeName"}}}]}]}}}}'`, o.Namespace, o.DaemonSet, o.PluginContainer),
			"a DaemonSet written for an older plugin sets NodeName; current HAMi charts set NODE_NAME from spec.nodeName",
		}}
}

// nodeNameEnvIssue says what is wrong with the container's NODE_NAME, or "".
func nodeNameEnvIssue(c *corev1.Container, node string) string {
	if c == nil {
		return ""
	}
	var legacy string
	for _, e := range c.Env {
		switch {
		case e.Name == "NODE_NAME":
			switch {
			case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath != "spec.nodeName":
				return fmt.Sprintf("container %s sets NODE_NAME from %s, not spec.nodeName", c.Name, e.ValueFrom.FieldRef.FieldPath)
			case e.ValueFrom == nil && e.Value != node:
				return fmt.Sprintf("container %s sets NODE_NAME to the literal %q, not this node (%s)", c.Name, e.Value, node)
			}
			return ""
		case strings.EqualFold(e.Name, "NodeName") || strings.EqualFold(e.Name, "NODENAME"):
			legacy = e.Name
		}
	}
	if len(c.EnvFrom) > 0 && legacy == "" {
		return "" // may come from a ConfigMap or Secret; cannot tell
	}
	if legacy != "" {
		return fmt.Sprintf("container %s sets the legacy variable %s but not NODE_NAME", c.Name, legacy)
	}
	return fmt.Sprintf("container %s sets no NODE_NAME", c.Name)
}

func describeState(s corev1.ContainerState) string {
	switch {
	case s.Waiting != nil:
		if s.Waiting.Message != "" {
			return fmt.Sprintf("waiting (%s: %s)", s.Waiting.Reason, trim(s.Waiting.Message, 200))
		}
		return fmt.Sprintf("waiting (%s)", s.Waiting.Reason)
	case s.Running != nil:
		return "running"
	case s.Terminated != nil:
		return fmt.Sprintf("terminated (%s, exit code %d)", s.Terminated.Reason, s.Terminated.ExitCode)
	}
	return "in no state yet"
}

func waitingReason(cs *corev1.ContainerStatus) string {
	switch {
	case cs.State.Waiting != nil && cs.State.Waiting.Reason != "":
		return cs.State.Waiting.Reason
	case cs.State.Terminated != nil:
		return "terminated (" + cs.State.Terminated.Reason + ")"
	}
	return "not running"
}

func matchingLines(s string, patterns ...*regexp.Regexp) string {
	var out []string
	for line := range strings.Lines(s) {
		for _, p := range patterns {
			if p.MatchString(line) {
				out = append(out, strings.TrimSpace(line))
				break
			}
		}
	}
	if len(out) > 3 {
		out = out[len(out)-3:]
	}
	return strings.Join(out, " | ")
}

// crashPattern matches the lines of a termination message that say why a process died.
var crashPattern = regexp.MustCompile(`(?i)panic|fatal|error|err:|failed|cannot|could not`)

// telling picks the lines of a termination message that say the most: the ones naming NVML,
// the node name or an error, else the last three.
func telling(msg string) string {
	if m := matchingLines(msg, nvmlPattern, nodeNamePattern, crashPattern); m != "" {
		return m
	}
	return lastLines(msg, 3)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

func trim(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && cut < len(s) && s[cut]&0xC0 == 0x80 { // keep UTF-8 whole
		cut--
	}
	return s[:cut] + "…"
}

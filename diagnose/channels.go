package diagnose

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/handshake"
)

// legacyNVIDIAHandshakeKey is the key HAMi before 2.8 wrote ("Reported <time>"); nothing
// reads it any more.
const legacyNVIDIAHandshakeKey = "hami.io/node-handshake-nvidia"

func (a *analysis) observeSpec() {
	v := a.c.opts.Vendor
	s := &a.r.Spec
	s.Key = v.RegisterKey
	raw, ok := a.node.Annotations[v.RegisterKey]
	s.Present, s.Length = ok, len(raw)
	s.verdict = annotation.Check(v, a.node.Annotations)
	if s.verdict.Registers {
		s.Devices = s.verdict.Devices
		for _, d := range s.Devices {
			if !d.Health {
				s.Unhealthy++
			}
		}
	} else {
		s.Error = s.verdict.Err.Error()
		s.HAMiLog = s.verdict.HAMiLog
	}
	switch {
	case !s.verdict.Registers || s.Unhealthy == len(s.Devices):
		s.State = StateBroken
	case s.Unhealthy > 0:
		s.State = StateWarning
	default:
		s.State = StateOK
	}
}

func (a *analysis) observeCount() {
	c := &a.r.Count
	c.Resource = a.c.opts.ResourceName
	name := corev1.ResourceName(c.Resource)
	if q, ok := a.node.Status.Allocatable[name]; ok {
		c.Allocatable = q.Value()
	}
	if q, ok := a.node.Status.Capacity[name]; ok {
		c.Capacity = q.Value()
	}
	if devs := a.r.Spec.Devices; len(devs) > 0 {
		c.Physical = len(devs)
		c.Split = devs[0].Count
		withheld := map[string]bool{}
		for id := range strings.SplitSeq(a.node.Annotations[allocation.KeyAgentDeviceCordon], ",") {
			withheld[strings.TrimSpace(id)] = true
		}
		for _, d := range devs {
			if withheld[d.ID] { // the node agent gave it to DRA: not offered to the kubelet
				c.Withheld++
				continue
			}
			c.Expected += int64(d.Count)
		}
	}
	switch {
	case c.Physical > 0 && c.Withheld == c.Physical && c.Allocatable <= 0:
		c.State = StateOK // every GPU is DRA's: the kubelet is rightly offered none
	case c.Allocatable <= 0:
		c.State = StateBroken
	case c.Expected > 0 && c.Allocatable != c.Expected:
		c.State = StateWarning
	default:
		c.State = StateOK
	}
}

func (a *analysis) observeHandshake() {
	o := a.c.opts
	h := &a.r.Handshake
	h.Key = o.Vendor.HandshakeKey
	if h.Key == "" {
		h.State, h.Parsed, h.Healthy, h.Reason = StateOK, "none", true, "vendor "+o.Vendor.Name+" has no handshake"
		return
	}
	v := handshake.FromAnnotations(a.node.Annotations, h.Key, o.Location)
	h.value = v
	h.Value, h.Present, h.Parsed = v.Raw, v.Present, v.State.String()
	now := o.Clock.Now()
	if v.TimeOK {
		h.Age = now.Sub(v.Time).Round(time.Second)
		h.AgeSeconds = int64(h.Age / time.Second)
	}
	d := handshake.Decide(handshake.Input{Handshake: v, Allocatable: a.r.Count.Allocatable, Reported: a.r.Count.Allocatable,
		Registered: true, Now: now}, handshake.Options{Location: o.Location, Version: o.HAMiVersion})
	h.Healthy, h.Reason = d.Healthy, d.Reason
	switch {
	case !v.Present || !d.Healthy:
		h.State = StateBroken
	case v.State == handshake.StateRequesting && v.TimeOK:
		h.State = StateOK
	default:
		h.State = StateWarning
	}
}

// checkCount: the kubelet channel (case 3).
func (a *analysis) checkCount() {
	o := a.c.opts
	c := a.r.Count
	if c.Physical > 0 && c.Withheld == c.Physical && c.Allocatable <= 0 {
		return
	}
	if c.Allocatable > 0 {
		if c.Expected > 0 && c.Allocatable != c.Expected {
			summary := fmt.Sprintf("allocatable %s is %d, but the annotation lists %d device(s) × split %d = %d", c.Resource, c.Allocatable, c.Physical, c.Split, c.Expected)
			counted := fmt.Sprintf("%s: %d device(s), counts summing to %d", a.r.Spec.Key, c.Physical, c.Expected)
			if c.Withheld > 0 {
				summary = fmt.Sprintf("allocatable %s is %d, but the annotation lists %d device(s), %d of them DRA's, and the other %d × split %d = %d",
					c.Resource, c.Allocatable, c.Physical, c.Withheld, c.Physical-c.Withheld, c.Split, c.Expected)
				counted = fmt.Sprintf("%s: %d device(s), %d withheld from the kubelet for DRA (%s), the others' counts summing to %d",
					a.r.Spec.Key, c.Physical, c.Withheld, allocation.KeyAgentDeviceCordon, c.Expected)
			}
			a.add(Finding{Case: CaseNoAllocatable, Severity: SeverityWarning, Code: CodeAllocatableMismatch,
				Summary: summary,
				Evidence: []string{
					fmt.Sprintf("node %s status.allocatable[%s] = %d", a.node.Name, c.Resource, c.Allocatable),
					counted,
				},
				Fix: []string{
					"another device plugin may advertise the same resource, or the split count changed without a plugin restart:",
					fmt.Sprintf("kubectl get pods -A -o wide --field-selector spec.nodeName=%s | grep -i -E 'device-plugin|gpu'", a.node.Name),
				}})
		}
		return
	}
	if a.earlierError(CaseNoAllocatable) {
		return
	}
	state := "is running"
	if !a.running {
		state = "state could not be read"
	}
	ev := []string{fmt.Sprintf("node %s status.allocatable[%s] = %d, capacity %d", a.node.Name, c.Resource, c.Allocatable, c.Capacity)}
	if len(a.pods) > 0 {
		ev = append(ev, fmt.Sprintf("device plugin Pod %s/%s %s", a.pods[len(a.pods)-1].Namespace, a.pods[len(a.pods)-1].Name, state))
	}
	path := a.pluginHostPath()
	ev = append(ev, fmt.Sprintf("the plugin's socket folder on the host (DaemonSet hostPath): %s", cmp.Or(path, "unknown")))
	if path != "" && path != DefaultPluginPath {
		ev = append(ev, fmt.Sprintf("that is not the kubelet's default %s: it must be <kubelet --root-dir>/device-plugins", DefaultPluginPath))
	}
	if c.Expected > 0 {
		ev = append(ev, fmt.Sprintf("the annotation lists %d device(s), so allocatable should be %d", c.Physical, c.Expected))
	}
	a.add(Finding{Case: CaseNoAllocatable, Severity: SeverityError, Code: CodeNoAllocatable,
		Summary:  fmt.Sprintf("the device plugin %s but the kubelet reports no %s: the plugin did not register with the kubelet (socket folder vs kubelet root-dir), or the registration was lost", state, c.Resource),
		Evidence: ev,
		Fix: []string{
			fmt.Sprintf("kubectl -n %s logs %s -c %s | grep -iE 'regist|kubelet.sock|socket'", o.Namespace, a.podName(), o.PluginContainer),
			"if the kubelet runs with another --root-dir: helm upgrade <release> <chart> -n " + o.Namespace + " --reuse-values --set devicePlugin.pluginPath=<root-dir>/device-plugins",
			fmt.Sprintf("after a kubelet restart: kubectl -n %s delete pod %s   (the plugin registers again at start)", o.Namespace, a.podName()),
		},
		OnNode: []string{
			"ps -o args= -C kubelet | tr ' ' '\\n' | grep -E -- '--root-dir|--config'",
			"grep -iE 'rootDir|root-dir' /var/lib/kubelet/config.yaml",
			fmt.Sprintf("ls -l %s/   # expect kubelet.sock and the plugin's socket side by side", cmp.Or(path, DefaultPluginPath)),
			"sudo systemctl restart kubelet   # to confirm: the plugin must re-register and allocatable appear within a minute",
		}})
}

// pluginHostPath is the host folder mounted where the plugin expects the kubelet's sockets.
func (a *analysis) pluginHostPath() string {
	var spec *corev1.PodSpec
	switch {
	case len(a.pods) > 0:
		spec = &a.pods[len(a.pods)-1].Spec
	case a.c.ds != nil:
		spec = &a.c.ds.Spec.Template.Spec
	default:
		return ""
	}
	var p *corev1.Pod
	if len(a.pods) > 0 {
		p = &a.pods[len(a.pods)-1]
	}
	ctr := a.pluginContainer(p)
	if ctr == nil {
		return ""
	}
	for _, m := range ctr.VolumeMounts {
		if strings.TrimSuffix(m.MountPath, "/") != DefaultPluginPath {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name == m.Name && v.HostPath != nil {
				return strings.TrimSuffix(v.HostPath.Path, "/")
			}
		}
	}
	return ""
}

func (a *analysis) podName() string {
	if len(a.pods) > 0 {
		return a.pods[len(a.pods)-1].Name
	}
	return "<device-plugin-pod-on-" + a.node.Name + ">"
}

// checkSpec: the register annotation and the right to write it (case 4).
func (a *analysis) checkSpec(ctx context.Context) {
	o := a.c.opts
	s := &a.r.Spec
	v := s.verdict
	earlier := a.earlierError(CaseNoAnnotation)
	sev := SeverityError
	if earlier {
		sev = SeverityWarning
	}
	node := a.node.Name
	removeAndRestart := []string{
		fmt.Sprintf("kubectl annotate node %s %s-", node, s.Key),
		fmt.Sprintf("kubectl -n %s delete pod %s   (HAMi's plugin rewrites the annotation only when it starts or the devices change)", o.Namespace, a.podName()),
	}
	// The right to write comes first: when it is missing, it is the cause of what follows.
	allowed, reason, err := a.c.canPatchNodes(ctx)
	sa := o.Namespace + ":" + a.c.serviceAccount()
	switch {
	case err != nil:
		a.add(notChecked("whether ServiceAccount "+sa+" may patch nodes (SubjectAccessReview)", "subjectaccessreviews", err))
	case !allowed:
		sev := SeverityWarning
		if !v.Registers && !earlier {
			sev = SeverityError
		}
		role := a.c.serviceAccount() + "-nodes"
		a.add(Finding{Case: CaseNoAnnotation, Severity: sev, Code: CodePatchForbidden,
			Summary: fmt.Sprintf("ServiceAccount %s may not patch nodes, so the device plugin cannot write %s", sa, s.Key),
			Evidence: []string{
				fmt.Sprintf("SubjectAccessReview for system:serviceaccount:%s, verb patch, resource nodes: denied%s", sa, parenthesized(reason)),
			},
			Fix: []string{
				fmt.Sprintf("kubectl create clusterrole %s --verb=get,list,watch,patch --resource=nodes", role),
				fmt.Sprintf("kubectl create clusterrolebinding %s --clusterrole=%s --serviceaccount=%s", role, role, sa),
				fmt.Sprintf("kubectl auth can-i patch nodes --as=system:serviceaccount:%s", sa),
			}})
	}

	broken := false
	switch {
	case errors.Is(v.Err, annotation.ErrAbsent):
		broken = true
		if !earlier {
			ev := []string{fmt.Sprintf("node %s has no annotation %s", node, s.Key)}
			if a.r.Count.Allocatable > 0 {
				ev = append(ev, fmt.Sprintf("allocatable %s = %d: the kubelet channel works, the plugin is running", a.r.Count.Resource, a.r.Count.Allocatable))
			}
			a.add(Finding{Case: CaseNoAnnotation, Severity: SeverityError, Code: CodeAnnotationMissing,
				Summary:  fmt.Sprintf("annotation %s is missing: the device plugin has not written the device list, so HAMi's scheduler skips the node", s.Key),
				Evidence: ev,
				Fix: []string{
					fmt.Sprintf("kubectl -n %s logs %s -c %s | grep -E 'Updating node annotations|patch node|get node error|Node name is empty'", o.Namespace, a.podName(), o.PluginContainer),
				}})
		}
	case v.HAMiCrashes:
		broken = true
		a.add(Finding{Case: CaseNoAnnotation, Severity: sev, Code: CodeAnnotationNullElement,
			Summary:  fmt.Sprintf("annotation %s contains a null device: HAMi's scheduler crashes on it (nil pointer) and restarts, which stops registration for every node", s.Key),
			Evidence: []string{v.Err.Error(), "value: " + trim(a.node.Annotations[s.Key], 160)},
			Fix:      removeAndRestart})
	case errors.Is(v.Err, annotation.ErrNoDevices):
		broken = true
		a.add(Finding{Case: CaseNoAnnotation, Severity: sev, Code: CodeAnnotationEmpty,
			Summary:  fmt.Sprintf("annotation %s lists no devices: HAMi logs %q and skips the node", s.Key, v.HAMiLog),
			Evidence: []string{fmt.Sprintf("value %q", trim(a.node.Annotations[s.Key], 80))},
			Fix: []string{
				fmt.Sprintf("kubectl -n %s exec %s -c %s -- nvidia-smi -L   # the plugin found no GPU; does the container see any?", o.Namespace, a.podName(), o.PluginContainer),
				fmt.Sprintf("kubectl -n %s get configmap -o yaml | grep -n -A3 filterdevices   # devices filtered out by the per-node config?", o.Namespace),
			}})
	case v.Err != nil:
		broken = true
		ev := []string{v.Err.Error()}
		var de *annotation.DecodeError
		raw := a.node.Annotations[s.Key]
		if errors.As(v.Err, &de) && de.Offset >= 0 {
			ev = append(ev, "at: "+around(raw, de.Offset))
		}
		if v.HAMiLog != "" {
			ev = append(ev, fmt.Sprintf("HAMi's scheduler logs (%s): %s", v.HAMiLogLevel, v.HAMiLog))
		}
		where := ""
		if de != nil && de.Offset >= 0 {
			where = fmt.Sprintf(" at byte %d", de.Offset)
		}
		a.add(Finding{Case: CaseNoAnnotation, Severity: sev, Code: CodeAnnotationMalformed,
			Summary:  fmt.Sprintf("annotation %s is malformed%s: HAMi's scheduler cannot decode it and skips the node", s.Key, where),
			Evidence: ev,
			Fix:      append(removeAndRestart, "a plugin older than HAMi 2.8 writes the legacy colon format, which HAMi ≥ 2.8 cannot read: upgrade the plugin")})
	default:
		a.checkHealth(sev)
	}

	if broken && !earlier && a.running {
		if issue := nodeNameEnvIssue(a.pluginContainer(a.newestPod()), node); issue != "" {
			a.add(a.nodeNameFinding(CaseNoAnnotation, a.newestPod(), issue, nil))
		}
	}
}

func (a *analysis) newestPod() *corev1.Pod {
	if len(a.pods) == 0 {
		return nil
	}
	return &a.pods[len(a.pods)-1]
}

// checkHealth: devices that decode but are unhealthy.
func (a *analysis) checkHealth(sev Severity) {
	o := a.c.opts
	s := &a.r.Spec
	if s.Unhealthy == 0 {
		return
	}
	var ev []string
	for _, d := range s.Devices {
		if !d.Health {
			ev = append(ev, fmt.Sprintf("device %d %s: health false or missing", d.Index, d.ID))
		}
	}
	if len(ev) > 4 {
		ev = append(ev[:4], fmt.Sprintf("… and %d more", len(ev)-4))
	}
	if !strings.Contains(strings.ToLower(a.node.Annotations[s.Key]), `"health"`) {
		ev = append(ev, `no device has a "health" key: a missing key means unhealthy (HAMi writes health only when true)`)
	}
	fix := []string{
		fmt.Sprintf("kubectl -n %s exec %s -c %s -- nvidia-smi -q -d ECC,PAGE_RETIREMENT", o.Namespace, a.podName(), o.PluginContainer),
		fmt.Sprintf("after the GPU is repaired: kubectl -n %s delete pod %s   (HAMi's plugin never marks a device healthy again without a restart)", o.Namespace, a.podName()),
	}
	onNode := []string{"sudo dmesg -T | grep -i xid   # XID errors mark a GPU unhealthy"}
	if s.Unhealthy == len(s.Devices) {
		a.add(Finding{Case: CaseNoAnnotation, Severity: sev, Code: CodeDevicesUnhealthy,
			Summary:  fmt.Sprintf("all %d device(s) in %s are unhealthy: the node registers but HAMi places no Pod on it", len(s.Devices), s.Key),
			Evidence: ev, Fix: fix, OnNode: onNode})
		return
	}
	a.add(Finding{Case: CaseNoAnnotation, Severity: SeverityWarning, Code: CodeDevicesUnhealthy,
		Summary:  fmt.Sprintf("%d of %d device(s) in %s are unhealthy; HAMi places no Pod on them", s.Unhealthy, len(s.Devices), s.Key),
		Evidence: ev, Fix: fix, OnNode: onNode})
}

// checkScheduler: the scheduler's node label selector and its leader (case 5).
func (a *analysis) checkScheduler() {
	o := a.c.opts
	s := &a.r.Scheduler
	node := a.node.Name
	depRef := o.Namespace + "/" + o.Scheduler
	switch {
	case a.c.deploy != nil:
		s.Deployment = depRef
	case apierrors.IsNotFound(a.c.deployErr):
		a.add(Finding{Case: CaseSchedulerExcludes, Severity: SeverityError, Code: CodeSchedulerNotFound,
			Summary:  fmt.Sprintf("HAMi's scheduler Deployment %s not found: nothing registers GPU nodes", depRef),
			Evidence: []string{"kubectl -n " + o.Namespace + " get deployment " + o.Scheduler + ": not found"},
			Fix: []string{
				"kubectl get deployments -A -l " + DefaultSchedulerSelector,
				"if it is installed under another name or namespace: kubectl hami-doctor node " + node + " --hami-namespace <ns> --scheduler <name>",
			}})
	case a.c.deployErr != nil && a.c.opts.NodeLabelSelector == nil:
		a.add(notChecked("the scheduler Deployment "+depRef+" (its --node-label-selector)", "deployments", a.c.deployErr))
	}
	if a.c.selectorErr != nil {
		a.add(Finding{Case: CaseSchedulerExcludes, Severity: SeverityWarning, Code: CodeLabelSelectorExcludes,
			Summary:  "the scheduler's --node-label-selector does not parse: " + a.c.selectorErr.Error(),
			Evidence: []string{a.c.selectorErr.Error()},
			Fix:      []string{fmt.Sprintf("kubectl -n %s get deployment %s -o yaml | grep -n node-label-selector", o.Namespace, o.Scheduler)}})
	}
	if sel := a.c.selector; len(sel) > 0 {
		s.NodeLabelSelector = sel
		if missing := matchesSelector(a.node.Labels, sel); len(missing) > 0 {
			f := Finding{Case: CaseSchedulerExcludes, Severity: SeverityError, Code: CodeLabelSelectorExcludes,
				Summary:  fmt.Sprintf("node %s does not match the scheduler's node label selector %s: HAMi's scheduler never lists it", node, selectorString(sel)),
				Evidence: []string{fmt.Sprintf("%s: %s", a.c.selectorFrom, selectorString(sel))}}
			a.addLabelFixes(&f, missing)
			f.Fix = append(f.Fix, "or change scheduler.nodeLabelSelector in the Helm values (helm upgrade) so that GPU nodes match")
			a.add(f)
		}
	}

	if !a.c.leaderElect {
		return // --leader-elect=false: the extender always leads
	}
	s.Lease = o.Namespace + "/" + o.Lease
	leaseFix := []string{
		fmt.Sprintf("kubectl -n %s get pods -l %s -o wide", o.Namespace, o.SchedulerSelector),
		fmt.Sprintf("kubectl -n %s logs deployment/%s -c kube-scheduler | grep -i -E 'leader|lease'", o.Namespace, o.Scheduler),
	}
	switch {
	case apierrors.IsNotFound(a.c.leaseErr):
		a.add(Finding{Case: CaseSchedulerExcludes, Severity: SeverityError, Code: CodeNoLeader,
			Summary:  fmt.Sprintf("Lease %s not found: kube-scheduler in HAMi's scheduler Pod has never led, so no extender registers nodes", s.Lease),
			Evidence: []string{"kubectl -n " + o.Namespace + " get lease " + o.Lease + ": not found"},
			Fix:      leaseFix})
		return
	case a.c.leaseErr != nil:
		a.add(notChecked("Lease "+s.Lease, "leases", a.c.leaseErr))
		return
	}
	l := a.c.lease
	now := o.Clock.Now()
	var renewed time.Time
	var dur time.Duration
	s.Leader, renewed, dur = leaseState(l)
	s.LeaseValid = s.Leader != "" && !renewed.IsZero() && now.Before(renewed.Add(dur))
	if !s.LeaseValid {
		last := "never renewed"
		if !renewed.IsZero() {
			last = fmt.Sprintf("last renewed %v ago", now.Sub(renewed).Round(time.Second))
		}
		a.add(Finding{Case: CaseSchedulerExcludes, Severity: SeverityError, Code: CodeNoLeader,
			Summary:  fmt.Sprintf("no HAMi scheduler leads: Lease %s is held by %q, %s (duration %v)", s.Lease, s.Leader, last, dur),
			Evidence: []string{fmt.Sprintf("Lease %s holder %q, %s, leaseDurationSeconds %d", s.Lease, s.Leader, last, int(dur/time.Second))},
			Fix:      leaseFix})
		return
	}
	if a.c.schedPodsErr != nil {
		a.add(notChecked("the scheduler Pods", "pods", a.c.schedPodsErr))
		return
	}
	var names []string
	for _, p := range a.c.schedPods {
		names = append(names, p.Name)
		if p.Name == s.Leader || strings.HasPrefix(s.Leader, p.Name+"_") {
			s.LeaderPod = p.Name
		}
	}
	if s.LeaderPod == "" {
		if len(names) > 0 {
			a.add(Finding{Case: CaseSchedulerExcludes, Severity: SeverityError, Code: CodeLeaderUnknown,
				Summary: fmt.Sprintf("Lease %s is held by %q, which is none of the scheduler Pods (%s): their extenders do not lead and register no node", s.Lease, s.Leader, strings.Join(names, ", ")),
				Evidence: []string{
					fmt.Sprintf("Lease %s holder %q", s.Lease, s.Leader),
					fmt.Sprintf("scheduler Pods (%s): %s", o.SchedulerSelector, strings.Join(names, ", ")),
					"HAMi's extender leads when the holder starts with its host name (kube-scheduler writes <hostname>_<uuid>)",
				},
				Fix: leaseFix})
		}
		return
	}
	a.add(Finding{Case: CaseSchedulerExcludes, Severity: SeverityInfo, Code: CodeFollowerLogQuiet,
		Summary:  fmt.Sprintf("the leader is Pod %s: only the leader's extender registers nodes; a follower logs nothing about them, so a quiet follower log proves nothing", s.LeaderPod),
		Evidence: []string{fmt.Sprintf("Lease %s holder %q, renewed within %v", s.Lease, s.Leader, dur)},
		Fix:      []string{fmt.Sprintf("kubectl -n %s logs %s -c %s | grep -E '%s|Scheduler is not leader'", o.Namespace, s.LeaderPod, o.ExtenderContainer, node)}})
}

// checkHandshake: the liveness handshake, interpreted as HAMi's scheduler does (case 5).
func (a *analysis) checkHandshake() {
	o := a.c.opts
	h := &a.r.Handshake
	node := a.node.Name
	if o.Vendor.Name == annotation.VendorNVIDIA {
		if val, ok := a.node.Annotations[legacyNVIDIAHandshakeKey]; ok {
			a.add(Finding{Case: Healthy, Severity: SeverityInfo, Code: CodeHandshakeVendorKey,
				Summary:  fmt.Sprintf("%s does not exist for NVIDIA: the NVIDIA handshake is %s (no suffix); this value is left over from HAMi before 2.8 and nobody reads it", legacyNVIDIAHandshakeKey, o.Vendor.HandshakeKey),
				Evidence: []string{fmt.Sprintf("%s=%q", legacyNVIDIAHandshakeKey, trim(val, 80))},
				Fix:      []string{fmt.Sprintf("kubectl annotate node %s %s-   (optional: harmless)", node, legacyNVIDIAHandshakeKey)}})
		}
	}
	if h.Key == "" {
		return
	}
	v := h.value
	leaderLogs := fmt.Sprintf("kubectl -n %s logs %s -c %s | grep %s", o.Namespace, cmp.Or(a.r.Scheduler.LeaderPod, "deployment/"+o.Scheduler), o.ExtenderContainer, node)
	switch v.State {
	case handshake.StateAbsent, handshake.StateOther:
		if a.earlierError(CaseSchedulerExcludes) {
			return // the scheduler skips a node whose devices it cannot read: a consequence
		}
		what := "absent"
		if v.State == handshake.StateOther {
			what = fmt.Sprintf("%q, which the scheduler replaces with Requesting_<time> on its next cycle", trim(v.Raw, 60))
		}
		sev := SeverityError
		if a.errorIn(CaseSchedulerExcludes) {
			sev = SeverityInfo // explained by the selector or the missing leader
		}
		a.add(Finding{Case: CaseSchedulerExcludes, Severity: sev, Code: CodeHandshakeMissing,
			Summary:  fmt.Sprintf("handshake %s is %s: HAMi's scheduler has not processed this node", h.Key, what),
			Evidence: []string{"a leading scheduler stamps Requesting_<time> within 15 s of seeing a node with devices"},
			Fix:      []string{leaderLogs, "the register loop's per-node lines (Processing node, Failed to get node devices) need -v=5 on the extender"}})
	case handshake.StateRequesting:
		window := handshake.DefaultWindow
		switch {
		case !v.HasSeparator:
			sev := SeverityWarning
			if o.HAMiVersion == handshake.VersionV290 && !a.earlierError(CaseSchedulerExcludes) {
				sev = SeverityError
			}
			a.add(Finding{Case: CaseSchedulerExcludes, Severity: sev, Code: CodeHandshakeBroken,
				Summary:  fmt.Sprintf("handshake %q has no '_': HAMi v2.9.0's scheduler panics on it (master reads it as fresh)", v.Raw),
				Evidence: []string{fmt.Sprintf("%s=%q", h.Key, v.Raw)},
				Fix:      []string{fmt.Sprintf("kubectl annotate node %s %s-   (the scheduler stamps a new one)", node, h.Key)}})
		case !v.TimeOK:
			a.add(Finding{Case: CaseSchedulerExcludes, Severity: SeverityWarning, Code: CodeHandshakeBroken,
				Summary:  fmt.Sprintf("handshake time %q does not parse with the layout %s (the pre-2024 dot layout?): v2.9.0 reads it as expired, master as fresh", v.Raw, handshake.Layout),
				Evidence: []string{fmt.Sprintf("%s=%q", h.Key, v.Raw)},
				Fix:      []string{fmt.Sprintf("kubectl annotate node %s %s-   (the scheduler stamps a new one)", node, h.Key)}})
		case h.Age > window && a.r.Count.Allocatable > 0:
			a.add(Finding{Case: CaseSchedulerExcludes, Severity: SeverityInfo, Code: CodeHandshakeOld,
				Summary:  fmt.Sprintf("handshake stamped %v ago: that is normal; since HAMi 2.8 nobody refreshes it, and allocatable > 0 keeps the node registered", h.Age),
				Evidence: []string{fmt.Sprintf("%s=%q; %s = %d", h.Key, v.Raw, a.r.Count.Resource, a.r.Count.Allocatable)}})
		case h.Age < -window:
			a.add(Finding{Case: CaseSchedulerExcludes, Severity: SeverityWarning, Code: CodeHandshakeBroken,
				Summary:  fmt.Sprintf("handshake time is %v in the future: the scheduler's clock or time zone differs (timestamps are local time, no zone)", -h.Age),
				Evidence: []string{fmt.Sprintf("%s=%q", h.Key, v.Raw)}})
		}
	case handshake.StateDeleted:
		if a.r.Count.Allocatable > 0 {
			a.add(Finding{Case: CaseSchedulerExcludes, Severity: SeverityWarning, Code: CodeHandshakeDeleted,
				Summary:  fmt.Sprintf("handshake is %q: HAMi v2.9.0's scheduler cleaned the node up when its allocatable was 0; it stamps Requesting_ again 60 s later", v.Raw),
				Evidence: []string{fmt.Sprintf("%s=%q; %s = %d now", h.Key, v.Raw, a.r.Count.Resource, a.r.Count.Allocatable)},
				Fix:      []string{leaderLogs}})
		}
	}
}

// around shows the value near offset with a marker.
func around(s string, off int) string {
	if off > len(s) {
		off = len(s)
	}
	lo, hi := max(0, off-30), min(len(s), off+30)
	return fmt.Sprintf("%q ⟨here⟩ %q", s[lo:off], s[off:hi])
}

func parenthesized(s string) string {
	if s == "" {
		return ""
	}
	return " (" + s + ")"
}

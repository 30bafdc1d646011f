package diagnose

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hamireg/hamireg/dra"
)

// The pod cases of a pod that gets its GPUs through DRA (a ResourceClaim of the SDK's or
// HAMi-DRA's driver), P9 to P12: kube-scheduler allocates the claim, the kubelet's DRA
// manager has the driver prepare it, the driver reports the device's health.
const (
	// P9ClaimPending (S0): a claim of the pod does not exist (a wrong name, a template whose
	// claim was not generated) or kube-scheduler has not allocated it for longer than
	// Options.AllocateWait without saying why.
	P9ClaimPending Case = "P9-ClaimPending"
	// P10ClaimUnallocatable (S0): kube-scheduler cannot allocate the pod's claims (condition
	// PodScheduled False, reason Unschedulable: "cannot allocate all claims"): no published GPU
	// has the memory, cores or share left, or the free ones are tainted (unhealthy, cordoned,
	// the device plugin's).
	P10ClaimUnallocatable Case = "P10-ClaimUnallocatable"
	// P11ClaimNotPrepared (S2): bound, the claims allocated and reserved for the pod, but the
	// kubelet has not started the containers: the driver's prepare failed
	// (FailedPrepareDynamicResources) or never came (the driver is not registered on the node).
	P11ClaimNotPrepared Case = "P11-ClaimNotPrepared"
	// P12DeviceUnhealthy (S3/S4): the pod's claim holds a device that is unhealthy: the
	// kubelet reports it Unhealthy in the container's allocatedResourcesStatus, or the device
	// carries the <driver>/unhealthy taint in its ResourceSlice or from a DeviceTaintRule.
	P12DeviceUnhealthy Case = "P12-DeviceUnhealthy"
)

// Finding codes of claim-based pods.
const (
	CodeClaimMissing       = "ClaimMissing"
	CodeClaimPending       = "ClaimNotAllocated"
	CodeClaimUnallocatable = "ClaimUnallocatable"
	CodeClaimNotPrepared   = "ClaimNotPrepared"
	CodePrepareFailed      = "PrepareFailed"
	CodeDeviceUnhealthy    = "DRADeviceUnhealthy"
	CodeDeviceCordoned     = "DRADeviceCordoned"
)

// Claim states of a [ClaimState].
const (
	ClaimStateMissing   = "missing"
	ClaimStateNotYet    = "not created yet"
	ClaimStatePending   = "pending"
	ClaimStateAllocated = "allocated"
	ClaimStateReserved  = "reserved"
)

// eventFailedPrepare is the kubelet's Event when a DRA driver's prepare fails.
const eventFailedPrepare = "FailedPrepareDynamicResources"

// ClaimState is one ResourceClaim of a pod served by the SDK's or HAMi-DRA's DRA driver.
type ClaimState struct {
	// PodClaim is the pod's spec.resourceClaims[].name, or "extended resource <name>" for
	// the claim kube-scheduler makes for an extended resource served through DRA.
	PodClaim string `json:"podClaim"`
	// Claim is the ResourceClaim's name ("" before a template's claim is generated);
	// Template the ResourceClaimTemplate it comes from.
	Claim    string `json:"claim,omitempty"`
	Template string `json:"template,omitempty"`
	// Drivers are the DRA drivers of its classes or allocation.
	Drivers []string `json:"drivers,omitempty"`
	// State is one of the ClaimState… values.
	State string `json:"state"`
	// Devices are the allocated devices, with their health.
	Devices []ClaimDevice `json:"devices,omitempty"`
}

// ClaimDevice is one allocated device of a claim.
type ClaimDevice struct {
	Request string `json:"request"`
	Driver  string `json:"driver"`
	Pool    string `json:"pool"`
	Device  string `json:"device"`
	// Health is what the kubelet reports in the containers' allocatedResourcesStatus
	// (Healthy, Unhealthy, Unknown), "" when it reports nothing for the device; Message
	// the driver's message.
	Health  string `json:"health,omitempty"`
	Message string `json:"message,omitempty"`
	// Taints are the device's taints, from its ResourceSlice and from DeviceTaintRules
	// ("key=value:Effect", the rule's name after "by").
	Taints []string `json:"taints,omitempty"`
}

// ours reports whether driver is the SDK's or HAMi-DRA's.
func ours(driver string) bool { return driver == dra.SDKDriver || driver == dra.HAMiDriver }

// classDrivers are the drivers of ours a DeviceClass selects: its name, or a CEL selector
// that tests device.driver == "<driver>".
func classDrivers(name string, classes []resourcev1.DeviceClass) []string {
	var out []string
	if ours(name) {
		out = append(out, name)
	}
	for _, c := range classes {
		if c.Name != name {
			continue
		}
		for _, s := range c.Spec.Selectors {
			if s.CEL == nil {
				continue
			}
			for _, d := range []string{dra.SDKDriver, dra.HAMiDriver} {
				if strings.Contains(s.CEL.Expression, `"`+d+`"`) && !slices.Contains(out, d) {
					out = append(out, d)
				}
			}
		}
	}
	return out
}

// specDrivers are the drivers of ours the classes of a claim spec name.
func specDrivers(spec resourcev1.ResourceClaimSpec, classes []resourcev1.DeviceClass) []string {
	var out []string
	add := func(class string) {
		for _, d := range classDrivers(class, classes) {
			if !slices.Contains(out, d) {
				out = append(out, d)
			}
		}
	}
	for _, r := range spec.Devices.Requests {
		if r.Exactly != nil {
			add(r.Exactly.DeviceClassName)
		}
		for _, s := range r.FirstAvailable {
			add(s.DeviceClassName)
		}
	}
	return out
}

// draClaims finds the pod's claims of our drivers; nil when the pod gets no GPU through DRA.
func (a *podAnalysis) draClaims() []ClaimState {
	p, ev := a.pod, a.ev
	claim := func(name string) *resourcev1.ResourceClaim {
		for i := range ev.Claims {
			if ev.Claims[i].Namespace == p.Namespace && ev.Claims[i].Name == name {
				return &ev.Claims[i]
			}
		}
		return nil
	}
	fill := func(cs *ClaimState, c *resourcev1.ResourceClaim) {
		for _, d := range specDrivers(c.Spec, ev.DeviceClasses) {
			if !slices.Contains(cs.Drivers, d) {
				cs.Drivers = append(cs.Drivers, d)
			}
		}
		cs.State = ClaimStatePending
		if c.Status.Allocation == nil {
			return
		}
		cs.State = ClaimStateAllocated
		if slices.ContainsFunc(c.Status.ReservedFor, func(r resourcev1.ResourceClaimConsumerReference) bool {
			return r.Resource == "pods" && r.Name == p.Name && (r.UID == "" || r.UID == p.UID)
		}) {
			cs.State = ClaimStateReserved
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			if ours(r.Driver) && !slices.Contains(cs.Drivers, r.Driver) {
				cs.Drivers = append(cs.Drivers, r.Driver)
			}
			cs.Devices = append(cs.Devices, ClaimDevice{Request: r.Request, Driver: r.Driver, Pool: r.Pool, Device: r.Device})
		}
	}
	var out []ClaimState
	for _, pc := range p.Spec.ResourceClaims {
		cs := ClaimState{PodClaim: pc.Name, State: ClaimStateMissing}
		name := ""
		switch {
		case pc.ResourceClaimName != nil:
			name = *pc.ResourceClaimName
		case pc.ResourceClaimTemplateName != nil:
			cs.Template = *pc.ResourceClaimTemplateName
			cs.State = ClaimStateNotYet
			for _, s := range p.Status.ResourceClaimStatuses {
				if s.Name == pc.Name && s.ResourceClaimName != nil {
					name = *s.ResourceClaimName
				}
			}
			for _, t := range ev.ClaimTemplates {
				if t.Namespace == p.Namespace && t.Name == cs.Template {
					cs.Drivers = specDrivers(t.Spec.Spec, ev.DeviceClasses)
				}
			}
		}
		cs.Claim = name
		if c := claim(name); name != "" && c != nil {
			fill(&cs, c)
		} else if name != "" {
			cs.State = ClaimStateMissing
		}
		if len(cs.Drivers) > 0 {
			out = append(out, cs)
		}
	}
	res := corev1.ResourceName(a.opts.Allocation.ResourceCount)
	if st := p.Status.ExtendedResourceClaimStatus; st != nil {
		cs := ClaimState{PodClaim: "extended resource " + string(res), Claim: st.ResourceClaimName, State: ClaimStateMissing}
		if c := claim(st.ResourceClaimName); c != nil {
			fill(&cs, c)
		}
		if len(cs.Drivers) > 0 || cs.State == ClaimStateMissing {
			out = append(out, cs)
		}
	} else if p.Spec.NodeName == "" && !a.hami && a.req.Any() && a.extendedByDRA(res) != "" {
		out = append(out, ClaimState{PodClaim: "extended resource " + string(res), Drivers: []string{a.extendedByDRA(res)}, State: ClaimStateNotYet})
	}
	return out
}

// extendedByDRA is the driver of ours whose DeviceClass serves the extended resource name
// (spec.extendedResourceName), "" when none.
func (a *podAnalysis) extendedByDRA(name corev1.ResourceName) string {
	for _, c := range a.ev.DeviceClasses {
		if c.Spec.ExtendedResourceName != nil && *c.Spec.ExtendedResourceName == string(name) {
			if d := classDrivers(c.Name, a.ev.DeviceClasses); len(d) > 0 {
				return d[0]
			}
		}
	}
	return ""
}

// draStage is the stage of a claim-based pod: S0 until every claim is allocated, S1 allocated,
// S2 bound and not prepared, S3 prepared (the kubelet reports the devices or started a
// container), S4 running.
func (a *podAnalysis) draStage() Stage {
	p := a.pod
	switch {
	case p.Status.Phase == corev1.PodRunning || p.Status.Phase == corev1.PodSucceeded:
		return StageRunning
	case slices.ContainsFunc(a.r.Claims, func(c ClaimState) bool { return c.State != ClaimStateAllocated && c.State != ClaimStateReserved }):
		return StageAdmitted
	case p.Spec.NodeName == "":
		return StageFiltered
	case prepared(p):
		return StageAllocated
	}
	return StageBound
}

// prepared reports whether the kubelet got past preparing the pod's claims: it reports
// claim devices' health, or a container left ContainerCreating.
func prepared(p *corev1.Pod) bool {
	for _, s := range slices.Concat(p.Status.InitContainerStatuses, p.Status.ContainerStatuses) {
		if s.State.Running != nil || s.State.Terminated != nil || (s.State.Waiting != nil && s.State.Waiting.Reason != "ContainerCreating") {
			return true
		}
		for _, r := range s.AllocatedResourcesStatus {
			if _, _, ok := ParseClaimResourceName(string(r.Name)); ok {
				return true
			}
		}
	}
	return false
}

// draStageText names a claim-based pod's stage.
func draStageText(s Stage) string {
	switch s {
	case StageAdmitted:
		return "S0 waiting for kube-scheduler to allocate the claims (DRA)"
	case StageFiltered:
		return "S1 claims allocated, not bound (DRA)"
	case StageBound:
		return "S2 bound, claims not prepared by the kubelet (DRA)"
	case StageAllocated:
		return "S3 claims prepared (DRA)"
	case StageRunning, StageNotAdmitted:
	}
	return "S4 running (DRA)"
}

// checkDRA diagnoses a claim-based pod: which claim stops it where.
func (a *podAnalysis) checkDRA() {
	a.r.Stage = a.draStage()
	a.r.StageText = draStageText(a.r.Stage)
	a.deviceHealth()
	switch a.r.Stage {
	case StageAdmitted:
		a.checkClaimsPending()
	case StageFiltered:
		a.add(Finding{Severity: SeverityInfo, Code: CodePodWaiting, Summary: "claims allocated; kube-scheduler binds the pod"})
	case StageBound:
		a.checkPrepare()
	case StageNotAdmitted, StageAllocated, StageRunning: // nothing stops it before the device
	}
	a.checkUnhealthy()
}

// schedMessage is kube-scheduler's PodScheduled=False Unschedulable message, "" when none.
func schedMessage(p *corev1.Pod) string {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return c.Message
		}
	}
	return ""
}

// claimLine describes a claim for evidence.
func (a *podAnalysis) claimLine(c ClaimState) string {
	name := c.Claim
	if name == "" {
		name = "(not generated yet from template " + c.Template + ")"
	}
	return fmt.Sprintf("pod %s/%s claim %q: ResourceClaim %s, driver %s, %s", a.pod.Namespace, a.pod.Name, c.PodClaim, name, strings.Join(c.Drivers, ","), c.State)
}

// checkClaimsPending explains a pod whose claims are not all allocated (P9, P10).
func (a *podAnalysis) checkClaimsPending() {
	p := a.pod
	msg := schedMessage(p)
	for _, c := range a.r.Claims {
		if c.State == ClaimStateMissing {
			a.add(Finding{Case: P9ClaimPending, Severity: SeverityError, Code: CodeClaimMissing,
				Summary:  fmt.Sprintf("the pod's claim %q names ResourceClaim %s, which does not exist: kube-scheduler waits for it", c.PodClaim, orDashString(c.Claim)),
				Evidence: append([]string{a.claimLine(c)}, nonEmpty("kube-scheduler: "+msg, msg)...),
				Fix: []string{fmt.Sprintf("kubectl -n %s create -f claim.yaml    # a ResourceClaim named %s of DeviceClass %s", p.Namespace, orDashString(c.Claim), strings.Join(c.Drivers, " or ")),
					fmt.Sprintf("kubectl -n %s get resourceclaims", p.Namespace)}})
			return
		}
	}
	if msg != "" {
		a.add(Finding{Case: P10ClaimUnallocatable, Severity: SeverityError, Code: CodeClaimUnallocatable,
			Summary:  "kube-scheduler cannot allocate the pod's claims: " + msg,
			Evidence: append(a.claimEvidence(), a.deviceEvidence()...),
			Fix: []string{
				fmt.Sprintf("kubectl get resourceslices --field-selector spec.driver=%s -o yaml    # what the GPUs have left, their taints", strings.Join(a.drivers(), ",")),
				"lower the claim's capacity requests (memory, cores) or its count, or free a GPU (delete a pod that holds one)",
				"a cordoned GPU (taint <driver>/cordoned): kubectl hami-doctor uncordon NODE GPU --yes",
				"no ResourceSlice: the node agent's DRA world is off or failing: kubectl hami-doctor node NODE",
			}})
		return
	}
	age := a.now.Sub(p.CreationTimestamp.Time)
	if p.CreationTimestamp.IsZero() || age <= a.opts.AllocateWait {
		a.add(Finding{Case: P9ClaimPending, Severity: SeverityInfo, Code: CodePodWaiting,
			Summary: "waiting for kube-scheduler to allocate the claims", Evidence: a.claimEvidence()})
		return
	}
	a.add(Finding{Case: P9ClaimPending, Severity: SeverityError, Code: CodeClaimPending,
		Summary:  fmt.Sprintf("the pod's claims are not allocated %s after its creation, and kube-scheduler says nothing", age.Round(time.Second)),
		Evidence: a.claimEvidence(),
		Fix: []string{"kubectl -n kube-system get pods -l component=kube-scheduler    # kube-scheduler runs and serves resource.k8s.io/v1",
			fmt.Sprintf("kubectl -n %s get pod %s -o jsonpath='{.spec.schedulerName}'    # the scheduler that is to allocate it", p.Namespace, p.Name)}})
}

func nonEmpty(s, test string) []string {
	if test == "" {
		return nil
	}
	return []string{s}
}

func orDashString(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// drivers are the drivers of the pod's claims.
func (a *podAnalysis) drivers() []string {
	var out []string
	for _, c := range a.r.Claims {
		for _, d := range c.Drivers {
			if !slices.Contains(out, d) {
				out = append(out, d)
			}
		}
	}
	return out
}

func (a *podAnalysis) claimEvidence() []string {
	var out []string
	for _, c := range a.r.Claims {
		out = append(out, a.claimLine(c))
	}
	return out
}

// deviceEvidence summarises the published devices of the pod's drivers: per driver and
// node, how many devices and which are tainted.
func (a *podAnalysis) deviceEvidence() []string {
	var out []string
	drivers := a.drivers()
	n := 0
	for _, s := range a.ev.ResourceSlices {
		if !slices.Contains(drivers, s.Spec.Driver) {
			continue
		}
		n++
		var tainted []string
		for _, d := range s.Spec.Devices {
			if t := a.taintsOf(s.Spec.Driver, s.Spec.Pool.Name, d); len(t) > 0 {
				tainted = append(tainted, d.Name+" ("+strings.Join(t, ", ")+")")
			}
		}
		line := fmt.Sprintf("ResourceSlice %s (driver %s, pool %s): %d devices", s.Name, s.Spec.Driver, s.Spec.Pool.Name, len(s.Spec.Devices))
		if len(tainted) > 0 {
			line += ", tainted: " + strings.Join(tainted, "; ")
		}
		out = append(out, line)
	}
	if n == 0 && a.ev.ReadErrors["resourceslices"] == nil {
		out = append(out, fmt.Sprintf("no ResourceSlice of driver %s: no node publishes GPUs for these claims", strings.Join(drivers, " or ")))
	}
	return out
}

// taintsOf are a device's taints from its slice and from DeviceTaintRules.
func (a *podAnalysis) taintsOf(driver, pool string, d resourcev1.Device) []string {
	var out []string
	for _, t := range d.Taints {
		out = append(out, taintString(t))
	}
	for _, r := range a.ev.DeviceTaintRules {
		if ruleSelects(r, driver, pool, d.Name) {
			out = append(out, taintString(r.Spec.Taint)+" by DeviceTaintRule "+r.Name)
		}
	}
	return out
}

func taintString(t resourcev1.DeviceTaint) string {
	s := t.Key
	if t.Value != "" {
		s += "=" + t.Value
	}
	return s + ":" + string(t.Effect)
}

// ruleSelects reports whether a DeviceTaintRule selects the device.
func ruleSelects(r resourcev1.DeviceTaintRule, driver, pool, device string) bool {
	s := r.Spec.DeviceSelector
	if s == nil {
		return false
	}
	match := func(want *string, have string) bool { return want == nil || *want == have }
	return match(s.Driver, driver) && match(s.Pool, pool) && match(s.Device, device)
}

// deviceHealth fills the claims' devices with the kubelet's health and their taints.
func (a *podAnalysis) deviceHealth() {
	p := a.pod
	health := map[string]corev1.ResourceHealth{}
	for _, s := range slices.Concat(p.Status.InitContainerStatuses, p.Status.ContainerStatuses) {
		for _, rs := range s.AllocatedResourcesStatus {
			if _, _, ok := ParseClaimResourceName(string(rs.Name)); !ok {
				continue
			}
			for _, h := range rs.Resources {
				if driver, pool, device, ok := ParseDeviceResourceID(string(h.ResourceID)); ok {
					health[driver+"/"+pool+"/"+device] = h
				} else {
					health[string(h.ResourceID)] = h
				}
			}
		}
	}
	for i := range a.r.Claims {
		for j := range a.r.Claims[i].Devices {
			d := &a.r.Claims[i].Devices[j]
			if h, ok := health[d.Driver+"/"+d.Pool+"/"+d.Device]; ok {
				d.Health = string(h.Health)
				if h.Message != nil {
					d.Message = *h.Message
				}
			}
			for _, s := range a.ev.ResourceSlices {
				if s.Spec.Driver != d.Driver || s.Spec.Pool.Name != d.Pool {
					continue
				}
				for _, dev := range s.Spec.Devices {
					if dev.Name == d.Device {
						d.Taints = a.taintsOf(d.Driver, d.Pool, dev)
					}
				}
			}
		}
	}
	// A resourceID that is a CDI device ID ("vendor/class=name"): this SDK's driver names its
	// CDI devices <claim UID>-<device>, so the name's suffix tells the device; for another
	// driver's name, every device of the claim's request takes the health (Unhealthy wins).
	for _, s := range slices.Concat(p.Status.InitContainerStatuses, p.Status.ContainerStatuses) {
		for _, rs := range s.AllocatedResourcesStatus {
			podClaim, request, ok := ParseClaimResourceName(string(rs.Name))
			if !ok {
				continue
			}
			for _, h := range rs.Resources {
				_, cdiName, isCDI := strings.Cut(string(h.ResourceID), "=")
				if !isCDI {
					continue
				}
				for i := range a.r.Claims {
					c := &a.r.Claims[i]
					if c.PodClaim != podClaim {
						continue
					}
					named := slices.ContainsFunc(c.Devices, func(d ClaimDevice) bool { return strings.HasSuffix(cdiName, "-"+d.Device) })
					for j := range c.Devices {
						d := &c.Devices[j]
						if named && !strings.HasSuffix(cdiName, "-"+d.Device) {
							continue
						}
						if !named && request != "" && d.Request != request && !strings.HasPrefix(d.Request, request+"/") {
							continue
						}
						if d.Health == "" || h.Health == corev1.ResourceHealthStatusUnhealthy {
							d.Health, d.Message = string(h.Health), ""
							if h.Message != nil {
								d.Message = *h.Message
							}
						}
					}
				}
			}
		}
	}
}

// checkPrepare explains a bound pod whose claims the kubelet has not prepared (P11).
func (a *podAnalysis) checkPrepare() {
	p, node := a.pod, a.pod.Spec.NodeName
	var ev []string
	for _, e := range a.eventsWith(eventFailedPrepare) {
		ev = append(ev, fmt.Sprintf("event %s (%d×, %s): %s", e.Reason, max(e.Count, 1), eventTime(e).Format(time.RFC3339), e.Message))
	}
	for _, c := range a.r.Claims {
		if c.State != ClaimStateReserved {
			ev = append(ev, a.claimLine(c)+fmt.Sprintf(": not reserved for pod %s", p.Name))
		}
	}
	published := map[string]bool{}
	for _, s := range a.ev.ResourceSlices {
		if s.Spec.NodeName != nil && *s.Spec.NodeName == node {
			published[s.Spec.Driver] = true
		}
	}
	var missing []string
	for _, d := range a.drivers() {
		if !published[d] && a.ev.ReadErrors["resourceslices"] == nil {
			missing = append(missing, d)
		}
	}
	if len(missing) > 0 {
		ev = append(ev, fmt.Sprintf("node %s has no ResourceSlice of driver %s: its DRA plugin is not registered with the kubelet", node, strings.Join(missing, ",")))
	}
	fix := []string{
		fmt.Sprintf("kubectl -n %s describe pod %s    # the kubelet's FailedPrepareDynamicResources message", p.Namespace, p.Name),
		fmt.Sprintf("kubectl hami-doctor node %s    # the node agent and its DRA world", node),
	}
	onNode := []string{"journalctl -u kubelet | grep -i 'prepare'    # the kubelet's DRA manager",
		"ls /var/lib/kubelet/plugins_registry/    # the driver's registration socket"}
	if len(a.eventsWith(eventFailedPrepare)) > 0 {
		a.add(Finding{Case: P11ClaimNotPrepared, Severity: SeverityError, Code: CodePrepareFailed,
			Summary:  fmt.Sprintf("the DRA driver failed to prepare the pod's claims on node %s", node),
			Evidence: append(ev, a.claimEvidence()...), Fix: fix, OnNode: onNode})
		return
	}
	bound := a.boundAt()
	age := a.now.Sub(bound)
	if bound.IsZero() || (age <= a.opts.AllocateWait && len(missing) == 0) {
		a.add(Finding{Case: P11ClaimNotPrepared, Severity: SeverityInfo, Code: CodePodWaiting,
			Summary: "bound; waiting for the kubelet to prepare the claims", Evidence: ev})
		return
	}
	a.add(Finding{Case: P11ClaimNotPrepared, Severity: SeverityError, Code: CodeClaimNotPrepared,
		Summary:  fmt.Sprintf("bound to node %s %s ago with its claims allocated, but the kubelet has not prepared them", node, age.Round(time.Second)),
		Evidence: append(ev, a.claimEvidence()...), Fix: fix, OnNode: onNode})
}

// boundAt is when the pod was scheduled (condition PodScheduled True), zero when unknown.
func (a *podAnalysis) boundAt() time.Time {
	for _, c := range a.pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionTrue {
			return c.LastTransitionTime.Time
		}
	}
	if e := a.lastEvent("Scheduled"); e != nil {
		return eventTime(*e)
	}
	return time.Time{}
}

// checkUnhealthy reports the claims' unhealthy and cordoned devices (P12).
func (a *podAnalysis) checkUnhealthy() {
	p := a.pod
	for _, c := range a.r.Claims {
		for _, d := range c.Devices {
			var why []string
			if d.Health == string(corev1.ResourceHealthStatusUnhealthy) {
				w := fmt.Sprintf("the kubelet reports %s/%s/%s Unhealthy in the pod's allocatedResourcesStatus", d.Driver, d.Pool, d.Device)
				if d.Message != "" {
					w += ": " + d.Message
				}
				why = append(why, w)
			}
			cordoned := false
			for _, t := range d.Taints {
				key, _, _ := strings.Cut(t, ":")
				key, _, _ = strings.Cut(key, "=")
				switch {
				case strings.HasSuffix(key, "/"+dra.TaintUnhealthy):
					why = append(why, fmt.Sprintf("device %s/%s/%s has the taint %s", d.Driver, d.Pool, d.Device, t))
				case strings.HasSuffix(key, "/"+dra.TaintCordoned):
					cordoned = true
				}
			}
			if len(why) > 0 && a.r.Stage >= StageBound {
				gpu := a.gpuOf(d)
				a.add(Finding{Case: P12DeviceUnhealthy, Severity: SeverityError, Code: CodeDeviceUnhealthy,
					Summary:  fmt.Sprintf("the pod's claim %q holds GPU %s (%s), which is unhealthy", c.PodClaim, gpu, d.Device),
					Evidence: append(why, a.claimLine(c)),
					Fix: []string{
						draRecreateFix(p),
						fmt.Sprintf("kubectl hami-doctor cordon %s %s --yes    # keep other claims off it until it is repaired", cmp.Or(p.Spec.NodeName, d.Pool), gpu),
					},
					OnNode: []string{"nvidia-smi -q -d PAGE_RETIREMENT,ECC; dmesg | grep -i xid    # why the GPU failed"}})
			}
			if cordoned {
				a.add(Finding{Severity: SeverityInfo, Code: CodeDeviceCordoned,
					Summary:  fmt.Sprintf("device %s/%s/%s of claim %q is cordoned: the pod keeps it, new claims do not get it", d.Driver, d.Pool, d.Device, c.PodClaim),
					Evidence: d.Taints})
			}
		}
	}
}

// gpuOf names the GPU of a device: its uuid attribute in the slice, else the device name.
func (a *podAnalysis) gpuOf(d ClaimDevice) string {
	for _, s := range a.ev.ResourceSlices {
		if s.Spec.Driver != d.Driver || s.Spec.Pool.Name != d.Pool {
			continue
		}
		for _, dev := range s.Spec.Devices {
			if u := dev.Attributes["uuid"].StringValue; dev.Name == d.Device && u != nil {
				return *u
			}
		}
	}
	if i, ok := profileOf(d.Driver).IndexOf(d.Device); ok {
		return fmt.Sprint(i)
	}
	return d.Device
}

// ParseClaimResourceName reads the resource name the kubelet gives a DRA claim in a
// container's allocatedResourcesStatus: "claim:<pod claim name>" or
// "claim:<pod claim name>/<request>". ok is false for any other name (a device plugin's
// resource, such as nvidia.com/gpu).
func ParseClaimResourceName(name string) (podClaim, request string, ok bool) {
	rest, found := strings.CutPrefix(name, "claim:")
	if !found || rest == "" {
		return "", "", false
	}
	podClaim, request, _ = strings.Cut(rest, "/")
	if podClaim == "" {
		return "", "", false
	}
	return podClaim, request, true
}

// ParseDeviceResourceID reads the resourceID the kubelet gives a DRA device in
// allocatedResourcesStatus when the driver gave it no CDI device ID:
// "<driver>/<pool>/<device>" (the pool may itself hold slashes). ok is false for a CDI device
// ID ("vendor/class=name") and anything else.
func ParseDeviceResourceID(id string) (driver, pool, device string, ok bool) {
	if strings.Contains(id, "=") {
		return "", "", "", false
	}
	driver, rest, found := strings.Cut(id, "/")
	if !found {
		return "", "", "", false
	}
	i := strings.LastIndex(rest, "/")
	if i < 0 {
		return "", "", "", false
	}
	pool, device = rest[:i], rest[i+1:]
	if driver == "" || pool == "" || device == "" {
		return "", "", "", false
	}
	return driver, pool, device, true
}

// draGather is what a pod diagnosis reads of DRA: the cluster's classes, slices and taint
// rules once, the claims and templates once per namespace.
type draGather struct {
	classes   []resourcev1.DeviceClass
	slices    []resourcev1.ResourceSlice
	rules     []resourcev1.DeviceTaintRule
	claims    map[string][]resourcev1.ResourceClaim
	templates map[string][]resourcev1.ResourceClaimTemplate
}

// gatherDRA reads the cluster-wide DRA objects.
func (g *podGather) gatherDRA(ctx context.Context) {
	g.dra.claims, g.dra.templates = map[string][]resourcev1.ResourceClaim{}, map[string][]resourcev1.ResourceClaimTemplate{}
	r := g.client.ResourceV1()
	if l, err := r.DeviceClasses().List(ctx, metav1.ListOptions{}); err != nil {
		g.errs["deviceclasses"] = err
	} else {
		g.dra.classes = l.Items
	}
	if l, err := r.ResourceSlices().List(ctx, metav1.ListOptions{}); err != nil {
		g.errs["resourceslices"] = err
	} else {
		for _, s := range l.Items {
			if ours(s.Spec.Driver) {
				g.dra.slices = append(g.dra.slices, s)
			}
		}
	}
	if l, err := r.DeviceTaintRules().List(ctx, metav1.ListOptions{}); err != nil {
		g.errs["devicetaintrules"] = err
	} else {
		g.dra.rules = l.Items
	}
}

// usesDRA reports whether a pod may get devices through DRA: it has claims, a claim of an
// extended resource, or asks an extended resource a DeviceClass serves.
func usesDRA(p *corev1.Pod, classes []resourcev1.DeviceClass) bool {
	if len(p.Spec.ResourceClaims) > 0 || p.Status.ExtendedResourceClaimStatus != nil {
		return true
	}
	for _, c := range classes {
		if c.Spec.ExtendedResourceName == nil {
			continue
		}
		for _, ctr := range slices.Concat(p.Spec.InitContainers, p.Spec.Containers) {
			if _, ok := ctr.Resources.Limits[corev1.ResourceName(*c.Spec.ExtendedResourceName)]; ok {
				return true
			}
		}
	}
	return false
}

// draEvidence adds the DRA objects a pod's diagnosis needs to ev.
func (g *podGather) draEvidence(ctx context.Context, pod *corev1.Pod, ev *PodEvidence) {
	ev.DeviceClasses, ev.ResourceSlices, ev.DeviceTaintRules = g.dra.classes, g.dra.slices, g.dra.rules
	if !usesDRA(pod, g.dra.classes) {
		return
	}
	ns := pod.Namespace
	if cs, ok := g.dra.claims[ns]; ok {
		ev.Claims = cs
	} else if l, err := g.client.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{}); err != nil {
		ev.ReadErrors["resourceclaims of namespace "+ns] = err
	} else {
		ev.Claims, g.dra.claims[ns] = l.Items, l.Items
	}
	if len(pod.Spec.ResourceClaims) == 0 {
		return
	}
	if ts, ok := g.dra.templates[ns]; ok {
		ev.ClaimTemplates = ts
	} else if l, err := g.client.ResourceV1().ResourceClaimTemplates(ns).List(ctx, metav1.ListOptions{}); err != nil {
		ev.ReadErrors["resourceclaimtemplates of namespace "+ns] = err
	} else {
		ev.ClaimTemplates, g.dra.templates[ns] = l.Items, l.Items
	}
}

// draResources are the resource.k8s.io resources a pod diagnosis reads.
var draResources = []string{"resourceclaims", "resourceclaimtemplates", "resourceslices", "deviceclasses", "devicetaintrules"}

// rbacFix names the RBAC rule to add when a DRA read was forbidden; nil otherwise.
func rbacFix(what string, err error) []string {
	res, _, _ := strings.Cut(what, " ")
	if !apierrors.IsForbidden(err) || !slices.Contains(draResources, res) {
		return nil
	}
	return []string{fmt.Sprintf("add the RBAC rule {apiGroups: [%s], resources: [%s], verbs: [get, list]} to the doctor's ClusterRole (diagnose.PodClusterRoleRules lists them all)", resourcev1.GroupName, res)}
}

// draRecreateFix is the command that gives a claim-based pod a new device: the pod deleted
// (its controller creates it again, a template's claim is generated anew) or, for a bare
// pod, replaced from its own manifest; a named claim is deallocated once no pod uses it, and the
// device's NoSchedule taint keeps the allocator off it.
func draRecreateFix(p *corev1.Pod) string {
	if len(p.OwnerReferences) > 0 {
		o := p.OwnerReferences[0]
		return fmt.Sprintf("kubectl -n %s delete pod %s    # %s %s creates it again; its claim is allocated on a healthy GPU", p.Namespace, p.Name, o.Kind, o.Name)
	}
	return recreateFix(p, "") + "    # its claim is allocated again, on a healthy GPU"
}

package diagnose

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/dra"
)

// Errors of Cordon and Uncordon, besides ErrNodeNotFound, ErrAPI and ErrInvalidOptions.
var (
	// ErrGPUNotFound: a GPU given to Cordon or Uncordon is neither in the node's register
	// annotation nor published in a ResourceSlice of the node.
	ErrGPUNotFound = errors.New("GPU not found on the node")
	// ErrForbidden: the identity may not do what the command needs; the error names the
	// RBAC rule to add ([CordonRules]).
	ErrForbidden = errors.New("forbidden")
)

// Labels and annotations of the DeviceTaintRules [Cordon] writes.
const (
	// CordonManagedBy is the value of the label app.kubernetes.io/managed-by on the rules.
	CordonManagedBy = "hamireg-doctor"
	// CordonNodeAnnotation and CordonGPUAnnotation record the node and the GPU UUID a rule
	// cordons, so that [Uncordon] finds it even when the device left its slice.
	CordonNodeAnnotation = "hamireg.io/cordon-node"
	CordonGPUAnnotation  = "hamireg.io/cordon-gpu"
	// labelManagedBy is the well-known label key.
	labelManagedBy = "app.kubernetes.io/managed-by"
)

// CordonOptions of [Cordon] and [Uncordon].
type CordonOptions struct {
	// DryRun computes the change and sends every write with the API server's dry run
	// (dryRun=All: validated and admitted, not stored). The result says what would change.
	DryRun bool
	// Drivers are the DRA drivers whose ResourceSlices on the node are searched for the GPUs;
	// nil: the SDK's and HAMi-DRA's ([dra.SDKDriver], [dra.HAMiDriver]).
	Drivers []string
}

// Actions of a [CordonChange].
const (
	// CordonAdded: the UUID was added to hami.io/device-cordon, or the rule created.
	CordonAdded = "added"
	// CordonRemoved: the UUID was removed from hami.io/device-cordon, or the rule deleted.
	CordonRemoved = "removed"
	// CordonUnchanged: already as asked (idempotent repeat).
	CordonUnchanged = "unchanged"
	// CordonKeptByAgent: Uncordon left the UUID in hami.io/device-cordon because the node
	// agent put it there (the GPU is DRA's; hamireg.io/agent-device-cordon names it).
	CordonKeptByAgent = "kept: the node agent cordons it for DRA"
)

// CordonResult is what [Cordon] or [Uncordon] did (with DryRun: would do) on one node.
type CordonResult struct {
	Node   string `json:"node"`
	DryRun bool   `json:"dryRun"`
	// Before and After are the node's hami.io/device-cordon as read and as written.
	Before string `json:"before"`
	After  string `json:"after"`
	// GPUs lists each GPU given, in the order given.
	GPUs []GPUCordon `json:"gpus"`
}

// GPUCordon is one GPU of a [CordonResult].
type GPUCordon struct {
	// GPU is the argument as given (a UUID or an index); UUID and Index the GPU it names
	// (Index -1 when only the UUID is known).
	GPU   string `json:"gpu"`
	UUID  string `json:"uuid"`
	Index int    `json:"index"`
	// Annotation is the action on hami.io/device-cordon (CordonAdded, CordonRemoved,
	// CordonUnchanged, CordonKeptByAgent).
	Annotation string `json:"annotation"`
	// Rules are the DeviceTaintRules of the GPU's DRA devices; empty when no DRA driver
	// publishes it.
	Rules []CordonChange `json:"rules,omitempty"`
}

// CordonChange is one DeviceTaintRule of a GPU: the rule's name, the device it selects
// (driver, pool, device) and the action.
type CordonChange struct {
	Rule   string `json:"rule"`
	Driver string `json:"driver"`
	Pool   string `json:"pool"`
	Device string `json:"device"`
	Action string `json:"action"`
}

// CordonRules returns the RBAC rules [Cordon] and [Uncordon] need: get and patch nodes
// (hami.io/device-cordon), list resourceslices (which DRA device a GPU is), and get, list,
// create, update and delete devicetaintrules.
func CordonRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "patch"}},
		{APIGroups: []string{resourcev1.GroupName}, Resources: []string{"resourceslices"}, Verbs: []string{"list"}},
		{APIGroups: []string{resourcev1.GroupName}, Resources: []string{"devicetaintrules"}, Verbs: []string{"get", "list", "create", "update", "delete"}},
	}
}

// CordonTaintKey is the key of the taint [Cordon] puts on a DRA device of driver:
// <driver>/cordoned, effect NoSchedule (kube-scheduler gives the device to no new claim;
// claims already allocated keep it).
func CordonTaintKey(driver string) string { return driver + "/" + dra.TaintCordoned }

// Cordon keeps new work off the GPUs of node, each given by UUID or index: it adds each
// UUID to the node's hami.io/device-cordon (HAMi master's extender and this SDK's place no new
// pod on it; entries already there, an operator's or the node agent's, are kept, and the node
// agent's register.Writer keeps an operator's in turn), and, for each GPU a DRA driver of
// opts.Drivers publishes in a ResourceSlice of the node, writes a DeviceTaintRule selecting
// that device (driver, pool, device) with the NoSchedule taint [CordonTaintKey], so that
// kube-scheduler allocates it to no new claim. Pods and claims that hold the GPU keep it.
//
// It is idempotent: a GPU already cordoned reports CordonUnchanged. Errors: ErrGPUNotFound
// (nothing written), ErrNodeNotFound, ErrForbidden naming the rule to add, ErrAPI,
// ErrInvalidOptions. On an error after some writes, the result says what was written.
func Cordon(ctx context.Context, client kubernetes.Interface, node string, gpus []string, opts CordonOptions) (*CordonResult, error) {
	return cordon(ctx, client, node, gpus, opts, true)
}

// Uncordon undoes [Cordon]: it removes each UUID from hami.io/device-cordon, except one the
// node agent put there itself (CordonKeptByAgent: a GPU the DRA world owns stays out of the
// extender's view), and deletes the GPU's DeviceTaintRules (found by their annotations
// [CordonNodeAnnotation] and [CordonGPUAnnotation], so also when the device left its slice).
// Same errors as Cordon.
func Uncordon(ctx context.Context, client kubernetes.Interface, node string, gpus []string, opts CordonOptions) (*CordonResult, error) {
	return cordon(ctx, client, node, gpus, opts, false)
}

// draDevice is a GPU as a DRA driver publishes it.
type draDevice struct {
	driver, pool, device, uuid string
	index                      int
}

func cordon(ctx context.Context, client kubernetes.Interface, node string, gpus []string, opts CordonOptions, on bool) (*CordonResult, error) {
	verb := "uncordon"
	if on {
		verb = "cordon"
	}
	if node == "" || len(gpus) == 0 {
		return nil, fmt.Errorf("%s: %w: give a node and at least one GPU (UUID or index)", verb, ErrInvalidOptions)
	}
	drivers := opts.Drivers
	if drivers == nil {
		drivers = []string{dra.SDKDriver, dra.HAMiDriver}
	}
	n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return nil, cordonAPIError(verb, "get", "nodes", "node "+node, err)
	}
	devs, err := listDRADevices(ctx, client, node, drivers)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", verb, err)
	}
	registered, _ := annotation.Decode(n.Annotations[annotation.KeyNVIDIARegister])
	res := &CordonResult{Node: node, DryRun: opts.DryRun}
	for _, arg := range gpus {
		g, err := resolveGPU(node, arg, registered, devs)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", verb, err)
		}
		res.GPUs = append(res.GPUs, g)
	}
	var dryRun []string
	if opts.DryRun {
		dryRun = []string{metav1.DryRunAll}
	}
	if err := patchCordon(ctx, client, n, res, on, dryRun); err != nil {
		return res, fmt.Errorf("%s: %w", verb, err)
	}
	logger := klog.FromContext(ctx)
	for i := range res.GPUs {
		g := &res.GPUs[i]
		var err error
		if on {
			err = cordonRules(ctx, client, node, g, devs, dryRun)
		} else {
			err = uncordonRules(ctx, client, node, g, dryRun)
		}
		if err != nil {
			return res, fmt.Errorf("%s: %w", verb, err)
		}
		logger.V(2).Info("GPU "+verb+"ed", "node", klog.KRef("", node), "gpuUUID", g.UUID, "annotation", g.Annotation, "rules", len(g.Rules), "dryRun", opts.DryRun)
	}
	return res, nil
}

// listDRADevices lists the GPUs the drivers publish in ResourceSlices of node.
func listDRADevices(ctx context.Context, client kubernetes.Interface, node string, drivers []string) ([]draDevice, error) {
	list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector(resourcev1.ResourceSliceSelectorNodeName, node).String()})
	if err != nil {
		return nil, cordonAPIError("", "list", "resourceslices", "the ResourceSlices of node "+node, err)
	}
	var out []draDevice
	for _, s := range list.Items {
		if s.Spec.NodeName == nil || *s.Spec.NodeName != node || !slices.Contains(drivers, s.Spec.Driver) {
			continue
		}
		p := profileOf(s.Spec.Driver)
		for _, d := range s.Spec.Devices {
			dd := draDevice{driver: s.Spec.Driver, pool: s.Spec.Pool.Name, device: d.Name, index: -1}
			if a := d.Attributes["uuid"]; a.StringValue != nil {
				dd.uuid = *a.StringValue
			}
			if i, ok := p.IndexOf(d.Name); ok && p.Driver != "" {
				dd.index = int(i)
			}
			out = append(out, dd)
		}
	}
	slices.SortFunc(out, func(a, b draDevice) int {
		return cmp.Or(cmp.Compare(a.driver, b.driver), cmp.Compare(a.pool, b.pool), cmp.Compare(a.device, b.device))
	})
	return out, nil
}

// profileOf is the profile of a driver this SDK knows, zero for another.
func profileOf(driver string) dra.Profile {
	for _, p := range []dra.Profile{dra.SDKProfile(), dra.HAMiProfile()} {
		if p.Driver == driver {
			return p
		}
	}
	return dra.Profile{}
}

// resolveGPU finds the GPU arg (UUID or decimal index) in the register annotation or the DRA
// devices.
func resolveGPU(node, arg string, registered []annotation.Device, devs []draDevice) (GPUCordon, error) {
	g := GPUCordon{GPU: arg, Index: -1}
	idx, err := strconv.Atoi(arg)
	isIndex := err == nil && idx >= 0
	for _, d := range registered {
		if d.ID == arg || (isIndex && int(d.Index) == idx) {
			g.UUID, g.Index = d.ID, int(d.Index)
			return g, nil
		}
	}
	for _, d := range devs {
		if d.uuid != "" && (d.uuid == arg || (isIndex && d.index == idx)) {
			g.UUID, g.Index = d.uuid, d.index
			return g, nil
		}
	}
	var known []string
	for _, d := range registered {
		known = append(known, fmt.Sprintf("%d=%s", d.Index, d.ID))
	}
	for _, d := range devs {
		if d.uuid != "" && !slices.ContainsFunc(registered, func(r annotation.Device) bool { return r.ID == d.uuid }) {
			known = append(known, fmt.Sprintf("%d=%s", d.index, d.uuid))
		}
	}
	return g, fmt.Errorf("GPU %q on node %s: %w (the node has %s; give a UUID or an index)", arg, node, ErrGPUNotFound, orNone(strings.Join(known, ", ")))
}

func orNone(s string) string {
	if s == "" {
		return "none in its register annotation or ResourceSlices"
	}
	return s
}

// patchCordon adds (on) or removes the UUIDs of res.GPUs in hami.io/device-cordon, with the
// node's resourceVersion as precondition, again on a conflict.
func patchCordon(ctx context.Context, client kubernetes.Interface, n *corev1.Node, res *CordonResult, on bool, dryRun []string) error {
	first := true
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if !first {
			var err error
			if n, err = client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{}); err != nil {
				return cordonAPIError("", "get", "nodes", "node "+n.Name, err)
			}
		}
		first = false
		before := n.Annotations[allocation.KeyDeviceCordon]
		list := splitList(before)
		agent := splitList(n.Annotations[allocation.KeyAgentDeviceCordon])
		for i := range res.GPUs {
			g := &res.GPUs[i]
			has := slices.Contains(list, g.UUID)
			switch {
			case on && has, !on && !has:
				g.Annotation = CordonUnchanged
			case on:
				list, g.Annotation = append(list, g.UUID), CordonAdded
			case slices.Contains(agent, g.UUID):
				g.Annotation = CordonKeptByAgent
			default:
				list, g.Annotation = slices.DeleteFunc(list, func(u string) bool { return u == g.UUID }), CordonRemoved
			}
		}
		after := strings.Join(list, ",")
		res.Before, res.After = before, after
		if slices.Equal(splitList(before), list) {
			res.After = before
			return nil
		}
		var value any = after
		if after == "" {
			value = nil
		}
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
			"resourceVersion": n.ResourceVersion,
			"annotations":     map[string]any{allocation.KeyDeviceCordon: value},
		}})
		if err != nil {
			return fmt.Errorf("encode the patch of node %s: %w", n.Name, err)
		}
		_, err = client.CoreV1().Nodes().Patch(ctx, n.Name, types.MergePatchType, patch, metav1.PatchOptions{DryRun: dryRun})
		if apierrors.IsConflict(err) {
			return err
		}
		if err != nil {
			return cordonAPIError("", "patch", "nodes", "node "+n.Name+" ("+allocation.KeyDeviceCordon+")", err)
		}
		return nil
	})
}

// splitList parses a comma list as HAMi does: entries trimmed, empty ones dropped.
func splitList(v string) []string {
	var out []string
	for e := range strings.SplitSeq(v, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// CordonRuleName is the name of the DeviceTaintRule [Cordon] writes for a device:
// "hamireg-cordon-<pool>-<device>-<hash>", the hash (8 hex digits) of driver, pool and device
// telling drivers apart; "hamireg-cordon-<hash>" (32 hex digits) when the first form is not a
// DNS subdomain.
func CordonRuleName(driver, pool, device string) string {
	sum := sha256.Sum256([]byte(driver + "\x00" + pool + "\x00" + device))
	name := "hamireg-cordon-" + pool + "-" + device + "-" + hex.EncodeToString(sum[:4])
	if len(validation.IsDNS1123Subdomain(name)) > 0 {
		name = "hamireg-cordon-" + hex.EncodeToString(sum[:16])
	}
	return name
}

// cordonRule is the DeviceTaintRule of one device.
func cordonRule(node, uuid string, d draDevice) *resourcev1.DeviceTaintRule {
	return &resourcev1.DeviceTaintRule{
		ObjectMeta: metav1.ObjectMeta{
			Name:        CordonRuleName(d.driver, d.pool, d.device),
			Labels:      map[string]string{labelManagedBy: CordonManagedBy},
			Annotations: map[string]string{CordonNodeAnnotation: node, CordonGPUAnnotation: uuid},
		},
		Spec: resourcev1.DeviceTaintRuleSpec{
			DeviceSelector: &resourcev1.DeviceTaintSelector{Driver: &d.driver, Pool: &d.pool, Device: &d.device},
			Taint:          resourcev1.DeviceTaint{Key: CordonTaintKey(d.driver), Effect: resourcev1.DeviceTaintEffectNoSchedule},
		},
	}
}

// cordonRules writes the rules of g's DRA devices.
func cordonRules(ctx context.Context, client kubernetes.Interface, node string, g *GPUCordon, devs []draDevice, dryRun []string) error {
	rules := client.ResourceV1().DeviceTaintRules()
	for _, d := range devs {
		if d.uuid != g.UUID {
			continue
		}
		want := cordonRule(node, g.UUID, d)
		ch := CordonChange{Rule: want.Name, Driver: d.driver, Pool: d.pool, Device: d.device}
		cur, err := rules.Get(ctx, want.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			if _, err := rules.Create(ctx, want, metav1.CreateOptions{DryRun: dryRun}); err != nil && !apierrors.IsAlreadyExists(err) {
				return cordonAPIError("", "create", "devicetaintrules", "DeviceTaintRule "+want.Name, err)
			}
			ch.Action = CordonAdded
		case err != nil:
			return cordonAPIError("", "get", "devicetaintrules", "DeviceTaintRule "+want.Name, err)
		case sameRule(cur, want):
			ch.Action = CordonUnchanged
		default:
			cur.Spec = want.Spec
			cur.Labels, cur.Annotations = mergeMap(cur.Labels, want.Labels), mergeMap(cur.Annotations, want.Annotations)
			if _, err := rules.Update(ctx, cur, metav1.UpdateOptions{DryRun: dryRun}); err != nil {
				return cordonAPIError("", "update", "devicetaintrules", "DeviceTaintRule "+want.Name, err)
			}
			ch.Action = CordonAdded
		}
		g.Rules = append(g.Rules, ch)
	}
	return nil
}

// sameRule reports whether cur already selects and taints as want does.
func sameRule(cur, want *resourcev1.DeviceTaintRule) bool {
	s, w := cur.Spec.DeviceSelector, want.Spec.DeviceSelector
	eq := func(a, b *string) bool { return a != nil && b != nil && *a == *b }
	return s != nil && eq(s.Driver, w.Driver) && eq(s.Pool, w.Pool) && eq(s.Device, w.Device) &&
		cur.Spec.Taint.Key == want.Spec.Taint.Key && cur.Spec.Taint.Effect == want.Spec.Taint.Effect &&
		cur.Annotations[CordonGPUAnnotation] == want.Annotations[CordonGPUAnnotation] &&
		cur.Annotations[CordonNodeAnnotation] == want.Annotations[CordonNodeAnnotation]
}

func mergeMap(a, b map[string]string) map[string]string {
	out := make(map[string]string, len(a)+len(b))
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}

// uncordonRules deletes the rules Cordon wrote for g on node.
func uncordonRules(ctx context.Context, client kubernetes.Interface, node string, g *GPUCordon, dryRun []string) error {
	rules := client.ResourceV1().DeviceTaintRules()
	list, err := rules.List(ctx, metav1.ListOptions{LabelSelector: labelManagedBy + "=" + CordonManagedBy})
	if err != nil {
		return cordonAPIError("", "list", "devicetaintrules", "the DeviceTaintRules of the doctor", err)
	}
	for _, r := range list.Items {
		if r.Labels[labelManagedBy] != CordonManagedBy || r.Annotations[CordonNodeAnnotation] != node || r.Annotations[CordonGPUAnnotation] != g.UUID {
			continue
		}
		ch := CordonChange{Rule: r.Name, Action: CordonRemoved}
		if s := r.Spec.DeviceSelector; s != nil {
			ch.Driver, ch.Pool, ch.Device = deref(s.Driver), deref(s.Pool), deref(s.Device)
		}
		err := rules.Delete(ctx, r.Name, metav1.DeleteOptions{DryRun: dryRun, Preconditions: &metav1.Preconditions{UID: &r.UID}})
		switch {
		case apierrors.IsNotFound(err):
			ch.Action = CordonUnchanged
		case err != nil:
			return cordonAPIError("", "delete", "devicetaintrules", "DeviceTaintRule "+r.Name, err)
		}
		g.Rules = append(g.Rules, ch)
	}
	return nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// cordonAPIError classifies an API error of the cordon: Forbidden names the rule to add,
// NotFound of the node is ErrNodeNotFound.
func cordonAPIError(verb, apiVerb, resource, what string, err error) error {
	prefix := ""
	if verb != "" {
		prefix = verb + ": "
	}
	group := ""
	if resource != "nodes" {
		group = resourcev1.GroupName
	}
	switch {
	case apierrors.IsForbidden(err):
		return fmt.Errorf("%s%s %s: %w: add the RBAC rule {apiGroups: [%q], resources: [%s], verbs: [%s]} to the identity's ClusterRole (diagnose.CordonRules lists them all): %w",
			prefix, apiVerb, what, ErrForbidden, group, resource, apiVerb, err)
	case resource == "nodes" && apiVerb == "get" && apierrors.IsNotFound(err):
		return fmt.Errorf("%s%s %s: %w", prefix, apiVerb, what, ErrNodeNotFound)
	}
	return fmt.Errorf("%s%s %s: %w: %w", prefix, apiVerb, what, ErrAPI, err)
}

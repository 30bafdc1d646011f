package extender

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/mig"
	"github.com/hamireg/hamireg/schedcache"
)

// ReasonNodeUnregistered is HAMi's reason for a candidate that is not in its device cache; the
// extender adds why.
const ReasonNodeUnregistered = allocation.ReasonNodeUnregistered

// Event reasons recorded on pods, HAMi's.
const (
	EventFilteringSucceed = "FilteringSucceed"
	EventFilteringFailed  = "FilteringFailed"
	EventBindingSucceed   = "BindingSucceed"
	EventBindingFailed    = "BindingFailed"
	// EventMIGReservationInvalid (the SDK's, Warning): the pod's hami.io/vgpu-mig-allocations
	// does not decode or does not match its devices.
	EventMIGReservationInvalid = "MIGReservationInvalid"
)

// decodeFilterArgs reads an ExtenderArgs and checks that it names a pod.
func decodeFilterArgs(body io.Reader) (*extenderv1.ExtenderArgs, error) {
	var args extenderv1.ExtenderArgs
	if err := decodeJSON(body, &args); err != nil {
		return nil, err
	}
	if args.Pod == nil {
		return nil, errors.New("no pod in the extender arguments")
	}
	return &args, nil
}

// decodeJSON decodes exactly one JSON value.
func decodeJSON(body io.Reader, v any) error {
	dec := json.NewDecoder(body)
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("decode request: %w", err)
	}
	if dec.More() {
		return errors.New("decode request: data after the JSON value")
	}
	return nil
}

// requestStatus is the HTTP status for a request that did not decode.
func requestStatus(err error) int {
	if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
		return http.StatusRequestEntityTooLarge
	}
	return http.StatusBadRequest
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(data)
}

func (e *Extender) serveFilter(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeJSON(w, http.StatusMethodNotAllowed, &extenderv1.ExtenderFilterResult{Error: "filter: method " + r.Method + " not allowed, use POST"})
		return
	}
	args, err := decodeFilterArgs(http.MaxBytesReader(w, r.Body, e.opts.MaxBodyBytes))
	if err != nil {
		err = &RequestError{Route: PathFilter, Err: err}
		klog.FromContext(r.Context()).V(2).Info("Refused a filter request", "err", err)
		writeJSON(w, requestStatus(err), &extenderv1.ExtenderFilterResult{Error: err.Error()})
		return
	}
	if err := e.waitReady(r.Context()); err != nil {
		writeJSON(w, http.StatusServiceUnavailable, &extenderv1.ExtenderFilterResult{Error: err.Error()})
		return
	}
	res := e.Filter(r.Context(), args)
	if res.Error != "" {
		klog.FromContext(r.Context()).Error(nil, "Filter failed", "pod", klog.KObj(args.Pod), "err", res.Error)
	}
	writeJSON(w, http.StatusOK, res)
}

// Filter answers kube-scheduler's filter call as HAMi does. A pod that asks for no GPU passes
// every candidate untouched (NodeNames and Nodes as they came).
//
// With ExtenderArgs.Nodes (whole Node objects: what the Cluster Autoscaler sends for a node it
// simulates, and kube-scheduler with nodeCacheCapable: false), the filter is a simulation, as
// in HAMi v2.10.0 and whatever NodeNames holds: each request Node is fitted from its own
// annotations (register annotation, hami.io/device-cordon, topology scores; no handshake),
// with nothing held on it (Options.SimulationLiveUsage counts the live pods on a request Node
// that is a registered live node) and the namespace's live quota. Nothing is written or
// assumed: no pod patch, no Event, no change to the usage, the quota state or the node cache,
// also for a pod that already holds a reservation. The answer is every request Node that fits
// (deep copies, best first by the node policy, ties by name; HAMi returns one of them) in
// Nodes, and the others in FailedNodes (never nil) with HAMi's reason: "node unregistered"
// for a Node without the register annotation or without devices, the fit reason words
// otherwise, each followed by why; a register annotation that does not decode is
// [ReasonRegisterUnparsable] and the error (HAMi: "node unregistered"). NodeNames is absent.
//
// Otherwise (NodeNames) every candidate is fitted (the registered ones from one
// snapshot of the node cache, with what pods hold of their GPUs), the node HAMi's policies
// choose is the only one answered, and the pod is patched with HAMi's filter annotations
// (spec §4.1) before the answer; its usage counts for the next filter at once. When no node
// fits, every candidate gets a reason that starts with HAMi's words ("node unregistered", the
// fit reason words) and says why: in FailedAndUnresolvableNodes when removing pods from the
// node cannot help (allocation.Unresolvable), else in FailedNodes (HAMi puts all of them in
// FailedNodes). A failed patch is the result's Error. Filter does not wait for readiness; the /filter route does.
//
// With Options.DeviceClasses, a candidate that serves the vendor's count resource through DRA
// (a DeviceClass maps it through spec.extendedResourceName and the node's allocatable of it
// is 0 or absent, dra.ServedThroughDRA: kube-scheduler's rule) is not fitted HAMi's way:
// kube-scheduler's DynamicResources plugin has already allocated the pod's claim there.
// The other candidates are fitted as above, and one that fits is answered as above. When none
// does, a pod whose GPU ask is whole GPUs (allocation.WholeGPUs: the count alone, or with
// cores or a memory percentage of 100) gets the DRA nodes in NodeNames, unpatched, beside the
// others' reasons; a pod that asks for a share gets every DRA node in
// FailedAndUnresolvableNodes with [ReasonDRANode] and the fix (a ResourceClaim with capacity
// requests): a claim written from extendedResourceName takes whole GPUs.
func (e *Extender) Filter(ctx context.Context, args *extenderv1.ExtenderArgs) (res *extenderv1.ExtenderFilterResult) {
	logger := klog.FromContext(ctx)
	pod := args.Pod
	defer func(start time.Time) { e.metrics.filtered(start, pod, e.opts.Config, res) }(e.opts.Clock.Now())
	if pod == nil {
		return &extenderv1.ExtenderFilterResult{Error: "filter: no pod in the extender arguments"}
	}
	e.stats.filters.Add(1)
	req := allocation.Requests(pod, e.opts.Config)
	if !req.Any() {
		logger.V(4).Info("Pod requests no HAMi resource, passing every node", "pod", klog.KObj(pod))
		if e.opts.EventRecorder != nil {
			e.opts.EventRecorder.Event(pod, corev1.EventTypeNormal, EventFilteringFailed, "does not request any resource")
		}
		return &extenderv1.ExtenderFilterResult{NodeNames: args.NodeNames, Nodes: args.Nodes}
	}
	if err := e.checkScoringWeights(pod, args.Nodes == nil); err != nil {
		logger.V(2).Info("Refused the pod's scoring weights", "pod", klog.KObj(pod), "err", err)
		return &extenderv1.ExtenderFilterResult{Error: err.Error()}
	}
	if args.Nodes != nil {
		return e.simulate(ctx, pod, req, args.Nodes)
	}
	m := e.mapping()
	names, draNodes := e.splitDRA(m, candidates(args))
	d := e.decide(pod, req, names)
	if d.node == "" && len(draNodes) > 0 {
		return e.toDRA(ctx, pod, m, d, draNodes)
	}
	if d.node == "" {
		logger.V(2).Info("No node fits the pod", "pod", klog.KObj(pod), "candidates", len(names))
		e.explainQuota(pod, req, d)
		e.recordFailure(pod, d.failed)
		return failedResult(d.failed)
	}
	if err := e.patchFilter(ctx, pod, d.node, allocation.EncodePodDevices(d.devices), mig.EncodeAllocations(allocation.MIGAllocations(d.devices))); err != nil {
		d.undo()
		return &extenderv1.ExtenderFilterResult{Error: err.Error()}
	}
	logger.V(3).Info("Pod placed", "pod", klog.KObj(pod), "node", d.node, "devices", allocation.EncodePodDevices(d.devices))
	if e.opts.EventRecorder != nil {
		e.opts.EventRecorder.Eventf(pod, corev1.EventTypeNormal, EventFilteringSucceed, "find fit node(%s), %d nodes not fit, %d nodes fit(%s)",
			d.node, d.notFit, len(d.scores), formatScores(d.scores))
	}
	return &extenderv1.ExtenderFilterResult{NodeNames: &[]string{d.node}}
}

// candidates are the names of the nodes kube-scheduler asks about (nodeCacheCapable: true);
// none when NodeNames is absent.
func candidates(args *extenderv1.ExtenderArgs) []string {
	if args.NodeNames == nil {
		return nil
	}
	return *args.NodeNames
}

// decision is a filter's outcome.
type decision struct {
	node    string
	devices allocation.PodDevices
	failed  map[string]string  // candidate → reason, when no node fits
	notFit  int                // candidates that do not fit
	scores  map[string]float64 // fitting nodes, only when Events are recorded
	undo    func()
	quota   *allocation.Quota // the namespace's quota, when it limits anything
}

// decide fits the pod on every candidate and, when one fits, records the chosen devices as the
// pod's usage. It is allocation.Schedule over the candidates (same fit, same node score, same
// choice and tie break), with each node's fit memoised while the node, its usage and the
// request are the same, so that a filter refits only the nodes that changed.
//
// A request an allocation.Probe models (one GPU container, no NUMA binding, no topology-aware
// policy) is only probed on each node: yes or no, and the node score kept per usage version;
// Fit then runs on the chosen node alone for its devices, or, when no node fits, on every
// probed node for its reason. Should Fit ever disagree with the probe, the decision is made
// again with Fit on every node (and counted in probeMismatches).
func (e *Extender) decide(pod *corev1.Pod, req allocation.PodRequest, names []string) decision {
	if probe, ok := allocation.NewProbe(req, pod.Annotations, e.opts.Config); ok {
		if d, ok := e.decideWith(pod, req, names, probe); ok {
			return d
		}
		e.probeMismatches.Add(1)
	}
	d, _ := e.decideWith(pod, req, names, nil)
	return d
}

// decideWith is decide, probing the nodes with probe unless it is nil; false when Fit
// disagreed with the probe.
func (e *Extender) decideWith(pod *corev1.Pod, req allocation.PodRequest, names []string, probe *allocation.Probe) (decision, bool) {
	cfg := e.opts.Config
	key := podKey(pod.Namespace, pod.Name)
	reqKey := requestKey(req, pod.Annotations)
	binpack := hasPolicy(cmp.Or(allocation.Policy(pod.Annotations[allocation.KeyNodeSchedulerPolicy]), cfg.NodeSchedulerPolicy), allocation.PolicyBinpack)
	withScores := e.opts.EventRecorder != nil
	snap := e.cache.Snapshot()

	waitStart := e.opts.Clock.Now()
	e.filterMu.Lock()
	defer e.filterMu.Unlock()
	e.metrics.filterLockWaited(waitStart)
	u := e.usage
	view := u.Lock()
	defer view.Unlock()
	self, _ := view.Pod(key) // what the pod itself holds: it does not count against itself
	d := decision{failed: map[string]string{}}
	var fo allocation.FitOptions
	if q := view.Quota(pod.Namespace, key); q.Limits.Any(cfg.Version) {
		fo.Quota, d.quota = &q, &q
		reqKey += quotaKey(q)
		probe = nil // the probe does not model quotas: Fit on every node
	}
	if withScores {
		d.scores = map[string]float64{}
	}
	best := 0.0
	var unexplained []string // probed nodes that do not fit, whose reason Fit gives only if needed
	chosenProbed := false
	for _, name := range names {
		info, ok := snap.Node(name)
		if !ok {
			d.failed[name] = ReasonNodeUnregistered + ": not known to the node cache (no Node object, or outside its informer)"
			continue
		}
		reg := registration(info, e.opts.Vendor.Name)
		if reg == nil || reg.State != schedcache.StateRegistered {
			d.failed[name] = unregistered(reg)
			continue
		}
		nu := u.nodeLocked(view, name)
		nodeAnnotations, cordon := nodeAnnotations(info)
		own := self != nil && self.Node == name
		var m fitMemo
		hit, probed := false, probe != nil && !own
		if probed {
			m, probed = nu.probed(probe, info, reg, reqKey, cordon)
		}
		if !probed {
			m, hit = nu.memo(info, reqKey, cordon)
		}
		if !probed && (own || !hit) {
			used, placements := nu.used, nu.mig
			if own {
				used, placements = minus(used, self.GPUs), minusMIG(placements, self.MIG)
			}
			devs := allocation.SetPairScores(allocation.SetMIGUsage(allocation.WithUsage(reg.Devices, used), placements), reg.PairScores)
			pd, reason, fits := allocation.FitWith(devs, req, pod.Annotations, nodeAnnotations, cfg, fo)
			m = fitMemo{valid: true, info: info, ver: nu.ver, reqKey: reqKey, cordon: cordon,
				devices: pd, reason: reason, ok: fits, score: allocation.NodeScore(devs)}
			if !own {
				nu.remember(m)
			}
		}
		if !m.ok {
			d.failed[name] = m.reason
			if probed {
				unexplained = append(unexplained, name)
			}
			continue
		}
		if withScores {
			d.scores[name] = m.score
		}
		better := m.score < best
		if binpack {
			better = m.score > best
		}
		if d.node == "" || better || (m.score == best && name < d.node) {
			d.node, d.devices, best = name, m.devices, m.score
			chosenProbed = probed
		}
	}
	if d.node == "" {
		return d, e.explainLocked(view, snap, pod, req, reqKey, unexplained, d.failed)
	}
	if chosenProbed {
		var ok bool
		if d.devices, ok = e.chosenLocked(view, snap, pod, req, reqKey, d.node, best); !ok {
			return decision{}, false
		}
	}
	d.notFit, d.failed = len(d.failed), nil // HAMi answers the chosen node only
	d.undo = view.Assume(pod, d.node, d.devices)
	return d, true
}

// registration is info's registration of the vendor, without copying it (the filter looks at
// every candidate).
func registration(info *schedcache.NodeInfo, vendor string) *schedcache.Registration {
	for i := range info.Registrations {
		if info.Registrations[i].Vendor == vendor {
			return &info.Registrations[i]
		}
	}
	return nil
}

// unregistered is the reason for a candidate the node cache knows but that is not registered.
func unregistered(reg *schedcache.Registration) string {
	if reg == nil {
		return ReasonNodeUnregistered + ": vendor not tracked by the node cache"
	}
	return fmt.Sprintf("%s: %s %s: %s", ReasonNodeUnregistered, reg.Vendor, reg.State, reg.Reason)
}

func minus(used, self map[string]allocation.Usage) map[string]allocation.Usage {
	out := maps.Clone(used)
	if out == nil {
		out = map[string]allocation.Usage{}
	}
	for gpu, u := range self {
		out[gpu] = out[gpu].Sub(u)
	}
	return out
}

// minusMIG is placements without one occurrence of each of self's, in new slices.
func minusMIG(placements, self map[string][]mig.Placement) map[string][]mig.Placement {
	if len(self) == 0 {
		return placements
	}
	out := maps.Clone(placements)
	for gpu, ps := range self {
		left := slices.Clone(out[gpu])
		for _, p := range ps {
			if i := slices.Index(left, p); i >= 0 {
				left = slices.Delete(left, i, i+1)
			}
		}
		out[gpu] = left
	}
	return out
}

func hasPolicy(p, want allocation.Policy) bool {
	return slices.Contains(strings.Split(string(p), ","), string(want))
}

// writtenKeys are the pod annotations the scheduler and the device plugin write; they do not
// steer the fit, so a re-filtered pod and its siblings share fits.
var writtenKeys = []string{allocation.KeyNode, allocation.KeyTime, allocation.KeyBindPhase, allocation.KeyBindTime,
	"hami.io/vgpu-devices-to-allocate", "hami.io/vgpu-devices-allocated", mig.KeyAllocations}

// requestKey identifies what a fit depends on besides the node: the request and the pod's
// annotations.
func requestKey(req allocation.PodRequest, annotations map[string]string) string {
	b := make([]byte, 0, 64+32*len(annotations))
	b = strconv.AppendInt(b, int64(req.Init), 10)
	for _, r := range req.Containers {
		b = fmt.Appendf(b, "|%d,%s,%d,%d,%d,%t", r.Count, r.Type, r.Memory, r.MemoryPercentage, r.Cores, r.Sidecar)
	}
	for _, k := range slices.Sorted(maps.Keys(annotations)) {
		if slices.Contains(writtenKeys, k) {
			continue
		}
		b = strconv.AppendQuote(append(b, '|'), k)
		b = strconv.AppendQuote(append(b, '='), annotations[k])
	}
	return string(b)
}

// patchFilter writes HAMi's filter annotations (spec §4.1) in one merge patch, with HAMi
// master's MIG reservation (mig.KeyAllocations) when the pod got MIG devices; a reservation
// left from an earlier placement is removed when it got none.
func (e *Extender) patchFilter(ctx context.Context, pod *corev1.Pod, node, devices, reservation string) error {
	annotations := map[string]any{
		allocation.KeyNode:          node,
		allocation.KeyTime:          strconv.FormatInt(e.opts.Clock.Now().Unix(), 10),
		e.opts.Vendor.ToAllocateKey: devices,
		e.opts.Vendor.AllocatedKey:  devices,
	}
	if reservation != "" {
		annotations[mig.KeyAllocations] = reservation
	} else if _, stale := pod.Annotations[mig.KeyAllocations]; stale {
		annotations[mig.KeyAllocations] = nil // null deletes it
	}
	patch := map[string]any{"metadata": map[string]any{
		"annotations": annotations,
		"labels":      map[string]string{allocation.KeyNode: node},
	}}
	return e.patchPod(ctx, pod.Namespace, pod.Name, patch)
}

func (e *Extender) patchPod(ctx context.Context, namespace, name string, patch any) error {
	data, err := json.Marshal(patch)
	if err != nil {
		return fmt.Errorf("patch pod %s/%s: %w", namespace, name, err)
	}
	if _, err := e.client.CoreV1().Pods(namespace).Patch(ctx, name, types.MergePatchType, data, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("patch pod %s/%s: %w", namespace, name, err)
	}
	return nil
}

// recordFailure records HAMi's FilteringFailed Events: one per reason word with the nodes it
// applies to, then the summary.
func (e *Extender) recordFailure(pod *corev1.Pod, failed map[string]string) {
	if e.opts.EventRecorder == nil {
		return
	}
	byWord := map[string][]string{}
	for node, reason := range failed {
		for _, w := range reasonWords(reason) {
			byWord[w] = append(byWord[w], node)
		}
	}
	for _, w := range slices.Sorted(maps.Keys(byWord)) {
		nodes := byWord[w]
		slices.Sort(nodes)
		e.opts.EventRecorder.Eventf(pod, corev1.EventTypeWarning, EventFilteringFailed, "%d nodes %s(%s)", len(nodes), w, strings.Join(nodes, ","))
	}
	e.opts.EventRecorder.Eventf(pod, corev1.EventTypeWarning, EventFilteringFailed, "no available node, %d nodes do not meet", len(failed))
}

// reasonWords are the words of a failure reason: "node unregistered", or the words of the
// "n/m Word" parts of a fit reason.
func reasonWords(reason string) []string {
	if strings.HasPrefix(reason, ReasonNodeUnregistered) {
		return []string{ReasonNodeUnregistered}
	}
	reason, _, _ = strings.Cut(reason, "; ") // what follows explains (a quota's usage)
	var words []string
	for part := range strings.SplitSeq(reason, ", ") {
		_, w, ok := strings.Cut(part, " ")
		if !ok {
			w = part
		}
		words = append(words, w)
	}
	return words
}

func formatScores(scores map[string]float64) string {
	parts := make([]string, 0, len(scores))
	for _, n := range slices.Sorted(maps.Keys(scores)) {
		parts = append(parts, fmt.Sprintf("%s:%.2f", n, scores[n]))
	}
	return strings.Join(parts, ",")
}

// checkScoringWeights returns HAMi v2.10.0's error for a pod whose
// allocation.KeyDeviceScoringWeights does not parse ("calcScore failed <parse error> for pod
// <name>"), before any node is scored, and records it as a Warning FilteringFailed Event when
// event is set (HAMi records none for a simulation request, whose ExtenderArgs carry Nodes).
// v2.9.0 ignores the annotation.
func (e *Extender) checkScoringWeights(pod *corev1.Pod, event bool) error {
	if _, err := allocation.PodScoringWeights(pod.Annotations, e.opts.Config.Version); err != nil {
		err = fmt.Errorf("calcScore failed %w for pod %s", err, pod.Name)
		if event && e.opts.EventRecorder != nil {
			e.opts.EventRecorder.Event(pod, corev1.EventTypeWarning, EventFilteringFailed, err.Error())
		}
		return err
	}
	return nil
}

package allocation

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/hamireg/hamireg/annotation"
)

// The reason words of a failed fit, as HAMi's scheduler writes them. A node's reason is
// "<count>/<devices> <Word>" parts joined by ", " (see [Fit]).
const (
	ReasonCardTypeMismatch                  = "CardTypeMismatch"
	ReasonCardUUIDMismatch                  = "CardUuidMismatch"
	ReasonCardTimeSlicingExhausted          = "CardTimeSlicingExhausted"
	ReasonCardComputeUnitsExhausted         = "CardComputeUnitsExhausted"
	ReasonCardInsufficientMemory            = "CardInsufficientMemory"
	ReasonCardInsufficientCore              = "CardInsufficientCore"
	ReasonCardNotHealth                     = "CardNotHealth"
	ReasonNumaNotFit                        = "NumaNotFit"
	ReasonExclusiveDeviceAllocateConflict   = "ExclusiveDeviceAllocateConflict"
	ReasonCardNotFoundCustomFilterRule      = "CardNotFoundCustomFilterRule"
	ReasonNodeInsufficientDevice            = "NodeInsufficientDevice"
	ReasonAllocatedCardsInsufficientRequest = "AllocatedCardsInsufficientRequest"
	ReasonCardCordoned                      = "CardCordoned"
	// ReasonNodeUnfitPod is what HAMi v2.9.0's extender reports for every registered node
	// that does not fit, whatever the reason.
	ReasonNodeUnfitPod = "NodeUnfitPod"
	// ReasonNodeUnregistered is what HAMi's extender reports for a candidate node it has no
	// devices of.
	ReasonNodeUnregistered = "node unregistered"
)

// Node is a candidate node for [Schedule]: its GPUs, in the order of its register annotation,
// with what pods already hold of them, and its annotations (HAMi master reads
// [KeyDeviceCordon] from them).
type Node struct {
	Name        string
	Devices     []DeviceUsage
	Annotations map[string]string
}

// Decision is the outcome of [Schedule].
type Decision struct {
	// Node is the chosen node, "" when none fits; Devices are the pod's devices there, one
	// entry per container.
	Node    string
	Devices PodDevices
	// Scores holds the score of every node that fits (HAMi's node score, before the pod).
	Scores map[string]float64
	// Failed holds the fit reason of every node that does not fit.
	Failed map[string]string
}

// Schedule fits the pod on every node and chooses one as HAMi's scheduler does: the node
// policy (the pod's [KeyNodeSchedulerPolicy] annotation, else c.NodeSchedulerPolicy) takes
// the node with the highest score for binpack, the lowest for anything else, where a node's
// score is 10 × (slots used / slots + cores used / cores + memory used / memory) over its GPUs
// before this pod. Equal scores go to the node whose name sorts first (HAMi's winner is
// arbitrary). podAnnotations are the pod's annotations.
func Schedule(nodes []Node, req PodRequest, podAnnotations map[string]string, c Config) Decision {
	return schedule(nodes, req, podAnnotations, c, nil)
}

// schedule is [Schedule] with the quota hook of [ScheduleWith].
func schedule(nodes []Node, req PodRequest, podAnnotations map[string]string, c Config, q *quotaCheck) Decision {
	c = c.orDefaults()
	d := Decision{Scores: map[string]float64{}, Failed: map[string]string{}}
	binpack := hasPolicy(cmp.Or(Policy(podAnnotations[KeyNodeSchedulerPolicy]), c.NodeSchedulerPolicy), PolicyBinpack)
	best := 0.0
	for _, n := range nodes {
		pd, reason, ok := fitPod(n.Devices, req, podAnnotations, n.Annotations, c, q)
		if !ok {
			d.Failed[n.Name] = reason
			continue
		}
		score := NodeScore(n.Devices)
		d.Scores[n.Name] = score
		better := score < best
		if binpack {
			better = score > best
		}
		if d.Node == "" || better || (score == best && n.Name < d.Node) {
			d.Node, d.Devices, best = n.Name, pd, score
		}
	}
	return d
}

// NodeScore is HAMi's node score: 10 × (Σ used slots / Σ slots + Σ used cores / Σ cores +
// Σ used memory / Σ memory) over devices. A total of 0 contributes 0.
func NodeScore(devices []DeviceUsage) float64 {
	var used, slots, cores, totalCores, mem, totalMem int64
	for _, d := range devices {
		used += d.Used
		slots += int64(d.Count)
		cores += d.Usedcores
		totalCores += int64(d.Devcore)
		mem += d.Usedmem
		totalMem += int64(d.Devmem)
	}
	return 10 * (ratio(used, slots) + ratio(cores, totalCores) + ratio(mem, totalMem))
}

func ratio(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// Fit places one pod's containers on one node's GPUs as HAMi's NVIDIA Fit does and returns the
// pod's devices there, one entry per container (empty for a container that asks for none), or
// the reason it does not fit: "NodeInsufficientDevice" when a container asks for more GPUs
// than the node has, else "<count>/<devices> <Word>" parts for each reason word, sorted and
// joined by ", " (HAMi joins them in random map order).
//
// Per container, the GPUs are ordered by the device policy (the pod's [KeyGPUSchedulerPolicy],
// else c.GPUSchedulerPolicy): binpack puts NUMA nodes in descending order and the busiest GPUs
// last, anything else NUMA nodes ascending and the idlest GPUs last, ties in the current order
// (HAMi master orders by usage first and by NUMA node among equals; v2.9.0 takes a policy
// only as a whole value, master as a comma list such as "binpack,topology-aware");
// then the walk goes from the last GPU to the first and takes the first that pass every check
// (health, cordon, type and mode, NUMA binding, UUID lists, free slot, memory, cores, exclusive
// use). With the topology-aware policy (v2.9.0: exactly "topology-aware"; master: a member of
// a comma list) every GPU that passes is collected and the GPUs are chosen by their pair scores
// ([DeviceUsage.PairScores], see [SetPairScores]): the worst connected one for a single GPU,
// the first best combination in walk order for more; fewer candidates than asked fail with
// AllocatedCardsInsufficientRequest. A GPU's usage score is [ScoringWeights.DeviceScore] with
// the pod's [KeyDeviceScoringWeights] ([PodScoringWeights]: HAMi v2.10.0; the default weights
// for v2.9.0 and for a value that does not parse). Beyond HAMi, weights never make a pod
// unfit where it fits without them: a container that does not fit in the weighted order is
// tried in the default order, and a pod that still does not fit is fitted again whole in the
// default order; when both fail, the reason is the weighted fit's.
//
// What a container takes counts for the next one, except for
// init containers, which run one at a time before the others and end ([Config.Accounting]):
// with [AccountingKubernetes] a regular init container is placed against what other pods hold
// plus the native sidecars declared before it, and sidecars add up like regular containers;
// with [AccountingHAMi] and [VersionMaster] every init container, sidecars included, is placed
// against what other pods hold only (HAMi v2.10.0); with [AccountingHAMi] and [VersionV290]
// they all add up like regular containers.
//
// devices is not modified. node holds the node's annotations.
func Fit(devices []DeviceUsage, req PodRequest, pod, node map[string]string, c Config) (PodDevices, string, bool) {
	return fit(devices, req, pod, node, c.orDefaults())
}

// fit is [Fit] with c already completed, for [Schedule] to call once per node.
func fit(devices []DeviceUsage, req PodRequest, pod, node map[string]string, c Config) (PodDevices, string, bool) {
	return fitPod(devices, req, pod, node, c, nil)
}

// fitPod is fitWith with the pod's weights fallback: when the pod's [KeyDeviceScoringWeights]
// are not the default and the greedy fit in their order fails, the whole pod is fitted again
// in the default order, so that weights never make a pod unschedulable on a node where it
// fits without them; when that fails too, the weighted fit's reason stands.
func fitPod(devices []DeviceUsage, req PodRequest, pod, node map[string]string, c Config, q *quotaCheck) (PodDevices, string, bool) {
	pd, reason, ok := fitWith(devices, req, pod, node, c, q)
	if ok {
		return pd, reason, ok
	}
	if w, err := PodScoringWeights(pod, c.Version); err != nil || w == DefaultScoringWeights {
		return pd, reason, ok
	}
	unweighted := maps.Clone(pod)
	delete(unweighted, KeyDeviceScoringWeights)
	if pd, _, ok := fitWith(devices, req, unweighted, node, c, q); ok {
		return pd, "", true
	}
	return nil, reason, false
}

// fitWith is fit with the quota hook of [FitWith] (nil: none).
func fitWith(devices []DeviceUsage, req PodRequest, pod, node map[string]string, c Config, q *quotaCheck) (PodDevices, string, bool) {
	policy := cmp.Or(Policy(pod[KeyGPUSchedulerPolicy]), c.GPUSchedulerPolicy)
	nvidia := c.Vendor == annotation.VendorNVIDIA
	f := fitter{pod: pod, c: c, binpack: devicePolicyHas(policy, PolicyBinpack, c.Version), nvidia: nvidia,
		topology: nvidia && devicePolicyHas(policy, PolicyTopologyAware, c.Version), masterSort: c.Version == VersionMaster}
	if q != nil {
		qc := *q
		f.quota = &qc
	}
	if c.Version == VersionMaster {
		f.mutex = devicePolicyHas(policy, "mutex", c.Version)
		f.cordoned = cordoned(node[KeyDeviceCordon])
	}
	cur := slices.Clone(devices)
	out := make(PodDevices, len(req.Containers))
	mode := c.EffectiveAccounting()
	for i, r := range req.Containers {
		out[i] = ContainerDevices{}
		if r.Count <= 0 {
			continue
		}
		// Where the container is placed: on what other pods hold and what the pod's
		// containers running beside it took (cur, and it takes its share there), or, for a
		// container that runs before the others and ends, on a copy it leaves behind.
		on, byItself := cur, false
		switch kind := req.Kind(i); {
		case kind == KindApp:
		case mode == AccountingKubernetes && kind == KindInit:
			on, byItself = slices.Clone(cur), true // beside the sidecars declared before it
		case mode == AccountingHAMi && c.Version == VersionMaster:
			on, byItself = slices.Clone(devices), true // HAMi v2.10.0: every init container alone
		}
		if f.quota != nil {
			f.quota.placed = out[:i]
		}
		picked, reason, ok := f.container(on, r)
		if !ok {
			return nil, reason, false
		}
		out[i] = picked
		if !byItself {
			take(cur, picked)
		}
	}
	return out, "", true
}

// take adds what a container was given to the devices it was given on.
func take(devices []DeviceUsage, picked ContainerDevices) {
	for _, p := range picked {
		for i := range devices {
			if devices[i].ID == p.UUID {
				devices[i].Usage = devices[i].Add(Usage{Used: 1, Usedmem: int64(p.Usedmem), Usedcores: int64(p.Usedcores)})
				if !p.MIG.IsZero() {
					// devices is a shallow copy of the caller's: never append in place.
					devices[i].MIG = append(slices.Clip(devices[i].MIG), p.MIG.Placement)
				}
			}
		}
	}
}

type fitter struct {
	pod            map[string]string
	c              Config
	binpack, mutex bool
	// nvidia applies NVIDIA's specifics (selectors, modes, NUMA binding, topology, MIG); other
	// vendors get the generic fit (see ConfigFor).
	nvidia   bool
	cordoned map[string]bool
	// topology collects every GPU that passes and lets topologyPick choose (topology.go).
	topology bool
	// masterSort orders by usage first and NUMA node second (HAMi master), not NUMA first.
	masterSort bool
	quota      *quotaCheck // nil: no quota
	// weights are the pod's scoring weights once read (nil: not yet, see scoringWeights).
	weights *ScoringWeights
}

// container places one container's request on devices, which it sorts in place, in the order
// of the pod's scoring weights; when that order fails and the weights are not the default,
// it tries the default order before it gives up (the weights fallback rule, see [Fit]), and
// gives the weighted order's reason when both fail.
func (f *fitter) container(devices []DeviceUsage, r Request) (ContainerDevices, string, bool) {
	w := f.scoringWeights()
	picked, reason, ok := f.containerOrdered(devices, r, w)
	if ok || w == DefaultScoringWeights {
		return picked, reason, ok
	}
	if picked, _, ok := f.containerOrdered(devices, r, DefaultScoringWeights); ok {
		return picked, "", true
	}
	return nil, reason, false
}

// containerOrdered is the walk of [fitter.container] over devices sorted by weights w.
func (f *fitter) containerOrdered(devices []DeviceUsage, r Request, w ScoringWeights) (ContainerDevices, string, bool) {
	if int(r.Count) > len(devices) && !f.isMIGRequest(devices, r) {
		return nil, ReasonNodeInsufficientDevice, false
	}
	f.sort(devices, r, w)
	numaBind, _ := strconv.ParseBool(f.pod[KeyNUMABind])
	numaBind = numaBind && f.nvidia
	reasons := map[string]int{}
	cores := min(r.Cores, 100)
	need, prevNuma := r.Count, -1
	var picked ContainerDevices
	for i := len(devices) - 1; i >= 0; i-- {
		d := &devices[i]
		if !d.Health {
			reasons[ReasonCardNotHealth]++
			continue
		}
		if f.cordoned[d.ID] {
			reasons[ReasonCardCordoned]++
			continue
		}
		if !f.typeFits(d, r) {
			reasons[ReasonCardTypeMismatch]++
			continue
		}
		if numaBind && d.Numa != prevNuma {
			if need != r.Count {
				reasons[ReasonNumaNotFit] += f.collected(picked)
			}
			need, prevNuma, picked = r.Count, d.Numa, nil
		}
		if !f.uuidFits(d.ID) {
			reasons[ReasonCardUUIDMismatch]++
			continue
		}
		if int64(d.Count) <= d.Used {
			reasons[ReasonCardTimeSlicingExhausted]++
			continue
		}
		if f.mutex && d.Used > 0 {
			reasons[ReasonExclusiveDeviceAllocateConflict]++
			continue
		}
		mem := r.Memory
		if r.MemoryPercentage != PercentageUnset && r.Memory == 0 {
			mem = d.Devmem * r.MemoryPercentage / 100 // int32 arithmetic, as HAMi
		}
		if f.quota != nil && !f.quota.fits(picked, ContainerDevice{UUID: d.ID, Type: r.Type, Usedmem: mem, Usedcores: cores}) {
			reasons[ReasonResourceQuotaNotFit]++
			continue
		}
		if d.Mode == ModeMIG && f.c.Version == VersionMaster {
			dev, reason, ok := f.migDevice(d, r, picked, mem, cores)
			if !ok {
				reasons[reason]++
				continue
			}
			picked = append(picked, dev)
			if f.topology {
				continue
			}
			if need--; need == 0 {
				return picked, "", true
			}
			i++ // the same GPU again for the next device, as HAMi master (PR #2724)
			continue
		}
		switch {
		case int64(d.Devmem)-d.Usedmem < int64(mem):
			reasons[ReasonCardInsufficientMemory]++
			continue
		case int64(d.Devcore)-d.Usedcores < int64(cores):
			reasons[ReasonCardInsufficientCore]++
			continue
		case d.Devcore == 100 && cores == 100 && d.Used > 0:
			reasons[ReasonExclusiveDeviceAllocateConflict]++
			continue
		case d.Devcore != 0 && d.Usedcores == int64(d.Devcore) && cores == 0:
			reasons[ReasonCardComputeUnitsExhausted]++
			continue
		case d.Mode == ModeMIG:
			reasons[ReasonCardNotFoundCustomFilterRule]++ // v2.9.0's MIG geometries are not placed here
			continue
		}
		if f.topology {
			picked = append(picked, ContainerDevice{UUID: d.ID, Type: r.Type, Usedmem: mem, Usedcores: cores})
			continue
		}
		if need > 0 {
			need--
			picked = append(picked, ContainerDevice{UUID: d.ID, Type: r.Type, Usedmem: mem, Usedcores: cores})
		}
		if need == 0 {
			return picked, "", true
		}
	}
	if f.topology && len(picked) >= int(r.Count) {
		return topologyPick(devices, picked, int(r.Count)), "", true
	}
	if n := f.collected(picked); n > 0 {
		reasons[ReasonAllocatedCardsInsufficientRequest] = n
	}
	return nil, formatReasons(reasons, len(devices)), false
}

// collected is how HAMi counts the devices collected so far in a reason: v2.9.0 counts the
// vendors of its map (1 when any), master the devices.
func (f *fitter) collected(picked ContainerDevices) int {
	if f.c.Version == VersionV290 {
		return min(len(picked), 1)
	}
	return len(picked)
}

// sort orders devices for the walk by the device score of HAMi's DeviceListsScore.ComputeScore
// with weights w ([ScoringWeights.DeviceScore], float32 as HAMi), stably (HAMi's sort is not
// stable beyond 12 devices).
func (f *fitter) sort(devices []DeviceUsage, r Request, w ScoringWeights) {
	type scored struct {
		d     DeviceUsage
		score float32
	}
	s := make([]scored, len(devices))
	for i, d := range devices {
		u := d
		if r.Type == d.Type { // HAMi adds the request only when the types match: never for a model name
			u.Usage = d.Add(Usage{Used: int64(r.Count), Usedmem: int64(r.Memory), Usedcores: int64(r.Cores)})
		}
		s[i] = scored{d, w.DeviceScore(u)}
	}
	slices.SortStableFunc(s, func(a, b scored) int {
		switch {
		case f.masterSort && f.binpack:
			return cmp.Or(cmp.Compare(a.score, b.score), cmp.Compare(b.d.Numa, a.d.Numa))
		case f.masterSort:
			return cmp.Or(cmp.Compare(b.score, a.score), cmp.Compare(a.d.Numa, b.d.Numa))
		}
		if f.binpack {
			return cmp.Or(cmp.Compare(b.d.Numa, a.d.Numa), cmp.Compare(a.score, b.score))
		}
		return cmp.Or(cmp.Compare(a.d.Numa, b.d.Numa), cmp.Compare(b.score, a.score))
	})
	for i := range s {
		devices[i] = s[i].d
	}
}

// scoringWeights are the pod's [KeyDeviceScoringWeights] under the fitter's version, read
// once; an invalid value counts as the default (callers that schedule reject it first, see
// [PodScoringWeights]).
func (f *fitter) scoringWeights() ScoringWeights {
	if f.weights == nil {
		w, err := PodScoringWeights(f.pod, f.c.Version)
		if err != nil {
			w = DefaultScoringWeights
		}
		f.weights = &w
	}
	return *f.weights
}

// typeFits checks, for NVIDIA, the pod's model lists (a GPU type must contain a listed model, ignoring
// case, and none of the excluded ones) and mode list.
func (f *fitter) typeFits(d *DeviceUsage, r Request) bool {
	if !f.nvidia {
		return r.Type == f.c.Vendor // the generic fit: the vendor's devices, no selectors
	}
	model := strings.ToUpper(d.Type)
	matches := func(list string) bool {
		return slices.ContainsFunc(strings.Split(list, ","), func(m string) bool { return strings.Contains(model, strings.ToUpper(m)) })
	}
	if use, ok := f.pod[KeyUseGPUType]; ok && !matches(use) {
		return false
	}
	if noUse, ok := f.pod[KeyNoUseGPUType]; ok && matches(noUse) {
		return false
	}
	if mode, ok := f.pod[KeyVGPUMode]; ok && !strings.Contains(mode, d.Mode) {
		return false
	}
	return r.Type == annotation.VendorNVIDIA
}

// uuidFits checks the pod's UUID lists: v2.9.0 applies the use list alone when there is one
// (an empty one matches nothing); master applies both and ignores an empty list.
func (f *fitter) uuidFits(id string) bool {
	if !f.nvidia {
		return true
	}
	use, hasUse := f.pod[KeyUseGPUUUID]
	noUse, hasNoUse := f.pod[KeyNoUseGPUUUID]
	listed := func(list string) bool { return slices.Contains(strings.Split(list, ","), id) }
	if f.c.Version == VersionV290 {
		if hasUse {
			return listed(use)
		}
		return !hasNoUse || !listed(noUse)
	}
	if hasUse && use != "" && !listed(use) {
		return false
	}
	return !hasNoUse || noUse == "" || !listed(noUse)
}

func cordoned(value string) map[string]bool {
	out := map[string]bool{}
	for id := range strings.SplitSeq(value, ",") {
		if id = strings.TrimSpace(id); id != "" {
			out[id] = true
		}
	}
	return out
}

// hasPolicy reports whether p, a policy or (HAMi master) a comma-separated combination,
// includes want.
func hasPolicy(p Policy, want Policy) bool {
	return slices.Contains(strings.Split(string(p), ","), string(want))
}

// formatReasons writes reason counts as "n/total Word" parts, sorted, joined by ", ".
func formatReasons(reasons map[string]int, total int) string {
	parts := make([]string, 0, len(reasons))
	for word, n := range reasons {
		parts = append(parts, fmt.Sprintf("%d/%d %s", n, total, word))
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}

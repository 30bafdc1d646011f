package allocation

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// ReasonResourceQuotaNotFit is HAMi's reason word for a GPU that would take the pod's
// namespace over its ResourceQuota on GPU memory or cores. It is counted per GPU, like the
// other words ("2/2 ResourceQuotaNotFit"), although the cause is namespace-wide.
const ReasonResourceQuotaNotFit = "ResourceQuotaNotFit"

// QuotaPrefix is the prefix of the ResourceQuota keys HAMi enforces: "limits." followed by the
// memory or core resource name ([QuotaKeys]).
const QuotaPrefix = "limits."

// Sentinel errors of the quota reader: every [QuotaError] unwraps to one of them.
var (
	// ErrQuotaKeyIgnored means a ResourceQuota key names a GPU resource in a form HAMi's quota
	// ignores: requests.nvidia.com/gpumem, a bare nvidia.com/gpumem, limits.nvidia.com/gpu,
	// the memory percentage. The key limits nothing on GPU memory or cores.
	ErrQuotaKeyIgnored = errors.New("quota key ignored by HAMi's GPU quota")
	// ErrQuotaValueFractional means a limit is not a whole number. HAMi ignores such a limit;
	// this package compares it exactly, as Kubernetes compares quota, which for whole MiB and
	// core percents is its integer part: 1500.5 limits to 1500.
	ErrQuotaValueFractional = errors.New("quota limit not a whole number")
	// ErrQuotaValueSuffix means a memory limit carries a binary suffix (Ki, Mi, Gi, …). HAMi
	// and this package apply it to the number and read the result as MiB: 10Gi is
	// 10737418240 MiB, no limit in practice.
	ErrQuotaValueSuffix = errors.New("quota limit has a unit suffix, read as MiB")
	// ErrQuotaValueNegative means a limit below 0 (the API server refuses them); it is
	// ignored.
	ErrQuotaValueNegative = errors.New("quota limit negative")
)

// QuotaError is something about a ResourceQuota object a user should know: a key HAMi
// ignores, or a value read differently from what it says. It unwraps to one of the ErrQuota
// sentinels.
type QuotaError struct {
	// Quota is the ResourceQuota object's name, Key the spec.hard key, Value its value.
	Quota, Key, Value string
	// Err is the class (an ErrQuota sentinel), Hint says what would work.
	Err  error
	Hint string
}

// Error implements error.
func (w *QuotaError) Error() string {
	return fmt.Sprintf("resource quota %s: %s: %s: %v: %s", w.Quota, w.Key, w.Value, w.Err, w.Hint)
}

// Unwrap returns the class.
func (w *QuotaError) Unwrap() error { return w.Err }

// QuotaAmount is GPU memory and cores held or asked against a quota: Memory in MiB as the
// device lists hold it (after [Config.MemoryFactor]), Cores in core percent.
type QuotaAmount struct {
	Memory, Cores int64
}

// Add returns a plus b.
func (a QuotaAmount) Add(b QuotaAmount) QuotaAmount {
	return QuotaAmount{Memory: a.Memory + b.Memory, Cores: a.Cores + b.Cores}
}

// Sub returns a minus b.
func (a QuotaAmount) Sub(b QuotaAmount) QuotaAmount {
	return QuotaAmount{Memory: a.Memory - b.Memory, Cores: a.Cores - b.Cores}
}

// QuotaLimit is one limit of a namespace.
type QuotaLimit struct {
	// Value is the limit as written: memory in the request's unit (MiB divided by
	// MemoryFactor), cores in core percent.
	Value int64
	// Set is true when a ResourceQuota of the namespace has the key (HAMi master's
	// LimitSet). With [VersionV290] a Value of 0 limits nothing all the same (HAMi issue
	// #2312); with [VersionMaster] it blocks every request.
	Set bool
	// Quota is the name of the ResourceQuota object the limit comes from: with several, the
	// tightest.
	Quota string
}

// Applies reports whether the limit restricts anything under version v.
func (l QuotaLimit) Applies(v Version) bool {
	return l.Set && (v != VersionV290 || l.Value != 0)
}

// QuotaLimits are a namespace's limits on GPU memory and cores.
type QuotaLimits struct {
	Memory, Cores QuotaLimit
}

// Any reports whether one of the limits restricts anything under version v.
func (l QuotaLimits) Any(v Version) bool { return l.Memory.Applies(v) || l.Cores.Applies(v) }

// Quota is what a pod's GPUs are checked against: its namespace's limits and what the
// namespace's other pods hold (Used, not counting the pod itself).
type Quota struct {
	Limits QuotaLimits
	Used   QuotaAmount
}

// Exceeded returns the quota keys that used plus ask goes over under c, memory first;
// none when it fits. The boundary fits: used + ask equal to the limit is allowed. The memory
// limit counts × c.MemoryFactor (the limit is in request units, usage in MiB).
func (q Quota) Exceeded(ask QuotaAmount, c Config) []string {
	c = c.orDefaults()
	mem, cores := QuotaKeys(c)
	var out []string
	if q.Limits.Memory.Applies(c.Version) && q.Used.Memory+ask.Memory > q.MemoryLimit(c) {
		out = append(out, mem)
	}
	if q.Limits.Cores.Applies(c.Version) && q.Used.Cores+ask.Cores > q.Limits.Cores.Value {
		out = append(out, cores)
	}
	return out
}

// MemoryLimit is the memory limit in MiB: Limits.Memory.Value × MemoryFactor (when above 1),
// saturating.
func (q Quota) MemoryLimit(c Config) int64 {
	v := q.Limits.Memory.Value
	if f := int64(c.MemoryFactor); f > 1 {
		if v > math.MaxInt64/f {
			return math.MaxInt64
		}
		v *= f
	}
	return v
}

// QuotaKeys returns the ResourceQuota keys HAMi enforces for c's resource names:
// "limits.nvidia.com/gpumem" and "limits.nvidia.com/gpucores" with the chart's.
func QuotaKeys(c Config) (memory, cores string) {
	c = c.orDefaults()
	return QuotaPrefix + c.ResourceMemory, QuotaPrefix + c.ResourceCores
}

// QuotaLimitsFrom reads a namespace's ResourceQuota objects (spec.hard) as HAMi's quota
// manager does, with two fixes: only the keys of [QuotaKeys] count, each value as a whole
// number (suffixes applied: "4k" is 4000); but where HAMi keeps one limit per key, the one
// delivered last (so that deleting either of two objects removes the limit), the limits of
// several objects combine as the tightest, and a fractional value limits to its integer part
// instead of nothing ([ErrQuotaValueFractional]). With [VersionV290] a 0 limits nothing and
// does not take part in the tightest. Objects that are nil or belong to no namespace are
// skipped; the order of quotas does not matter (equal limits go to the name that sorts
// first).
//
// The warnings list the keys that name GPU resources in a form HAMi ignores and the values
// read differently from how they look ([QuotaError]), sorted by object and key.
func QuotaLimitsFrom(quotas []*corev1.ResourceQuota, c Config) (QuotaLimits, []*QuotaError) {
	c = c.orDefaults()
	memKey, coresKey := QuotaKeys(c)
	var out QuotaLimits
	var warnings []*QuotaError
	for _, rq := range quotas {
		if rq == nil {
			continue
		}
		for _, key := range slices.Sorted(maps.Keys(rq.Spec.Hard)) {
			q := rq.Spec.Hard[key]
			var l *QuotaLimit
			switch string(key) {
			case memKey:
				l = &out.Memory
			case coresKey:
				l = &out.Cores
			default:
				if w := ignoredKey(string(key), c); w != nil {
					w.Quota, w.Value = rq.Name, q.String()
					warnings = append(warnings, w)
				}
				continue
			}
			v, w := quotaValue(q, string(key) == memKey)
			if w != nil {
				w.Quota, w.Key, w.Value = rq.Name, string(key), q.String()
				warnings = append(warnings, w)
				if errors.Is(w.Err, ErrQuotaValueNegative) {
					continue
				}
			}
			next := QuotaLimit{Value: v, Set: true, Quota: rq.Name}
			if tighter(next, *l, c.Version) {
				*l = next
			}
		}
	}
	slices.SortStableFunc(warnings, func(a, b *QuotaError) int {
		return cmp.Or(cmp.Compare(a.Quota, b.Quota), cmp.Compare(a.Key, b.Key))
	})
	return out, warnings
}

// tighter reports whether next replaces cur as the namespace's limit.
func tighter(next, cur QuotaLimit, v Version) bool {
	switch {
	case !cur.Set:
		return true
	case v == VersionV290 && next.Value == 0: // no limit
		return false
	case v == VersionV290 && cur.Value == 0:
		return true
	}
	return next.Value < cur.Value || (next.Value == cur.Value && next.Quota < cur.Quota)
}

// quotaValue is a limit as a whole number: exact when it is one, its integer part when it is
// fractional, saturated beyond int64.
func quotaValue(q resource.Quantity, memory bool) (int64, *QuotaError) {
	if q.Sign() < 0 {
		return 0, &QuotaError{Err: ErrQuotaValueNegative, Hint: "ignored; a quota limit is at least 0"}
	}
	var w *QuotaError
	if s := q.String(); memory && strings.TrimRight(s, "0123456789.") != "" && !strings.HasSuffix(s, "k") {
		w = &QuotaError{Err: ErrQuotaValueSuffix, Hint: "the suffix multiplies the number, which is then read as MiB; write the MiB as a plain number"}
	}
	if q.CmpInt64(math.MaxInt64) >= 0 {
		return math.MaxInt64, w
	}
	if v, ok := q.AsInt64(); ok {
		return v, w
	}
	v := q.Value() // rounded up: the number is fractional, so its integer part is one less
	if resource.NewQuantity(v, q.Format).Cmp(q) != 0 {
		v--
		w = &QuotaError{Err: ErrQuotaValueFractional, Hint: fmt.Sprintf("limits to %d (HAMi ignores a fractional limit)", v)}
	}
	return v, w
}

// ignoredKey classifies a spec.hard key that names one of c's GPU resources in a form HAMi's
// quota does not read; nil for keys about other resources.
func ignoredKey(key string, c Config) *QuotaError {
	memKey, coresKey := QuotaKeys(c)
	name, prefix := key, ""
	for _, p := range []string{QuotaPrefix, "requests."} {
		if rest, ok := strings.CutPrefix(key, p); ok {
			name, prefix = rest, p
		}
	}
	w := &QuotaError{Key: key, Err: ErrQuotaKeyIgnored}
	switch {
	case name == c.ResourceMemory || name == c.ResourceCores:
		want := memKey
		if name == c.ResourceCores {
			want = coresKey
		}
		w.Hint = "HAMi limits GPU " + map[bool]string{true: "memory", false: "cores"}[name == c.ResourceMemory] + " only with " + want
		if prefix == "requests." {
			w.Hint += "; Kubernetes counts this key against the containers' requests only, without the memory factor or percentage requests"
		}
	case name == c.ResourceCount && prefix == "requests.":
		return nil // Kubernetes' own quota enforces requests of an extended resource
	case name == c.ResourceCount:
		w.Hint = "nobody enforces it (Kubernetes' quota counts extended resources as requests." + c.ResourceCount + ")"
	case name == c.ResourceMemoryPercentage:
		w.Hint = "HAMi has no quota on the memory percentage; a percentage request counts as its MiB on each GPU against " + memKey
	default:
		return nil
	}
	return w
}

// QuotaUsage is what pd holds against its namespace's quota, as HAMi counts a pod's devices:
// every device entry's memory and cores. init is how many of pd's entries are init
// containers. With [VersionV290] everything adds up; with [VersionMaster] (which runs init
// containers one at a time before the others) each GPU counts the larger of the largest init
// container's share and the regular containers' sum.
func QuotaUsage(pd PodDevices, init int, v Version) QuotaAmount {
	var out QuotaAmount
	if v == VersionV290 || init <= 0 {
		for _, c := range pd {
			for _, d := range c {
				out = out.Add(QuotaAmount{Memory: int64(d.Usedmem), Cores: int64(d.Usedcores)})
			}
		}
		return out
	}
	type peak struct{ init, app QuotaAmount }
	per := map[string]*peak{}
	var order []string
	for i, c := range pd {
		sums := map[string]QuotaAmount{}
		for _, d := range c {
			sums[d.GPU()] = sums[d.GPU()].Add(QuotaAmount{Memory: int64(d.Usedmem), Cores: int64(d.Usedcores)})
		}
		for gpu, s := range sums {
			p := per[gpu]
			if p == nil {
				p = &peak{}
				per[gpu] = p
				order = append(order, gpu)
			}
			if i < init {
				p.init = QuotaAmount{Memory: max(p.init.Memory, s.Memory), Cores: max(p.init.Cores, s.Cores)}
			} else {
				p.app = p.app.Add(s)
			}
		}
	}
	for _, gpu := range order {
		p := per[gpu]
		out = out.Add(QuotaAmount{Memory: max(p.init.Memory, p.app.Memory), Cores: max(p.init.Cores, p.app.Cores)})
	}
	return out
}

// AdmissionQuotaAsk is what HAMi's admission webhook counts of pod against its namespace's
// quota, pod as mutated (counts and cores defaults filled in). With [AccountingKubernetes]
// ([Config.EffectiveAccounting]) every container's memory and cores × its count ([Requests])
// aggregate by the Kubernetes rule: max(Σ apps + Σ sidecars, max over init containers of
// InitUse) (see [AccountingKubernetes]). With [AccountingHAMi], HAMi's: [VersionV290]: the regular
// containers whose count is exactly 1, with their raw memory (limits, else requests)
// × MemoryFactor and raw cores. [VersionMaster]: every container's memory and cores × its
// count ([Requests]), the init containers as the largest of them against the regular
// containers' sum. A memory percentage counts 0 in both: the webhook does not know the GPU.
func AdmissionQuotaAsk(pod *corev1.Pod, c Config) QuotaAmount {
	c = c.orDefaults()
	if pod == nil {
		return QuotaAmount{}
	}
	if c.EffectiveAccounting() == AccountingKubernetes {
		return admissionAsk(Requests(pod, c))
	}
	if c.Version == VersionV290 {
		var out QuotaAmount
		for i := range pod.Spec.Containers {
			ctr := &pod.Spec.Containers[i]
			if q, ok := quantity(ctr, c.ResourceCount); !ok || q.Value() != 1 {
				continue
			}
			if q, ok := quantity(ctr, c.ResourceMemory); ok {
				mem := q.Value()
				if c.MemoryFactor > 1 {
					mem *= int64(c.MemoryFactor)
				}
				out.Memory += mem
			}
			if q, ok := quantity(ctr, c.ResourceCores); ok {
				out.Cores += q.Value()
			}
		}
		return out
	}
	req := Requests(pod, c)
	var app, init QuotaAmount
	for i, r := range req.Containers {
		a := QuotaAmount{Memory: int64(r.Memory) * int64(r.Count), Cores: int64(r.Cores) * int64(r.Count)}
		if i < req.Init {
			init = QuotaAmount{Memory: max(init.Memory, a.Memory), Cores: max(init.Cores, a.Cores)}
			continue
		}
		app = app.Add(a)
	}
	return QuotaAmount{Memory: max(app.Memory, init.Memory), Cores: max(app.Cores, init.Cores)}
}

// FitOptions are the optional inputs of [FitWith] and [ScheduleWith]. The zero value is
// [Fit] and [Schedule].
type FitOptions struct {
	// Quota, when set, checks each candidate GPU against the pod's namespace quota as HAMi's
	// fitQuota does: after the health, cordon, type, NUMA, UUID, slot and exclusive checks and
	// before the GPU's own memory and cores, the pod's memory and cores if it took this GPU
	// (this GPU, the GPUs already taken for the container, and the earlier containers of the
	// pod, counted by [EffectiveUsage] under the Config's accounting) plus Quota.Used must
	// stay within the limits; a GPU that
	// does not counts as [ReasonResourceQuotaNotFit]. A memory percentage is resolved on each
	// GPU first. Nil, or limits that restrict nothing, means no check.
	Quota *Quota
}

// FitWith is [Fit] with the options of o.
func FitWith(devices []DeviceUsage, req PodRequest, pod, node map[string]string, c Config, o FitOptions) (PodDevices, string, bool) {
	c = c.orDefaults()
	return fitPod(devices, req, pod, node, c, o.quotaCheck(req, c))
}

// ScheduleWith is [Schedule] with the options of o.
func ScheduleWith(nodes []Node, req PodRequest, podAnnotations map[string]string, c Config, o FitOptions) Decision {
	c = c.orDefaults()
	return schedule(nodes, req, podAnnotations, c, o.quotaCheck(req, c))
}

func (o FitOptions) quotaCheck(req PodRequest, c Config) *quotaCheck {
	if o.Quota == nil || !o.Quota.Limits.Any(c.Version) {
		return nil
	}
	return &quotaCheck{q: *o.Quota, c: c, kinds: req.Kinds()}
}

// quotaCheck is the fit's quota hook: the fit sets placed to the pod's containers placed so
// far before each container.
type quotaCheck struct {
	q      Quota
	c      Config
	kinds  []ContainerKind
	placed PodDevices
}

// fits reports whether the pod, having placed q.placed and picked the devices of the current
// container, may also take d.
func (q *quotaCheck) fits(picked ContainerDevices, d ContainerDevice) bool {
	pd := make(PodDevices, len(q.placed), len(q.placed)+1)
	copy(pd, q.placed)
	cur := make(ContainerDevices, len(picked), len(picked)+1)
	copy(cur, picked)
	pd = append(pd, append(cur, d))
	return len(q.q.Exceeded(UsageQuota(EffectiveUsage(pd, q.kinds, false, q.c)), q.c)) == 0
}

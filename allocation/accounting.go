package allocation

import (
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
)

// Accounting selects how a pod's init containers and native sidecars (init containers with
// restartPolicy Always) count on a GPU: in the fit, in the usage the scheduler stores, against
// the namespace's ResourceQuota and at admission. The zero value is the Kubernetes rule with
// [VersionMaster] and HAMi v2.9.0's plain sum with [VersionV290] (see [Config.EffectiveAccounting]).
type Accounting string

// The accounting modes.
const (
	// AccountingKubernetes is the rule kube-scheduler and ResourceQuota apply to a pod's
	// requests (KEP-753; k8s.io/component-helpers/resource AggregateContainerRequests),
	// applied to each GPU (by UUID) and to each of its quantities (slots, memory, cores)
	// apart: the pod holds max(Σ apps + Σ sidecars, max over init containers i of InitUse(i)),
	// where InitUse(i) is a regular init container's own share plus the sidecars declared
	// before it, and for a sidecar the sidecars up to and including it. A sidecar's slots add
	// like an app container's. The fit places a regular init container against what other
	// pods hold plus the sidecars declared before it, sidecars and app containers
	// cumulatively. Once every regular (non-sidecar) init container has terminated with exit
	// code 0 (pod.status.initContainerStatuses, by name), the pod holds Σ apps + Σ sidecars.
	AccountingKubernetes Accounting = "kubernetes"
	// AccountingHAMi is exactly HAMi's accounting of [Config.Version], which looks at no
	// restartPolicy: a sidecar is an init container. [VersionV290]: every container is fitted
	// cumulatively and the pod holds the sum of its entries. [VersionMaster] (HAMi v2.10.0):
	// each init container is fitted alone against what other pods hold, app containers
	// cumulatively; the pod holds, per GPU, memory and cores max(largest init entry, sum of
	// the app entries) and slots max(1 if any init entry, number of app entries); the
	// admission webhook counts max(Σ apps, largest init container); once the pod is updated
	// with every initContainerStatuses entry Terminated with exit code 0 it holds its app
	// entries only, for good (a sidecar's share is dropped). Pick it for a cluster where
	// HAMi's own scheduler and this SDK share GPUs, so that both count a pod alike.
	AccountingHAMi Accounting = "hami"
)

// EffectiveAccounting is c's accounting mode with the zero value resolved:
// [AccountingKubernetes] for [VersionMaster], [AccountingHAMi] for [VersionV290] (HAMi v2.9.0
// sums every container, which never under-counts a sidecar).
func (c Config) EffectiveAccounting() Accounting {
	if c.Accounting != "" {
		return c.Accounting
	}
	if c.Version == VersionV290 {
		return AccountingHAMi
	}
	return AccountingKubernetes
}

// validAccounting checks c.Accounting.
func (c Config) validAccounting() error {
	switch c.Accounting {
	case "", AccountingKubernetes, AccountingHAMi:
		return nil
	}
	return fmt.Errorf("allocation config: unknown accounting %q, want %q or %q (empty: %q with HAMi master, %q with v2.9.0): %w",
		c.Accounting, AccountingKubernetes, AccountingHAMi, AccountingKubernetes, AccountingHAMi, ErrInvalidConfig)
}

// ContainerKind is how a container of a pod runs, for accounting.
type ContainerKind uint8

// The container kinds.
const (
	// KindApp is a container of spec.containers.
	KindApp ContainerKind = iota
	// KindInit is a regular init container: it runs to completion before the next one starts.
	KindInit
	// KindSidecar is a native sidecar: an init container with restartPolicy Always, which
	// starts in order and keeps running beside the app containers.
	KindSidecar
)

// String returns "app", "init" or "sidecar" ("unknown" for another value).
func (k ContainerKind) String() string {
	switch k {
	case KindApp:
		return "app"
	case KindInit:
		return "init"
	case KindSidecar:
		return "sidecar"
	}
	return "unknown"
}

// Kind returns the kind of container i of r (init containers first).
func (r PodRequest) Kind(i int) ContainerKind {
	switch {
	case i >= r.Init:
		return KindApp
	case i < len(r.Containers) && r.Containers[i].Sidecar:
		return KindSidecar
	}
	return KindInit
}

// Kinds returns the kind of every container of r, in order.
func (r PodRequest) Kinds() []ContainerKind {
	out := make([]ContainerKind, len(r.Containers))
	for i := range out {
		out[i] = r.Kind(i)
	}
	return out
}

// Kinds returns the kind of every container of pod, init containers first: the order of its
// pod device entries (entry i is initContainers[i], or containers[i-len(initContainers)]).
func Kinds(pod *corev1.Pod) []ContainerKind {
	if pod == nil {
		return nil
	}
	out := make([]ContainerKind, 0, len(pod.Spec.InitContainers)+len(pod.Spec.Containers))
	for i := range pod.Spec.InitContainers {
		k := KindInit
		if isSidecar(&pod.Spec.InitContainers[i]) {
			k = KindSidecar
		}
		out = append(out, k)
	}
	for range pod.Spec.Containers {
		out = append(out, KindApp)
	}
	return out
}

func isSidecar(c *corev1.Container) bool {
	return c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
}

// InitDone reports whether pod's init phase is over under c's accounting, so that it holds
// its steady-state share ([EffectiveUsage] with initDone): with [AccountingKubernetes], every
// regular init container has a status Terminated with exit code 0 (sidecars do not count;
// a pod without regular init containers has nothing to shrink); with [AccountingHAMi] and
// [VersionMaster], the pod has init containers and every initContainerStatuses entry (there is
// at least one) is Terminated with exit code 0, sidecars included (HAMi v2.10.0);
// [VersionV290] never shrinks.
func InitDone(pod *corev1.Pod, c Config) bool {
	if pod == nil || len(pod.Spec.InitContainers) == 0 {
		return false
	}
	succeeded := func(s *corev1.ContainerStatus) bool {
		return s.State.Terminated != nil && s.State.Terminated.ExitCode == 0
	}
	switch {
	case c.EffectiveAccounting() == AccountingKubernetes:
		regular := 0
		for i := range pod.Spec.InitContainers {
			ctr := &pod.Spec.InitContainers[i]
			if isSidecar(ctr) {
				continue
			}
			regular++
			ok := false
			for j := range pod.Status.InitContainerStatuses {
				if s := &pod.Status.InitContainerStatuses[j]; s.Name == ctr.Name {
					ok = succeeded(s)
					break
				}
			}
			if !ok {
				return false
			}
		}
		return regular > 0
	case c.Version == VersionV290:
		return false
	}
	if len(pod.Status.InitContainerStatuses) == 0 {
		return false
	}
	for i := range pod.Status.InitContainerStatuses {
		if !succeeded(&pod.Status.InitContainerStatuses[i]) {
			return false
		}
	}
	return true
}

// EffectiveUsage returns what a pod with devices pd holds of each physical GPU
// ([ContainerDevice.GPU]) under c's accounting ([Config.EffectiveAccounting]): kinds are its
// containers' kinds in the order of pd's entries ([Kinds], [PodRequest.Kinds]; an entry
// without a kind is an app container's), initDone whether its init phase is over
// ([InitDone]). GPUs it holds nothing of are absent.
//
// With [AccountingKubernetes] each quantity (slots, memory, cores) of each GPU is
// max(Σ apps + Σ sidecars, max over init containers of InitUse), as
// k8s.io/component-helpers/resource.AggregateContainerRequests computes a pod's requests, and
// Σ apps + Σ sidecars once initDone. With [AccountingHAMi] it is HAMi's count of c.Version:
// the plain sum of the entries ([PodDevices.Usage]) with [VersionV290]; HAMi v2.10.0's
// collapse with [VersionMaster] (memory and cores max(largest init entry, Σ app entries), slots
// max(1 if any init entry, number of app entries)), the app entries only once initDone.
//
// Without sidecars and before initDone, both modes give HAMi v2.10.0's collapse, except that
// the Kubernetes rule counts an init container's entries on one GPU together.
func EffectiveUsage(pd PodDevices, kinds []ContainerKind, initDone bool, c Config) map[string]Usage {
	kind := func(i int) ContainerKind {
		if i < len(kinds) {
			return kinds[i]
		}
		return KindApp
	}
	switch {
	case !slices.ContainsFunc(kinds, func(k ContainerKind) bool { return k != KindApp }):
		return pd.Usage() // app containers only: every rule is the sum
	case c.EffectiveAccounting() == AccountingKubernetes:
		return kubernetesUsage(pd, kind, initDone)
	case c.Version == VersionV290:
		return pd.Usage()
	}
	return hamiCollapse(pd, kind, initDone)
}

// PodUsage is [EffectiveUsage] for pod's devices pd: its [Kinds] and [InitDone].
func PodUsage(pd PodDevices, pod *corev1.Pod, c Config) map[string]Usage {
	return EffectiveUsage(pd, Kinds(pod), InitDone(pod, c), c)
}

// UsageQuota is what per-GPU usage counts against a namespace's quota: its memory and cores,
// summed over the GPUs.
func UsageQuota(used map[string]Usage) QuotaAmount {
	var out QuotaAmount
	for _, u := range used {
		out = out.Add(QuotaAmount{Memory: u.Usedmem, Cores: u.Usedcores})
	}
	return out
}

func maxUsage(a, b Usage) Usage {
	return Usage{Used: max(a.Used, b.Used), Usedmem: max(a.Usedmem, b.Usedmem), Usedcores: max(a.Usedcores, b.Usedcores)}
}

func entryUsage(d ContainerDevice) Usage {
	return Usage{Used: 1, Usedmem: int64(d.Usedmem), Usedcores: int64(d.Usedcores)}
}

// kubernetesUsage is the KEP-753 rule per GPU and quantity.
func kubernetesUsage(pd PodDevices, kind func(int) ContainerKind, initDone bool) map[string]Usage {
	type state struct{ sidecars, peak, apps Usage }
	per := map[string]*state{}
	get := func(gpu string) *state {
		s := per[gpu]
		if s == nil {
			s = &state{}
			per[gpu] = s
		}
		return s
	}
	for i, c := range pd {
		own := map[string]Usage{}
		for _, d := range c {
			own[d.GPU()] = own[d.GPU()].Add(entryUsage(d))
		}
		for gpu, u := range own {
			s := get(gpu)
			switch kind(i) {
			case KindSidecar:
				s.sidecars = s.sidecars.Add(u)
				s.peak = maxUsage(s.peak, s.sidecars)
			case KindInit:
				if !initDone {
					s.peak = maxUsage(s.peak, s.sidecars.Add(u))
				}
			default:
				s.apps = s.apps.Add(u)
			}
		}
	}
	out := make(map[string]Usage, len(per))
	for gpu, s := range per {
		if u := maxUsage(s.peak, s.sidecars.Add(s.apps)); u.Used > 0 { // none: held by done init containers only
			out[gpu] = u
		}
	}
	return out
}

// hamiCollapse is HAMi v2.10.0's CollapseInitContainerUsage, and its app-only usage once the
// init containers are done.
func hamiCollapse(pd PodDevices, kind func(int) ContainerKind, initDone bool) map[string]Usage {
	type state struct {
		init, apps Usage
		anyInit    bool
	}
	per := map[string]*state{}
	for i, c := range pd {
		isInit := kind(i) != KindApp
		if isInit && initDone {
			continue
		}
		for _, d := range c {
			s := per[d.GPU()]
			if s == nil {
				s = &state{}
				per[d.GPU()] = s
			}
			if isInit {
				s.init, s.anyInit = maxUsage(s.init, entryUsage(d)), true
			} else {
				s.apps = s.apps.Add(entryUsage(d))
			}
		}
	}
	out := make(map[string]Usage, len(per))
	for gpu, s := range per {
		out[gpu] = maxUsage(s.init, s.apps)
	}
	return out
}

// admissionAsk aggregates what req's containers ask (memory and cores × count; a percentage
// counts 0) by the Kubernetes rule.
func admissionAsk(req PodRequest) QuotaAmount {
	var apps, sidecars, peak QuotaAmount
	maxAmount := func(a, b QuotaAmount) QuotaAmount {
		return QuotaAmount{Memory: max(a.Memory, b.Memory), Cores: max(a.Cores, b.Cores)}
	}
	for i, r := range req.Containers {
		a := QuotaAmount{Memory: int64(r.Memory) * int64(r.Count), Cores: int64(r.Cores) * int64(r.Count)}
		switch req.Kind(i) {
		case KindSidecar:
			sidecars = sidecars.Add(a)
			peak = maxAmount(peak, sidecars)
		case KindInit:
			peak = maxAmount(peak, sidecars.Add(a))
		default:
			apps = apps.Add(a)
		}
	}
	return maxAmount(peak, sidecars.Add(apps))
}

// AskQuota is what req asks at least against its namespace's quota under c's accounting,
// before it is placed: every container's memory and cores × its count (a memory percentage
// counts 0: it depends on the GPU), aggregated as [EffectiveUsage] aggregates what the pod
// will hold: by the Kubernetes rule, HAMi v2.10.0's max(Σ apps, largest init container), or
// HAMi v2.9.0's sum.
func AskQuota(req PodRequest, c Config) QuotaAmount {
	switch {
	case c.EffectiveAccounting() == AccountingKubernetes:
		return admissionAsk(req)
	case c.Version == VersionV290:
		var out QuotaAmount
		for _, r := range req.Containers {
			out = out.Add(QuotaAmount{Memory: int64(r.Memory) * int64(r.Count), Cores: int64(r.Cores) * int64(r.Count)})
		}
		return out
	}
	var app, init QuotaAmount
	for i, r := range req.Containers {
		a := QuotaAmount{Memory: int64(r.Memory) * int64(r.Count), Cores: int64(r.Cores) * int64(r.Count)}
		if req.Kind(i) != KindApp {
			init = QuotaAmount{Memory: max(init.Memory, a.Memory), Cores: max(init.Cores, a.Cores)}
			continue
		}
		app = app.Add(a)
	}
	return QuotaAmount{Memory: max(app.Memory, init.Memory), Cores: max(app.Cores, init.Cores)}
}

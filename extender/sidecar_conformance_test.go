package extender

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"testing/synctest"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	resourcehelper "k8s.io/component-helpers/resource"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/internal/vectors"
)

// sidecarVector is a sidecar-accounting.json vector: quota.json's shape, with the generator's
// evaluation of the upstream Kubernetes rule (not HAMi output).
type sidecarVector struct {
	quotaVector
	K8sEffectiveLimits         map[string]int64            `json:"k8s_effective_limits"`
	K8sEffectiveLimitsExisting map[string]map[string]int64 `json:"k8s_effective_limits_existing"`
}

// TestConformanceSidecar replays sidecar-accounting.json (native sidecars and init containers)
// through the real informers, Filter and Admit (the harness of TestConformanceQuota) in each
// accounting mode:
//
//   - allocation.AccountingHAMi must answer exactly as HAMi of the folder's version: the fit,
//     the patches, the quota before and after, the webhook.
//   - allocation.AccountingKubernetes must answer by the Kubernetes rule, computed here from
//     the input: each pod's effective limits from k8s.io/component-helpers/resource (checked
//     against the vector's k8s_effective_limits and k8s_effective_limits_existing), an existing
//     pod whose regular init containers all exited 0 counting its apps and sidecars only; the
//     pod fits its node's GPU (every vector has one per node) iff the GPU's slots, memory and
//     cores and the namespace's quota hold what is used plus its effective limits.
//   - The zero value is the Kubernetes rule with HAMi master, HAMi's plain sum with v2.9.0.
func TestConformanceSidecar(t *testing.T) {
	t.Parallel()
	for _, folder := range vectors.Folders(t) {
		var f struct {
			Vectors []sidecarVector `json:"vectors"`
		}
		if !folder.Read(t, "sidecar-accounting.json", &f) {
			continue
		}
		version := vectors.Pick(folder, allocation.VersionMaster, allocation.VersionV290)
		t.Logf("checked %d vectors from %s", len(f.Vectors), folder.Dir)
		for _, v := range f.Vectors {
			for _, mode := range []allocation.Accounting{"", allocation.AccountingHAMi, allocation.AccountingKubernetes} {
				t.Run(fmt.Sprintf("%s/%s/accounting=%s", folder.Name(), v.Name, mode), func(t *testing.T) {
					t.Parallel()
					cfg := v.Input.Config.config(version)
					cfg.Accounting = mode
					got := runQuotaVector(t, v.quotaVector, cfg, true)
					if cfg.EffectiveAccounting() == allocation.AccountingHAMi {
						checkQuotaVector(t, v.quotaVector, cfg, got)
						return
					}
					checkKubernetesRule(t, v, cfg, got)
				})
			}
		}
	}
}

// upstreamLimits is what Kubernetes charges pod (k8s.io/component-helpers/resource with the
// containers' limits as requests: extended resources have requests = limits), per resource.
func upstreamLimits(pod *corev1.Pod) map[string]int64 {
	p := pod.DeepCopy()
	for _, list := range [][]corev1.Container{p.Spec.InitContainers, p.Spec.Containers} {
		for i := range list {
			list[i].Resources.Requests = list[i].Resources.Limits
		}
	}
	out := map[string]int64{}
	for name, q := range resourcehelper.AggregateContainerRequests(p, resourcehelper.PodResourcesOptions{}) {
		out[string(name)] = q.Value()
	}
	return out
}

// steadyLimits is what a pod whose regular init containers are done holds by the rule: its
// app containers and sidecars.
func steadyLimits(pod *corev1.Pod) map[string]int64 {
	out := map[string]int64{}
	add := func(c *corev1.Container) {
		for name, q := range c.Resources.Limits {
			out[string(name)] += q.Value()
		}
	}
	for i := range pod.Spec.InitContainers {
		if c := &pod.Spec.InitContainers[i]; c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			add(c)
		}
	}
	for i := range pod.Spec.Containers {
		add(&pod.Spec.Containers[i])
	}
	return out
}

// initDone is the rule's shrink gate, from the pod's statuses: every regular init container
// terminated with exit code 0.
func initDone(pod *corev1.Pod) bool {
	regular := 0
	for _, c := range pod.Spec.InitContainers {
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			continue
		}
		regular++
		i := slices.IndexFunc(pod.Status.InitContainerStatuses, func(s corev1.ContainerStatus) bool { return s.Name == c.Name })
		if i < 0 || pod.Status.InitContainerStatuses[i].State.Terminated == nil || pod.Status.InitContainerStatuses[i].State.Terminated.ExitCode != 0 {
			return false
		}
	}
	return regular > 0
}

func checkKubernetesRule(t *testing.T, v sidecarVector, cfg allocation.Config, got quotaRun) {
	t.Helper()
	const gpu, mem, cores = allocation.DefaultResourceCount, allocation.DefaultResourceMemory, allocation.DefaultResourceCores
	in := v.Input
	pod := in.Pod.pod(t)
	ask := upstreamLimits(pod)
	for res, want := range v.K8sEffectiveLimits {
		if ask[res] != want {
			t.Fatalf("component-helpers charges %s %d for the pod, the generator %d", res, ask[res], want)
		}
	}
	// The existing pods, after the steps, as the rule counts them.
	existing := map[string]*corev1.Pod{}
	for _, p := range in.ExistingPods {
		existing[p.Name] = p.pod(t)
	}
	for _, s := range in.Steps {
		switch s.Op {
		case "add_pod", "update_pod":
			existing[s.Pod.Name] = s.Pod.pod(t)
		case "delete_pod":
			delete(existing, s.Pod.Name)
		}
	}
	var usedSlots, usedMem, usedCores, quotaMem int64
	ns := cmpOr(in.Pod.Namespace, "default")
	for _, p := range existing {
		if _, placed := allocation.PodNode(p); !placed {
			continue
		}
		want := upstreamLimits(p)
		if w, ok := v.K8sEffectiveLimitsExisting[p.Namespace+"/"+p.Name]; ok && (w[gpu] != want[gpu] || w[mem] != want[mem]) {
			t.Fatalf("component-helpers charges %v for %s, the generator %v", want, p.Name, w)
		}
		if initDone(p) {
			want = steadyLimits(p)
		}
		usedSlots, usedMem, usedCores = usedSlots+want[gpu], usedMem+want[mem], usedCores+want[cores]
		if p.Namespace == ns {
			quotaMem += want[mem]
		}
	}
	limit := int64(-1)
	for _, q := range in.Quotas {
		if l, ok := q.Hard["limits."+mem]; ok && cmpOr(q.Namespace, "default") == ns {
			q := resource.MustParse(l)
			limit = q.Value()
		}
	}
	if got.Before[ns][mem].Used != quotaMem {
		t.Errorf("quota before the filter: %d MiB used, the rule %d", got.Before[ns][mem].Used, quotaMem)
	}
	quotaFits := limit < 0 || quotaMem+ask[mem] <= limit
	wantWebhook := webhookResult{Allowed: quotaFits}
	if !quotaFits {
		wantWebhook = webhookResult{Code: 403, Message: "exceeding resource quota"}
	}
	if got.Webhook != wantWebhook {
		t.Errorf("webhook %+v, the rule %+v", got.Webhook, wantWebhook)
	}
	if len(in.Nodes) != 1 || len(in.Nodes[0].Devices) != 1 {
		t.Fatalf("the rule is computed for one node with one GPU, the vector has %d nodes", len(in.Nodes))
	}
	d := in.Nodes[0].Devices[0]
	var wantReason string
	switch {
	case usedSlots+ask[gpu] > int64(d.Count):
		wantReason = allocation.ReasonCardTimeSlicingExhausted
	case !quotaFits:
		wantReason = allocation.ReasonResourceQuotaNotFit
	case usedMem+ask[mem] > int64(d.Devmem):
		wantReason = allocation.ReasonCardInsufficientMemory
	case usedCores+ask[cores] > int64(d.Devcore):
		wantReason = allocation.ReasonCardInsufficientCore
	}
	node := in.Nodes[0].Name
	if wantReason != "" {
		if got.NodeNames != nil || !strings.Contains(got.Failed[node], wantReason) {
			t.Fatalf("NodeNames %v, failed %q; by the rule (%d/%d slots, %d/%d MiB used, quota %d/%d MiB, the pod %v) the reason is %s",
				got.NodeNames, got.Failed[node], usedSlots, d.Count, usedMem, d.Devmem, quotaMem, limit, ask, wantReason)
		}
		if got.After[ns][mem].Used != quotaMem {
			t.Errorf("quota after a failed filter: %d MiB, before %d", got.After[ns][mem].Used, quotaMem)
		}
		return
	}
	if !slices.Equal(got.NodeNames, []string{node}) {
		t.Fatalf("NodeNames %v (failed %v); by the rule (%d/%d slots, %d/%d MiB used, quota %d/%d MiB, the pod %v) it fits %s",
			got.NodeNames, got.Failed, usedSlots, d.Count, usedMem, d.Devmem, quotaMem, limit, ask, node)
	}
	if want := quotaMem + ask[mem]; got.After[ns][mem].Used != want {
		t.Errorf("quota after: %d MiB used, the rule %d", got.After[ns][mem].Used, want)
	}
	// The wire format is unchanged: one entry per container, init containers first.
	req := allocation.Requests(pod, cfg)
	var want strings.Builder
	for _, r := range req.Containers {
		if r.Count > 0 {
			fmt.Fprintf(&want, "%s,%s,%d,%d:", d.ID, r.Type, r.Memory, r.Cores)
		}
		want.WriteString(";")
	}
	if len(got.Patches) != 1 || !strings.Contains(got.Patches[0], `"hami.io/vgpu-devices-allocated":"`+want.String()+`"`) {
		t.Errorf("patches %q, want the devices %q", got.Patches, want.String())
	}
}

// TestMetricsInitContainerSharedGPU: HAMi v2.10.0's node gauges show a pod whose init
// container and app container share a GPU at its per-GPU peak (CollapseInitContainerUsage:
// memory and cores max(largest init entry, sum of app entries), slots max(1, app entries)),
// which the SDK's default accounting with HAMi master gives as well (the Kubernetes rule
// without sidecars); v2.9.0 sums them.
func TestMetricsInitContainerSharedGPU(t *testing.T) {
	t.Parallel()
	const gpu, mem, cores = allocation.DefaultResourceCount, allocation.DefaultResourceMemory, allocation.DefaultResourceCores
	const uuid = "GPU-0node1-0000-1111-2222-333344445555"
	for name, tc := range map[string]struct {
		version          allocation.Version
		accounting       allocation.Accounting
		mem, cores, used int64
	}{
		"master":                  {version: allocation.VersionMaster, mem: 10000, cores: 30, used: 1},
		"master/hami":             {version: allocation.VersionMaster, accounting: allocation.AccountingHAMi, mem: 10000, cores: 30, used: 1},
		"master/kubernetes":       {version: allocation.VersionMaster, accounting: allocation.AccountingKubernetes, mem: 10000, cores: 30, used: 1},
		"v2.9.0":                  {version: allocation.VersionV290, mem: 16000, cores: 50, used: 2},
		"v2.9.0/kubernetes (SDK)": {version: allocation.VersionV290, accounting: allocation.AccountingKubernetes, mem: 10000, cores: 30, used: 1},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				node := gpuNode("node1", annotation.Encode([]annotation.Device{{ID: uuid, Count: 10, Devmem: 23028, Devcore: 100,
					Type: "NVIDIA A10", Mode: "hami-core", Health: true}}), 1)
				pod := vectorPod{Name: "init-and-app", Phase: corev1.PodRunning,
					Annotations: map[string]string{allocation.KeyNode: "node1",
						annotation.KeyNVIDIAAllocated: uuid + ",NVIDIA,10000,30:;" + uuid + ",NVIDIA,6000,20:;"},
					InitContainers: []vectorContainer{{Name: "init", Limits: map[string]string{gpu: "1", mem: "10000", cores: "30"}}},
					Containers:     []vectorContainer{{Name: "app", Limits: map[string]string{gpu: "1", mem: "6000", cores: "20"}}},
				}.pod(t)
				reg := prometheus.NewRegistry()
				e := setupWithNodes(t, Options{Config: allocation.Config{Version: tc.version, Accounting: tc.accounting}, Registerer: reg,
					BuildInfo: normalisedBuildInfo}, node, pod)
				e.run()
				body, _ := scrape(t, hamiOnly(reg))
				want := map[string]string{
					"hami_gpu_memory_allocated_bytes": formatValue(float64(tc.mem) * (1 << 20)),
					"hami_gpu_core_allocated_ratio":   formatValue(float64(tc.cores)),
					"hami_gpu_shared_count":           formatValue(float64(tc.used)),
				}
				got := map[string]string{}
				for line := range strings.SplitSeq(body, "\n") {
					if s, ok := parseSeries(line); ok && want[s.name] != "" && s.label("device_uuid", "deviceuuid") == uuid {
						got[s.name] = s.value
					}
				}
				if diff := gocmp.Diff(want, got); diff != "" {
					t.Errorf("node gauges (-want +got):\n%s\n%s", diff, body)
				}
			})
		})
	}
}

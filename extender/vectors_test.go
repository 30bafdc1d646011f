package extender

import (
	"encoding/json"
	"maps"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/internal/vectors"
)

// vectorConfig is the scheduler configuration of a fit, quota or topology vector.
type vectorConfig struct {
	GPUPolicy     allocation.Policy `json:"gpu_scheduler_policy"`
	NodePolicy    allocation.Policy `json:"node_scheduler_policy"`
	DefaultMemory int32             `json:"default_memory"`
	DefaultCores  int32             `json:"default_cores"`
	MemoryFactor  int32             `json:"memory_factor"`
}

// config is the extender's configuration for the vector's under version.
func (c vectorConfig) config(version allocation.Version) allocation.Config {
	return allocation.Config{GPUSchedulerPolicy: c.GPUPolicy, NodeSchedulerPolicy: c.NodePolicy,
		DefaultMemory: c.DefaultMemory, DefaultCores: c.DefaultCores, MemoryFactor: c.MemoryFactor, Version: version}
}

// vectorPatch is one merge patch HAMi's Filter sent.
type vectorPatch struct {
	Body json.RawMessage `json:"body"`
}

// patchBody is a merge patch of a pod's metadata: annotations and labels.
type patchBody = map[string]map[string]map[string]string

// hami decodes the patch with the vectors' {unix_now} as the test's filter time.
func (p vectorPatch) hami(t *testing.T) patchBody {
	t.Helper()
	var out patchBody
	if err := json.Unmarshal([]byte(strings.ReplaceAll(string(p.Body), "{unix_now}", strconv.FormatInt(t0.Unix(), 10))), &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// ruled is the patch with HAMi's device lists after the deliberate difference's rule (see
// allocation's conformance test): every container keeps its entry. The rule is asserted: HAMi's
// list must have one entry per GPU container.
func (p vectorPatch) ruled(t *testing.T, pod *corev1.Pod, cfg allocation.Config) patchBody {
	t.Helper()
	out := p.hami(t)
	for _, k := range []string{"hami.io/vgpu-devices-allocated", "hami.io/vgpu-devices-to-allocate"} {
		if hami, ok := out["metadata"]["annotations"][k]; ok {
			ruled, fits := vectors.OneEntryPerContainer(hami, gpuContainers(pod, cfg))
			if !fits {
				t.Errorf("%s: HAMi's list %q has not one entry per GPU container", k, hami)
			}
			out["metadata"]["annotations"][k] = ruled
		}
	}
	return out
}

// nodeObjects are the vector's nodes as the register pass sees them: the register annotation
// of their devices, their own annotations, allocatable nvidia.com/gpu.
func nodeObjects(nodes []vectorNode) []runtime.Object {
	var objs []runtime.Object
	for _, n := range nodes {
		node := registered(n.Name, 0, 0)
		node.Annotations[annotation.KeyNVIDIARegister] = annotation.Encode(n.Devices)
		maps.Copy(node.Annotations, n.Annotations)
		node.Status.Allocatable[annotation.ResourceNVIDIAGPU] = *resource.NewQuantity(10*int64(len(n.Devices)), resource.DecimalSI)
		objs = append(objs, node)
	}
	return objs
}

// vectorCluster starts the extender on a vector's cluster as HAMi's vector harness builds it:
// the registered nodes, the ResourceQuotas and the existing pods, every Event recorded in e.rec.
func vectorCluster(t *testing.T, cfg allocation.Config, nodes []vectorNode, quotas []quotaSpec, pods []vectorPod) *env {
	t.Helper()
	objs := nodeObjects(nodes)
	for _, q := range quotas {
		objs = append(objs, q.object())
	}
	for _, p := range pods {
		objs = append(objs, p.pod(t))
	}
	rec := record.NewFakeRecorder(1000)
	e := setupWithNodes(t, Options{Config: cfg, EventRecorder: rec}, objs...)
	e.rec = rec
	e.run()
	return e
}

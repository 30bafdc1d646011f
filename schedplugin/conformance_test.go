package schedplugin

import (
	"cmp"
	"context"
	"maps"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/extender"
	"github.com/hamireg/hamireg/internal/vectors"
	"github.com/hamireg/hamireg/mig"
)

// The vector files' shapes, the fields the plugin's replay reads (one type for fit.json,
// quota.json, topology.json and mig-fit.json).
type (
	vContainer struct {
		Name     string            `json:"name"`
		Limits   map[string]string `json:"limits"`
		Requests map[string]string `json:"requests"`
	}
	vPod struct {
		Name           string            `json:"name"`
		Namespace      string            `json:"namespace"`
		Annotations    map[string]string `json:"annotations"`
		Phase          corev1.PodPhase   `json:"phase"`
		Containers     []vContainer      `json:"containers"`
		InitContainers []vContainer      `json:"init_containers"`
	}
	vNode struct {
		Name        string              `json:"name"`
		Annotations map[string]string   `json:"annotations"`
		Devices     []annotation.Device `json:"devices"`
		Decoded     []annotation.Device `json:"decoded_devices"`
	}
	vQuota struct {
		Name      string            `json:"name"`
		Namespace string            `json:"namespace"`
		Hard      map[string]string `json:"hard"`
	}
	vStep struct {
		Op        string   `json:"op"`
		Pod       *vPod    `json:"pod"`
		Quota     *vQuota  `json:"quota"`
		NodeNames []string `json:"node_names"`
	}
	vInput struct {
		Config struct {
			GPUPolicy     string `json:"gpu_scheduler_policy"`
			NodePolicy    string `json:"node_scheduler_policy"`
			DefaultMemory int32  `json:"default_memory"`
			DefaultCores  int32  `json:"default_cores"`
			MemoryFactor  int32  `json:"memory_factor"`
		} `json:"config"`
		Quotas         []vQuota `json:"quotas"`
		Nodes          []vNode  `json:"nodes"`
		ExistingPods   []vPod   `json:"existing_pods"`
		Steps          []vStep  `json:"steps"`
		FilteredBefore []vStep  `json:"filtered_before"`
		Pod            vPod     `json:"pod"`
		NodeNames      []string `json:"node_names"`
	}
	vFile struct {
		Vectors []struct {
			Name  string `json:"name"`
			Input vInput `json:"input"`
		} `json:"vectors"`
	}
)

func (p vPod) pod() *corev1.Pod {
	list := func(m map[string]string) corev1.ResourceList {
		out := corev1.ResourceList{}
		for k, v := range m {
			out[corev1.ResourceName(k)] = resource.MustParse(v)
		}
		return out
	}
	ctr := func(c vContainer) corev1.Container {
		return corev1.Container{Name: c.Name, Resources: corev1.ResourceRequirements{Limits: list(c.Limits), Requests: list(c.Requests)}}
	}
	out := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: cmp.Or(p.Namespace, "default"), UID: types.UID("uid-" + p.Name),
		Annotations: maps.Clone(p.Annotations)}, Status: corev1.PodStatus{Phase: cmp.Or(p.Phase, corev1.PodPending)}}
	for _, c := range p.InitContainers {
		out.Spec.InitContainers = append(out.Spec.InitContainers, ctr(c))
	}
	for _, c := range p.Containers {
		out.Spec.Containers = append(out.Spec.Containers, ctr(c))
	}
	return out
}

func (q vQuota) object() *corev1.ResourceQuota {
	out := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: q.Name, Namespace: cmp.Or(q.Namespace, "default")},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{}}}
	for k, v := range q.Hard {
		out.Spec.Hard[corev1.ResourceName(k)] = resource.MustParse(v)
	}
	return out
}

// objects are the vector's API objects before its steps: nodes registered with their devices,
// quotas, existing pods, the pod.
func (in vInput) objects() []runtime.Object {
	var objs []runtime.Object
	for _, n := range in.Nodes {
		objs = append(objs, gpuNode(n.Name, slices.Concat(n.Devices, n.Decoded), n.Annotations))
	}
	for _, q := range in.Quotas {
		objs = append(objs, q.object())
	}
	for _, p := range in.ExistingPods {
		objs = append(objs, p.pod())
	}
	return objs
}

// outcome is one scheduling decision: the chosen node and what the pod's annotations say,
// or every candidate's failure reason with whether it is unresolvable.
type outcome struct {
	Skipped      bool
	Node         string
	Devices, MIG string
	Failed       map[string]string
	Unresolvable map[string]bool
}

// scheduler schedules one pod on the named candidates against the API objects of client.
type scheduler interface {
	schedule(ctx context.Context, pod *corev1.Pod, names []string) outcome
}

// replay runs the vector's steps and its pod through a scheduler made by start and returns the
// final outcome.
func replay(t *testing.T, in vInput, start func(t *testing.T, client *fake.Clientset) (context.Context, scheduler)) outcome {
	t.Helper()
	var out outcome
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(in.objects()...)
		ctx, s := start(t, client)
		pods := client.CoreV1().Pods
		ensure := func(p *corev1.Pod) *corev1.Pod {
			if cur, err := pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{}); err == nil {
				return cur
			}
			cur, err := pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			synctest.Wait()
			return cur
		}
		steps := slices.Clone(in.Steps)
		for _, fb := range in.FilteredBefore {
			steps = append(steps, vStep{Op: "filter", Pod: fb.Pod, NodeNames: fb.NodeNames})
		}
		for _, st := range steps {
			var err error
			switch st.Op {
			case "add_pod":
				_, err = pods(st.Pod.pod().Namespace).Create(ctx, st.Pod.pod(), metav1.CreateOptions{})
			case "update_pod":
				_, err = pods(st.Pod.pod().Namespace).Update(ctx, st.Pod.pod(), metav1.UpdateOptions{})
			case "delete_pod":
				err = pods(st.Pod.pod().Namespace).Delete(ctx, st.Pod.Name, metav1.DeleteOptions{})
			case "add_quota":
				_, err = client.CoreV1().ResourceQuotas(st.Quota.object().Namespace).Create(ctx, st.Quota.object(), metav1.CreateOptions{})
			case "update_quota":
				_, err = client.CoreV1().ResourceQuotas(st.Quota.object().Namespace).Update(ctx, st.Quota.object(), metav1.UpdateOptions{})
			case "delete_quota":
				err = client.CoreV1().ResourceQuotas(st.Quota.object().Namespace).Delete(ctx, st.Quota.Name, metav1.DeleteOptions{})
			case "filter":
				s.schedule(ctx, ensure(st.Pod.pod()), st.NodeNames)
			default:
				t.Fatalf("unknown step %q", st.Op)
			}
			if err != nil {
				t.Fatalf("step %s: %v", st.Op, err)
			}
			synctest.Wait()
		}
		out = s.schedule(ctx, ensure(in.Pod.pod()), in.NodeNames)
		synctest.Wait()
	})
	return out
}

// annotated reads the devices the decision wrote on pod.
func annotated(ctx context.Context, tb testing.TB, client *fake.Clientset, pod *corev1.Pod, o *outcome) {
	tb.Helper()
	cur, err := client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	o.Devices, o.MIG = cur.Annotations[annotation.KeyNVIDIAAllocated], cur.Annotations[mig.KeyAllocations]
	if to := cur.Annotations[annotation.KeyNVIDIAToAllocate]; to != o.Devices {
		tb.Errorf("to-allocate %q, allocated %q", to, o.Devices)
	}
}

// extenderScheduler is the SDK's extender: the baseline.
type extenderScheduler struct {
	t      *testing.T
	client *fake.Clientset
	ext    *extender.Extender
	cfg    allocation.Config
}

func startExtender(cfg allocation.Config) func(t *testing.T, client *fake.Clientset) (context.Context, scheduler) {
	return func(t *testing.T, client *fake.Clientset) (context.Context, scheduler) {
		t.Helper()
		_, ctx := ktesting.NewTestContext(t)
		ctx, ext := runExtender(t, ctx, client, cfg, 10*time.Second)
		synctest.Wait()
		return ctx, &extenderScheduler{t: t, client: client, ext: ext, cfg: cfg}
	}
}

func (s *extenderScheduler) schedule(ctx context.Context, pod *corev1.Pod, names []string) outcome {
	res := s.ext.Filter(ctx, &extenderv1.ExtenderArgs{Pod: pod, NodeNames: &names})
	if res.Error != "" {
		s.t.Fatalf("extender filter: %s", res.Error)
	}
	if !allocation.Requests(pod, s.cfg).Any() {
		return outcome{Skipped: true}
	}
	o := outcome{Failed: map[string]string{}, Unresolvable: map[string]bool{}}
	if res.NodeNames != nil && len(*res.NodeNames) == 1 && len(res.FailedNodes)+len(res.FailedAndUnresolvableNodes) == 0 {
		o.Node = (*res.NodeNames)[0]
		annotated(ctx, s.t, s.client, pod, &o)
		return o
	}
	for n, r := range res.FailedNodes {
		o.Failed[n] = r
	}
	for n, r := range res.FailedAndUnresolvableNodes {
		o.Failed[n], o.Unresolvable[n] = r, true
	}
	return o
}

// pluginScheduler runs the plugin as kube-scheduler does for one pod: PreFilter, Filter on
// every candidate's NodeInfo (its pods, as the API has them), Score and NormalizeScore, the
// highest score (ties: the first name), Reserve and PreBind; the node lock is then released as
// the device plugin would.
type pluginScheduler struct {
	e *env
}

func startPlugin(args *Args) func(t *testing.T, client *fake.Clientset) (context.Context, scheduler) {
	return func(t *testing.T, client *fake.Clientset) (context.Context, scheduler) {
		t.Helper()
		e := newEnvWith(t, args, client)
		synctest.Wait()
		return e.ctx, &pluginScheduler{e: e}
	}
}

// nodeInfos are the candidates' NodeInfos: the Node (a bare one when the API has none) and
// the pods on it, by spec.nodeName or, for a pod a scheduler placed, hami.io/vgpu-node.
func (s *pluginScheduler) nodeInfos(ctx context.Context, names []string) map[string]*fakeNodeInfo {
	e := s.e
	out := map[string]*fakeNodeInfo{}
	for _, n := range names {
		node, err := e.client.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
		if err != nil {
			node = &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}
		}
		out[n] = nodeInfo(node)
	}
	list, err := e.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	for i := range list.Items {
		p := &list.Items[i]
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue // the scheduler's informer leaves terminal pods out
		}
		node := cmp.Or(p.Spec.NodeName, p.Annotations[allocation.KeyNode])
		if ni, ok := out[node]; ok && node != "" {
			p = p.DeepCopy()
			p.Spec.NodeName = node
			ni.pods = append(ni.pods, &fakePodInfo{pod: p})
		}
	}
	return out
}

func (s *pluginScheduler) schedule(ctx context.Context, pod *corev1.Pod, names []string) outcome {
	e, p := s.e, s.e.p
	cs := newCycleState()
	if _, st := p.PreFilter(ctx, cs, pod, nil); st.Code() == fwk.Skip {
		return outcome{Skipped: true}
	} else if !st.IsSuccess() {
		e.t.Fatalf("PreFilter: %v", st)
	}
	o := outcome{Failed: map[string]string{}, Unresolvable: map[string]bool{}}
	var scores fwk.NodeScoreList
	for n, ni := range s.nodeInfos(ctx, names) {
		st := p.Filter(ctx, cs, pod, ni)
		if !st.IsSuccess() {
			o.Failed[n], o.Unresolvable[n] = st.Message(), st.Code() == fwk.UnschedulableAndUnresolvable
			continue
		}
		score, st := p.Score(ctx, cs, pod, ni)
		if !st.IsSuccess() {
			e.t.Fatal(st)
		}
		scores = append(scores, fwk.NodeScore{Name: n, Score: score})
	}
	if len(scores) == 0 {
		return o
	}
	if st := p.NormalizeScore(ctx, cs, pod, scores); !st.IsSuccess() {
		e.t.Fatal(st)
	}
	best := slices.MaxFunc(scores, func(a, b fwk.NodeScore) int {
		return cmp.Or(cmp.Compare(a.Score, b.Score), strings.Compare(b.Name, a.Name))
	})
	if st := p.Reserve(ctx, cs, pod, best.Name); !st.IsSuccess() {
		e.t.Fatalf("Reserve on %s: %v", best.Name, st)
	}
	if st := p.PreBind(ctx, cs, pod, best.Name); !st.IsSuccess() {
		e.t.Fatalf("PreBind on %s: %v", best.Name, st)
	}
	if err := p.sh.locker.Release(ctx, best.Name, types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}); err != nil {
		e.t.Fatal(err)
	}
	o = outcome{Node: best.Name}
	annotated(ctx, e.t, e.client, pod, &o)
	return o
}

// reasonCore is a failure reason without the extender's explanation after "; " (a quota's
// usage), which the plugin's status leaves out.
func reasonCore(r string) string {
	r, _, _ = strings.Cut(r, "; ")
	return r
}

// TestConformance replays every fit, quota, topology and MIG vector through the plugin and
// through the SDK's extender (whose own conformance tests hold it to HAMi's answers, with the
// SDK's documented rules), for both HAMi versions: the same chosen node, the same device
// annotations (and MIG reservation), and for a pod that fits nowhere the same reason per
// candidate, unresolvable (UnschedulableAndUnresolvable) exactly where the extender answers
// FailedAndUnresolvableNodes.
func TestConformance(t *testing.T) {
	t.Parallel()
	for _, folder := range vectors.Folders(t) {
		version := vectors.Pick(folder, allocation.VersionMaster, allocation.VersionV290)
		for _, file := range []string{"fit.json", "quota.json", "topology.json", "mig-fit.json"} {
			var f vFile
			if !folder.Read(t, file, &f) {
				continue
			}
			for _, v := range f.Vectors {
				t.Run(folder.Name()+"/"+file+"/"+v.Name, func(t *testing.T) {
					t.Parallel()
					c := v.Input.Config
					cfg := allocation.Config{GPUSchedulerPolicy: allocation.Policy(c.GPUPolicy), NodeSchedulerPolicy: allocation.Policy(c.NodePolicy),
						DefaultMemory: c.DefaultMemory, DefaultCores: c.DefaultCores, MemoryFactor: c.MemoryFactor, Version: version}
					args := &Args{GPUSchedulerPolicy: c.GPUPolicy, NodeSchedulerPolicy: c.NodePolicy, DefaultMemory: c.DefaultMemory,
						DefaultCores: c.DefaultCores, MemoryFactor: c.MemoryFactor, HAMiVersion: version.String()}
					want := replay(t, v.Input, startExtender(cfg))
					got := replay(t, v.Input, startPlugin(args))
					compareOutcomes(t, want, got)
				})
			}
			t.Logf("checked %d vectors from %s (%s)", len(f.Vectors), folder.Dir, file)
		}
	}
}

func compareOutcomes(t *testing.T, ext, plug outcome) {
	t.Helper()
	if ext.Skipped || plug.Skipped {
		if ext.Skipped != plug.Skipped {
			t.Fatalf("skipped: extender %v, plugin %v", ext.Skipped, plug.Skipped)
		}
		return
	}
	if ext.Node != plug.Node || ext.Devices != plug.Devices || ext.MIG != plug.MIG {
		t.Fatalf("plugin chose %q %q %q, extender %q %q %q (plugin failed %v)", plug.Node, plug.Devices, plug.MIG, ext.Node, ext.Devices, ext.MIG, plug.Failed)
	}
	if !slices.Equal(slices.Sorted(maps.Keys(ext.Failed)), slices.Sorted(maps.Keys(plug.Failed))) {
		t.Fatalf("failed nodes: plugin %v, extender %v", plug.Failed, ext.Failed)
	}
	for n, r := range ext.Failed {
		if reasonCore(r) != reasonCore(plug.Failed[n]) {
			t.Errorf("%s: plugin %q, extender %q", n, plug.Failed[n], r)
		}
		if ext.Unresolvable[n] != plug.Unresolvable[n] {
			t.Errorf("%s: plugin unresolvable %v, extender %v", n, plug.Unresolvable[n], ext.Unresolvable[n])
		}
	}
}

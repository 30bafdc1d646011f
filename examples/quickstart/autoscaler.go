package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/hamireg/hamireg/annotation"
)

// The autoscaler item of step 2: a pod no node of the cluster can hold (8 GPUs with
// autoscalerMiB each; the demo pod holds 10 GiB of two of them), left Pending under a
// scheduler name nobody serves, and the extender's /filter asked the way a Cluster Autoscaler
// asks it when it simulates a scale-up: whole Node objects in ExtenderArgs.Nodes.
const (
	autoscalerPod       = "scale-up"
	autoscalerScheduler = "simulated-only" // no scheduler serves it: the pod stays Pending
	autoscalerGPUs      = 8
	autoscalerMiB       = 35000
)

// autoscaler sends the extender a simulation /filter: a template of the node (a copy of its
// Node under a new name, as an autoscaler's node group template is) and a bare template
// without the register annotation. The template fits, the bare one is "node unregistered",
// and the call writes nothing: the pod's resourceVersion is unchanged and it has no Events.
func (q *quickstart) autoscaler(ctx context.Context) error {
	c := q.cp.AdminClient()
	pods := c.CoreV1().Pods(demoNamespace)
	pod := gpuPod(demoNamespace, autoscalerPod, autoscalerGPUs, autoscalerMiB, nil)
	pod.Spec.SchedulerName = autoscalerScheduler
	created, err := pods.Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create pod %s/%s: %w", demoNamespace, autoscalerPod, err)
	}
	defer func() { _ = pods.Delete(context.WithoutCancel(ctx), autoscalerPod, metav1.DeleteOptions{}) }()

	node, err := c.CoreV1().Nodes().Get(ctx, q.opts.node, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("get node %s: %w", q.opts.node, err)
	}
	template := templateNode(node, node.Name+"-template")
	bare := templateNode(node, node.Name+"-bare")
	delete(bare.Annotations, annotation.KeyNVIDIARegister)
	args := extenderv1.ExtenderArgs{Pod: created, Nodes: &corev1.NodeList{Items: []corev1.Node{*template, *bare}}}
	res, err := q.filter(ctx, &args)
	if err != nil {
		return failed(fmt.Errorf("the extender's /filter with ExtenderArgs.Nodes: %w", err), "extender", q.extender)
	}
	var fit []string
	if res.Nodes != nil {
		for _, n := range res.Nodes.Items {
			fit = append(fit, n.Name)
		}
	}
	if !slices.Equal(fit, []string{template.Name}) || res.FailedNodes[bare.Name] == "" {
		return failed(fmt.Errorf("the extender's /filter with ExtenderArgs.Nodes answered nodes %v and failed nodes %v; want %s to fit and %s to fail", fit, res.FailedNodes, template.Name, bare.Name), "extender", q.extender)
	}
	after, err := pods.Get(ctx, autoscalerPod, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("get pod %s/%s: %w", demoNamespace, autoscalerPod, err)
	}
	events, err := c.CoreV1().Events(demoNamespace).List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("involvedObject.uid", string(created.UID)).String()})
	if err != nil {
		return fmt.Errorf("list the events of pod %s/%s: %w", demoNamespace, autoscalerPod, err)
	}
	if after.ResourceVersion != created.ResourceVersion || len(events.Items) > 0 {
		return failed(fmt.Errorf("the extender's /filter with ExtenderArgs.Nodes wrote to the API: pod %s/%s resourceVersion %s → %s, %d Events", demoNamespace, autoscalerPod, created.ResourceVersion, after.ResourceVersion, len(events.Items)), "extender", q.extender)
	}
	q.out.item("autoscaler", "pod %s/%s (%d GPUs × %d MiB) fits no node of the cluster; a Cluster Autoscaler's /filter with whole Nodes (ExtenderArgs.Nodes):", demoNamespace, autoscalerPod, autoscalerGPUs, autoscalerMiB)
	q.out.item("", "template %s (a copy of %s's Node): fits", template.Name, node.Name)
	for _, n := range slices.Sorted(maps.Keys(res.FailedNodes)) {
		q.out.item("", "template %s (no %s): %s", n, annotation.KeyNVIDIARegister, res.FailedNodes[n])
	}
	q.out.item("", "a simulation writes nothing: pod resourceVersion %s unchanged, 0 Events, no reservation", after.ResourceVersion)
	return nil
}

// templateNode is node under another name, as an autoscaler's template of its node group:
// no UID, no resourceVersion, no node lock.
func templateNode(node *corev1.Node, name string) *corev1.Node {
	t := node.DeepCopy()
	t.Name, t.UID, t.ResourceVersion = name, "", ""
	t.Labels = maps.Clone(t.Labels)
	if t.Labels != nil {
		t.Labels[corev1.LabelHostname] = name
	}
	for k := range t.Annotations {
		if strings.HasPrefix(k, "hami.io/mutex") {
			delete(t.Annotations, k)
		}
	}
	return t
}

// filter posts args to the extender's /filter.
func (q *quickstart) filter(ctx context.Context, args *extenderv1.ExtenderArgs) (*extenderv1.ExtenderFilterResult, error) {
	body, err := json.Marshal(args)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, q.extenderURL+"/filter", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(b))
	}
	var res extenderv1.ExtenderFilterResult
	if err := json.Unmarshal(b, &res); err != nil {
		return nil, fmt.Errorf("decode the answer: %w", err)
	}
	if res.Error != "" {
		return nil, fmt.Errorf("error %q", res.Error)
	}
	return &res, nil
}

package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kubeschedulerconfigv1 "k8s.io/kube-scheduler/config/v1"
	"k8s.io/utils/ptr"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/envtest"
	"github.com/hamireg/hamireg/internal/manifests"
)

const (
	// pluginScheduler is the profile of examples/scheduler here: kube-scheduler built with the
	// SDK's HAMiGPU plugin. Its deploy/config.yaml calls it hami-scheduler, the name the
	// extender's kube-scheduler already has in this cluster.
	pluginScheduler = "hami-plugin-scheduler"
	// pluginName is the plugin's name in the KubeSchedulerConfiguration (schedplugin.Name).
	hamiPluginName = "HAMiGPU"
	// The step's PriorityClasses and pods.
	lowPriority, highPriority      = "quickstart-low", "quickstart-high"
	lowPod, highPod, waitingPod    = "plugin-low", "plugin-high", "plugin-waiting"
	lowShare, highShare            = 100, 60 // memory percentages of one GPU
	schedulerProgram               = "hami-scheduler"
	schedulerProgramDir            = "examples/scheduler"
	pluginStepRBAC                 = "examples/scheduler/deploy/rbac.yaml"
	pluginStepKubeSchedulerUserRef = "quickstart-hami-plugin"
)

// pluginStep shows what only a scheduler plugin can do: examples/scheduler (kube-scheduler
// built with the SDK's HAMiGPU plugin) places a low-priority pod holding one GPU's whole
// memory; a high-priority pod that needs 60 % of that GPU preempts it (kube-scheduler's own
// preemption, which asks the plugin's Filter); a third pod of low priority waits, and is bound
// as soon as its blocker is deleted (the plugin's queueing hint), not after a back-off or the
// 5-minute flush. All three name one GPU (nvidia.com/use-gpuuuid), the last one no pod holds.
func (q *quickstart) pluginStep(ctx context.Context, step int) error {
	q.out.step(step, time.Since(q.start), "the scheduler plugin: preemption and requeue on node %s", q.opts.node)
	sched, err := q.startPluginScheduler(ctx)
	if err != nil {
		return err
	}
	c := q.cp.AdminClient()
	for name, value := range map[string]int32{lowPriority: 100, highPriority: 1000} {
		pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Value: value}
		if _, err := c.SchedulingV1().PriorityClasses().Create(ctx, pc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create PriorityClass %s: %w", name, err)
		}
	}
	gpu, err := q.freeGPU(ctx)
	if err != nil {
		return err
	}
	pods := c.CoreV1().Pods(demoNamespace)

	low, err := pods.Create(ctx, q.schedPluginPod(lowPod, lowPriority, gpu, lowShare), metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create pod %s: %w", lowPod, err)
	}
	if _, err := q.waitForAdmission(ctx, low.UID); err != nil {
		return failed(fmt.Errorf("pod %s/%s was not bound and admitted: %w%s", demoNamespace, lowPod, err, q.podEvents(ctx, low)), "examples/scheduler", sched)
	}
	q.out.item("low", "pod %s/%s (priority 100): %d %% of %s's memory, bound by the plugin and allocated", demoNamespace, lowPod, lowShare, gpu)

	t := time.Now()
	high, err := pods.Create(ctx, q.schedPluginPod(highPod, highPriority, gpu, highShare), metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create pod %s: %w", highPod, err)
	}
	if _, err := q.waitForAdmission(ctx, high.UID); err != nil {
		return failed(fmt.Errorf("pod %s/%s did not preempt %s: %w%s", demoNamespace, highPod, lowPod, err, q.podEvents(ctx, high)), "examples/scheduler", sched)
	}
	preempted := round(time.Since(t))
	if _, err := pods.Get(ctx, lowPod, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		return fmt.Errorf("pod %s/%s is still there after %s was bound on its GPU: %w", demoNamespace, lowPod, highPod, cmp.Or(err, errors.New("not deleted")))
	}
	if _, err := pods.Get(ctx, demoPod, metav1.GetOptions{}); err != nil {
		return fmt.Errorf("step 2's pod %s/%s (no priority, on other GPUs) is gone after the preemption: %w", demoNamespace, demoPod, err)
	}
	q.out.item("preempted", "pod %s/%s (priority 1000) needs %d %% of %s: kube-scheduler's preemption evicted %s, the only victim; bound in %v", demoNamespace, highPod, highShare, gpu, lowPod, preempted)

	waiting, err := pods.Create(ctx, q.schedPluginPod(waitingPod, lowPriority, gpu, highShare), metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create pod %s: %w", waitingPod, err)
	}
	var reason string
	if err := q.poll(ctx, func() bool {
		p, err := pods.Get(ctx, waitingPod, metav1.GetOptions{})
		if err != nil {
			return false
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Reason == corev1.PodReasonUnschedulable {
				reason = cond.Message
				return true
			}
		}
		return false
	}); err != nil {
		return failed(fmt.Errorf("pod %s/%s was not rejected: %w", demoNamespace, waitingPod, err), "examples/scheduler", sched)
	}
	q.out.item("pending", "pod %s/%s (priority 100), %d %% of %s: it cannot preempt a higher priority: %s", demoNamespace, waitingPod, highShare, gpu, reason)
	t = time.Now()
	if err := pods.Delete(ctx, highPod, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		return fmt.Errorf("delete pod %s: %w", highPod, err)
	}
	if _, err := q.waitForAdmission(ctx, waiting.UID); err != nil {
		return failed(fmt.Errorf("pod %s/%s was not bound after %s was deleted: %w%s", demoNamespace, waitingPod, highPod, err, q.podEvents(ctx, waiting)), "examples/scheduler", sched)
	}
	q.out.item("requeued", "%s deleted: %s bound and allocated %v later (the plugin's queueing hint, no back-off, no 5-minute flush)", highPod, waitingPod, round(time.Since(t)))
	return nil
}

// schedPluginPod is a pod of the step's scheduler: one container asking one GPU (gpu, by UUID) with
// share % of its memory.
func (q *quickstart) schedPluginPod(name, priority, gpu string, share int64) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: demoNamespace, Annotations: map[string]string{allocation.KeyUseGPUUUID: gpu}},
		Spec: corev1.PodSpec{
			SchedulerName:     pluginScheduler,
			PriorityClassName: priority,
			NodeSelector:      map[string]string{corev1.LabelHostname: q.opts.node},
			Containers: []corev1.Container{{Name: "cuda", Image: "registry.example/cuda:12", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
				allocation.DefaultResourceCount:            resource.MustParse("1"),
				allocation.DefaultResourceMemoryPercentage: *resource.NewQuantity(share, resource.DecimalSI),
			}}}},
		},
	}
}

// freeGPU is the last GPU of the node's register annotation that no pod holds and that is not
// cordoned.
func (q *quickstart) freeGPU(ctx context.Context) (string, error) {
	c := q.cp.AdminClient()
	node, err := c.CoreV1().Nodes().Get(ctx, q.opts.node, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	devs, err := annotation.Decode(node.Annotations[annotation.KeyNVIDIARegister])
	if err != nil {
		return "", fmt.Errorf("node %s: %s: %w", q.opts.node, annotation.KeyNVIDIARegister, err)
	}
	pods, err := c.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", err
	}
	held := map[string]bool{}
	for id := range strings.SplitSeq(node.Annotations[allocation.KeyDeviceCordon], ",") {
		held[strings.TrimSpace(id)] = true // cordoned: the DRA step's GPU
	}
	for i := range pods.Items {
		pd, _, _ := allocation.Allocated(&pods.Items[i], annotation.NVIDIA(), allocation.VersionMaster)
		for _, ctr := range pd {
			for _, d := range ctr {
				held[d.UUID] = true
			}
		}
	}
	for _, d := range slices.Backward(devs) {
		if !held[d.ID] {
			return d.ID, nil
		}
	}
	return "", fmt.Errorf("node %s: every GPU is held by a pod", q.opts.node)
}

// startPluginScheduler builds examples/scheduler and runs it as a second scheduler of the
// cluster, with one profile (pluginScheduler) that enables HAMiGPU at every extension point
// and NodeResourcesFit's ignoredResources of deploy/config.yaml, as the user
// system:kube-scheduler bound to the ClusterRoles of deploy/rbac.yaml.
func (q *quickstart) startPluginScheduler(ctx context.Context) (*envtest.Scheduler, error) {
	t := time.Now()
	dir := filepath.Join(q.opts.repo, schedulerProgramDir)
	bin := filepath.Join(q.bin, schedulerProgram)
	if err := q.withProgress(ctx, q.goCommand(ctx, dir, "build", "-o", bin, "."), "building "+schedulerProgramDir+" (kube-scheduler with the HAMiGPU plugin)"); err != nil {
		return nil, fmt.Errorf("go build in %s: %w", dir, err)
	}
	objs, err := manifests.Read(filepath.Join(q.opts.repo, pluginStepRBAC))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", pluginStepRBAC, err)
	}
	c := q.cp.AdminClient()
	for _, o := range objs {
		cr, ok := o.(*rbacv1.ClusterRole)
		if !ok {
			continue
		}
		if _, err := c.RbacV1().ClusterRoles().Create(ctx, cr, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("create ClusterRole %s: %w", cr.Name, err)
		}
		// kube-scheduler runs here as the user system:kube-scheduler, not as the Deployment's
		// ServiceAccount.
		b := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: pluginStepKubeSchedulerUserRef + "-" + cr.Name},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: cr.Name},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: kubeSchedulerUser}}}
		if _, err := c.RbacV1().ClusterRoleBindings().Create(ctx, b, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("create ClusterRoleBinding %s: %w", b.Name, err)
		}
	}
	ignored := &kubeschedulerconfigv1.NodeResourcesFitArgs{IgnoredResources: []string{
		allocation.DefaultResourceMemory, allocation.DefaultResourceCores, allocation.DefaultResourceMemoryPercentage, allocation.DefaultResourcePriority}}
	cfg := &kubeschedulerconfigv1.KubeSchedulerConfiguration{
		Profiles: []kubeschedulerconfigv1.KubeSchedulerProfile{{
			SchedulerName:            ptr.To(pluginScheduler),
			PercentageOfNodesToScore: ptr.To[int32](100),
			Plugins: &kubeschedulerconfigv1.Plugins{MultiPoint: kubeschedulerconfigv1.PluginSet{
				Enabled: []kubeschedulerconfigv1.Plugin{{Name: hamiPluginName, Weight: ptr.To[int32](10)}}}},
			PluginConfig: []kubeschedulerconfigv1.PluginConfig{
				{Name: "NodeResourcesFit", Args: runtime.RawExtension{Object: ignored}},
				// The extender's kube-scheduler already writes the handshakes here.
				{Name: hamiPluginName, Args: runtime.RawExtension{Raw: []byte(`{"handshake":{"mode":"off"}}`)}},
			},
		}},
	}
	sched, err := q.cp.StartScheduler(ctx, envtest.SchedulerOptions{Config: cfg, Binary: bin})
	if err != nil {
		return nil, fmt.Errorf("start examples/scheduler: %w", err)
	}
	q.onStop(func() error { q.stopped++; return sched.Stop() })
	q.out.item("scheduler", "examples/scheduler (kube-scheduler %s with the %s plugin, profile %s) ready in %v",
		q.cp.Version(), hamiPluginName, pluginScheduler, round(time.Since(t)))
	return sched, nil
}

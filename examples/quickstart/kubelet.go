package main

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/envtest/kubeletpeer"
	"github.com/hamireg/hamireg/envtest/proc"
)

// statusPeriod is how often the kubelet here copies the device manager's counts into the
// Node's status (a real kubelet: on a device change, and every 10 s).
const statusPeriod = time.Second

// admission is what the kubelet's device manager gave one pod's GPU containers, and the DRA
// manager its claims.
type admission struct {
	pod    *corev1.Pod
	allocs map[string]kubeletpeer.Allocation // by container
	cdi    map[string][]string               // the CDI device IDs of each container's claims
	err    error
}

// kubelet plays the node's kubelet around the real device manager: node status, and pod
// admission (ManagerImpl.Allocate for each GPU container of a pod bound to the node, as the
// kubelet does before it starts the containers). There is no container runtime: the Pods of
// the processes the quickstart runs (the device plugin's, the scheduler's) are reported
// Running; other pods stay Pending after their Allocate.
type kubelet struct {
	client   kubernetes.Interface
	node     string
	dm       *kubeletpeer.DeviceManager
	running  map[string]bool // names of the stand-in Pods, reported Running
	announce func(admission) // called for each pod admitted (may be nil)

	mu       sync.Mutex
	dra      *kubeletpeer.DRAManager // set by the DRA step; pods with claims are prepared through it
	admitted map[types.UID]admission
	changed  chan struct{} // closed and replaced on each admission
}

// run keeps the node status and admits pods until ctx ends.
func (k *kubelet) run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		tick := time.NewTicker(statusPeriod)
		defer tick.Stop()
		for {
			_ = k.dm.UpdateNodeStatus(ctx, k.client.CoreV1(), k.node) // a failure is retried next period
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	})
	factory := informers.NewSharedInformerFactoryWithOptions(k.client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", k.node).String()
	}))
	queue := make(chan *corev1.Pod, 1024)
	handle := func(obj any) {
		if p, ok := obj.(*corev1.Pod); ok {
			select {
			case queue <- p:
			default: // never here: a handful of pods
			}
		}
	}
	_, _ = factory.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: handle, UpdateFunc: func(_, o any) { handle(o) }})
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	for {
		select {
		case <-ctx.Done():
			return
		case p := <-queue:
			k.admit(ctx, p)
		}
	}
}

// admit runs the device manager's Allocate for the pod's GPU containers once.
func (k *kubelet) admit(ctx context.Context, p *corev1.Pod) {
	if p.DeletionTimestamp != nil {
		k.finish(ctx, p)
		return
	}
	k.mu.Lock()
	_, done := k.admitted[p.UID]
	k.mu.Unlock()
	if done {
		return
	}
	a := admission{pod: p, allocs: map[string]kubeletpeer.Allocation{}, cdi: map[string][]string{}}
	k.mu.Lock()
	draManager := k.dra
	k.mu.Unlock()
	switch {
	case k.running[p.Name]:
		a.err = k.reportRunning(ctx, p)
	case (len(p.Spec.ResourceClaims) > 0 || p.Status.ExtendedResourceClaimStatus != nil) && draManager != nil:
		// The pod's own claims, or the one kube-scheduler wrote for its extended resources
		// (a DeviceClass's extendedResourceName): the DRA manager prepares both.
		// As the kubelet does before the containers start: NodePrepareResources of each
		// claim's driver, then the CDI devices of each container.
		a.err = draManager.Prepare(ctx, p)
		for _, c := range p.Spec.Containers {
			if a.err != nil {
				break
			}
			a.cdi[c.Name], a.err = draManager.GetResources(p, c.Name)
		}
		if a.err != nil {
			a.err = fmt.Errorf("the kubelet's DRA Prepare of pod %s/%s: %w", p.Namespace, p.Name, a.err)
		}
	default:
		for _, c := range p.Spec.Containers {
			if _, ok := c.Resources.Limits[annotation.ResourceNVIDIAGPU]; !ok {
				continue
			}
			got, err := k.dm.Allocate(ctx, p, c.Name)
			if err != nil {
				a.err = fmt.Errorf("the kubelet's Allocate for container %s of pod %s/%s: %w", c.Name, p.Namespace, p.Name, err)
				break
			}
			a.allocs[c.Name] = got
		}
	}
	k.mu.Lock()
	if k.admitted == nil {
		k.admitted = map[types.UID]admission{}
	}
	k.admitted[p.UID] = a
	if k.changed != nil {
		close(k.changed)
		k.changed = nil
	}
	announce := k.announce
	k.mu.Unlock()
	if announce != nil {
		announce(a)
	}
}

// finish is the kubelet's last word on a pod being deleted (preempted, or deleted with a grace
// period): its containers have stopped (there are none here), so it deletes the pod for good,
// with grace period 0 and the pod's UID as precondition. Until then the pod stays Terminating
// and holds its GPUs, as on a real node.
func (k *kubelet) finish(ctx context.Context, p *corev1.Pod) {
	if k.running[p.Name] {
		return // the stand-in Pods of the quickstart's own processes
	}
	err := k.client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{
		GracePeriodSeconds: ptr.To[int64](0), Preconditions: &metav1.Preconditions{UID: &p.UID}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		fmt.Fprintf(os.Stderr, "quickstart: the kubelet could not finish deleting pod %s/%s: %v\n", p.Namespace, p.Name, err)
	}
}

// admission returns the pod's admission and whether it happened, and a channel that is
// closed at the next admission.
func (k *kubelet) admission(uid types.UID) (admission, bool, <-chan struct{}) {
	k.mu.Lock()
	defer k.mu.Unlock()
	a, ok := k.admitted[uid]
	if k.changed == nil {
		k.changed = make(chan struct{})
	}
	return a, ok, k.changed
}

// waitForAdmission waits, woken by each admission, until the pod uid was admitted, for at
// most the step timeout.
func (q *quickstart) waitForAdmission(ctx context.Context, uid types.UID) (admission, error) {
	return q.waitForAdmissionOn(ctx, q.kubelet, uid)
}

// waitForAdmissionOn is waitForAdmission on the kubelet k of another node.
func (q *quickstart) waitForAdmissionOn(ctx context.Context, k *kubelet, uid types.UID) (admission, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, q.opts.timeout, fmt.Errorf("not within %v", q.opts.timeout))
	defer cancel()
	for {
		a, ok, changed := k.admission(uid)
		if ok {
			return a, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return admission{}, context.Cause(ctx)
		}
	}
}

// reportRunning writes the status a kubelet writes for a pod whose containers run (read
// afresh and written again on a conflict).
func (k *kubelet) reportRunning(ctx context.Context, p *corev1.Pod) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p, err := k.client.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		now := metav1.Now()
		p.Status.Phase = corev1.PodRunning
		p.Status.StartTime = &now
		p.Status.HostIP, p.Status.PodIP = "127.0.0.1", "127.0.0.1"
		p.Status.Conditions = []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		}
		p.Status.ContainerStatuses = nil
		for _, c := range p.Spec.Containers {
			p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{
				Name: c.Name, Image: c.Image, ImageID: c.Image, Ready: true, Started: new(true),
				ContainerID: "quickstart://" + c.Name,
				State:       corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
			})
		}
		_, err = k.client.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{})
		return err
	})
}

// startNode creates the GPU node as a kubelet registers it (labelled for the DaemonSet's
// nodeSelector, Ready, without the not-ready taint that only the node lifecycle controller
// would remove) and the scheduler's stand-in Pod, and starts the kubelet's loops.
func (q *quickstart) startNode(ctx context.Context) error {
	ds, err := find[*appsv1.DaemonSet](q, pluginName)
	if err != nil {
		return err
	}
	dep, err := find[*appsv1.Deployment](q, schedulerName)
	if err != nil {
		return err
	}
	if err := q.createReadyNode(ctx, q.opts.node, ds); err != nil {
		return err
	}
	c := q.cp.AdminClient()

	kctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	q.kubelet = &kubelet{client: c, node: q.opts.node, dm: q.dm, running: map[string]bool{q.schedulerPod(): true, q.pluginPod(): true}}
	done := make(chan struct{})
	go func() { defer close(done); q.kubelet.run(kctx) }()
	q.onStop(func() error { cancel(); <-done; return nil })

	if _, err := c.CoreV1().Pods(namespace).Create(ctx, standInPod(q.schedulerPod(), dep.Spec.Template, q.opts.node), metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create the scheduler's Pod: %w", err)
	}
	q.out.item("node", "%s created with labels %s; the kubelet here reports its device counts every %v", q.opts.node, labelString(ds.Spec.Template.Spec.NodeSelector), statusPeriod)
	return nil
}

// startPlugin runs examples/deviceplugin --simulate dgxa100 with the DaemonSet's arguments
// (its socket in the device manager's folder) and extra, as the ServiceAccount
// hami-device-plugin. Run again (the DRA step), it stops the running plugin first and prints
// only the arguments.
func (q *quickstart) startPlugin(ctx context.Context, extra ...string) error {
	ds, err := find[*appsv1.DaemonSet](q, pluginName)
	if err != nil {
		return err
	}
	ctr, err := container(&ds.Spec.Template.Spec, pluginContainer)
	if err != nil {
		return err
	}
	kubeconfig, err := q.cp.ServiceAccountKubeconfig(ctx, mkdir(q.work, "deviceplugin"), namespace, pluginName, pluginName)
	if err != nil {
		return fmt.Errorf("credentials of ServiceAccount %s/%s: %w", namespace, pluginName, err)
	}
	root := filepath.Dir(q.dm.Dir()) // <root>/device-plugins is the device manager's folder
	if q.hook == "" {
		q.hook = mkdir(q.work, "hook")
	}
	args := pluginArgs(ctr.Args)
	args = append(args, extra...)
	// HAMi-core's folders in the work folder (the DaemonSet's hostPath is /usr/local/vgpu):
	// Allocate makes each container's folder there and the node monitor reads it, every 200ms
	// rather than HAMi's 5s so that step 4 need not wait.
	args = append(args, "--kubelet-root-dir="+root, "--simulate=dgxa100", "--simulate-uuid-seed="+q.opts.node,
		"--hook-path="+q.hook, "--prepare-state-dir=true", "--monitor-period="+monitorPeriod.String(),
		"--kubeconfig="+kubeconfig, fmt.Sprintf("-v=%d", q.opts.verbosity))
	// The container's literal env (HOOK_PATH, ENABLE_TOPOLOGY_SCORE, …) and NODE_NAME, which
	// the DaemonSet takes from spec.nodeName, over this process's own.
	env := []string{"NODE_NAME=" + q.opts.node}
	manifestEnv := map[string]string{}
	for _, e := range ctr.Env {
		if e.ValueFrom == nil && e.Name != "NODE_NAME" {
			manifestEnv[e.Name] = e.Value
		}
	}
	for _, k := range slices.Sorted(maps.Keys(manifestEnv)) {
		env = append(env, k+"="+manifestEnv[k])
	}
	for _, e := range os.Environ() {
		name, _, _ := strings.Cut(e, "=")
		if _, set := manifestEnv[name]; !set && name != "NODE_NAME" && name != "NodeName" {
			env = append(env, e)
		}
	}
	q.scores = publishesScores(args, manifestEnv["ENABLE_TOPOLOGY_SCORE"])
	restart := q.plugin != nil
	if restart {
		if err := q.plugin.Stop(20 * time.Second); err != nil {
			return fmt.Errorf("stop the device plugin: %w", err)
		}
	} else if _, err := q.cp.AdminClient().CoreV1().Pods(namespace).Create(ctx, standInPod(q.pluginPod(), ds.Spec.Template, q.opts.node), metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create the device plugin's Pod: %w", err)
	}
	name := "deviceplugin"
	if restart {
		name += "-dra"
	}
	p, err := q.spawn(proc.Options{Name: name, Path: filepath.Join(q.bin, "deviceplugin"), Args: args, Env: env})
	if err != nil {
		return err
	}
	q.plugin = p
	q.pluginMetricsURL = "" // learnt from the new process's log when needed
	if restart {
		q.out.item("plugin", "examples/deviceplugin restarted with %s", strings.Join(args[:len(args)-2], " "))
		return nil
	}
	q.out.item("plugin", "examples/deviceplugin with the DaemonSet's arguments and env, NODE_NAME=%s:", q.opts.node)
	q.out.item("", "%s", strings.Join(args[:len(args)-2], " "))
	q.out.item("", "%s", strings.Join(env[1:1+len(manifestEnv)], " "))
	return nil
}

// pluginArgs are the DaemonSet container's arguments for a device plugin on this machine:
// without --kubelet-root-dir (the caller gives the node's), and with /metrics on a free
// loopback port rather than the Pod's :9394, which several plugins here (and several
// quickstarts on one machine) would share; an empty --metrics-bind-address stays off.
func pluginArgs(ctrArgs []string) []string {
	var args []string
	metricsSet := false
	for _, a := range ctrArgs {
		switch {
		case strings.HasPrefix(a, "--kubelet-root-dir="):
			continue
		case strings.HasPrefix(a, "--metrics-bind-address="):
			metricsSet = true
			if v := strings.TrimPrefix(a, "--metrics-bind-address="); v != "" && v != "0" {
				a = "--metrics-bind-address=" + pluginMetricsBind
			}
		}
		args = append(args, a)
	}
	if !metricsSet { // the plugin's default, :9394
		args = append(args, "--metrics-bind-address="+pluginMetricsBind)
	}
	return args
}

// labelString writes labels as k=v,k=v, sorted.
func labelString(l map[string]string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(l)) {
		parts = append(parts, k+"="+l[k])
	}
	return strings.Join(parts, ",")
}

// publishesScores says whether the device plugin publishes topology scores with these
// arguments and ENABLE_TOPOLOGY_SCORE value (the flag, when given, wins over the variable).
func publishesScores(args []string, envValue string) bool {
	on := envValue == "true"
	for _, a := range args {
		switch a {
		case "--topology-score", "-topology-score", "--topology-score=true", "-topology-score=true":
			on = true
		case "--topology-score=false", "-topology-score=false":
			on = false
		}
	}
	return on
}

// createReadyNode creates the Node name with the labels the DaemonSet ds selects on, no
// taints, and the status of a ready node whose kubelet is the quickstart's (the device manager
// alone, no container runtime).
func (q *quickstart) createReadyNode(ctx context.Context, name string, ds *appsv1.DaemonSet) error {
	labels := map[string]string{"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
	maps.Copy(labels, ds.Spec.Template.Spec.NodeSelector)
	c := q.cp.AdminClient()
	n, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create node %s: %w", name, err)
	}
	n.Spec.Taints = nil
	if n, err = c.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("untaint node %s: %w", name, err)
	}
	q8 := resource.MustParse
	n.Status = corev1.NodeStatus{
		Capacity:    corev1.ResourceList{corev1.ResourceCPU: q8("64"), corev1.ResourceMemory: q8("512Gi"), corev1.ResourcePods: q8("110")},
		Allocatable: corev1.ResourceList{corev1.ResourceCPU: q8("64"), corev1.ResourceMemory: q8("512Gi"), corev1.ResourcePods: q8("110")},
		Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			Message: "the quickstart's kubelet (the real device manager, no container runtime)", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}},
		Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}},
		NodeInfo:  corev1.NodeSystemInfo{KubeletVersion: q.cp.Version(), OperatingSystem: "linux", Architecture: "amd64"},
	}
	if _, err := c.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("status of node %s: %w", name, err)
	}
	return nil
}

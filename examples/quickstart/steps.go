package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/handshake"
	"github.com/hamireg/hamireg/nodelock"
)

// The simulated node: go-nvml's DGX A100, split as the DaemonSet says.
const (
	simulatedGPUs = 8
	demoPod       = "demo"
	demoNamespace = "default"
	demoGPUs      = 2
	demoMemMiB    = 10 * 1024
	demoCores     = 30
	// settle is how long the register annotation must stay deleted while the plugin is
	// paused before the doctor looks.
	settle = 300 * time.Millisecond
)

// run is the whole quickstart: step 0 (up), the five steps, DRA on the same node, the scheduler plugin, the MIG node (unless --mig=false) and --keep.
func (q *quickstart) run(ctx context.Context) error {
	if err := q.up(ctx); err != nil {
		return err
	}
	if err := q.channels(ctx); err != nil {
		return err
	}
	if err := q.demo(ctx); err != nil {
		return err
	}
	if err := q.autoscaler(ctx); err != nil {
		return err
	}
	if err := q.quota(ctx); err != nil {
		return err
	}
	if err := q.metrics(ctx); err != nil {
		return err
	}
	if err := q.doctor(ctx); err != nil {
		return err
	}
	if err := q.draStep(ctx, 6); err != nil {
		return err
	}
	if err := q.pluginStep(ctx, 7); err != nil {
		return err
	}
	if q.opts.mig {
		if err := q.migNode(ctx, 8); err != nil {
			return err
		}
	}
	if !q.opts.keep {
		return nil
	}
	return q.keep(ctx)
}

// channels is step 1: the device plugin starts, and each channel of the node is shown when it
// first is healthy, with the time since the start.
func (q *quickstart) channels(ctx context.Context) error {
	q.out.step(1, time.Since(q.start), "node %s: its three channels", q.opts.node)
	t := time.Now()
	if err := q.startPlugin(ctx); err != nil {
		return err
	}
	nodes := q.cp.AdminClient().CoreV1().Nodes()
	seen := map[string]bool{}
	lastErr := errors.New("the node was not read yet")
	err := q.poll(ctx, func() bool {
		n, err := nodes.Get(ctx, q.opts.node, metav1.GetOptions{})
		if err != nil {
			lastErr = err
			return false
		}
		for _, c := range channelStates(n, time.Now(), q.scores) {
			if c.healthy && !seen[c.name] {
				seen[c.name] = true
				q.out.item(c.name, "healthy after %-7v %s", round(time.Since(t)), c.detail)
			}
			if !c.healthy {
				lastErr = errors.New(c.name + ": " + c.detail)
			}
		}
		return len(seen) == 3
	})
	if err != nil {
		return failed(fmt.Errorf("the node's channels are not all healthy: %w (last: %w)", err, lastErr), "deviceplugin", q.plugin)
	}
	return nil
}

// channel is one channel's state as HAMi's scheduler sees it.
type channel struct {
	name    string
	healthy bool
	detail  string
}

// channelStates reads the three channels from the Node: the register annotation as HAMi's
// scheduler decodes it (and, when the device plugin publishes them, the topology scores
// written in the same patch), the device count in allocatable (GPUs × split), and the
// handshake as HAMi's health check reads it.
func channelStates(n *corev1.Node, now time.Time, scores bool) []channel {
	v := annotation.Check(annotation.NVIDIA(), n.Annotations)
	spec := channel{name: "spec", healthy: v.Registers && len(v.Devices) == simulatedGPUs}
	want := int64(0)
	if v.Registers {
		d := v.Devices[0]
		for _, d := range v.Devices {
			want += int64(d.Count)
		}
		spec.detail = fmt.Sprintf("%s: %d × %s, %d MiB, split %d, health %v", annotation.KeyNVIDIARegister, len(v.Devices), d.Type, d.Devmem, d.Count, d.Health)
	} else {
		spec.detail = fmt.Sprintf("%s: %v", annotation.KeyNVIDIARegister, v.Err)
	}
	if scores {
		summary, ok := scoreSummary(v.Devices, n.Annotations[annotation.KeyNVIDIAScore])
		spec.healthy = spec.healthy && ok
		spec.detail += "; " + annotation.KeyNVIDIAScore + ": " + summary
	}
	q := n.Status.Allocatable[annotation.ResourceNVIDIAGPU]
	got := q.Value()
	count := channel{name: "count", healthy: got > 0 && got == want,
		detail: fmt.Sprintf("status.allocatable[%s] = %d (%d GPUs × split)", annotation.ResourceNVIDIAGPU, got, simulatedGPUs)}
	raw, present := n.Annotations[annotation.KeyNVIDIAHandshake]
	hv := handshake.Parse(raw, present, time.Local)
	r := handshake.Check(hv, got, now, handshake.Options{})
	hs := channel{name: "handshake", healthy: present && hv.State == handshake.StateRequesting && r.Healthy && !r.NeedUpdate,
		detail: fmt.Sprintf("%s = %s (%s)", annotation.KeyNVIDIAHandshake, raw, r.Reason)}
	return []channel{spec, count, hs}
}

// demo is step 2: a pod asking for 2 GPUs with 10 GiB and 30 % cores each, through
// kube-scheduler, the extender's filter and bind, the kubelet's Allocate and the device
// plugin's protocol.
func (q *quickstart) demo(ctx context.Context) error {
	q.out.step(2, time.Since(q.start), "pod %s/%s: %d GPUs with %d MiB and %d %% cores each, %s", demoNamespace, demoPod, demoGPUs, demoMemMiB, demoCores, allocation.PolicyTopologyAware)
	pods := q.cp.AdminClient().CoreV1().Pods(demoNamespace)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: demoPod, Namespace: demoNamespace,
			Annotations: map[string]string{allocation.KeyGPUSchedulerPolicy: string(allocation.PolicyTopologyAware)}},
		Spec: corev1.PodSpec{
			SchedulerName: schedulerName, // the webhook would set it; see apply
			Containers: []corev1.Container{{Name: "cuda", Image: "nvcr.io/nvidia/cuda:12.6.3-base-ubuntu24.04", Command: []string{"nvidia-smi"},
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
					annotation.ResourceNVIDIAGPU: *resource.NewQuantity(demoGPUs, resource.DecimalSI),
					"nvidia.com/gpumem":          *resource.NewQuantity(demoMemMiB, resource.DecimalSI),
					"nvidia.com/gpucores":        *resource.NewQuantity(demoCores, resource.DecimalSI),
				}}}},
		},
	}
	t := time.Now()
	created, err := pods.Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create pod %s/%s: %w", demoNamespace, demoPod, err)
	}
	q.demoUID = created.UID
	a, err := q.waitForAdmission(ctx, created.UID)
	if err != nil {
		return failed(fmt.Errorf("pod %s/%s was not bound and admitted: %w%s", demoNamespace, demoPod, err, q.podEvents(ctx, created)), "extender", q.extender)
	}
	if a.err != nil {
		return failed(a.err, "deviceplugin", q.plugin)
	}
	admitted := time.Since(t)
	var final *corev1.Pod
	err = q.poll(ctx, func() bool {
		p, err := pods.Get(ctx, demoPod, metav1.GetOptions{})
		if err != nil {
			return false
		}
		final = p
		return p.Annotations[allocation.KeyBindPhase] == string(allocation.PhaseSuccess)
	})
	if err != nil {
		return failed(fmt.Errorf("pod %s/%s has %s %q, want success: %w", demoNamespace, demoPod, allocation.KeyBindPhase, final.Annotations[allocation.KeyBindPhase], err), "deviceplugin", q.plugin)
	}
	var lock string
	err = q.poll(ctx, func() bool {
		n, err := q.cp.AdminClient().CoreV1().Nodes().Get(ctx, q.opts.node, metav1.GetOptions{})
		if err != nil {
			return false
		}
		lock = n.Annotations[nodelock.Key]
		return lock == ""
	})
	if err != nil {
		return fmt.Errorf("the node lock %s=%q is still on %s: %w", nodelock.Key, lock, q.opts.node, err)
	}
	released := time.Since(t)

	q.out.item("scheduled", "kube-scheduler → the extender's filter chose node %s; its bind took the node lock and bound the pod (admitted %v after the create)", final.Spec.NodeName, round(admitted))
	pd, err := allocation.DecodePodDevices(final.Annotations[annotation.KeyNVIDIAAllocated], allocation.VersionMaster)
	if err != nil {
		return fmt.Errorf("pod %s/%s: %s: %w", demoNamespace, demoPod, annotation.KeyNVIDIAAllocated, err)
	}
	for _, ctr := range pd {
		for _, d := range ctr {
			q.out.item("GPU", "%s: %d MiB, %d %% cores", d.UUID, d.Usedmem, d.Usedcores)
			q.demoGPUs = append(q.demoGPUs, d.UUID)
		}
	}
	node, err := q.cp.AdminClient().CoreV1().Nodes().Get(ctx, q.opts.node, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("get node %s: %w", q.opts.node, err)
	}
	choice, err := topologyChoice(annotation.Check(annotation.NVIDIA(), node.Annotations).Devices, node.Annotations[annotation.KeyNVIDIAScore], q.demoGPUs)
	if err != nil {
		return fmt.Errorf("pod %s/%s: %w", demoNamespace, demoPod, err)
	}
	q.out.item("topology", "%s: %s → %s", allocation.KeyGPUSchedulerPolicy, allocation.PolicyTopologyAware, choice)
	q.out.item("annotations", "the pod's, written by the extender (filter, bind) and the device plugin (Allocate):")
	for _, k := range slices.Sorted(maps.Keys(final.Annotations)) {
		if strings.HasPrefix(k, "hami.io/") {
			q.out.item("", "%s: %s", k, final.Annotations[k])
		}
	}
	alloc := a.allocs["cuda"]
	q.demoEnv = alloc.Envs
	q.out.item("env", "what the device plugin returned to the kubelet's Allocate for container cuda (%s %s):", annotation.ResourceNVIDIAGPU, strings.Join(alloc.DeviceIDs[annotation.ResourceNVIDIAGPU], ","))
	for _, k := range slices.Sorted(maps.Keys(alloc.Envs)) {
		q.out.item("", "%s=%s", k, alloc.Envs[k])
	}
	for _, m := range alloc.Mounts {
		q.out.item("", "mount %s ← host %s", m.ContainerPath, m.HostPath)
	}
	q.out.item("lock", "%s released by the device plugin, %s %s, %v after the create", nodelock.Key, allocation.KeyBindPhase, allocation.PhaseSuccess, round(released))
	return nil
}

// podEvents lists the pod's events, for a failure message.
func (q *quickstart) podEvents(ctx context.Context, pod *corev1.Pod) string {
	list, err := q.cp.AdminClient().CoreV1().Events(pod.Namespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.uid=" + string(pod.UID)})
	if err != nil || len(list.Items) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("\nthe pod's events:")
	for _, e := range list.Items {
		fmt.Fprintf(&b, "\n  %s %s: %s", e.Type, e.Reason, e.Message)
	}
	return b.String()
}

// doctor is step 5: cmd/kubectl-hami_doctor (kubectl hami-doctor) on the healthy node and on the pod
// step 3 left Pending over the quota (case P3); then, with the device plugin paused
// (SIGSTOP) so that the doctor sees the broken node before the agent repairs it, the register
// annotation deleted by hand and the doctor again; then the plugin resumed and the time it
// takes to heal the annotation.
func (q *quickstart) doctor(ctx context.Context) error {
	q.out.step(5, time.Since(q.start), "the doctor on %s, healthy and then with one channel broken", q.opts.node)
	out, code, err := q.runDoctor(ctx)
	if err != nil {
		return err
	}
	if code != 0 {
		return fmt.Errorf("doctor node %s exited %d on the healthy node, want 0:\n%s", q.opts.node, code, out)
	}
	q.out.block("   │ ", out)

	// The pod of step 3 over the quota: the pod diagnosis names the case.
	q.out.linef("")
	pod := quotaNamespace + "/" + overPod
	out, code, err = q.runDoctorArgs(ctx, "pod", pod)
	if err != nil {
		return err
	}
	if code != 1 {
		return fmt.Errorf("doctor pod %s exited %d on the pod over the quota, want 1 (a case applies):\n%s", pod, code, out)
	}
	q.out.item("", "%s", podCaseLine(out))

	pid := q.plugin.Pid()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return fmt.Errorf("pause the device plugin: %w", err)
	}
	resumed := false
	resume := func() error {
		if resumed {
			return nil
		}
		resumed = true
		return syscall.Kill(pid, syscall.SIGCONT)
	}
	defer func() { _ = resume() }()
	q.out.linef("")
	q.out.item("break", "device plugin paused (SIGSTOP); deleting %s by hand:", annotation.KeyNVIDIARegister)
	q.out.item("", "kubectl annotate node %s %s-", q.opts.node, annotation.KeyNVIDIARegister)
	patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:null}}}`, annotation.KeyNVIDIARegister)
	nodes := q.cp.AdminClient().CoreV1().Nodes()
	if _, err := nodes.Patch(ctx, q.opts.node, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "kubectl-annotate"}); err != nil {
		return fmt.Errorf("delete the register annotation: %w", err)
	}
	// A write the plugin sent just before it stopped can still land after the deletion: delete
	// again until the annotation has stayed away for a moment.
	var gone time.Time
	err = q.poll(ctx, func() bool {
		n, err := nodes.Get(ctx, q.opts.node, metav1.GetOptions{})
		if err != nil {
			return false
		}
		if _, back := n.Annotations[annotation.KeyNVIDIARegister]; back {
			gone = time.Time{}
			_, _ = nodes.Patch(ctx, q.opts.node, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "kubectl-annotate"})
			return false
		}
		if gone.IsZero() {
			gone = time.Now()
		}
		return time.Since(gone) >= settle
	})
	if err != nil {
		return fmt.Errorf("delete the register annotation: it keeps coming back while the device plugin is paused: %w", err)
	}
	out, code, err = q.runDoctor(ctx)
	if err != nil {
		return err
	}
	if code != 1 {
		return fmt.Errorf("doctor node %s exited %d on the broken node, want 1 (a case applies):\n%s", q.opts.node, code, out)
	}
	q.out.block("   │ ", out)

	if err := resume(); err != nil {
		return fmt.Errorf("resume the device plugin: %w", err)
	}
	t := time.Now()
	q.out.linef("")
	q.out.item("heal", "device plugin resumed (SIGCONT); its watch of the Node sees the deletion")
	err = q.poll(ctx, func() bool {
		n, err := nodes.Get(ctx, q.opts.node, metav1.GetOptions{})
		return err == nil && channelStates(n, time.Now(), q.scores)[0].healthy
	})
	if err != nil {
		return failed(fmt.Errorf("the node agent did not heal %s: %w", annotation.KeyNVIDIARegister, err), "deviceplugin", q.plugin)
	}
	q.out.item("", "%s healed by the node agent %v after it resumed", annotation.KeyNVIDIARegister, round(time.Since(t)))
	out, code, err = q.runDoctor(ctx)
	if err != nil {
		return err
	}
	if code != 0 {
		return fmt.Errorf("doctor node %s exited %d after the heal, want 0:\n%s", q.opts.node, code, out)
	}
	first, _, _ := strings.Cut(out, "\n")
	q.out.item("", "doctor again: %s", first)
	return nil
}

// runDoctor runs kubectl hami-doctor node NAME with the admin kubeconfig; it returns the
// output and the exit status.
func (q *quickstart) runDoctor(ctx context.Context) (string, int, error) {
	return q.runDoctorArgs(ctx, "node", q.opts.node)
}

// runDoctorArgs runs cmd/kubectl-hami_doctor, built as the kubectl plugin kubectl-hami_doctor, with
// args and the admin kubeconfig; it returns the output and the exit status.
func (q *quickstart) runDoctorArgs(ctx context.Context, args ...string) (string, int, error) {
	args = append(args, "--kubeconfig", q.cp.Kubeconfig())
	q.out.item("doctor", "$ kubectl hami-doctor %s", strings.Join(args, " "))
	cmd := exec.CommandContext(ctx, filepath.Join(q.bin, doctorBinary), args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return out.String(), 0, nil
	case errors.As(err, &ee) && ee.ExitCode() > 0:
		return out.String(), ee.ExitCode(), nil
	}
	return "", 0, fmt.Errorf("run cmd/kubectl-hami_doctor: %w\n%s", err, out.String())
}

// keep is step 9 (8 with --mig=false), --keep: everything stays up until Ctrl-C; the kubelet announces each pod it admits.
func (q *quickstart) keep(ctx context.Context) error {
	step := 8
	if q.opts.mig {
		step = 9 // after the MIG node's step
	}
	q.out.step(step, time.Since(q.start), "everything keeps running until Ctrl-C")
	q.kubelet.mu.Lock()
	q.kubelet.announce = func(a admission) {
		switch {
		case a.err != nil:
			q.out.item("kubelet", "pod %s/%s: %v", a.pod.Namespace, a.pod.Name, a.err)
		case len(a.allocs) > 0:
			for c, al := range a.allocs {
				q.out.item("kubelet", "pod %s/%s container %s: Allocate gave %s, NVIDIA_VISIBLE_DEVICES=%s", a.pod.Namespace, a.pod.Name, c,
					strings.Join(al.DeviceIDs[annotation.ResourceNVIDIAGPU], ","), al.Envs["NVIDIA_VISIBLE_DEVICES"])
			}
		}
	}
	q.kubelet.mu.Unlock()
	kc := q.cp.Kubeconfig()
	q.out.item("kubeconfig", "%s (cluster admin)", kc)
	q.out.item("try", "export KUBECONFIG=%s", kc)
	q.out.item("", "kubectl get node %s -o yaml            # the three channels", q.opts.node)
	q.out.item("", "kubectl get pods -A -o wide")
	q.out.item("", "kubectl -n %s describe pod %s               # Pending: over ResourceQuota %s", quotaNamespace, overPod, quotaName)
	q.out.item("", "%s node %s     # cd cmd/kubectl-hami_doctor && go build -o ~/bin/%s .", filepath.Join(q.bin, doctorBinary), q.opts.node, doctorBinary)
	q.out.item("", "%s pod %s/%s", filepath.Join(q.bin, doctorBinary), quotaNamespace, overPod)
	if q.metricsURL != "" {
		q.out.item("", "curl -s %s | grep ^hami_", q.metricsURL)
	}
	if url, err := q.pluginMetrics(ctx); err == nil {
		q.out.item("", "curl -s %s | grep -E '^hami_(vgpu|container)_'   # the node monitor", url)
	}
	q.out.item("", "kill -USR1 %d                         # a critical XID on GPU 0: 10 devices fewer on both channels", q.plugin.Pid())
	q.out.item("logs", "%s/*.log", q.work)
	q.out.item("", "GPU pods with schedulerName %s bound to %s get their Allocate here (no container runtime: they stay Pending)", schedulerName, q.opts.node)
	<-ctx.Done()
	q.out.linef("")
	q.out.linef("quickstart: %v: stopping everything", context.Cause(ctx))
	return nil
}

// podCaseLine is the case line of a pod report ("case  P3-NoNodeFits: ..."), or its first
// line when it has none.
func podCaseLine(out string) string {
	for line := range strings.Lines(out) {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "case "); ok {
			return "pod case: " + strings.TrimSpace(rest)
		}
	}
	first, _, _ := strings.Cut(out, "\n")
	return first
}

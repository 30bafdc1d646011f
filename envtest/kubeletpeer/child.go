package kubeletpeer

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"syscall"

	cadvisorapi "github.com/google/cadvisor/lib/model"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
)

// RunIfChild must come first in TestMain of every test binary (or in main of every program)
// that uses [StartDeviceManager]: StartDeviceManager re-executes the binary as its child, and
// in that child RunIfChild runs the device manager until the parent closes its stdin, and
// returns the child's exit code and true; the caller then exits with that code at once. In
// the binary itself it returns 0 and false at once. ctx is the child's root context (its
// logger is the device manager's).
//
//	func TestMain(m *testing.M) {
//		if code, child := kubeletpeer.RunIfChild(context.Background()); child {
//			os.Exit(code) // the device manager's child ends here
//		}
//		os.Exit(m.Run())
//	}
func RunIfChild(ctx context.Context) (code int, child bool) {
	if os.Getenv(envChild) != "1" {
		return 0, false
	}
	return childMain(ctx), true
}

// childMain runs in a new mount namespace (CLONE_NEWNS, plus CLONE_NEWUSER when not root).
// stdin carries one JSON request per line, stdout one JSON reply per line, stderr is the log.
func childMain(ctx context.Context) int {
	out := &lockedEncoder{enc: json.NewEncoder(os.Stdout)}
	logger := klog.FromContext(ctx)

	if err := setupMounts(os.Getenv(envDir)); err != nil {
		_ = out.Encode(reply{Error: err.Error(), Namespace: true})
		return 1
	}
	// The pods given to "allocate" are the kubelet's active pods from then on, as a pod being
	// admitted is already in the kubelet's pod manager.
	var active []*corev1.Pod
	activePods := func() []*corev1.Pod { return active }
	topo := topologyConfig{policy: os.Getenv(envTopologyPolicy)}
	if n := os.Getenv(envNUMANodes); n != "" {
		topo.numaNodes, _ = strconv.Atoi(n)
	}
	m, tm, err := startManager(logger, activePods, topo)
	if err != nil {
		_ = out.Encode(reply{Error: err.Error()})
		return 1
	}
	_ = out.Encode(reply{})
	// The manager's device health updates go to the parent as they come, between replies.
	stopForward := forwardUpdates(m, out)
	defer func() { stopForward() }()

	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		var req request
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			_ = out.Encode(reply{Error: fmt.Sprintf("bad request %q: %v", in.Text(), err)})
			continue
		}
		var r reply
		switch req.Op {
		case "capacity":
			capacity, allocatable, deleted := m.GetCapacity(logger)
			r.Resources = &Resources{Capacity: counts(capacity), Allocatable: counts(allocatable), Deleted: deleted}
		case "restart":
			if err := m.Stop(logger); err != nil {
				r.Error = "stop device manager: " + err.Error()
				break
			}
			stopForward()
			if m, tm, err = startManager(logger, activePods, topo); err != nil {
				r.Error = err.Error()
				stopForward = func() {}
				break
			}
			stopForward = forwardUpdates(m, out)
		case "allocate":
			if req.Pod == nil {
				r.Error = "allocate: no pod"
				break
			}
			active = append(active, req.Pod)
			r.Allocation, err = allocate(ctx, m, req.Pod, req.Container)
			if err != nil {
				r.Error = err.Error()
			}
		case "admit":
			switch {
			case req.Pod == nil:
				r.Error = "admit: no pod"
			case topo.policy == "":
				r.Error = "admit: no Topology Manager (DeviceManagerOptions.TopologyManagerPolicy is empty)"
			default:
				active = append(active, req.Pod)
				r.Admission = admit(ctx, m, tm, req.Pod)
			}
		case "resourcesStatus":
			if req.Pod == nil || req.Status == nil {
				r.Error = "resourcesStatus: no pod or no status"
				break
			}
			m.UpdateAllocatedResourcesStatus(logger, req.Pod, req.Status)
			r.Status = req.Status
		default:
			r.Error = "unknown request " + strconv.Quote(req.Op)
		}
		if err := out.Encode(r); err != nil {
			return 1
		}
		if m == nil {
			return 1
		}
	}
	// stdin closed: the test process stops us (or died).
	if err := m.Stop(logger); err != nil {
		logger.Error(err, "Stop device manager")
		return 1
	}
	return 0
}

// setupMounts makes every mount private to this namespace (so nothing propagates back to
// the host), covers /var/lib with a tmpfs and bind-mounts the test's folder at the
// device manager's hard-coded /var/lib/kubelet/device-plugins.
func setupMounts(hostDir string) error {
	if hostDir == "" {
		return errors.New(envDir + " is empty")
	}
	// Hold the folder open: the tmpfs may hide it if it lives under /var/lib.
	d, err := os.Open(hostDir)
	if err != nil {
		return fmt.Errorf("open %s: %w", hostDir, err)
	}
	defer func() { _ = d.Close() }()
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private in the new mount namespace: %w", err)
	}
	if err := syscall.Mount("tmpfs", "/var/lib", "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "mode=0755,size=64m"); err != nil {
		return fmt.Errorf("mount tmpfs on /var/lib: %w", err)
	}
	target := pluginapi.DevicePluginPath
	if err := os.MkdirAll(target, 0o750); err != nil {
		return fmt.Errorf("create %s on the tmpfs: %w", target, err)
	}
	src := "/proc/self/fd/" + strconv.Itoa(int(d.Fd()))
	if err := syscall.Mount(src, target, "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mount %s at %s: %w", hostDir, target, err)
	}
	return nil
}

// topologyConfig is the Topology Manager of the child: none (policy "") or the kubelet's with
// policy over numaNodes NUMA nodes.
type topologyConfig struct {
	policy    string
	numaNodes int
}

// startManager builds and starts ManagerImpl as the kubelet's container manager does,
// without pods: no active pods, all sources ready. Without a policy there are no topology
// constraints (the fake Topology Manager); with one, the kubelet's Topology Manager (container
// scope) over topo.numaNodes NUMA nodes, with the device manager as its hint provider.
func startManager(logger klog.Logger, activePods devicemanager.ActivePodsFunc, topo topologyConfig) (*devicemanager.ManagerImpl, topologymanager.Manager, error) {
	tm := topologymanager.NewFakeManager(logger)
	var nodes []cadvisorapi.Node
	if topo.policy != "" {
		for i := range max(topo.numaNodes, 1) {
			nodes = append(nodes, cadvisorapi.Node{Id: i})
		}
		var err error
		if tm, err = topologymanager.NewManager(logger, nodes, topo.policy, topologymanager.ContainerTopologyScope, nil); err != nil {
			return nil, nil, fmt.Errorf("create topology manager: %w", err)
		}
	}
	m, err := devicemanager.NewManagerImpl(logger, nodes, tm)
	if err != nil {
		return nil, nil, fmt.Errorf("create device manager: %w", err)
	}
	tm.AddHintProvider(logger, m)
	ready := config.NewSourcesReady(func(sets.Set[string]) bool { return true })
	if err := m.Start(logger, activePods, ready, containermap.NewContainerMap(), sets.New[string]()); err != nil {
		return nil, nil, fmt.Errorf("start device manager: %w", err)
	}
	return m, tm, nil
}

// admit does what the kubelet's admission does with its Topology Manager: Admit merges the
// device manager's hints under the policy and, when the pod is admitted, allocates each
// container's devices (the device manager's Allocate, aligned to the chosen NUMA nodes).
func admit(ctx context.Context, m *devicemanager.ManagerImpl, tm topologymanager.Manager, pod *corev1.Pod) *Admission {
	res := tm.Admit(ctx, &lifecycle.PodAdmitAttributes{Pod: pod, Operation: lifecycle.AddOperation})
	a := &Admission{Admit: res.Admit, Reason: res.Reason, Message: res.Message}
	if !res.Admit {
		return a
	}
	a.DeviceIDs = map[string]map[string][]string{}
	for _, list := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range list {
			for res, devs := range m.GetDevices(string(pod.UID), c.Name) {
				if a.DeviceIDs[c.Name] == nil {
					a.DeviceIDs[c.Name] = map[string][]string{}
				}
				a.DeviceIDs[c.Name][res] = sets.List(sets.KeySet(devs))
			}
		}
	}
	return a
}

func counts(l corev1.ResourceList) map[string]int64 {
	c := make(map[string]int64, len(l))
	for name, q := range l {
		c[string(name)] = q.Value()
	}
	return c
}

// allocate does what the kubelet does for one container of an admitted pod: ManagerImpl's
// Allocate (GetPreferredAllocation and Allocate on the plugin), then, as the container is
// created, GetDeviceRunContainerOptions; it returns the container's devices and options.
func allocate(ctx context.Context, m *devicemanager.ManagerImpl, pod *corev1.Pod, name string) (*Allocation, error) {
	var ctr *corev1.Container
	for _, list := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range list {
			if list[i].Name == name {
				ctr = &list[i]
			}
		}
	}
	if ctr == nil {
		return nil, fmt.Errorf("allocate: pod %s/%s has no container %q", pod.Namespace, pod.Name, name)
	}
	if err := m.Allocate(ctx, pod, ctr, lifecycle.AddOperation); err != nil {
		return nil, err
	}
	opts, err := m.GetDeviceRunContainerOptions(ctx, pod, ctr)
	if err != nil {
		return nil, err
	}
	a := &Allocation{Envs: map[string]string{}, DeviceIDs: map[string][]string{}}
	if opts != nil {
		for _, e := range opts.Envs {
			a.Envs[e.Name] = e.Value
		}
		for _, mt := range opts.Mounts {
			a.Mounts = append(a.Mounts, Mount{ContainerPath: mt.ContainerPath, HostPath: mt.HostPath, ReadOnly: mt.ReadOnly})
		}
		for _, d := range opts.Devices {
			a.Devices = append(a.Devices, Device{ContainerPath: d.PathInContainer, HostPath: d.PathOnHost, Permissions: d.Permissions})
		}
		for _, d := range opts.CDIDevices {
			a.CDIDevices = append(a.CDIDevices, d.Name)
		}
		for _, an := range opts.Annotations {
			if a.Annotations == nil {
				a.Annotations = map[string]string{}
			}
			a.Annotations[an.Name] = an.Value
		}
	}
	for res, devs := range m.GetDevices(string(pod.UID), name) {
		a.DeviceIDs[res] = sets.List(sets.KeySet(devs))
	}
	return a, nil
}

// lockedEncoder serialises the child's lines on stdout: the replies of the request loop and
// the device health updates of forwardUpdates.
type lockedEncoder struct {
	mu  sync.Mutex
	enc *json.Encoder
}

func (e *lockedEncoder) Encode(v any) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.enc.Encode(v)
}

// forwardUpdates sends each update of m's updates channel (pods whose devices changed
// health) to the parent as a podUpdate line, until the returned stop is called; stop waits
// for it.
func forwardUpdates(m *devicemanager.ManagerImpl, out *lockedEncoder) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-quit:
				return
			case u := <-m.Updates():
				if len(u.PodUIDs) > 0 {
					_ = out.Encode(reply{PodUpdate: u.PodUIDs})
				}
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			close(quit)
			<-done
		})
	}
}

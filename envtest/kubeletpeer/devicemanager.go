package kubeletpeer

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/klog/v2"

	"github.com/hamireg/hamireg/envtest"
	"github.com/hamireg/hamireg/envtest/proc"
)

// Environment of the device-manager child process (see RunIfChild).
const (
	envChild          = "HAMIREG_KUBELETPEER_CHILD"
	envDir            = "HAMIREG_KUBELETPEER_DIR"
	envTopologyPolicy = "HAMIREG_KUBELETPEER_TOPOLOGY_POLICY"
	envNUMANodes      = "HAMIREG_KUBELETPEER_NUMA_NODES"
)

const tempPrefix = "hamireg-kl-"

// ErrNamespace is wrapped by StartDeviceManager when the machine does not let the test
// create a private mount namespace (or mount in it).
var ErrNamespace = errors.New("private mount namespace for the kubelet device manager not available")

// DeviceManagerOptions configures [StartDeviceManager]. The zero value is valid.
type DeviceManagerOptions struct {
	// Dir is the host folder that the manager sees as /var/lib/kubelet/device-plugins (its
	// kubelet.sock, the plugin sockets and the checkpoint). Default: a new folder under
	// os.TempDir(), removed by Stop.
	Dir string
	// StartTimeout bounds Start and Restart. Default: 30 s.
	StartTimeout time.Duration
	// TopologyManagerPolicy, when set, runs the kubelet's Topology Manager
	// (topologymanager.NewManager, container scope) with this policy ("single-numa-node",
	// "restricted", "best-effort", "none") beside the device manager, which is its hint
	// provider, as the kubelet's --topology-manager-policy does; [DeviceManager.Admit] then
	// admits pods through it. Default "": no Topology Manager (no NUMA constraint, and Admit
	// is refused).
	TopologyManagerPolicy string
	// NUMANodes is the number of NUMA nodes (ids 0 to NUMANodes-1) the Topology Manager and
	// the device manager see. Default 2 with a TopologyManagerPolicy.
	NUMANodes int
}

// Resources is what the device manager reports to node status (GetCapacity).
type Resources struct {
	// Capacity is healthy plus unhealthy devices per resource name.
	Capacity map[string]int64 `json:"capacity"`
	// Allocatable is healthy devices per resource name.
	Allocatable map[string]int64 `json:"allocatable"`
	// Deleted lists resources whose plugin has been gone longer than the 5 minute grace
	// period; node status sets their capacity to 0.
	Deleted []string `json:"deleted,omitempty"`
}

// DeviceManager is the kubelet's complete device manager (devicemanager.ManagerImpl from
// k8s.io/kubernetes) running in a child process in a private mount namespace, where a
// tmpfs covers /var/lib and Dir is bind-mounted at the hard-coded
// /var/lib/kubelet/device-plugins. Plugins in the test process use Dir()/kubelet.sock and
// put their sockets in Dir(), exactly as on a node.
type DeviceManager struct {
	opts    DeviceManagerOptions
	base    string // temp folder: log, owner pid, default Dir
	ownsDir bool
	spawner *proc.Spawner
	p       *proc.Process

	mu      sync.Mutex // one request at a time
	stopped bool
	cmds    *os.File
	repR    *os.File
	replies *bufio.Reader

	// lines carries the child's replies from the reader goroutine (readLines), which sends
	// the child's device health updates to updates instead; quit ends the reader, which
	// closes readerDone.
	lines      chan lineResult
	updates    chan []string
	quit       chan struct{}
	readerDone chan struct{}
	status     podRegistry // pods allocated or admitted, for SyncPodStatus
	syncing    atomic.Bool // a SyncPodStatus runs
}

// lineResult is one line of the child's stdout, or the error that ended it.
type lineResult struct {
	line []byte
	err  error
}

// StartDeviceManager starts the child and returns when ManagerImpl.Start has returned
// (kubelet.sock is being served). The test binary's TestMain must call [RunIfChild]
// first. A machine that forbids the namespace makes it return an error wrapping
// ErrNamespace.
func StartDeviceManager(ctx context.Context, opts DeviceManagerOptions) (_ *DeviceManager, err error) {
	if opts.StartTimeout == 0 {
		opts.StartTimeout = 30 * time.Second
	}
	envtest.RemoveStaleDirs(tempPrefix)
	base, err := envtest.MakeTempDir(tempPrefix)
	if err != nil {
		return nil, err
	}
	m := &DeviceManager{opts: opts, base: base, spawner: proc.NewSpawner(),
		lines: make(chan lineResult, 1), updates: make(chan []string, 100), quit: make(chan struct{}), readerDone: make(chan struct{})}
	defer func() {
		if err != nil {
			_ = m.Stop()
		}
	}()
	if m.opts.Dir == "" {
		m.opts.Dir = filepath.Join(base, "device-plugins")
		m.ownsDir = true
	}
	if m.opts.Dir, err = filepath.Abs(m.opts.Dir); err != nil {
		return nil, fmt.Errorf("resolve %s: %w", opts.Dir, err)
	}
	if err := os.MkdirAll(m.opts.Dir, 0o750); err != nil {
		return nil, fmt.Errorf("create %s: %w", m.opts.Dir, err)
	}
	if err := checkSocketPath(m.SocketPath()); err != nil {
		return nil, err
	}
	if err := m.start(ctx); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *DeviceManager) start(ctx context.Context) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find the test binary: %w", err)
	}
	cmdR, cmdW, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("create pipe: %w", err)
	}
	defer func() { _ = cmdR.Close() }() // the child holds its own copy
	repR, repW, err := os.Pipe()
	if err != nil {
		_ = cmdW.Close()
		return fmt.Errorf("create pipe: %w", err)
	}
	defer func() { _ = repW.Close() }() // so that the reader sees EOF when the child exits

	attr := &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
	if uid, gid := os.Getuid(), os.Getgid(); uid != 0 {
		// Unprivileged: a user namespace in which the test user is root, owning the mount
		// namespace (what `unshare -rm` does).
		attr.Cloneflags |= syscall.CLONE_NEWUSER
		attr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: uid, Size: 1}}
		attr.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: gid, Size: 1}}
		attr.GidMappingsEnableSetgroups = false
	}
	p, err := m.spawner.Start(proc.Options{
		Name:        "kubelet device manager",
		Path:        self,
		Args:        []string{"-test.run=^$"}, // never reached when RunIfChild is called
		Env:         append(os.Environ(), envChild+"=1", envDir+"="+m.opts.Dir, envTopologyPolicy+"="+m.opts.TopologyManagerPolicy, envNUMANodes+"="+strconv.Itoa(cmp.Or(m.opts.NUMANodes, 2))),
		LogPath:     m.LogPath(),
		Stdin:       cmdR,
		Stdout:      repW,
		SysProcAttr: attr,
	})
	if err != nil {
		_ = cmdW.Close()
		_ = repR.Close()
		if errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ENOSPC) {
			return fmt.Errorf("%w: clone(CLONE_NEWNS) refused: %w", ErrNamespace, err)
		}
		return err
	}
	m.mu.Lock()
	m.p, m.cmds, m.repR, m.replies = p, cmdW, repR, bufio.NewReader(repR)
	m.mu.Unlock()
	go m.readLines(m.replies)

	// The child answers once when the mounts are in place and ManagerImpl has started.
	ctx, cancel := context.WithTimeoutCause(ctx, m.opts.StartTimeout,
		fmt.Errorf("kubelet device manager not started within %v", m.opts.StartTimeout))
	defer cancel()
	if _, err := m.readReply(ctx); err != nil {
		return err
	}
	return nil
}

// Admission is the kubelet's admission verdict on a pod under the Topology Manager
// ([DeviceManager.Admit]): Admit, and else the Reason ("TopologyAffinityError" when no
// NUMA alignment satisfies the policy) and Message; when admitted, the device ids the device
// manager allocated, by container and resource (sorted).
type Admission struct {
	Admit     bool                           `json:"admit"`
	Reason    string                         `json:"reason,omitempty"`
	Message   string                         `json:"message,omitempty"`
	DeviceIDs map[string]map[string][]string `json:"deviceIDs,omitempty"`
}

type request struct {
	Op        string            `json:"op"`
	Pod       *corev1.Pod       `json:"pod,omitempty"`
	Container string            `json:"container,omitempty"`
	Status    *corev1.PodStatus `json:"status,omitempty"` // op resourcesStatus
}

type reply struct {
	Error      string            `json:"error,omitempty"`
	Namespace  bool              `json:"namespace,omitempty"` // the error is about the namespace setup
	Resources  *Resources        `json:"resources,omitempty"`
	Allocation *Allocation       `json:"allocation,omitempty"`
	Admission  *Admission        `json:"admission,omitempty"`
	Status     *corev1.PodStatus `json:"status,omitempty"` // op resourcesStatus
	// PodUpdate is not a reply: the child sends it, unasked, when the manager's updates
	// channel names pods whose devices changed health.
	PodUpdate []string `json:"podUpdate,omitempty"`
}

// Allocation is what the kubelet's device manager gave one container: the device ids it
// chose per resource (sorted) and the plugin's environment, mounts, device nodes, CDI
// devices and annotations as the container runtime gets them (GetDeviceRunContainerOptions).
type Allocation struct {
	DeviceIDs   map[string][]string `json:"deviceIDs,omitempty"`
	Envs        map[string]string   `json:"envs,omitempty"`
	Mounts      []Mount             `json:"mounts,omitempty"`
	Devices     []Device            `json:"devices,omitempty"`
	CDIDevices  []string            `json:"cdiDevices,omitempty"`
	Annotations map[string]string   `json:"annotations,omitempty"`
}

// Device is one device node of an [Allocation] (the plugin's DeviceSpec).
type Device struct {
	ContainerPath string `json:"containerPath"`
	HostPath      string `json:"hostPath"`
	Permissions   string `json:"permissions,omitempty"`
}

// Mount is one mount of an [Allocation].
type Mount struct {
	ContainerPath string `json:"containerPath"`
	HostPath      string `json:"hostPath"`
	ReadOnly      bool   `json:"readOnly,omitempty"`
}

// readLines reads the child's stdout until it ends or quit is closed: device health updates
// go to m.updates (dropped when it is full, as the kubelet's channel drops them), replies
// and the final error to m.lines.
func (m *DeviceManager) readLines(r *bufio.Reader) {
	defer close(m.readerDone)
	for {
		line, err := r.ReadBytes('\n')
		if err == nil {
			var u struct {
				PodUpdate []string `json:"podUpdate"`
			}
			if json.Unmarshal(line, &u) == nil && len(u.PodUpdate) > 0 {
				select {
				case m.updates <- u.PodUpdate:
				default:
				}
				continue
			}
		}
		select {
		case m.lines <- lineResult{line, err}:
		case <-m.quit:
			return
		}
		if err != nil {
			return
		}
	}
}

func (m *DeviceManager) readReply(ctx context.Context) (*reply, error) {
	var res lineResult
	select {
	case res = <-m.lines:
	case <-ctx.Done():
		_ = m.p.Stop(time.Second) // unblocks the reader
		return nil, fmt.Errorf("kubelet device manager: %w\n%s", context.Cause(ctx), m.p.LogTail(20))
	}
	if res.err != nil {
		<-m.p.Exited()
		return nil, fmt.Errorf("kubelet device manager exited (%w)\n%s", m.p.ExitError(), m.p.LogTail(20))
	}
	var r reply
	if err := json.Unmarshal(res.line, &r); err != nil {
		return nil, fmt.Errorf("kubelet device manager: unexpected output %q: the test binary must call kubeletpeer.RunIfChild first in TestMain and exit when it reports the child", truncate(res.line, 200))
	}
	if r.Error != "" {
		if r.Namespace {
			return nil, fmt.Errorf("%w: %s", ErrNamespace, r.Error)
		}
		return nil, errors.New(r.Error)
	}
	return &r, nil
}

func truncate(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}

func (m *DeviceManager) call(ctx context.Context, op string) (*reply, error) {
	return m.do(ctx, request{Op: op})
}

func (m *DeviceManager) do(ctx context.Context, req request) (*reply, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopped {
		return nil, errors.New("kubelet device manager stopped")
	}
	b, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("encode %s request: %w", req.Op, err)
	}
	if _, err := m.cmds.Write(append(b, '\n')); err != nil {
		return nil, fmt.Errorf("send %s to the kubelet device manager: %w", req.Op, err)
	}
	r, err := m.readReply(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", req.Op, err)
	}
	return r, nil
}

// Allocate does what the kubelet does for container of pod when it admits the pod and
// creates the container: ManagerImpl.Allocate (which calls the plugin's
// GetPreferredAllocation, if it has one, and Allocate for each device-plugin resource in the
// container's limits), then GetDeviceRunContainerOptions. Call it for the init containers
// first, then the others, as the kubelet does. From then on pod counts as active (its
// devices stay allocated). The error is the device manager's, with the plugin's text, as
// the kubelet's admission shows it (UnexpectedAdmissionError).
func (m *DeviceManager) Allocate(ctx context.Context, pod *corev1.Pod, container string) (Allocation, error) {
	r, err := m.do(ctx, request{Op: "allocate", Pod: pod, Container: container})
	if err != nil {
		return Allocation{}, err
	}
	m.status.add(pod)
	if r.Allocation == nil {
		return Allocation{}, errors.New("allocate: empty reply")
	}
	return *r.Allocation, nil
}

// Admit does what the kubelet's admission does for pod under the Topology Manager of
// [DeviceManagerOptions.TopologyManagerPolicy]: the policy merges the device manager's NUMA
// hints (from the devices' Topology the plugin sent in ListAndWatch) and admits or refuses the
// pod; an admitted pod's containers get their devices (the device manager's Allocate, aligned
// to the chosen NUMA nodes, GetPreferredAllocation and the plugin's Allocate included) and the
// pod counts as active from then on. It is an error without a TopologyManagerPolicy.
func (m *DeviceManager) Admit(ctx context.Context, pod *corev1.Pod) (Admission, error) {
	r, err := m.do(ctx, request{Op: "admit", Pod: pod})
	if err != nil {
		return Admission{}, err
	}
	m.status.add(pod)
	if r.Admission == nil {
		return Admission{}, errors.New("admit: empty reply")
	}
	return *r.Admission, nil
}

// Capacity returns ManagerImpl.GetCapacity: what the kubelet would put in the Node's
// status (capacity, allocatable, and resources past their grace period).
func (m *DeviceManager) Capacity(ctx context.Context) (Resources, error) {
	r, err := m.call(ctx, "capacity")
	if err != nil {
		return Resources{}, err
	}
	if r.Resources == nil {
		return Resources{}, errors.New("capacity: empty reply")
	}
	return *r.Resources, nil
}

// WaitForResources polls Capacity every 10 ms until resource reads capacity and
// allocatable, and returns the last value read. When ctx ends first it returns an error that
// names the wanted and the last read values (bound the wait with a deadline on ctx).
func (m *DeviceManager) WaitForResources(ctx context.Context, resource string, capacity, allocatable int64) (Resources, error) {
	var last Resources
	err := wait.PollUntilContextCancel(ctx, 10*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		r, err := m.Capacity(ctx)
		if err != nil {
			return false, err
		}
		last = r
		return r.Capacity[resource] == capacity && r.Allocatable[resource] == allocatable, nil
	})
	if err != nil {
		return last, fmt.Errorf("wait for %s capacity %d allocatable %d, last read %+v: %w", resource, capacity, allocatable, last, err)
	}
	return last, nil
}

// Restart simulates a kubelet restart: ManagerImpl.Stop (every plugin is disconnected),
// then a new ManagerImpl on the same folder, which reads the checkpoint, deletes the plugin
// sockets and re-creates kubelet.sock. Plugins must notice and register again; until then
// their resources read 0.
func (m *DeviceManager) Restart(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, m.opts.StartTimeout)
	defer cancel()
	_, err := m.call(ctx, "restart")
	return err
}

// Dir is the host folder the manager sees as /var/lib/kubelet/device-plugins.
func (m *DeviceManager) Dir() string { return m.opts.Dir }

// SocketPath is Dir()/kubelet.sock, where plugins send Register.
func (m *DeviceManager) SocketPath() string { return filepath.Join(m.opts.Dir, "kubelet.sock") }

// LogPath is the child's log (klog output of ManagerImpl).
func (m *DeviceManager) LogPath() string { return filepath.Join(m.base, "devicemanager.log") }

// LogTail returns the last n lines of the child's log, for failure messages.
func (m *DeviceManager) LogTail(n int) string { return proc.Tail(m.LogPath(), n) }

// Stop stops ManagerImpl and the child, and removes the temporary folder (and Dir, if it
// made it). It is safe to call more than once.
func (m *DeviceManager) Stop() error {
	m.mu.Lock()
	if m.stopped {
		m.mu.Unlock()
		return nil
	}
	m.stopped = true
	p, cmds, repR := m.p, m.cmds, m.repR
	m.mu.Unlock()

	var errs []error
	if cmds != nil {
		_ = cmds.Close() // EOF: the child stops ManagerImpl and exits
	}
	if p != nil {
		select {
		case <-p.Exited():
		case <-time.After(5 * time.Second):
			if err := p.Stop(5 * time.Second); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if repR != nil {
		_ = repR.Close()
		close(m.quit)
		<-m.readerDone
	}
	m.spawner.Close()
	if err := os.RemoveAll(m.base); err != nil {
		errs = append(errs, err)
	}
	if m.ownsDir {
		_ = os.RemoveAll(m.opts.Dir)
	}
	return errors.Join(errs...)
}

// UpdateNodeStatus writes Capacity() into the Node's status the way the kubelet's node
// status setter does: capacity and allocatable per resource, and capacity 0 for deleted
// resources. Other status fields are kept.
func (m *DeviceManager) UpdateNodeStatus(ctx context.Context, nodes corev1client.NodesGetter, nodeName string) error {
	res, err := m.Capacity(ctx)
	if err != nil {
		return err
	}
	capacity, allocatable := map[string]any{}, map[string]any{}
	for name, v := range res.Capacity {
		capacity[name] = resource.NewQuantity(v, resource.DecimalSI).String()
	}
	for name, v := range res.Allocatable {
		allocatable[name] = resource.NewQuantity(v, resource.DecimalSI).String()
	}
	for _, name := range res.Deleted {
		capacity[name] = "0"
		allocatable[name] = "0"
	}
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"capacity": capacity, "allocatable": allocatable}})
	if err != nil {
		return err
	}
	_, err = nodes.Nodes().Patch(ctx, nodeName, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
	if err != nil {
		return fmt.Errorf("update status of node %s: %w", nodeName, err)
	}
	return nil
}

// UpdateAllocatedResourcesStatus is the device manager's part of the kubelet's pod status
// (ManagerImpl.UpdateAllocatedResourcesStatus, in the child): for each entry of
// status.ContainerStatuses whose container got devices through [DeviceManager.Allocate] or
// [DeviceManager.Admit], it sets one allocatedResourcesStatus entry per device-plugin
// resource (name: the resource, e.g. nvidia.com/gpu) listing each device the container holds
// (resourceID: the device ID from ListAndWatch, e.g. HAMi's replica ID <GPU UUID>-<i>) as
// Healthy, or Unhealthy when the plugin's last ListAndWatch marked it so or the plugin is
// gone. Other entries (DRA claims') are kept. It returns the updated status and writes
// nothing to the API server.
func (m *DeviceManager) UpdateAllocatedResourcesStatus(ctx context.Context, pod *corev1.Pod, status *corev1.PodStatus) (*corev1.PodStatus, error) {
	r, err := m.do(ctx, request{Op: "resourcesStatus", Pod: pod, Status: status})
	if err != nil {
		return nil, err
	}
	if r.Status == nil {
		return nil, errors.New("resourcesStatus: empty reply")
	}
	return r.Status, nil
}

// WritePodStatus is the kubelet's status sync of pod as far as device-plugin device health
// goes: it reads the pod from the API server, adds a waiting container status (reason
// ContainerCreating) for each container the status lacks, sets the allocatedResourcesStatus
// of the containers with [DeviceManager.UpdateAllocatedResourcesStatus] and writes the status
// (UpdateStatus, retried on conflicts) when it changed. pods needs get and update of
// pods/status.
func (m *DeviceManager) WritePodStatus(ctx context.Context, pods corev1client.PodsGetter, pod *corev1.Pod) error {
	return writePodStatus(ctx, pods, types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}, func(p *corev1.Pod, s *corev1.PodStatus) error {
		updated, err := m.UpdateAllocatedResourcesStatus(ctx, p, s)
		if err != nil {
			return err
		}
		*s = *updated
		return nil
	})
}

// SyncPodStatus is the kubelet's sync loop for device health (the device manager's updates
// channel, which ManagerImpl fills when a ListAndWatch message changes the health of a
// device a pod holds, as kubelet.go's syncLoopIteration reads containerManager.Updates()):
// it writes the status of the pods named ([DeviceManager.WritePodStatus]) among those given
// to Allocate or Admit. It blocks until ctx ends or the manager stops, then returns nil; a
// failed write is logged (klog.FromContext(ctx)) and the loop goes on. One SyncPodStatus at
// a time ([ErrSyncRunning]). Updates that arrive while none runs are kept, up to 100 (the
// device manager's channel size), and handled when one starts.
func (m *DeviceManager) SyncPodStatus(ctx context.Context, pods corev1client.PodsGetter) error {
	if !m.syncing.CompareAndSwap(false, true) {
		return fmt.Errorf("sync pod status of the device manager: %w", ErrSyncRunning)
	}
	defer m.syncing.Store(false)
	logger := klog.FromContext(ctx)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-m.readerDone:
			return nil
		case uids := <-m.updates:
			syncPods(ctx, logger, pods, uids, &m.status, m.WritePodStatus)
		}
	}
}

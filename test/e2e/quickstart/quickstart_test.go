// Package quickstart_test runs the examples/quickstart binary end to end, as `make
// quickstart` does: its own control plane, kube-scheduler, the kubelet's device manager,
// examples/extender and examples/deviceplugin --simulate dgxa100. It checks the exit status,
// the lines each step prints, and that nothing it started is left running or on disk, on the
// normal path and when Ctrl-C ends --keep.
package quickstart_test

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hamireg/hamireg/envtest"
)

// envMarker is set in the quickstart's environment; every process it starts inherits it, so a
// scan of /proc finds whatever outlives it.
const envMarker = "HAMIREG_QUICKSTART_E2E"

var (
	buildOnce sync.Once
	bin       string
	errBuild  error
)

// quickstartBin builds examples/quickstart (its own module) once per test binary.
func quickstartBin(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "hamireg-qs-bin-") //nolint:usetesting // shared by the tests, removed by TestMain
		if err != nil {
			errBuild = err
			return
		}
		bin = filepath.Join(dir, "quickstart")
		args := []string{"build", "-o", bin}
		if race {
			args = append(args, "-race")
		}
		cmd := exec.Command("go", append(args, ".")...)
		cmd.Dir = filepath.Join("..", "..", "..", "examples", "quickstart")
		if out, err := cmd.CombinedOutput(); err != nil {
			errBuild = fmt.Errorf("go build examples/quickstart: %w\n%s", err, out)
		}
	})
	if errBuild != nil {
		t.Fatal(errBuild)
	}
	return bin
}

func TestMain(m *testing.M) {
	code := m.Run()
	if bin != "" {
		_ = os.RemoveAll(filepath.Dir(bin))
	}
	os.Exit(code)
}

// run is one quickstart process with its output collected line by line.
type run struct {
	cmd    *exec.Cmd
	marker string
	mu     sync.Mutex
	out    bytes.Buffer
	lines  chan string
	done   chan struct{}
}

// start runs the quickstart with args; the node is named after the test.
func start(t *testing.T, args ...string) *run {
	t.Helper()
	if os.Getenv(envtest.EnvBinDir) == "" {
		t.Fatal(envtest.ErrBinariesMissing)
	}
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	r := &run{marker: hex.EncodeToString(b), lines: make(chan string, 1024), done: make(chan struct{})}
	args = append([]string{"--k8s-bin", os.Getenv(envtest.EnvBinDir), "--programs", t.TempDir(), "--repo", filepath.Join("..", "..", "..")}, args...)
	r.cmd = exec.Command(quickstartBin(t), args...)
	r.cmd.Env = append(os.Environ(), envMarker+"="+r.marker)
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	pr, pw := io.Pipe()
	r.cmd.Stdout, r.cmd.Stderr = pw, pw
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(r.done)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			r.mu.Lock()
			r.out.WriteString(sc.Text() + "\n")
			r.mu.Unlock()
			select {
			case r.lines <- sc.Text():
			default:
			}
		}
	}()
	go func() {
		_ = r.cmd.Wait()
		_ = pw.Close()
	}()
	t.Cleanup(func() {
		if r.cmd.ProcessState == nil {
			_ = r.cmd.Process.Kill()
		}
		<-r.done
		if t.Failed() {
			t.Logf("quickstart output:\n%s", r.output())
		}
	})
	return r
}

func (r *run) output() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.out.String()
}

// waitLine waits for a line containing s.
func (r *run) waitLine(t *testing.T, s string, timeout time.Duration) {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case l := <-r.lines:
			if strings.Contains(l, s) {
				return
			}
		case <-r.done:
			t.Fatalf("quickstart ended before printing %q", s)
		case <-deadline:
			t.Fatalf("no line with %q within %v", s, timeout)
		}
	}
}

// wait waits for the process to exit and returns its exit status.
func (r *run) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(timeout):
		t.Fatalf("quickstart still running after %v", timeout)
	}
	for r.cmd.ProcessState == nil {
		time.Sleep(10 * time.Millisecond)
	}
	return r.cmd.ProcessState.ExitCode()
}

// wantNothingLeft checks that no process with the run's marker is alive and that the work
// folders it printed and the peers' temporary folders it owned are gone.
func (r *run) wantNothingLeft(t *testing.T) {
	t.Helper()
	procs, _ := filepath.Glob("/proc/[0-9]*/environ")
	needle := []byte(envMarker + "=" + r.marker)
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !bytes.Contains(b, needle) {
			continue
		}
		args, _ := os.ReadFile(filepath.Join(filepath.Dir(p), "cmdline"))
		t.Errorf("left running: pid %s: %s", filepath.Base(filepath.Dir(p)), bytes.ReplaceAll(args, []byte{0}, []byte{' '}))
	}
	work := regexp.MustCompile(`in (/\S+hamireg-qs-\d+)`).FindStringSubmatch(r.output())
	if work == nil {
		t.Errorf("no work folder in the first line")
	} else if _, err := os.Stat(work[1]); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("work folder %s left behind (%v)", work[1], err)
	}
	pid := fmt.Sprint(r.cmd.Process.Pid)
	for _, prefix := range []string{"hamireg-e2e-", "hamireg-kl-", "hamireg-qs-"} {
		dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), prefix+"*"))
		for _, d := range dirs {
			if owner, err := os.ReadFile(filepath.Join(d, "owner.pid")); err == nil && strings.TrimSpace(string(owner)) == pid {
				t.Errorf("left behind: %s", d)
			}
		}
	}
}

// TestQuickstart is `make quickstart` without --keep: every step's lines, exit 0, nothing left.
func TestQuickstart(t *testing.T) {
	r := start(t, "--node", "qs-node")
	if code := r.wait(t, 5*time.Minute); code != 0 {
		t.Fatalf("exit status %d, want 0", code)
	}
	out := r.output()
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^quickstart: a HAMi-compatible GPU cluster on 127\.0\.0\.1, in /`),
		regexp.MustCompile(`(?m)^== 0\. the peers and the programs`),
		regexp.MustCompile(`(?m)^   kubelet +device manager .* serving /\S+/kubelet\.sock`),
		regexp.MustCompile(`(?m)^   apiserver +etcd \S+ and kube-apiserver v1\.\d+\.\d+ \(TLS, RBAC\) ready`),
		regexp.MustCompile(`(?m)^   scheduler +kube-scheduler .* leads Lease kube-system/hami-scheduler as hami-scheduler-\S+_`),
		// Step 1: each channel healthy, with its time.
		regexp.MustCompile(`(?m)^== 1\. node qs-node: its three channels`),
		regexp.MustCompile(`(?m)^ +ENABLE_TOPOLOGY_SCORE=true HOOK_PATH=/usr/local `),
		// The simulated DGX A100 (NVSwitch): 12 NVLinks × 100 plus the PCIe level.
		regexp.MustCompile(`(?m)^   spec +healthy after \S+ +hami\.io/node-nvidia-register: 8 × .*A100.*, split 10, health true; hami\.io/node-nvidia-score: 28 pairs scored 1240 ×4, 1220 ×8, 1210 ×16$`),
		regexp.MustCompile(`(?m)^   count +healthy after \S+ +status\.allocatable\[nvidia\.com/gpu\] = 80 `),
		regexp.MustCompile(`(?m)^   handshake +healthy after \S+ +hami\.io/node-handshake = Requesting_\d{4}-\d\d-\d\d \d\d:\d\d:\d\d `),
		// Step 2: the choice, the annotations, the env, the lock.
		regexp.MustCompile(`(?m)^== 2\. pod default/demo: 2 GPUs with 10240 MiB and 30 % cores each, topology-aware`),
		regexp.MustCompile(`(?m)^   scheduled +.*chose node qs-node`),
		regexp.MustCompile(`(?m)^   GPU +GPU-[0-9a-f-]+: 10240 MiB, 30 % cores\n   GPU +GPU-[0-9a-f-]+: 10240 MiB, 30 % cores$`),
		regexp.MustCompile(`(?m)^   topology +hami\.io/gpu-scheduler-policy: topology-aware → GPUs (0 and 1|2 and 3|4 and 5|6 and 7), pair score 1240: the node's best \(4 of its 28 choices score 1240\)$`),
		regexp.MustCompile(`(?m)^ +hami\.io/bind-phase: success$`),
		regexp.MustCompile(`(?m)^ +hami\.io/gpu-scheduler-policy: topology-aware$`),
		regexp.MustCompile(`(?m)^ +hami\.io/vgpu-devices-allocated: GPU-[0-9a-f-]+,NVIDIA,10240,30:GPU-[0-9a-f-]+,NVIDIA,10240,30:;$`),
		regexp.MustCompile(`(?m)^ +hami\.io/vgpu-node: qs-node$`),
		regexp.MustCompile(`(?m)^ +NVIDIA_VISIBLE_DEVICES=GPU-[0-9a-f-]+,GPU-[0-9a-f-]+$`),
		regexp.MustCompile(`(?m)^ +CUDA_DEVICE_MEMORY_LIMIT_0=10240m$`),
		regexp.MustCompile(`(?m)^ +CUDA_DEVICE_MEMORY_LIMIT_1=10240m$`),
		regexp.MustCompile(`(?m)^ +CUDA_DEVICE_SM_LIMIT=30$`),
		regexp.MustCompile(`(?m)^   lock +hami\.io/mutex\.lock released by the device plugin`),
		// Step 3: the quota, a pod under it placed, one over it Pending with the reason.
		regexp.MustCompile(`(?m)^== 3\. namespace team-a: ResourceQuota limits\.nvidia\.com/gpumem = 20000 `),
		regexp.MustCompile(`(?m)^   placed +pod team-a/small, 1 GPU with 8000 MiB: on qs-node, hami\.io/bind-phase success`),
		regexp.MustCompile(`(?m)^   pending +pod team-a/big, 2 GPUs with 8000 MiB each: Pending, not bound`),
		regexp.MustCompile(`(?m)^ +Warning FilteringFailed: 1 nodes ResourceQuotaNotFit\(qs-node\)$`),
		regexp.MustCompile(`(?m)^ +Warning FilteringFailed: no available node, 1 nodes do not meet$`),
		regexp.MustCompile(`(?m)^ +Warning ResourceQuotaNotFit: namespace team-a over ResourceQuota gpu-quota limits\.nvidia\.com/gpumem 20000: 8000 MiB used by team-a/small \(8000 MiB\), the pod asks 16000 MiB$`),
		// Step 4: HAMi's gauges from the extender's /metrics.
		regexp.MustCompile(`(?m)^== 4\. the extender's /metrics`),
		regexp.MustCompile(`(?m)^   scrape +GET http://127\.0\.0\.1:\d+/metrics: \d+ samples`),
		regexp.MustCompile(`(?m)^ +hami_gpu_memory_allocated_bytes\{.*device_uuid="GPU-[0-9a-f-]+",node="qs-node",zone="vGPU"\} 1\.073741824e\+10\n +hami_gpu_memory_allocated_bytes\{.*\} 1\.073741824e\+10$`),
		regexp.MustCompile(`(?m)^ +hami_vgpu_memory_allocated_bytes\{container_index="0",device_uuid="GPU-[0-9a-f-]+",namespace="default",node="qs-node",pod="demo",zone="vGPU"\} 1\.073741824e\+10$`),
		regexp.MustCompile(`(?m)^ +hami_resource_quota_used\{limit="20000",namespace="team-a",quota_name="nvidia\.com/gpumem",zone="vGPU"\} 8000$`),
		// Step 4 too: the demo container's region, as HAMi-core writes it, on the device
		// plugin's node monitor.
		regexp.MustCompile(`(?m)^   region +container cuda's HAMi-core region, .*: /\S+/hook/vgpu/containers/[0-9a-f-]{36}_cuda/[0-9a-f-]+\.cache$`),
		regexp.MustCompile(`(?m)^   monitor +GET http://127\.0\.0\.1:\d+/metrics: the device plugin's node monitor`),
		regexp.MustCompile(`(?m)^   usage +default/demo cuda (GPU-[0-9a-f-]+): 3072 MiB of 10240 MiB, SM 25 %\n   usage +default/demo cuda GPU-[0-9a-f-]+: 1024 MiB of 10240 MiB, SM 10 %$`),
		// Step 5: healthy, the case and its fix, the heal.
		regexp.MustCompile(`(?m)^== 5\. the doctor on qs-node`),
		regexp.MustCompile(`(?m)^   │ Node qs-node: healthy$`),
		regexp.MustCompile(`(?m)^   doctor +\$ kubectl hami-doctor pod team-a/big --kubeconfig \S+$`),
		regexp.MustCompile(`(?m)^ +pod case: P3-NoNodeFits: .*quota`),
		regexp.MustCompile(`(?m)^   │ Node qs-node: case 4: register annotation missing or unusable$`),
		regexp.MustCompile(`(?m)^   │ +fix: +kubectl -n kube-system logs hami-device-plugin-\S+ -c device-plugin`),
		regexp.MustCompile(`(?m)^ +hami\.io/node-nvidia-register healed by the node agent \S+ after it resumed$`),
		regexp.MustCompile(`(?m)^ +doctor again: Node qs-node: healthy$`),
		// Step 6: DRA on the same node: one idle GPU to claims, the slice, the cordon, a claim
		// of 10Gi and 30 cores placed by kube-scheduler and prepared, its CDI edits.
		regexp.MustCompile(`(?m)^== 6\. DRA on node qs-node: GPU [0-7] to claims, the other 7 stay with the device plugin`),
		regexp.MustCompile(`(?m)^   kubelet +DRA manager \(k8s\.io/kubernetes pkg/kubelet/cm/dra\) watching /\S+/plugins_registry`),
		regexp.MustCompile(`(?m)^   plugin +examples/deviceplugin restarted with .* --dra --dra-profile=sdk --dra-gpus=[0-7] --cdi-dir=/\S+ `),
		regexp.MustCompile(`(?m)^   slice +ResourceSlice \S+ of driver gpu\.hamireg\.io, \S+ after the restart: 8 devices; gpu-[0-7] \(cores=100 memory=40Gi shares=10\) for claims; 7 tainted gpu\.hamireg\.io/owned-by-hami:NoSchedule$`),
		regexp.MustCompile(`(?m)^   extender +hami\.io/device-cordon: GPU-[0-9a-f-]+ \(HAMi's extender gives it no pod\); status\.allocatable\[nvidia\.com/gpu\] = 70$`),
		regexp.MustCompile(`(?m)^   scheduled +kube-scheduler's DynamicResources plugin allocated gpu\.hamireg\.io/gpu-[0-7] of pool qs-node \(shareID [0-9a-f-]{36}\), consumed cores=30 memory=10Gi shares=1; pod bound to qs-node`),
		regexp.MustCompile(`(?m)^   CDI +what the kubelet hands the container runtime for container cuda: k8s\.hamireg\.io/claim=[0-9a-f-]{36}-gpu-[0-7]$`),
		regexp.MustCompile(`(?m)^ +CUDA_DEVICE_MEMORY_LIMIT_0=10240m$\n(?: +\S+\n)*? +CUDA_DEVICE_SM_LIMIT_0=30$`),
		regexp.MustCompile(`(?m)^ +mount /etc/ld\.so\.preload ← host \S+$`),
		regexp.MustCompile(`(?m)^   beside +step 2's pod default/demo on the same node, through the device plugin's Allocate: CUDA_DEVICE_MEMORY_LIMIT_0=10240m CUDA_DEVICE_MEMORY_LIMIT_1=10240m .*CUDA_DEVICE_SM_LIMIT=30 .*NVIDIA_VISIBLE_DEVICES=GPU-`),
		// Step 6 too: the extended-resource mapping: a DRA node (every GPU DRA's, count 0),
		// the DeviceClass with extendedResourceName, and one pod spec on both kinds of node.
		regexp.MustCompile(`(?m)^   DRA node +qs-node-dra: examples/deviceplugin --dra --dra-profile=sdk \(no --dra-gpus: every GPU DRA's\); status\.allocatable\[nvidia\.com/gpu\] = 0, `),
		regexp.MustCompile(`(?m)^   mapping +DeviceClass gpu\.hamireg\.io with extendedResourceName nvidia\.com/gpu \(examples/deviceplugin/deploy/mapping/deviceclass\.yaml\)`),
		regexp.MustCompile(`(?m)^   pods +gpu-anywhere-0 and gpu-anywhere-1, one spec: limits nvidia\.com/gpu: 1, a required anti-affinity on kubernetes\.io/hostname, on qs-node or qs-node-dra$`),
		regexp.MustCompile(`(?m)^   gpu-anywhere-0 on qs-node through the device plugin, admitted \S+ after the create: hami\.io/vgpu-devices-to-allocate=GPU-[0-9a-f-]+,NVIDIA,40960,0:;$\n +the device manager's Allocate for container cuda: CUDA_DEVICE_MEMORY_LIMIT_0=40960m .*NVIDIA_VISIBLE_DEVICES=GPU-`),
		regexp.MustCompile(`(?m)^   gpu-anywhere-1 on qs-node-dra through DRA, admitted \S+ after the create: kube-scheduler wrote ResourceClaim gpu-anywhere-1-extended-resources-\S+ \(owner: the pod\) for nvidia\.com/gpu, allocated gpu\.hamireg\.io/gpu-[0-7], consumed cores=0 memory=40Gi shares=1; no HAMi annotation$\n +the DRA manager's CDI edits for container cuda \(the whole GPU\): CUDA_DEVICE_MEMORY_LIMIT_0=40960m .*NVIDIA_VISIBLE_DEVICES=GPU-`),
		regexp.MustCompile(`(?m)^ +pods deleted; DeviceClass gpu\.hamireg\.io applied again without the mapping`),
		// Step 7: examples/scheduler (kube-scheduler with the HAMiGPU plugin): a preemption and
		// a requeue on one GPU.
		regexp.MustCompile(`(?m)^== 7\. the scheduler plugin: preemption and requeue on node qs-node`),
		regexp.MustCompile(`(?m)^   scheduler +examples/scheduler \(kube-scheduler v1\.\d+\.\d+ with the HAMiGPU plugin, profile hami-plugin-scheduler\) ready`),
		regexp.MustCompile(`(?m)^   low +pod default/plugin-low \(priority 100\): 100 % of GPU-[0-9a-f-]+'s memory, bound by the plugin and allocated$`),
		regexp.MustCompile(`(?m)^   preempted +pod default/plugin-high \(priority 1000\) needs 60 % of GPU-[0-9a-f-]+: kube-scheduler's preemption evicted plugin-low, the only victim; bound in \S+$`),
		regexp.MustCompile(`(?m)^   pending +pod default/plugin-waiting \(priority 100\), 60 % of GPU-[0-9a-f-]+: it cannot preempt a higher priority: 0/\d+ nodes are available: .*CardInsufficientMemory`),
		regexp.MustCompile(`(?m)^   requeued +plugin-high deleted: plugin-waiting bound and allocated \S+ later \(the plugin's queueing hint`),
		// Step 8: the MIG node, its profiles, a pod reserved 2g.10gb and the MIG device it got.
		regexp.MustCompile(`(?m)^== 8\. node qs-node-mig: 8 simulated A100s in MIG mode, and a MIG pod`),
		regexp.MustCompile(`(?m)^   register +hami\.io/node-nvidia-register: 8 GPUs in mode mig, the first:\n +\{"id":"GPU-[0-9a-f-]+","count":7,"devmem":40960,"devcore":100,.*"mode":"mig","migProfiles":\[\{"name":"1g\.5gb","memoryMB":4864,"core":15,"sliceCount":1,`),
		regexp.MustCompile(`(?m)^   reserved +pod default/mig-demo \(1 GPU, 9000 MiB\): profile 2g\.10gb at placement \d\+2 of GPU-[0-9a-f-]+; hami\.io/bind-phase success`),
		regexp.MustCompile(`(?m)^   annotations +hami\.io/vgpu-devices-allocated: GPU-[0-9a-f-]+,NVIDIA,9856,29:;$`),
		regexp.MustCompile(`(?m)^ +hami\.io/vgpu-mig-allocations: \[\{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-[0-9a-f-]+","profile":"2g\.10gb","placement":\{"start":\d,"size":2\},"migUUID":"(MIG-[0-9a-f-]+)","gpuInstanceID":\d+,"computeInstanceID":\d+\}\]$`),
		regexp.MustCompile(`(?m)^   env +the kubelet's Allocate: NVIDIA_VISIBLE_DEVICES=MIG-[0-9a-f-]+ `),
		regexp.MustCompile(`(?m)^quickstart: done in \S+: 12 process\(es\) stopped, /\S+ removed$`),
	} {
		if !want.MatchString(out) {
			t.Errorf("output has no match for %s", want)
		}
	}
	if strings.Contains(out, "== 9.") {
		t.Error("step 9 (--keep) ran without --keep")
	}
	// The monitor's first GPU of the demo container is the first of its allocation (the
	// region's device order is the container's).
	alloc := regexp.MustCompile(`(?m)^ +hami\.io/vgpu-devices-allocated: (GPU-[0-9a-f-]+),NVIDIA,10240,30:(GPU-[0-9a-f-]+),`).FindStringSubmatch(out)
	usage := regexp.MustCompile(`(?m)^   usage +default/demo cuda (GPU-[0-9a-f-]+): 3072 MiB`).FindStringSubmatch(out)
	if alloc == nil || usage == nil || usage[1] != alloc[1] {
		t.Errorf("the monitor's first GPU of default/demo %v is not the allocation's first %v", usage, alloc)
	}
	// The MIG UUID of the reservation is the one the kubelet's Allocate answered.
	if m := regexp.MustCompile(`"migUUID":"(MIG-[0-9a-f-]+)"`).FindStringSubmatch(out); m == nil || !strings.Contains(out, "NVIDIA_VISIBLE_DEVICES="+m[1]+" ") {
		t.Errorf("the reservation's MIG UUID is not the one the kubelet's Allocate got (%v)", m)
	}
	r.wantNothingLeft(t)
}

// TestQuickstartKeep is --keep ended by Ctrl-C: the kubeconfig is printed, the run ends with
// exit 0 and everything is stopped and removed.
func TestQuickstartKeep(t *testing.T) {
	r := start(t, "--keep", "--mig=false", "--node", "qs-keep")
	r.waitLine(t, "== 8. everything keeps running until Ctrl-C", 5*time.Minute)
	r.waitLine(t, "kubeconfig", 10*time.Second)
	out := r.output()
	kc := regexp.MustCompile(`(?m)^   kubeconfig +(/\S+) \(cluster admin\)$`).FindStringSubmatch(out)
	if kc == nil {
		t.Fatal("no kubeconfig line")
	}
	if _, err := os.Stat(kc[1]); err != nil {
		t.Errorf("kubeconfig %s: %v", kc[1], err)
	}
	if err := r.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if code := r.wait(t, time.Minute); code != 0 {
		t.Fatalf("exit status %d after Ctrl-C in --keep, want 0", code)
	}
	r.wantNothingLeft(t)
	if _, err := os.Stat(kc[1]); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("kubeconfig %s left behind (%v)", kc[1], err)
	}
}

// TestQuickstartInterrupted is Ctrl-C in the middle of step 1: exit 130, nothing left.
func TestQuickstartInterrupted(t *testing.T) {
	r := start(t, "--node", "qs-int")
	r.waitLine(t, "== 1. node qs-int", 5*time.Minute)
	if err := r.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if code := r.wait(t, time.Minute); code != 130 {
		t.Fatalf("exit status %d after Ctrl-C, want 130", code)
	}
	if !strings.Contains(r.output(), "quickstart: interrupted: ") {
		t.Error("no interrupted line")
	}
	r.wantNothingLeft(t)
}

// TestQuickstartNoNamespace runs the quickstart as an unprivileged user (uid 1000) in a user
// namespace whose user.max_user_namespaces is 0: the machine then allows neither a mount
// namespace (not root) nor a user namespace, so the kubelet's device manager cannot be hosted.
// The quickstart must say why and what to run instead, exit 1 without a stack trace, and
// leave nothing behind. Building that user namespace takes root on the host.
func TestQuickstartNoNamespace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the test maps uids 0-65535 into a user namespace to run the quickstart as uid 1000 there")
	}
	qs := quickstartBin(t)
	if err := os.Chmod(filepath.Dir(qs), 0o755); err != nil { // uid 1000 runs it
		t.Fatal(err)
	}
	repo, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	r := &run{marker: hex.EncodeToString(b)}
	script := `echo 0 > /proc/sys/user/max_user_namespaces && exec setpriv --reuid 1000 --regid 1000 --clear-groups "$@"`
	r.cmd = exec.Command("sh", "-c", script, "sh", qs, "--k8s-bin", os.Getenv(envtest.EnvBinDir), "--repo", repo, "--node", "qs-nons")
	r.cmd.Env = append(os.Environ(), envMarker+"="+r.marker)
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Cloneflags: syscall.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 65536}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 65536}}, GidMappingsEnableSetgroups: true}
	r.cmd.Stdout, r.cmd.Stderr = &r.out, &r.out
	err = r.cmd.Run()
	out := r.output()
	if ee := (*exec.ExitError)(nil); !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("exit: %v, want status 1\n%s", err, out)
	}
	for _, want := range []string{
		"quickstart: FAILED: start the kubelet's device manager: private mount namespace for the kubelet device manager not available",
		"sudo -E env \"PATH=$PATH\" make quickstart",
		"sudo sysctl -w user.max_user_namespaces=15000",
		"cd cmd/kubectl-hami_doctor && go run . explain",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output has no %q:\n%s", want, out)
		}
	}
	for _, bad := range []string{"goroutine ", "panic:", "== 1."} {
		if strings.Contains(out, bad) {
			t.Errorf("output has %q:\n%s", bad, out)
		}
	}
	r.wantNothingLeft(t)
}

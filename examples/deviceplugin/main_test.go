package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/kubeletplugin/kubelettest"
)

// syncBuffer is a bytes.Buffer safe for the logger and the test at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func env(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

func TestRunUsage(t *testing.T) {
	t.Parallel()
	withNode := map[string]string{"NODE_NAME": "gpu-1"}
	tests := map[string]struct {
		args []string
		env  map[string]string
		// host: a fake clientset instead of --kubeconfig.
		host bool
		code int
		want string
	}{
		"unknown flag":          {args: []string{"--bogus"}, env: withNode, code: 2, want: "flag provided but not defined: -bogus"},
		"bad flag value":        {args: []string{"--device-split-count", "ten"}, env: withNode, code: 2, want: "invalid value"},
		"extra argument":        {args: []string{"serve"}, env: withNode, code: 2, want: `unexpected arguments ["serve"]`},
		"negative split":        {args: []string{"--device-split-count", "-1"}, env: withNode, code: 2, want: "--device-split-count -1"},
		"no node name":          {code: 2, want: "NODE_NAME"},
		"invalid node name":     {env: map[string]string{"NODE_NAME": "Not_A_Node"}, code: 2, want: "invalid node name"},
		"unknown server":        {args: []string{"--simulate", "dgx1"}, env: withNode, code: 2, want: `unknown simulated server "dgx1"`},
		"monitor version":       {args: []string{"--simulate", "dgxh100", "--monitor-version", "v3"}, env: withNode, host: true, code: 2, want: `--monitor-version "v3" is not master or v2.9.0`},
		"priority source":       {args: []string{"--simulate", "dgxh100", "--monitor-priority-source", "tenant"}, env: withNode, host: true, code: 2, want: `--monitor-priority-source "tenant"`},
		"monitor period":        {args: []string{"--simulate", "dgxh100", "--monitor-period", "-1s"}, env: withNode, host: true, code: 2, want: "--monitor-period -1s is not positive"},
		"unknown topology":      {args: []string{"--simulate", "dgxh100", "--simulate-topology", "torus"}, env: withNode, code: 2, want: `unknown simulated topology "torus"`},
		"topology version":      {args: []string{"--topology-version", "v3"}, env: withNode, code: 2, want: `--topology-version "v3"`},
		"zero memory scaling":   {args: []string{"--simulate", "dgxa100", "--device-memory-scaling", "0"}, env: withNode, code: 2, want: "invalid options"},
		"seed without simulate": {args: []string{"--simulate-uuid-seed", "n1"}, env: withNode, code: 2, want: "--simulate-uuid-seed needs --simulate"},
		"unknown DRA profile":   {args: []string{"--dra", "--dra-profile", "nvidia"}, env: withNode, code: 2, want: `--dra-profile: unknown DRA profile "nvidia"`},
		"unknown list strategy": {args: []string{"--device-list-strategy", "cdi"}, env: withNode, code: 2, want: "envvar, volume-mounts, cdi-annotations, cdi-cri"},
		"list strategy env":     {env: map[string]string{"NODE_NAME": "gpu-1", "DEVICE_LIST_STRATEGY": "envvar,volume-mounts"}, code: 2, want: "keep one of them"},
		"bad CDI kind":          {args: []string{"--device-list-strategy", "cdi-cri", "--cdi-kind", "gpu"}, env: withNode, code: 2, want: "want <vendor>/<class>"},
		"CDI with MIG": {
			args: []string{"--simulate", "dgxa100", "--mig", "--device-list-strategy", "cdi-cri"}, env: withNode, host: true,
			code: 2, want: "use envvar or volume-mounts on a MIG node",
		},
		"CDI with DRA": {
			args: []string{"--simulate", "dgxa100", "--dra", "--device-list-strategy", "envvar,cdi-annotations"}, env: withNode, host: true,
			code: 2, want: "use envvar or volume-mounts for DRA",
		},
		// The agent validates the GPUs at New (after the scan and the client).
		"empty DRA GPU": {
			args: []string{"--simulate", "dgxa100", "--dra", "--dra-gpus", "0,,1"}, env: withNode, host: true,
			code: 2, want: `GPUs entry ""`,
		},
		"metrics address without port": {args: []string{"--metrics-bind-address", "9394"}, env: withNode, code: 2, want: `--metrics-bind-address: invalid metrics address "9394": address 9394: missing port in address`},
		"metrics port by name":         {args: []string{"--metrics-bind-address", ":http"}, env: withNode, code: 2, want: `--metrics-bind-address: invalid metrics address ":http": port "http" is not a number`},
		"metrics port too large":       {args: []string{"--metrics-bind-address", "127.0.0.1:65536"}, env: withNode, code: 2, want: `port "65536" is not a number within [0, 65535]`},
		"metrics port in use": {
			args: []string{"--simulate", "dgxa100", "--metrics-bind-address", busy(t)}, env: withNode, host: true,
			code: 1, want: "deviceplugin: listen on the metrics address 127.0.0.1:",
		},
		"no kubeconfig file": {
			args: []string{"--simulate", "dgxh100", "--kubeconfig", filepath.Join(t.TempDir(), "missing")}, env: withNode,
			code: 1, want: "give --kubeconfig",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var stderr syncBuffer
			h := host{getenv: env(tc.env)}
			if tc.host {
				h.client = fake.NewClientset()
			}
			if code := run(t.Context(), tc.args, &stderr, h); code != tc.code {
				t.Errorf("exit status %d, want %d; stderr:\n%s", code, tc.code, stderr.String())
			}
			if !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("stderr does not contain %q:\n%s", tc.want, stderr.String())
			}
		})
	}
}

// TestRunKubeletSocketMissing starts with only the legacy NodeName set and stops at the missing
// kubelet socket, whose error names the folder.
func TestRunKubeletSocketMissing(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	cs := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1"}})
	var stderr syncBuffer
	code := run(t.Context(), []string{"--simulate", "dgxb200", "--metrics-bind-address", "127.0.0.1:0", "--kubelet-root-dir", root, "--prepare-state-dir=false"}, &stderr,
		host{getenv: env(map[string]string{"NodeName": "gpu-1"}), client: cs})
	if code != 1 {
		t.Fatalf("exit status %d, want 1; stderr:\n%s", code, stderr.String())
	}
	for _, want := range []string{"kubelet socket missing", filepath.Join(root, "device-plugins"), "--root-dir"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr does not contain %q:\n%s", want, stderr.String())
		}
	}
}

// TestRunSimulated runs the plugin on a simulated DGX A100 against a fake kubelet and a fake
// clientset: 8 GPUs x 4 registered on both channels, SIGUSR1's XID takes GPU 0's 4 devices
// out and the quiet period brings them back, and cancellation ends it with status 0.
func TestRunSimulated(t *testing.T) {
	t.Parallel()
	k := kubelettest.Start(t)
	root, err := os.MkdirTemp("", "dp") //nolint:usetesting // socket paths must stay < 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	if err := os.Symlink(k.Dir(), filepath.Join(root, "device-plugins")); err != nil {
		t.Fatal(err)
	}
	cs := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1"}})
	xid := make(chan os.Signal, 1)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var stderr syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"--simulate", "dgxa100", "--device-split-count", "4", "--metrics-bind-address", "0", "--kubelet-root-dir", root,
			"--health-quiet-period", "300ms", "--prepare-state-dir=false", "--simulate-topology", "hybrid-cube-mesh", "-v", "2"}, &stderr,
			host{getenv: env(map[string]string{"NODE_NAME": "gpu-1", "ENABLE_TOPOLOGY_SCORE": "true"}), xid: xid, client: cs})
	}()
	healthy := func(n int) {
		t.Helper()
		wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
		defer wcancel()
		if _, err := k.WaitFor(wctx, func(s kubelettest.State) bool {
			p, ok := s.Resource("nvidia.com/gpu")
			return ok && len(p.Devices) == 32 && p.Healthy() == n
		}); err != nil {
			t.Fatalf("wait for %d healthy devices: %v\nstderr:\n%s", n, err, stderr.String())
		}
	}
	healthy(32)
	if p, _ := k.State().Resource("nvidia.com/gpu"); p.Devices[0].Topology != nil {
		t.Errorf("NUMA topology sent without --enable-numa-topology: %v", p.Devices[0])
	}
	node, err := cs.CoreV1().Nodes().Get(ctx, "gpu-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	devs, err := annotation.Decode(node.Annotations[annotation.KeyNVIDIARegister])
	if err != nil || len(devs) != 8 || devs[0].Count != 4 || !strings.HasPrefix(devs[0].Type, "NVIDIA") {
		t.Fatalf("register annotation: %d devices %+v, %v", len(devs), devs, err)
	}
	// ENABLE_TOPOLOGY_SCORE=true: the scores came in the same patch, in device order; GPUs 6
	// and 7 of a DGX-1V share two NVLinks and a PCIe switch.
	scores, err := annotation.DecodePairScores(node.Annotations[annotation.KeyNVIDIAScore])
	if err != nil || len(scores) != 8 || scores[6].UUID != devs[6].ID || scores[6].Scores[devs[7].ID] != 250 {
		t.Fatalf("score annotation %q: %v", node.Annotations[annotation.KeyNVIDIAScore], err)
	}
	xid <- syscall.SIGUSR1
	healthy(28)
	healthy(32) // the quiet period passed
	if node, err := cs.CoreV1().Nodes().Get(ctx, "gpu-1", metav1.GetOptions{}); err != nil || len(node.Status.Capacity) != 0 {
		t.Errorf("Node status capacity %v (%v) without --report-node-capacity, want none", node.Status.Capacity, err)
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("exit status %d after cancellation, want 0; stderr:\n%s", code, stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("run did not return after cancellation")
	}
	for _, want := range []string{"Updating node annotations with 8 device(s)", "Simulating a critical XID", "Device plugin stopped"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("log does not contain %q:\n%s", want, stderr.String())
		}
	}
}

// TestRunNUMAAndCapacity: --enable-numa-topology sends each GPU's NUMA node (as the register
// annotation has it) with its devices, and REPORT_NODE_CAPACITY=true writes the healthy GPUs'
// memory, scaled as in the annotation, and cores into the Node's status.
func TestRunNUMAAndCapacity(t *testing.T) {
	t.Parallel()
	k := kubelettest.Start(t)
	root, err := os.MkdirTemp("", "dp") //nolint:usetesting // socket paths must stay < 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	if err := os.Symlink(k.Dir(), filepath.Join(root, "device-plugins")); err != nil {
		t.Fatal(err)
	}
	cs := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1"}})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var stderr syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"--simulate", "dgxa100", "--device-split-count", "2", "--device-memory-scaling", "1.5", "--metrics-bind-address", "", "--kubelet-root-dir", root,
			"--prepare-state-dir=false", "--enable-numa-topology"}, &stderr,
			host{getenv: env(map[string]string{"NODE_NAME": "gpu-1", "REPORT_NODE_CAPACITY": "true"}), client: cs})
	}()
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	defer wcancel()
	st, err := k.WaitFor(wctx, func(s kubelettest.State) bool {
		p, ok := s.Resource("nvidia.com/gpu")
		return ok && len(p.Devices) == 16
	})
	if err != nil {
		t.Fatalf("wait for 16 devices: %v\nstderr:\n%s", err, stderr.String())
	}
	var node *corev1.Node
	deadline := time.Now().Add(20 * time.Second)
	for {
		node, err = cs.CoreV1().Nodes().Get(ctx, "gpu-1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := node.Status.Capacity["nvidia.com/gpucores"]; ok || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	devs, err := annotation.Decode(node.Annotations[annotation.KeyNVIDIARegister])
	if err != nil || len(devs) != 8 {
		t.Fatalf("register annotation: %v %v", devs, err)
	}
	numa := map[string]int64{}
	var mem int64
	for _, d := range devs {
		numa[d.ID] = int64(d.Numa)
		mem += int64(d.Devmem)
	}
	p, _ := st.Resource("nvidia.com/gpu")
	for _, d := range p.Devices {
		uuid := d.ID[:strings.LastIndexByte(d.ID, '-')] // "<uuid>-<i>"
		if d.Topology == nil || len(d.Topology.Nodes) != 1 || d.Topology.Nodes[0].ID != numa[uuid] {
			t.Errorf("device %s topology %v, want NUMA node %d", d.ID, d.Topology, numa[uuid])
		}
	}
	for _, list := range []corev1.ResourceList{node.Status.Capacity, node.Status.Allocatable} {
		if q := list["nvidia.com/gpumem"]; q.Value() != mem || mem <= 8*40000 {
			t.Errorf("nvidia.com/gpumem %v, want %d (the annotation's scaled MiB)", q.String(), mem)
		}
		if q := list["nvidia.com/gpucores"]; q.Value() != 800 {
			t.Errorf("nvidia.com/gpucores %v, want 800", q.String())
		}
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("exit status %d after cancellation, want 0; stderr:\n%s", code, stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("run did not return after cancellation")
	}
}

// busy returns the address of a listener that stays open until the test ends.
func busy(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lis.Close() })
	return lis.Addr().String()
}

// get returns the status and body of GET url.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url) //nolint:noctx // the test's own server
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, string(body)
}

// servingAddress waits for the log line of the metrics server and returns its URL.
func servingAddress(t *testing.T, stderr *syncBuffer) string {
	t.Helper()
	re := regexp.MustCompile(`"Serving metrics and probes" address="(http://[^"]+)"`)
	deadline := time.Now().Add(20 * time.Second)
	for {
		if m := re.FindStringSubmatch(stderr.String()); m != nil {
			return m[1]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no metrics address in the log:\n%s", stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRunServesMetricsAndProbes: --metrics-bind-address serves the agent's metrics and
// probes: /healthz 200 at once, /readyz 503 naming the missing step while the API server
// refuses the register annotation and 200 once the kubelet has the devices, /metrics the
// SDK's families; the server is gone once run returned.
func TestRunServesMetricsAndProbes(t *testing.T) {
	t.Parallel()
	k := kubelettest.Start(t)
	root, err := os.MkdirTemp("", "dp") //nolint:usetesting // socket paths must stay < 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	if err := os.Symlink(k.Dir(), filepath.Join(root, "device-plugins")); err != nil {
		t.Fatal(err)
	}
	cs := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1"}})
	var open atomic.Bool
	cs.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		if open.Load() {
			return false, nil, nil
		}
		return true, nil, errors.New("the API server is away")
	})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var stderr syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"--simulate", "dgxh100", "--metrics-bind-address", "127.0.0.1:0", "--kubelet-root-dir", root,
			"--prepare-state-dir=false", "-v", "2"}, &stderr, host{getenv: env(map[string]string{"NODE_NAME": "gpu-1"}), client: cs})
	}()
	url := servingAddress(t, &stderr)

	if code, body := get(t, url+"/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/healthz = %d %q, want 200 ok", code, body)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, body := get(t, url+"/readyz")
		if code != http.StatusServiceUnavailable || !strings.HasPrefix(body, "node agent not ready: node gpu-1: ") {
			t.Fatalf("/readyz before the annotation = %d %q, want 503 not ready", code, body)
		}
		if strings.Contains(body, "register annotation hami.io/node-nvidia-register not written yet") && strings.Contains(body, "the API server is away") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz never named the refused annotation: %q", body)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if st := k.State(); st.Registrations != 0 {
		t.Errorf("registered with the kubelet before the annotation: %+v", st)
	}

	open.Store(true)
	for {
		code, body := get(t, url+"/readyz")
		if code == http.StatusOK {
			if body != "ok\n" {
				t.Errorf("/readyz = %q", body)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz = %d %q after the annotation, want 200", code, body)
		}
		time.Sleep(10 * time.Millisecond)
	}
	code, body := get(t, url+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics = %d %q", code, body)
	}
	for _, want := range []string{
		`hamireg_nodeagent_scans_total{result="ok",vendor="NVIDIA"} 1`,
		"# TYPE hamireg_nodeagent_allocations_total counter",
		`hamireg_nodeagent_allocate_errors_total{kind="no_binding_pod",vendor="NVIDIA"} 0`,
		"# TYPE hamireg_register_writes_total counter",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics has no %q:\n%s", want, body)
		}
	}
	if code, _ := get(t, url+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz while ready = %d", code)
	}

	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("exit status %d after cancellation, want 0; stderr:\n%s", code, stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("run did not return after cancellation")
	}
	if resp, err := http.Get(url + "/healthz"); err == nil { //nolint:noctx // the test's own server
		_ = resp.Body.Close()
		t.Errorf("the metrics server still answers after run returned: %s", resp.Status)
	}
}

// --dra-health (default on) serves the kubelet's device health stream; off, the DRA plugin
// does not offer it.
func TestDRAOptionsHealth(t *testing.T) {
	t.Parallel()
	for _, health := range []bool{true, false} {
		o, err := draOptions(true, "sdk", "", "/var/lib/kubelet", "/var/run/cdi", time.Second, health)
		if err != nil {
			t.Fatal(err)
		}
		if o.Plugin.DisableHealthService == health {
			t.Errorf("--dra-health=%t: DisableHealthService %t", health, o.Plugin.DisableHealthService)
		}
	}
}

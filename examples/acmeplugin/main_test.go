package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/allocation/allocationtest"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/clienttest"
	"github.com/hamireg/hamireg/kubeletplugin/kubelettest"
	"github.com/hamireg/hamireg/nodeagent"
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

func TestVendor(t *testing.T) {
	t.Parallel()
	want := map[string]string{
		"register":    "hami.io/node-acme-register",
		"handshake":   "hami.io/node-handshake-acme",
		"to-allocate": "hami.io/acme-devices-to-allocate",
		"allocated":   "hami.io/acme-devices-allocated",
		"resource":    "acme.example/npu",
	}
	got := map[string]string{
		"register": acme.RegisterKey, "handshake": acme.HandshakeKey, "to-allocate": acme.ToAllocateKey,
		"allocated": acme.AllocatedKey, "resource": acme.ResourceName,
	}
	if diff := cmp.Diff(want, got); diff != "" || acme.Format != annotation.FormatJSON {
		t.Errorf("vendor keys (-want +got):\n%s\nformat %v", diff, acme.Format)
	}
}

func TestRunUsage(t *testing.T) {
	t.Parallel()
	withNode := map[string]string{"NODE_NAME": "npu-1"}
	tests := map[string]struct {
		args []string
		env  map[string]string
		code int
		want string
	}{
		"unknown flag":                 {args: []string{"--bogus"}, env: withNode, code: 2, want: "flag provided but not defined: -bogus"},
		"bad flag value":               {args: []string{"--simulate", "four"}, env: withNode, code: 2, want: "invalid value"},
		"no node name":                 {code: 2, want: "NODE_NAME"},
		"invalid node name":            {env: map[string]string{"NODE_NAME": "Not_A_Node"}, code: 2, want: "invalid node name"},
		"negative simulate":            {args: []string{"--simulate", "-1"}, env: withNode, code: 2, want: "--simulate -1 is negative"},
		"zero split":                   {args: []string{"--device-split-count", "0"}, env: withNode, code: 2, want: "--device-split-count 0 is not within"},
		"zero memory":                  {args: []string{"--device-memory", "0"}, env: withNode, code: 2, want: "--device-memory 0 is not within"},
		"metrics address without port": {args: []string{"--metrics-bind-address", "9396"}, env: withNode, code: 2, want: `--metrics-bind-address: invalid metrics address "9396": address 9396: missing port in address`},
		"metrics port by name":         {args: []string{"--metrics-bind-address", "localhost:metrics"}, env: withNode, code: 2, want: `--metrics-bind-address: invalid metrics address "localhost:metrics": port "metrics" is not a number`},
		"no kubeconfig file": {
			args: []string{"--simulate", "1", "--kubeconfig", filepath.Join(t.TempDir(), "missing")}, env: withNode,
			code: 1, want: "give --kubeconfig",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var stderr syncBuffer
			if code := run(t.Context(), tc.args, &stderr, env(tc.env), nil); code != tc.code {
				t.Errorf("exit status %d, want %d; stderr:\n%s", code, tc.code, stderr.String())
			}
			if !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("stderr does not contain %q:\n%s", tc.want, stderr.String())
			}
		})
	}
}

// --simulate creates the device nodes, in a temporary folder that cleanup removes when no
// --dev-root is given; every device node is an NPU with an ID stable for the node and index.
func TestSimulatedNPUs(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "dev")
	n, cleanup, err := newNPUs("npu-1", dir, 3, 5, 8192)
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	if err := os.WriteFile(filepath.Join(dir, "acme01"), nil, 0o600); err != nil { // not a device node name
		t.Fatal(err)
	}
	devs, failed, err := n.Devices(t.Context())
	if err != nil || failed != nil {
		t.Fatalf("Devices: %v %v", failed, err)
	}
	var ids []string
	for i, d := range devs {
		ids = append(ids, d.ID)
		want := annotation.Device{ID: d.ID, Index: uint(i), Count: 5, Devmem: 8192, Devcore: 100, Type: "ACME-NPU", Health: true}
		if diff := cmp.Diff(want, d); diff != "" || !strings.HasPrefix(d.ID, fmt.Sprintf("ACME-%d-", i)) {
			t.Errorf("device %d (-want +got):\n%s", i, diff)
		}
	}
	if len(devs) != 3 {
		t.Fatalf("%d devices, want 3: %v", len(devs), ids)
	}
	again, _, _ := (&npus{node: "npu-1", dir: dir, split: 5, memory: 8192}).Devices(t.Context())
	other, _, _ := (&npus{node: "npu-2", dir: dir, split: 5, memory: 8192}).Devices(t.Context())
	if again[2].ID != devs[2].ID || other[2].ID == devs[2].ID {
		t.Errorf("IDs are not stable per node and index: %s, again %s, another node %s", devs[2].ID, again[2].ID, other[2].ID)
	}
	if n.Changed() != nil {
		t.Error("Changed is not nil")
	}

	tmp, cleanup, err := newNPUs("npu-1", "", 2, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	if devs, _, err := tmp.Devices(t.Context()); err != nil || len(devs) != 2 {
		t.Errorf("temporary folder %s: %d devices, %v", tmp.dir, len(devs), err)
	}
	cleanup()
	if _, err := os.Stat(tmp.dir); !os.IsNotExist(err) {
		t.Errorf("temporary folder %s not removed: %v", tmp.dir, err)
	}
	if real, _, _ := newNPUs("npu-1", "", 0, 1, 1); real.dir != "/dev" {
		t.Errorf("without --simulate the device nodes are in %s, want /dev", real.dir)
	}
}

// Allocate answers with the device node and limits of every NPU of the entry, in its order.
func TestAllocate(t *testing.T) {
	t.Parallel()
	n := &npus{node: "npu-1", dir: "/host/dev", split: 10, memory: 16384}
	node := []annotation.Device{{ID: "ACME-0-aa", Index: 0}, {ID: "ACME-3-bb", Index: 3}}
	req := nodeagent.ContainerRequest{
		Devices:     allocation.ContainerDevices{{UUID: "ACME-3-bb", Type: "ACME", Usedmem: 4096, Usedcores: 30}, {UUID: "ACME-0-aa", Type: "ACME", Usedmem: 1024}},
		NodeDevices: node,
	}
	got, err := n.Allocate(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	want := allocation.Response{
		Envs: map[string]string{"ACME_VISIBLE_DEVICES": "ACME-3-bb,ACME-0-aa", "ACME_MEMORY_LIMIT_0": "4096", "ACME_MEMORY_LIMIT_1": "1024"},
		DeviceNodes: []allocation.DeviceNode{
			{ContainerPath: "/dev/acme3", HostPath: "/host/dev/acme3", Permissions: "rw"},
			{ContainerPath: "/dev/acme0", HostPath: "/host/dev/acme0", Permissions: "rw"},
		},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("response (-want +got):\n%s", diff)
	}
	req.Devices = allocation.ContainerDevices{{UUID: "ACME-7-cc"}}
	if _, err := n.Allocate(t.Context(), req); err == nil || !strings.Contains(err.Error(), "ACME-7-cc is not one of node npu-1") {
		t.Errorf("unknown NPU: %v", err)
	}
}

// TestRunSimulated runs the plugin on 4 simulated NPUs against a fake kubelet and a fake
// clientset: both channels carry them, a pod bound as HAMi's scheduler binds it gets its
// NPU's device node and environment from Allocate over gRPC, and cancellation ends it with
// status 0.
func TestRunSimulated(t *testing.T) {
	t.Parallel()
	k := kubelettest.Start(t)
	root, err := os.MkdirTemp("", "acme") //nolint:usetesting // socket paths must stay < 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	if err := os.Symlink(k.Dir(), filepath.Join(root, "device-plugins")); err != nil {
		t.Fatal(err)
	}
	cs := clienttest.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "npu-1"}})
	dev := filepath.Join(t.TempDir(), "dev")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var stderr syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"--simulate", "4", "--dev-root", dev, "--device-split-count", "2", "--kubelet-root-dir", root,
			"--metrics-bind-address", "127.0.0.1:0", "-v", "2"}, &stderr,
			env(map[string]string{"NODE_NAME": "npu-1"}), cs)
	}()
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	defer wcancel()
	state, err := k.WaitFor(wctx, func(s kubelettest.State) bool {
		p, ok := s.Resource("acme.example/npu")
		return ok && len(p.Devices) == 8 && p.Healthy() == 8
	})
	if err != nil {
		t.Fatalf("wait for 8 healthy devices: %v\nstderr:\n%s", err, stderr.String())
	}
	if p, _ := state.Resource("acme.example/npu"); filepath.Base(p.SocketPath) != "hamireg-acme-npu.sock" {
		t.Errorf("plugin socket %s, want hamireg-acme-npu.sock (the vendor's, beside NVIDIA's)", p.SocketPath)
	}
	node, err := cs.CoreV1().Nodes().Get(ctx, "npu-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	devs, err := annotation.Decode(node.Annotations["hami.io/node-acme-register"])
	if err != nil || len(devs) != 4 || devs[0].Count != 2 || devs[0].Type != "ACME-NPU" {
		t.Fatalf("register annotation: %d devices %+v, %v", len(devs), devs, err)
	}

	// A pod bound as HAMi's scheduler binds it to NPU 1, admitted as the kubelet admits it.
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "npu-pod", UID: "uid-1"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "infer", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{"acme.example/npu": resource.MustParse("1")}}}}}}
	if _, err := cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	entry := allocation.ContainerDevices{{UUID: devs[1].ID, Type: "ACME", Usedmem: 3000, Usedcores: 30}}
	allocationtest.Schedule(t, cs, pod, "npu-1", allocation.PodDevices{entry}, allocationtest.Options{Vendor: acme})
	ids, err := k.PickHealthy(ctx, "acme.example/npu", 1)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := k.Allocate(ctx, "acme.example/npu", ids)
	if err != nil {
		t.Fatalf("Allocate: %v\nstderr:\n%s", err, stderr.String())
	}
	want := &pluginapi.ContainerAllocateResponse{
		Envs:    map[string]string{"ACME_VISIBLE_DEVICES": devs[1].ID, "ACME_MEMORY_LIMIT_0": "3000"},
		Devices: []*pluginapi.DeviceSpec{{ContainerPath: "/dev/acme1", HostPath: filepath.Join(dev, "acme1"), Permissions: "rw"}},
	}
	if diff := cmp.Diff(want, resp.ContainerResponses[0], protocmp.Transform()); len(resp.ContainerResponses) != 1 || diff != "" {
		t.Errorf("Allocate answered (-want +got):\n%s", diff)
	}
	if p, _ := cs.CoreV1().Pods("default").Get(ctx, "npu-pod", metav1.GetOptions{}); p.Annotations[allocation.KeyBindPhase] != string(allocation.PhaseSuccess) {
		t.Errorf("bind-phase %q after Allocate, want success", p.Annotations[allocation.KeyBindPhase])
	}
	// The vendor's own metrics: the allocation counted under vendor ACME.
	url := servingAddress(t, &stderr)
	if code, body := get(t, url+"/metrics"); code != http.StatusOK || !strings.Contains(body, `hamireg_nodeagent_allocations_total{vendor="ACME"} 1`) ||
		!strings.Contains(body, `hamireg_nodeagent_scans_total{result="ok",vendor="ACME"} 1`) {
		t.Errorf("/metrics = %d, want the ACME allocation and scan counted:\n%s", code, body)
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

// An address in use stops the plugin with status 1, naming the address, before it registers.
func TestRunMetricsAddressInUse(t *testing.T) {
	t.Parallel()
	cs := clienttest.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "npu-1"}})
	var stderr syncBuffer
	code := run(t.Context(), []string{"--simulate", "1", "--dev-root", filepath.Join(t.TempDir(), "dev"), "--kubelet-root-dir", t.TempDir(),
		"--metrics-bind-address", busy(t)}, &stderr, env(map[string]string{"NODE_NAME": "npu-1"}), cs)
	if code != 1 || !strings.Contains(stderr.String(), "acmeplugin: listen on the metrics address 127.0.0.1:") {
		t.Errorf("exit status %d, want 1 naming the address; stderr:\n%s", code, stderr.String())
	}
}

// The probes: /healthz 200 while the agent runs, /readyz 503 naming the missing step while the
// API server refuses the register annotation, then 200 once the kubelet has the NPUs; the
// server is gone once run returned.
func TestRunServesProbes(t *testing.T) {
	t.Parallel()
	k := kubelettest.Start(t)
	root, err := os.MkdirTemp("", "acme") //nolint:usetesting // socket paths must stay < 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	if err := os.Symlink(k.Dir(), filepath.Join(root, "device-plugins")); err != nil {
		t.Fatal(err)
	}
	cs := clienttest.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "npu-1"}})
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
		done <- run(ctx, []string{"--simulate", "2", "--dev-root", filepath.Join(t.TempDir(), "dev"), "--kubelet-root-dir", root,
			"--metrics-bind-address", "127.0.0.1:0", "-v", "2"}, &stderr, env(map[string]string{"NODE_NAME": "npu-1"}), cs)
	}()
	url := servingAddress(t, &stderr)
	if code, body := get(t, url+"/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/healthz = %d %q, want 200 ok", code, body)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, body := get(t, url+"/readyz")
		if code != http.StatusServiceUnavailable {
			t.Fatalf("/readyz = %d %q before the annotation, want 503", code, body)
		}
		if strings.Contains(body, "register annotation hami.io/node-acme-register not written yet: ") && strings.Contains(body, "the API server is away") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz never named the refused annotation: %q", body)
		}
		time.Sleep(10 * time.Millisecond)
	}
	open.Store(true)
	for {
		code, _ := get(t, url+"/readyz")
		if code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz = %d after the annotation, want 200", code)
		}
		time.Sleep(10 * time.Millisecond)
	}
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second) // the device list sent is on its way
	defer wcancel()
	if _, err := k.WaitFor(wctx, func(s kubelettest.State) bool {
		p, ok := s.Resource("acme.example/npu")
		return ok && p.Healthy() == 20
	}); err != nil {
		t.Errorf("ready, but the kubelet never had the 20 devices: %v", err)
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

package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/allocation/allocationtest"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/kubeletplugin/kubelettest"
	"github.com/hamireg/hamireg/mig"
	"github.com/hamireg/hamireg/nvmlscan/nvmlsim"
)

func TestRunMIGUsage(t *testing.T) {
	t.Parallel()
	withNode := map[string]string{"NODE_NAME": "gpu-1"}
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("migProfileAllowlist: [{models: [A100], profiles: [big]}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		args []string
		want string
	}{
		"match rule":             {args: []string{"--mig", "--mig-model-match", "prefix"}, want: `invalid value "prefix" for flag -mig-model-match: invalid MIG profile allowlist: match rule "prefix" is neither word nor substring`},
		"profile discovery":      {args: []string{"--mig", "--mig-profiles", "rev"}, want: `invalid value "rev" for flag -mig-profiles: MIG profile discovery "rev" is neither base nor all`},
		"missing allowlist":      {args: []string{"--mig", "--mig-allowlist", filepath.Join(dir, "none.yaml")}, want: "--mig-allowlist: open"},
		"invalid allowlist":      {args: []string{"--mig", "--mig-allowlist", bad}, want: "--mig-allowlist " + bad},
		"debug without simulate": {args: []string{"--simulate-debug-address", "127.0.0.1:0"}, want: "--simulate-debug-address needs --simulate"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var stderr syncBuffer
			if code := run(t.Context(), tc.args, &stderr, host{getenv: env(withNode)}); code != 2 {
				t.Errorf("exit status %d, want 2; stderr:\n%s", code, stderr.String())
			}
			if !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("stderr does not contain %q:\n%s", tc.want, stderr.String())
			}
		})
	}
}

// debugState reads the --simulate-debug-address endpoint.
func debugState(ctx context.Context, t *testing.T, url string) nvmlsim.MIGState {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	var s nvmlsim.MIGState
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s, %v", url, resp.Status, err)
	}
	return s
}

// TestRunSimulatedMIG runs the plugin with --simulate dgxa100 --mig against a fake kubelet and
// a fake clientset: every GPU registers in MIG mode with its NVML profiles (count 7), a pod
// reserved a 2g.10gb at placement 2 gets that MIG device at Allocate, and the debug endpoint
// shows it, with no overlap.
func TestRunSimulatedMIG(t *testing.T) {
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
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: "default", UID: types.UID("u-1")},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main"}}}}
	cs := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1"}}, pod)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var stderr syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"--simulate", "dgxa100", "--mig", "--simulate-debug-address", "127.0.0.1:0", "--metrics-bind-address", "0", "--kubelet-root-dir", root,
			"--prepare-state-dir=false", "-v", "2"}, &stderr, host{getenv: env(map[string]string{"NODE_NAME": "gpu-1"}), client: cs})
	}()
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	if _, err := k.WaitFor(wctx, func(s kubelettest.State) bool {
		p, ok := s.Resource("nvidia.com/gpu")
		return ok && len(p.Devices) == 8*7 && p.Healthy() == 8*7
	}); err != nil {
		t.Fatalf("wait for 56 healthy devices: %v\nstderr:\n%s", err, stderr.String())
	}
	node, err := cs.CoreV1().Nodes().Get(ctx, "gpu-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	devs, err := annotation.Decode(node.Annotations[annotation.KeyNVIDIARegister])
	if err != nil || len(devs) != 8 {
		t.Fatalf("register annotation: %d devices, %v", len(devs), err)
	}
	ones := make([]annotation.MigPlacement, 7)
	for i := range ones {
		ones[i] = annotation.MigPlacement{Start: uint32(i), Size: 1}
	}
	wantProfiles := []annotation.MigProfile{
		{Name: "1g.5gb", MemoryMB: 4864, Core: 15, SliceCount: 1, Placements: ones},
		{Name: "2g.10gb", MemoryMB: 9856, Core: 29, SliceCount: 2, Placements: []annotation.MigPlacement{{Start: 0, Size: 2}, {Start: 2, Size: 2}, {Start: 4, Size: 2}}},
		{Name: "3g.20gb", MemoryMB: 19968, Core: 43, SliceCount: 3, Placements: []annotation.MigPlacement{{Start: 0, Size: 4}, {Start: 4, Size: 4}}},
		{Name: "7g.40gb", MemoryMB: 40192, Core: 100, SliceCount: 7, Placements: []annotation.MigPlacement{{Start: 0, Size: 8}}},
	}
	for _, d := range devs {
		if d.Mode != "mig" || d.Count != 7 || d.Devmem != 40960 || d.Devcore != 100 {
			t.Errorf("device %d: mode %q count %d devmem %d devcore %d", d.Index, d.Mode, d.Count, d.Devmem, d.Devcore)
		}
		if diff := cmp.Diff(wantProfiles, d.MIGProfiles); diff != "" {
			t.Errorf("device %d profiles (-want +got):\n%s", d.Index, diff)
		}
	}
	m := regexp.MustCompile(`address="(http://[^"]+)"`).FindStringSubmatch(stderr.String())
	if m == nil {
		t.Fatalf("no debug address in the log:\n%s", stderr.String())
	}
	state := debugState(ctx, t, m[1])
	if len(state.GPUs) != 8 || state.Overlaps != "" || state.GPUs[3].MIGMode != 1 || len(state.GPUs[3].Instances) != 0 {
		t.Fatalf("debug state before Allocate: %+v", state)
	}

	// The scheduler reserved a 2g.10gb at placement 2 of GPU 3 (as HAMi master writes it).
	gpu := devs[3].ID
	allocationtest.Schedule(t, cs, pod, "gpu-1", allocation.PodDevices{{{UUID: gpu, Type: "NVIDIA", Usedmem: 9856, Usedcores: 29}}}, allocationtest.Options{})
	reservation := mig.EncodeAllocations([]mig.Allocation{{GPUUUID: gpu, Profile: "2g.10gb", Placement: mig.Placement{Start: 2, Size: 2}}})
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{mig.KeyAllocations: reservation}}})
	if _, err := cs.CoreV1().Pods("default").Patch(ctx, "train", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	ids, err := k.PickHealthy(ctx, "nvidia.com/gpu", 1)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := k.Allocate(ctx, "nvidia.com/gpu", ids)
	if err != nil {
		t.Fatalf("Allocate: %v\nstderr:\n%s", err, stderr.String())
	}
	state = debugState(ctx, t, m[1])
	got := state.GPUs[3].Instances
	if len(got) != 1 || got[0].Profile != "2g.10gb" || got[0].Placement != (mig.Placement{Start: 2, Size: 2}) || state.Overlaps != "" {
		t.Fatalf("debug state after Allocate: %+v", state)
	}
	if env := resp.ContainerResponses[0].Envs["NVIDIA_VISIBLE_DEVICES"]; env != got[0].MigUUID {
		t.Errorf("NVIDIA_VISIBLE_DEVICES = %q, want the MIG device %q", env, got[0].MigUUID)
	}
	after, err := cs.CoreV1().Pods("default").Get(ctx, "train", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	allocs, err := mig.DecodeAllocations(after.Annotations[mig.KeyAllocations])
	if err != nil || len(allocs) != 1 || allocs[0].Runtime == nil || allocs[0].Runtime.MigUUID != got[0].MigUUID ||
		allocs[0].Runtime.GPUInstanceID != got[0].GPUInstanceID {
		t.Errorf("reservation after Allocate: %+v, %v", allocs, err)
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

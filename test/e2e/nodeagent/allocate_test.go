package nodeagent_test

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/envtest/kubeletpeer"
	"github.com/hamireg/hamireg/kubeletplugin"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// cacheFile is HAMi-core's shared cache under the chart's HOOK_PATH, a random UUID per
// Allocate.
var cacheFile = regexp.MustCompile(`^/usr/local/vgpu/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\.cache$`)

// wantContainer checks what the kubelet's device manager got for container name of pod: the
// HAMi-core environment and mounts of spec section 7.2 for its entry, exactly, and device
// ids that are replicas of the entry's GPUs (GetPreferredAllocation through ManagerImpl),
// apart from ids in reused: the kubelet hands an app container the devices of the pod's
// finished init containers first (ManagerImpl's devicesToReuse, sent as must-include ids),
// which no plugin answer can change.
func wantContainer(t *testing.T, pod *corev1.Pod, name string, entry allocation.ContainerDevices, got kubeletpeer.Allocation, reused []string) {
	t.Helper()
	uuids := make([]string, len(entry))
	want := map[string]string{
		"CUDA_DEVICE_SM_LIMIT": strconv.Itoa(int(entry[0].Usedcores)),
		"LIBCUDA_LOG_LEVEL":    "1",
	}
	for i, d := range entry {
		uuids[i] = d.UUID
		want[fmt.Sprintf("CUDA_DEVICE_MEMORY_LIMIT_%d", i)] = fmt.Sprintf("%dm", d.Usedmem)
	}
	want["NVIDIA_VISIBLE_DEVICES"] = strings.Join(uuids, ",")
	cache := got.Envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"]
	if !cacheFile.MatchString(cache) {
		t.Errorf("container %s: CUDA_DEVICE_MEMORY_SHARED_CACHE = %q, want /usr/local/vgpu/<uuid>.cache", name, cache)
	}
	want["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = cache
	if diff := cmp.Diff(want, got.Envs); diff != "" {
		t.Errorf("container %s: environment (-want +got):\n%s", name, diff)
	}
	wantMounts := []kubeletpeer.Mount{
		{ContainerPath: "/etc/ld.so.preload", HostPath: "/usr/local/vgpu/ld.so.preload", ReadOnly: true},
		{ContainerPath: "/tmp/vgpulock", HostPath: "/tmp/vgpulock"},
		{ContainerPath: "/usr/local/vgpu", HostPath: "/usr/local/vgpu/containers/" + string(pod.UID) + "_" + name},
		{ContainerPath: "/usr/local/vgpu/libvgpu.so", HostPath: "/usr/local/vgpu/libvgpu.so", ReadOnly: true},
	}
	mounts := slices.Clone(got.Mounts)
	slices.SortFunc(mounts, func(a, b kubeletpeer.Mount) int { return strings.Compare(a.ContainerPath, b.ContainerPath) })
	if diff := cmp.Diff(wantMounts, mounts); diff != "" {
		t.Errorf("container %s: mounts (-want +got):\n%s", name, diff)
	}
	ids := got.DeviceIDs[resourceName]
	if len(ids) != len(entry) {
		t.Errorf("container %s: the kubelet chose %d devices %v, want %d", name, len(ids), ids, len(entry))
	}
	for _, id := range ids {
		u, _, err := kubeletplugin.ParseVirtualDeviceID(id)
		if err != nil {
			t.Errorf("container %s: kubelet device id %q: %v", name, id, err)
		}
		if !slices.Contains(uuids, u) && !slices.Contains(reused, id) {
			t.Errorf("container %s: the kubelet chose %s, a replica of %s, not of the scheduler's %v (and not reused from an init container)", name, id, u, uuids)
		}
	}
}

// TestAllocate binds pods as HAMi's scheduler does and admits them through the kubelet's
// device manager, one container at a time: each container gets its entry's HAMi-core
// environment, the entry is consumed, and after the last one the pod has bind-phase success
// and the node lock is gone; until then the lock stays.
func TestAllocate(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	tests := map[string]struct {
		ctrs    []harness.Ctr
		devices func() allocation.PodDevices // init containers first
	}{
		"one container": {
			ctrs:    []harness.Ctr{{Name: "cuda", GPUs: 1}},
			devices: func() allocation.PodDevices { return allocation.PodDevices{{f.Share(0, 3000, 30)}} },
		},
		"two containers": {
			ctrs: []harness.Ctr{{Name: "trainer", GPUs: 1}, {Name: "evaluator", GPUs: 1}},
			devices: func() allocation.PodDevices {
				return allocation.PodDevices{{f.Share(1, 3000, 30)}, {f.Share(2, 2000, 20)}}
			},
		},
		"init container": {
			ctrs: []harness.Ctr{{Name: "warmup", Init: true, GPUs: 1}, {Name: "main", GPUs: 2}},
			devices: func() allocation.PodDevices {
				return allocation.PodDevices{{f.Share(3, 1000, 10)}, {f.Share(4, 4000, 40), f.Share(5, 4000, 40)}}
			},
		},
		"sidecar without GPU": {
			ctrs: []harness.Ctr{{Name: "proxy"}, {Name: "infer", GPUs: 1}, {Name: "logger"}},
			devices: func() allocation.PodDevices {
				return allocation.PodDevices{{}, {f.Share(6, 8000, 50)}, {}}
			},
		},
	}
	for name, tc := range tests { // sequential: one pod at a time holds the node lock
		t.Run(name, func(t *testing.T) {
			podName := strings.ToLower(strings.ReplaceAll(name, " ", "-"))
			devices := tc.devices()
			pod := f.Schedule(t, f.CreatePod(t, podName, tc.ctrs...), devices)
			if f.Lock(t) == "" {
				t.Fatal("no node lock after bind")
			}
			entryOf := map[string]allocation.ContainerDevices{}
			for i, d := range devices {
				c, _ := allocation.ContainerAt(pod, i)
				entryOf[c.Name] = d
			}
			names := harness.GPUContainers(pod)
			var reused []string
			for i, c := range names {
				got, err := f.DM.Allocate(t.Context(), pod, c)
				if err != nil {
					t.Fatalf("allocate container %s: %v", c, err)
				}
				wantContainer(t, pod, c, entryOf[c], got, reused)
				if slices.ContainsFunc(pod.Spec.InitContainers, func(k corev1.Container) bool { return k.Name == c }) {
					reused = append(reused, got.DeviceIDs[resourceName]...)
				}
				if i < len(names)-1 {
					p, _ := f.Pod(t, podName)
					if ph := p.Annotations[allocation.KeyBindPhase]; ph != string(allocation.PhaseAllocating) || f.Lock(t) == "" {
						t.Errorf("after container %s of %d: bind-phase %q, lock %q; want allocating and the lock kept", c, len(names), ph, f.Lock(t))
					}
				}
			}
			f.WantProtocolEnd(t, podName, allocation.PhaseSuccess)
			p, _ := f.Pod(t, podName)
			left, err := allocation.DecodePodDevices(p.Annotations[annotation.KeyNVIDIAToAllocate], allocation.VersionMaster)
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := left.Next(); ok || len(left) != len(devices) {
				t.Errorf("%s = %q after the last container: want %d empty entries", annotation.KeyNVIDIAToAllocate, p.Annotations[annotation.KeyNVIDIAToAllocate], len(devices))
			}
			if got, want := p.Annotations[annotation.KeyNVIDIAAllocated], allocation.EncodePodDevices(devices); got != want {
				t.Errorf("%s = %q, want the scheduler's %q untouched", annotation.KeyNVIDIAAllocated, got, want)
			}
		})
	}
}

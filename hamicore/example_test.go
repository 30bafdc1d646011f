package hamicore_test

import (
	"fmt"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/hamicore"
)

// A device plugin serves the container of a pod the scheduler gave 3000 MiB and 30 % of the
// cores of GPU-b: HAMi-core's environment and mounts with the chart's settings.
func Example() {
	gpus := []annotation.Device{
		{ID: "GPU-a", Count: 10, Devmem: 23028, Devcore: 100, Type: "NVIDIA A10", Mode: "hami-core", Health: true},
		{ID: "GPU-b", Index: 1, Count: 10, Devmem: 23028, Devcore: 100, Type: "NVIDIA A10", Mode: "hami-core", Health: true},
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{UID: "7f3c", Annotations: map[string]string{annotation.KeyNVIDIAToAllocate: "GPU-b,NVIDIA,3000,30:;"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "train"}}},
	}
	const cacheID = "c0ffee"
	answer := func(pod *corev1.Pod, ctr *corev1.Container, entry allocation.ContainerDevices) (allocation.Response, error) {
		// snippet: doc
		c := hamicore.Container{PodUID: string(pod.UID), Name: ctr.Name, Env: ctr.Env, CacheID: cacheID}
		resp, err := hamicore.ContainerResponse(entry, c, gpus, hamicore.EnvOptions{}) // the chart's settings
		if err != nil {
			return allocation.Response{}, err
		}
		// create resp.StateDir (empty, mode 0777), then answer the kubelet with resp
		// end snippet
		return resp, nil
	}

	pd, err := allocation.DecodePodDevices(pod.Annotations[annotation.KeyNVIDIAToAllocate], allocation.VersionMaster)
	if err != nil {
		fmt.Println(err)
		return
	}
	i, _ := pd.Next()
	ctr, _ := allocation.ContainerAt(pod, i)
	resp, err := answer(pod, ctr, pd[i])
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, k := range slices.Sorted(maps.Keys(resp.Envs)) {
		fmt.Printf("%s=%s\n", k, resp.Envs[k])
	}
	for _, m := range resp.Mounts {
		fmt.Printf("%s -> %s (read-only %v)\n", m.HostPath, m.ContainerPath, m.ReadOnly)
	}
	fmt.Println("state folder:", resp.StateDir)
	// Output:
	// CUDA_DEVICE_MEMORY_LIMIT_0=3000m
	// CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/c0ffee.cache
	// CUDA_DEVICE_SM_LIMIT=30
	// LIBCUDA_LOG_LEVEL=1
	// NVIDIA_VISIBLE_DEVICES=GPU-b
	// /usr/local/vgpu/libvgpu.so -> /usr/local/vgpu/libvgpu.so (read-only true)
	// /usr/local/vgpu/containers/7f3c_train -> /usr/local/vgpu (read-only false)
	// /tmp/vgpulock -> /tmp/vgpulock (read-only false)
	// /usr/local/vgpu/ld.so.preload -> /etc/ld.so.preload (read-only true)
	// state folder: /usr/local/vgpu/containers/7f3c_train
}

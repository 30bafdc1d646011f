// Package monitortest writes HAMi-core regions where a node monitor reads them, as
// HAMi-core inside a container would, so that tests, demos and simulated nodes have real
// files for package monitor (and for HAMi's own vGPUmonitor) to read. It does not import
// package testing: programs such as the quickstart use it too.
//
//	path, err := monitortest.WriteContainer(root, pod.UID, "cuda", "0f7e6d5c", monitortest.Region(1,
//		monitortest.GPU{UUID: uuid, Limit: 10 << 30, Used: 3 << 30, SMUtil: 25}))
package monitortest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/types"

	"github.com/hamireg/hamireg/hamicore/region"
)

// ErrBadName is a pod UID, container name, claim UID or cache ID that cannot be a folder or
// file name of the layout (empty, or with a path separator).
var ErrBadName = errors.New("name not usable in a region path")

// GPU is one device of a [Region]: the UUID, HAMi-core's memory limit in bytes (0 = none),
// the bytes the container's process uses on it and its SM utilisation in percent.
type GPU struct {
	UUID   string
	Limit  uint64
	Used   uint64
	SMUtil uint64
	// SMLimit is the core limit in percent; 0 means 100.
	SMLimit uint64
}

// Region returns a 1.2 region as HAMi-core leaves it with one running CUDA process (host
// PID hostPID) using gpus: the device count, UUIDs and limits, the process's memory per
// device (context 300 MiB, the rest data, total the sum, NVML's view equal), a fresh
// feedback state (recent_kernel 2, utilization_switch 1) and priority 1.
func Region(hostPID int32, gpus ...GPU) *region.Region {
	r := &region.Region{Layout: region.LayoutV1, Major: 1, Minor: 2, DeviceCount: uint64(len(gpus)), ProcNum: 1,
		UtilizationSwitch: 1, RecentKernel: 2, Priority: 1}
	slot := region.Slot{Index: 0, PID: 1, HostPID: hostPID, Status: 1}
	for i, g := range gpus {
		if i >= region.MaxDevices {
			break
		}
		d := region.Device{MemoryLimit: g.Limit, SMLimit: g.SMLimit}
		if d.SMLimit == 0 {
			d.SMLimit = 100
		}
		_ = d.SetUUID(g.UUID) // a UUID too long for the field is left empty, as HAMi-core never writes one
		r.Devices = append(r.Devices, d)
		ctx := min(g.Used, 300<<20)
		slot.Used[i] = region.Memory{Context: ctx, Data: g.Used - ctx, Total: g.Used}
		slot.MonitorUsed[i] = g.Used
		slot.Util[i].SM = g.SMUtil
	}
	r.Slots = []region.Slot{slot}
	return r
}

func checkName(kind, s string) error {
	if s == "" || strings.ContainsAny(s, `/\`) || s == "." || s == ".." {
		return fmt.Errorf("%w: %s %q", ErrBadName, kind, s)
	}
	return nil
}

// WriteContainer writes r as the region of container ctr of the pod with UID podUID under
// root (the monitor's root, HAMi's /usr/local/vgpu): the folder
// <root>/containers/<podUID>_<ctr>/ (mode 0777, made when the device plugin has not),
// the empty libvgpu.so mount point the runtime leaves there, and <cacheID>.cache, written
// as region.WriteFile does (the magic last; an existing file is rewritten in place). It
// returns the region file's path.
func WriteContainer(root string, podUID types.UID, ctr, cacheID string, r *region.Region) (string, error) {
	for _, c := range [][2]string{{"pod UID", string(podUID)}, {"container", ctr}, {"cache ID", cacheID}} {
		if err := checkName(c[0], c[1]); err != nil {
			return "", err
		}
	}
	dir := filepath.Join(root, "containers", string(podUID)+"_"+ctr)
	return write(dir, filepath.Join(dir, cacheID+".cache"), true, r)
}

// WriteClaim writes r as the region of a DRA claim under root, where the SDK's DRA driver
// points HAMi-core: <root>/claims/<claimUID>/<claimUID>.cache.
func WriteClaim(root string, claimUID types.UID, r *region.Region) (string, error) {
	if err := checkName("claim UID", string(claimUID)); err != nil {
		return "", err
	}
	dir := filepath.Join(root, "claims", string(claimUID))
	return write(dir, filepath.Join(dir, string(claimUID)+".cache"), false, r)
}

func write(dir, path string, lib bool, r *region.Region) (string, error) {
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return "", fmt.Errorf("write region: %w", err)
	}
	if lib {
		f, err := os.OpenFile(filepath.Join(dir, "libvgpu.so"), os.O_RDONLY|os.O_CREATE, 0o644)
		if err != nil {
			return "", fmt.Errorf("write region: %w", err)
		}
		_ = f.Close()
	}
	if err := region.WriteFile(path, r); err != nil {
		return "", err
	}
	return path, nil
}

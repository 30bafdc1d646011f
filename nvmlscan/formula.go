package nvmlscan

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"strconv"
	"strings"
)

// The per-device formulas of HAMi's node agent (register.go, v2.9.0 and master). They are
// pure so that the formula table of the specification can be tested without NVML.

// devmem is the published memory in MiB: whole MiB of totalBytes, times scaling truncated
// towards zero unless the node is in MIG mode or scaling is 1. HAMi computes
// int32(float64(int32(total/2^20)) × scaling); values that do not fit an int32 are an error
// here instead of wrapping around.
func devmem(totalBytes uint64, scaling float64, mig bool) (int32, error) {
	mib := totalBytes / (1 << 20)
	if mib > math.MaxInt32 {
		return 0, fmt.Errorf("%w: %d MiB of memory", ErrOutOfRange, mib)
	}
	if mig || scaling == 1 {
		return int32(mib), nil
	}
	scaled := float64(int32(mib)) * scaling
	if scaled >= math.MaxInt32+1 {
		return 0, fmt.Errorf("%w: %d MiB × memory scaling %v", ErrOutOfRange, mib, scaling)
	}
	return int32(scaled), nil
}

// devcore is the published core percentage: int32(scaling × 100) with Go's truncating
// conversion (0.29 → 28, 1.15 → 114), or 100 in MIG mode. Options validation keeps the
// product within int32.
func devcore(scaling float64, mig bool) int32 {
	if mig {
		return 100
	}
	return int32(scaling * 100)
}

// deviceType is the published "type": the model when it starts with "NVIDIA" (no space
// required), else "NVIDIA-" + model.
func deviceType(model string) string {
	if strings.HasPrefix(model, "NVIDIA") {
		return model
	}
	return "NVIDIA-" + model
}

// busIDString converts NVML's NUL-terminated PciInfo.BusId.
func busIDString(raw [32]int8) string {
	b := make([]byte, 0, len(raw))
	for _, c := range raw {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b)
}

// sysfsBusID turns NVML's bus id ("00000000:3B:00.0", 8 hex digits of PCI domain) into the
// sysfs directory name ("0000:3b:00.0"): lower-cased, with the leading "0000" trimmed as HAMi
// and NVIDIA's plugin do. A bus id that already has a 4-digit domain is left as is (HAMi would
// trim it to ":3b:00.0", which no real NVML returns).
func sysfsBusID(busID string) string {
	id := strings.ToLower(strings.TrimSpace(busID))
	if domain, _, ok := strings.Cut(id, ":"); ok && len(domain) == 8 {
		id = strings.TrimPrefix(id, "0000")
	}
	return id
}

// errNoBusID means NVML reported an empty PCI bus id (go-nvml's simulated servers do).
var errNoBusID = errors.New("empty pci bus id")

// numaNode reads bus/pci/devices/<bus id>/numa_node under sysfs. A negative value ("-1": no
// affinity) gives 0 and a nil error; an unreadable or malformed file gives 0 and the error,
// both as HAMi.
func numaNode(sysfs fs.FS, busID string) (int, error) {
	n, err := kernelNUMANode(sysfs, busID)
	return max(n, 0), err
}

// kernelNUMANode is the value of bus/pci/devices/<bus id>/numa_node under sysfs as the kernel
// wrote it (-1: no affinity); -1 and the error when the file cannot be read or parsed.
func kernelNUMANode(sysfs fs.FS, busID string) (int, error) {
	id := sysfsBusID(busID)
	if id == "" {
		return -1, errNoBusID
	}
	raw, err := fs.ReadFile(sysfs, "bus/pci/devices/"+id+"/numa_node")
	if err != nil {
		return -1, fmt.Errorf("read numa node: %w", err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		return -1, fmt.Errorf("parse numa node of %s: %w", id, err)
	}
	return n, nil
}

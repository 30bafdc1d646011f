package region

import "fmt"

// Magic is HAMi-core's initialized_flag: the last word it writes when it creates a region.
// A file without it is not initialised yet.
const Magic = 19920718

// The fixed sizes of HAMi-core's shared region.
const (
	// MaxDevices is the length of the region's per-device arrays (CUDA_DEVICE_MAX_COUNT).
	MaxDevices = 16
	// MaxSlots is the number of process slots (SHARED_REGION_MAX_PROCESS_NUM).
	MaxSlots = 1024
	// UUIDSize is the size of one device UUID field, NUL padded.
	UUIDSize = 96
	// HeaderSize is the smallest file anything can be read from: the magic and the two
	// version words of the 1.x layouts.
	HeaderSize = 12
)

// Layout is one of the binary layouts HAMi-core's shared_region_t has had (little-endian,
// x86-64, glibc's 32-byte sem_t).
type Layout int

// The layouts this package reads. [Detect] chooses one by file size and version words.
const (
	// LayoutUnknown is no layout: the zero value.
	LayoutUnknown Layout = iota
	// LayoutV0 is HAMi-core before 2024-08 (HAMi ≤ v2.4.0): no version words, a 1168-byte
	// process slot; file size 1197897.
	LayoutV0
	// LayoutV1 is HAMi-core 1.1 (2024-08 .. 2026-03) and 1.2 (from 2026-04, HAMi v2.8.2 and
	// later): the same offsets, 1.2 adds a sequence lock in the slot's padding and a second
	// semaphore in the tail's padding; file size 2008953.
	LayoutV1
	// LayoutV1SeqlockFirst is the HAMi-core of 2026-03-25 .. 2026-04-24 (shipped with HAMi
	// v2.8.1): version 1.1, but the second semaphore follows the first and the slot's
	// sequence lock follows hostpid, which shifts every later field; file size 2008985.
	// HAMi's monitor reads it as LayoutV1 and gets every field wrong.
	LayoutV1SeqlockFirst
)

// String returns "v0", "v1", "v1.1-seqlock-first" or "unknown".
func (l Layout) String() string {
	switch l {
	case LayoutV0:
		return "v0"
	case LayoutV1:
		return "v1"
	case LayoutV1SeqlockFirst:
		return "v1.1-seqlock-first"
	case LayoutUnknown:
	}
	return "unknown"
}

// Field is a word of the region's tail that a monitor reads or writes.
type Field int

// The tail's words. HAMi's priority feedback writes only RecentKernel and UtilizationSwitch.
const (
	// FieldProcNum is proc_num, the number of process slots in use (int32).
	FieldProcNum Field = iota
	// FieldUtilizationSwitch is utilization_switch (int32): 1 = HAMi-core enforces the core limit.
	FieldUtilizationSwitch
	// FieldRecentKernel is recent_kernel (int32): HAMi-core sets 2 at a kernel launch, the
	// monitor counts it down each round and writes -1 to block the container.
	FieldRecentKernel
	// FieldPriority is priority (int32), from CUDA_TASK_PRIORITY: 0 is high, 1 (the default) low.
	FieldPriority
)

// String returns the field's name in HAMi-core's header.
func (f Field) String() string {
	switch f {
	case FieldProcNum:
		return "proc_num"
	case FieldUtilizationSwitch:
		return "utilization_switch"
	case FieldRecentKernel:
		return "recent_kernel"
	case FieldPriority:
		return "priority"
	}
	return fmt.Sprintf("Field(%d)", int(f))
}

// offsets are the byte offsets of one layout (spec: hami-monitor.md §3.2).
type offsets struct {
	versioned                      bool // major/minor at 4 and 8
	smInitFlag, ownerPID, sem      int64
	semPostinit                    int64 // -1: none
	num, uuids, limit, smLimit     int64
	procs, slotSize                int64
	slotPID, slotHostPID           int64
	slotSeqlock                    int64 // -1: none (a 1.1 file has zero padding there: read only from 1.2)
	slotUsed, usedStride           int64
	slotMonitorUsed                int64
	slotUtil, utilStride           int64
	slotStatus                     int64
	procNum, utilSwitch, recentKer int64
	priority                       int64
	lastKernelTime                 int64 // -1: none
	size                           int64 // sizeof(shared_region_t); HAMi-core's file is one byte longer
}

var layouts = [...]offsets{
	LayoutV0: {
		smInitFlag: 4, ownerPID: 8, sem: 16, semPostinit: -1,
		num: 48, uuids: 56, limit: 1592, smLimit: 1720, procs: 1848, slotSize: 1168,
		slotPID: 0, slotHostPID: 4, slotSeqlock: -1, slotUsed: 8, usedStride: 40, slotMonitorUsed: 648,
		slotUtil: 776, utilStride: 24, slotStatus: 1160,
		procNum: 1197880, utilSwitch: 1197884, recentKer: 1197888, priority: 1197892, lastKernelTime: -1,
		size: 1197896,
	},
	LayoutV1: {
		versioned:  true,
		smInitFlag: 12, ownerPID: 16, sem: 24, semPostinit: 2008920,
		num: 56, uuids: 64, limit: 1600, smLimit: 1728, procs: 1856, slotSize: 1960,
		slotPID: 0, slotHostPID: 4, slotSeqlock: 1936, slotUsed: 8, usedStride: 64, slotMonitorUsed: 1032,
		slotUtil: 1160, utilStride: 48, slotStatus: 1928,
		procNum: 2008896, utilSwitch: 2008900, recentKer: 2008904, priority: 2008908, lastKernelTime: 2008912,
		size: 2008952,
	},
	LayoutV1SeqlockFirst: {
		versioned:  true,
		smInitFlag: 12, ownerPID: 16, sem: 24, semPostinit: 56,
		num: 88, uuids: 96, limit: 1632, smLimit: 1760, procs: 1888, slotSize: 1960,
		slotPID: 0, slotHostPID: 4, slotSeqlock: 8, slotUsed: 16, usedStride: 64, slotMonitorUsed: 1040,
		slotUtil: 1168, utilStride: 48, slotStatus: 1936,
		procNum: 2008928, utilSwitch: 2008932, recentKer: 2008936, priority: 2008940, lastKernelTime: 2008944,
		size: 2008984,
	},
}

func (l Layout) valid() bool { return l > LayoutUnknown && int(l) < len(layouts) }

// StructSize is sizeof(shared_region_t) of the layout; HAMi-core's file is one byte longer
// (it extends the file by writing one byte at this offset). 0 for an unknown layout.
func (l Layout) StructSize() int64 {
	if !l.valid() {
		return 0
	}
	return layouts[l].size
}

// Offset returns the byte offset of f in the layout; ok is false for an unknown layout or
// field.
func (l Layout) Offset(f Field) (offset int64, ok bool) {
	if !l.valid() {
		return 0, false
	}
	o := layouts[l]
	switch f {
	case FieldProcNum:
		return o.procNum, true
	case FieldUtilizationSwitch:
		return o.utilSwitch, true
	case FieldRecentKernel:
		return o.recentKer, true
	case FieldPriority:
		return o.priority, true
	}
	return 0, false
}

// hasSeqlock reports whether slots of a file of this layout and minor version carry a
// sequence lock: 1.2, and the seqlock-first 1.1.
func (l Layout) hasSeqlock(minor uint32) bool {
	switch l {
	case LayoutV1:
		return minor >= 2
	case LayoutV1SeqlockFirst:
		return true
	case LayoutUnknown, LayoutV0:
	}
	return false
}

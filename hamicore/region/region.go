package region

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
)

// Errors of [Detect] and [Read], classified for errors.Is. Every error of this package wraps
// [ErrInvalid] as well as one of the others.
var (
	// ErrInvalid is any region that cannot be read: every other error below wraps it.
	ErrInvalid = errors.New("invalid HAMi-core shared region")
	// ErrTooSmall is a file shorter than [HeaderSize] bytes.
	ErrTooSmall = fmt.Errorf("%w: file too small", ErrInvalid)
	// ErrNotInitialized is a file whose first word is not [Magic]: HAMi-core has not finished
	// creating it (or it is not a region). Read it again later.
	ErrNotInitialized = fmt.Errorf("%w: magic flag not set", ErrInvalid)
	// ErrUnknownLayout is a file whose size and version match no layout this package knows.
	ErrUnknownLayout = fmt.Errorf("%w: unknown layout", ErrInvalid)
	// ErrTruncated is a file that became shorter than its layout while it was read.
	ErrTruncated = fmt.Errorf("%w: file truncated", ErrInvalid)
)

// Detect chooses the layout of a region file of size bytes whose first bytes are header
// (at least [HeaderSize] of them, fewer only when the file is that short). The table, by
// file size and version words (major.minor at bytes 4 and 8):
//
//	1197896–1197897 bytes, any version words    LayoutV0 (it has none: bytes 4..12 are other fields)
//	2008952–2008953 bytes, version 1.1 or 1.2   LayoutV1
//	2008984–2008985 bytes, version 1.1          LayoutV1SeqlockFirst
//
// The lower size is sizeof(shared_region_t), the upper the file HAMi-core writes. Anything
// else is [ErrUnknownLayout]: the file is never read as a layout it does not match (HAMi's
// monitor reads a 1.5 MB file as v0 and the seqlock-first file as v1). major and minor are
// the version words as read (0 for v0 and short files).
func Detect(size int64, header []byte) (layout Layout, major, minor uint32, err error) {
	if size < HeaderSize || len(header) < HeaderSize {
		return LayoutUnknown, 0, 0, fmt.Errorf("%w: %d bytes, a region has at least %d", ErrTooSmall, size, HeaderSize)
	}
	if flag := int32(binary.LittleEndian.Uint32(header)); flag != Magic {
		return LayoutUnknown, 0, 0, fmt.Errorf("%w: initialized_flag %d, want %d", ErrNotInitialized, flag, Magic)
	}
	major, minor = binary.LittleEndian.Uint32(header[4:]), binary.LittleEndian.Uint32(header[8:])
	switch {
	case size == layouts[LayoutV0].size || size == layouts[LayoutV0].size+1:
		return LayoutV0, 0, 0, nil
	case (size == layouts[LayoutV1].size || size == layouts[LayoutV1].size+1) && major == 1 && (minor == 1 || minor == 2):
		return LayoutV1, major, minor, nil
	case (size == layouts[LayoutV1SeqlockFirst].size || size == layouts[LayoutV1SeqlockFirst].size+1) && major == 1 && minor == 1:
		return LayoutV1SeqlockFirst, major, minor, nil
	}
	return LayoutUnknown, major, minor, fmt.Errorf("%w: file size %d, version %d.%d (known: v0 %d bytes, v1.1/1.2 %d, v1.1-seqlock-first %d)",
		ErrUnknownLayout, size, major, minor, layouts[LayoutV0].size+1, layouts[LayoutV1].size+1, layouts[LayoutV1SeqlockFirst].size+1)
}

// Region is one read of a HAMi-core shared region: every field a monitor uses, decoded
// with bounds checks from bytes read out of the file (never a cast of a mapping).
type Region struct {
	// Layout is the layout the file was read as; Major and Minor its version words (0 for v0).
	Layout       Layout
	Major, Minor uint32
	// Size is the file's size when it was read.
	Size int64
	// SMInitFlag and OwnerPID are sm_init_flag and owner_pid as written.
	SMInitFlag int32
	OwnerPID   uint64
	// DeviceCount is the device_num word as written; Devices has min(DeviceCount,
	// [MaxDevices]) entries, in the container's NVML order.
	DeviceCount uint64
	Devices     []Device
	// ProcNum is proc_num as written (a corrupt region may hold a negative or huge value).
	ProcNum int32
	// Slots are the process slots [0, clamp(ProcNum, 0, MaxSlots)), live or exited, in slot
	// order, without the slots whose sequence lock never read consistent (TornSlots counts
	// them).
	Slots     []Slot
	TornSlots int
	// UtilizationSwitch, RecentKernel and Priority are the tail's words the priority
	// feedback uses; LastKernelTime is last_kernel_time (unix seconds, 0 for v0).
	UtilizationSwitch int32
	RecentKernel      int32
	Priority          int32
	LastKernelTime    uint64
}

// Device is one entry of the region's per-device arrays.
type Device struct {
	// RawUUID is the uuids[i] field as written, NUL padded.
	RawUUID [UUIDSize]byte
	// MemoryLimit is limit[i] in bytes (0: none); SMLimit is sm_limit[i] in percent.
	MemoryLimit uint64
	SMLimit     uint64
}

// UUID returns the UUID up to its first NUL.
func (d *Device) UUID() string {
	if i := bytes.IndexByte(d.RawUUID[:], 0); i >= 0 {
		return string(d.RawUUID[:i])
	}
	return string(d.RawUUID[:])
}

// ValidUUID reports whether HAMi-core has written the UUID (its first byte is not NUL).
func (d *Device) ValidUUID() bool { return d.RawUUID[0] != 0 }

// Memory is a process's memory on one device, as HAMi-core accounts it, in bytes. Total is
// HAMi-core's own counter, not the sum of the others.
type Memory struct {
	Context, Module, Data, Offset, Total uint64
}

// add sums m into s, wrapping as HAMi's uint64 sums do.
func (s *Memory) add(m Memory) {
	s.Context += m.Context
	s.Module += m.Module
	s.Data += m.Data
	s.Offset += m.Offset
	s.Total += m.Total
}

// Util is a process's utilisation of one device, in percent points.
type Util struct {
	Dec, Enc, SM uint64
}

// Slot is one process slot (shrreg_proc_slot_t).
type Slot struct {
	// Index is the slot's position in the region.
	Index int
	// PID is the process in the container's PID namespace, HostPID the same process on the
	// host (0 until HAMi-core found it through NVML).
	PID, HostPID int32
	// Status is 1 running, 2 suspended, 0 exited (HAMi-core keeps an exited slot's counters
	// until it compacts the table).
	Status int32
	// Seq is the 1.2 sequence lock word (0 for layouts without one).
	Seq uint64
	// Used is HAMi-core's accounting per container-local device index; MonitorUsed the same
	// process's memory as NVML reported it to HAMi-core; Util its utilisation.
	Used        [MaxDevices]Memory
	MonitorUsed [MaxDevices]uint64
	Util        [MaxDevices]Util
}

// Live reports whether the slot's process has not exited (status != 0).
func (s *Slot) Live() bool { return s.Status != 0 }

// Usage returns device i's memory and SM utilisation summed over the live slots, the sums
// HAMi v2.10.0's monitor exports (exited slots and slots beyond proc_num are not counted).
// An index outside Devices gives zeros.
func (r *Region) Usage(i int) (mem Memory, smUtil uint64) {
	if i < 0 || i >= MaxDevices {
		return Memory{}, 0
	}
	for k := range r.Slots {
		s := &r.Slots[k]
		if !s.Live() {
			continue
		}
		mem.add(s.Used[i])
		smUtil += s.Util[i].SM
	}
	return mem, smUtil
}

// seqlockRetries is how often a slot whose sequence lock shows a write in progress is read
// again before it is left out (HAMi-core holds it for a few stores).
const seqlockRetries = 4

// Read reads the region of a file of size bytes from r. It reads the header, the tail and
// the slots below proc_num only (a few KiB for a typical container, never the 2 MB file),
// each with one ReadAt, so that a file truncated or rewritten meanwhile yields
// [ErrTruncated] or a region that is consistent per slot, never a fault. Slots of a 1.2
// region are read twice and kept only when both reads agree and the sequence lock is even.
// Errors wrap [ErrInvalid].
func Read(r io.ReaderAt, size int64) (*Region, error) {
	head := make([]byte, min(size, layouts[LayoutV1SeqlockFirst].procs))
	if size < 0 {
		head = nil
	}
	if err := readFull(r, head, 0); err != nil {
		return nil, err
	}
	layout, major, minor, err := Detect(size, head)
	if err != nil {
		return nil, err
	}
	o := &layouts[layout]
	reg := &Region{Layout: layout, Major: major, Minor: minor, Size: size}
	reg.SMInitFlag = int32(binary.LittleEndian.Uint32(head[o.smInitFlag:]))
	reg.OwnerPID = binary.LittleEndian.Uint64(head[o.ownerPID:])
	reg.DeviceCount = binary.LittleEndian.Uint64(head[o.num:])
	reg.Devices = make([]Device, min(reg.DeviceCount, MaxDevices))
	for i := range reg.Devices {
		d := &reg.Devices[i]
		copy(d.RawUUID[:], head[o.uuids+int64(i)*UUIDSize:])
		d.MemoryLimit = binary.LittleEndian.Uint64(head[o.limit+int64(i)*8:])
		d.SMLimit = binary.LittleEndian.Uint64(head[o.smLimit+int64(i)*8:])
	}

	end := o.priority + 4
	if o.lastKernelTime >= 0 {
		end = o.lastKernelTime + 8
	}
	tail := make([]byte, end-o.procNum)
	if err := readFull(r, tail, o.procNum); err != nil {
		return nil, err
	}
	reg.ProcNum = int32(binary.LittleEndian.Uint32(tail))
	reg.UtilizationSwitch = int32(binary.LittleEndian.Uint32(tail[o.utilSwitch-o.procNum:]))
	reg.RecentKernel = int32(binary.LittleEndian.Uint32(tail[o.recentKer-o.procNum:]))
	reg.Priority = int32(binary.LittleEndian.Uint32(tail[o.priority-o.procNum:]))
	if o.lastKernelTime >= 0 {
		reg.LastKernelTime = binary.LittleEndian.Uint64(tail[o.lastKernelTime-o.procNum:])
	}

	n := int64(max(0, min(reg.ProcNum, MaxSlots)))
	if n == 0 {
		return reg, nil
	}
	raw := make([]byte, n*o.slotSize)
	if err := readFull(r, raw, o.procs); err != nil {
		return nil, err
	}
	seqlock := layout.hasSeqlock(minor)
	var again []byte
	if seqlock {
		again = make([]byte, len(raw))
		if err := readFull(r, again, o.procs); err != nil {
			return nil, err
		}
	}
	reg.Slots = make([]Slot, 0, n)
	for i := range n {
		lo, hi := i*o.slotSize, (i+1)*o.slotSize
		b := raw[lo:hi]
		if seqlock {
			ok, err := settle(r, o, b, again[lo:hi], o.procs+lo)
			if err != nil {
				return nil, err
			}
			if !ok {
				reg.TornSlots++
				continue
			}
		}
		reg.Slots = append(reg.Slots, decodeSlot(o, int(i), b, seqlock))
	}
	return reg, nil
}

// settle makes first a consistent read of one slot: it and second (a later read of the same
// bytes) must agree and carry an even sequence word; on disagreement the slot is read again
// up to seqlockRetries times. ok is false when it never settles.
func settle(r io.ReaderAt, o *offsets, first, second []byte, at int64) (ok bool, err error) {
	for range seqlockRetries {
		seq := binary.LittleEndian.Uint64(second[o.slotSeqlock:])
		if seq%2 == 0 && bytes.Equal(first, second) {
			return true, nil
		}
		copy(first, second)
		if err := readFull(r, second, at); err != nil {
			return false, err
		}
	}
	seq := binary.LittleEndian.Uint64(second[o.slotSeqlock:])
	if seq%2 == 0 && bytes.Equal(first, second) {
		return true, nil
	}
	return false, nil
}

func decodeSlot(o *offsets, index int, b []byte, seqlock bool) Slot {
	s := Slot{Index: index}
	s.PID = int32(binary.LittleEndian.Uint32(b[o.slotPID:]))
	s.HostPID = int32(binary.LittleEndian.Uint32(b[o.slotHostPID:]))
	s.Status = int32(binary.LittleEndian.Uint32(b[o.slotStatus:]))
	if seqlock {
		s.Seq = binary.LittleEndian.Uint64(b[o.slotSeqlock:])
	}
	for d := range MaxDevices {
		u := b[o.slotUsed+int64(d)*o.usedStride:]
		s.Used[d] = Memory{
			Context: binary.LittleEndian.Uint64(u),
			Module:  binary.LittleEndian.Uint64(u[8:]),
			Data:    binary.LittleEndian.Uint64(u[16:]),
			Offset:  binary.LittleEndian.Uint64(u[24:]),
			Total:   binary.LittleEndian.Uint64(u[32:]),
		}
		s.MonitorUsed[d] = binary.LittleEndian.Uint64(b[o.slotMonitorUsed+int64(d)*8:])
		t := b[o.slotUtil+int64(d)*o.utilStride:]
		s.Util[d] = Util{
			Dec: binary.LittleEndian.Uint64(t),
			Enc: binary.LittleEndian.Uint64(t[8:]),
			SM:  binary.LittleEndian.Uint64(t[16:]),
		}
	}
	return s
}

// readFull fills b from r at off; a short read is ErrTruncated.
func readFull(r io.ReaderAt, b []byte, off int64) error {
	if len(b) == 0 {
		return nil
	}
	n, err := r.ReadAt(b, off)
	if n == len(b) {
		return nil
	}
	if err == nil || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: %d of %d bytes at offset %d", ErrTruncated, n, len(b), off)
	}
	return fmt.Errorf("read region at offset %d: %w", off, err)
}

// ReadFile opens path and reads its region with [Read]. The file is opened read-only and
// closed before ReadFile returns.
func ReadFile(path string) (*Region, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open region: %w", err)
	}
	defer func() { _ = f.Close() }()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat region: %w", err)
	}
	reg, err := Read(f, st.Size())
	if err != nil {
		return nil, fmt.Errorf("read region %s: %w", path, err)
	}
	return reg, nil
}

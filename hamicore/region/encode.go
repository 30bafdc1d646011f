package region

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
)

// ErrNotEncodable is a [Region] that [Encode] cannot write: an unknown layout, more than
// [MaxDevices] devices or [MaxSlots] slots, a slot index out of range, a UUID longer than
// its field, or a size that is not the layout's.
var ErrNotEncodable = errors.New("region cannot be encoded")

// Encode returns the file HAMi-core writes for r, byte for byte: r.Size bytes (0 means
// HAMi-core's own size, the struct plus one byte), the semaphores as glibc (≥ 2.21, 64-bit)
// leaves them after sem_init(sem, 1, 1), version 1.Minor for the 1.x layouts (1.2 when
// Minor is 0), every field of r, and the magic. Slots go to their Index (slots may be
// sparse; ProcNum is written as given, not derived); DeviceCount is written as given, and
// Devices fill the per-device arrays. It is what tests and simulated nodes use to put real
// region files where a monitor reads them; see also [WriteFile].
func Encode(r *Region) ([]byte, error) {
	if !r.Layout.valid() {
		return nil, fmt.Errorf("%w: layout %v", ErrNotEncodable, r.Layout)
	}
	o := &layouts[r.Layout]
	size := r.Size
	if size == 0 {
		size = o.size + 1
	}
	if size != o.size && size != o.size+1 {
		return nil, fmt.Errorf("%w: size %d, layout %v takes %d or %d bytes", ErrNotEncodable, size, r.Layout, o.size, o.size+1)
	}
	if len(r.Devices) > MaxDevices {
		return nil, fmt.Errorf("%w: %d devices, at most %d", ErrNotEncodable, len(r.Devices), MaxDevices)
	}
	b := make([]byte, size)
	le := binary.LittleEndian
	le.PutUint32(b, Magic)
	minor := r.Minor
	if o.versioned {
		if minor == 0 {
			minor = 2
			if r.Layout == LayoutV1SeqlockFirst {
				minor = 1
			}
		}
		le.PutUint32(b[4:], 1)
		le.PutUint32(b[8:], minor)
	}
	le.PutUint32(b[o.smInitFlag:], uint32(r.SMInitFlag))
	le.PutUint64(b[o.ownerPID:], r.OwnerPID)
	putSem(b[o.sem:])
	if o.semPostinit >= 0 && (r.Layout == LayoutV1SeqlockFirst || minor >= 2) {
		putSem(b[o.semPostinit:])
	}
	le.PutUint64(b[o.num:], r.DeviceCount)
	for i := range r.Devices {
		d := &r.Devices[i]
		copy(b[o.uuids+int64(i)*UUIDSize:], d.RawUUID[:])
		le.PutUint64(b[o.limit+int64(i)*8:], d.MemoryLimit)
		le.PutUint64(b[o.smLimit+int64(i)*8:], d.SMLimit)
	}
	seqlock := r.Layout.hasSeqlock(minor)
	for k := range r.Slots {
		s := &r.Slots[k]
		if s.Index < 0 || s.Index >= MaxSlots {
			return nil, fmt.Errorf("%w: slot index %d outside [0, %d)", ErrNotEncodable, s.Index, MaxSlots)
		}
		sb := b[o.procs+int64(s.Index)*o.slotSize:]
		le.PutUint32(sb[o.slotPID:], uint32(s.PID))
		le.PutUint32(sb[o.slotHostPID:], uint32(s.HostPID))
		le.PutUint32(sb[o.slotStatus:], uint32(s.Status))
		if seqlock {
			le.PutUint64(sb[o.slotSeqlock:], s.Seq)
		}
		for d := range MaxDevices {
			u := sb[o.slotUsed+int64(d)*o.usedStride:]
			m := s.Used[d]
			le.PutUint64(u, m.Context)
			le.PutUint64(u[8:], m.Module)
			le.PutUint64(u[16:], m.Data)
			le.PutUint64(u[24:], m.Offset)
			le.PutUint64(u[32:], m.Total)
			le.PutUint64(sb[o.slotMonitorUsed+int64(d)*8:], s.MonitorUsed[d])
			t := sb[o.slotUtil+int64(d)*o.utilStride:]
			le.PutUint64(t, s.Util[d].Dec)
			le.PutUint64(t[8:], s.Util[d].Enc)
			le.PutUint64(t[16:], s.Util[d].SM)
		}
	}
	le.PutUint32(b[o.procNum:], uint32(r.ProcNum))
	le.PutUint32(b[o.utilSwitch:], uint32(r.UtilizationSwitch))
	le.PutUint32(b[o.recentKer:], uint32(r.RecentKernel))
	le.PutUint32(b[o.priority:], uint32(r.Priority))
	if o.lastKernelTime >= 0 {
		le.PutUint64(b[o.lastKernelTime:], r.LastKernelTime)
	}
	return b, nil
}

// putSem writes an unlocked process-shared glibc semaphore of value 1: the 8-byte data word
// 1, the private word 0x80.
func putSem(b []byte) {
	binary.LittleEndian.PutUint64(b, 1)
	binary.LittleEndian.PutUint32(b[8:], 0x80)
}

// SetUUID sets the device's UUID field (NUL padded); ErrNotEncodable when uuid is longer
// than [UUIDSize]-1 bytes.
func (d *Device) SetUUID(uuid string) error {
	if len(uuid) >= UUIDSize {
		return fmt.Errorf("%w: UUID of %d bytes, at most %d", ErrNotEncodable, len(uuid), UUIDSize-1)
	}
	d.RawUUID = [UUIDSize]byte{}
	copy(d.RawUUID[:], uuid)
	return nil
}

// WriteFile writes r to path as HAMi-core does: a new file (mode 0666 before umask) gets
// every byte but the magic first and the magic last, so that a reader never sees a
// half-written region as initialised; an existing file is rewritten in place (the same
// inode, as HAMi-core's writes through its mapping keep it). It is for tests and simulated
// nodes: a real HAMi-core writes its region itself.
func WriteFile(path string, r *Region) error {
	b, err := Encode(r)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o666)
	if err != nil {
		return fmt.Errorf("write region: %w", err)
	}
	var existing int64
	st, err := f.Stat()
	if err == nil {
		existing = st.Size()
		if existing != int64(len(b)) {
			err = f.Truncate(int64(len(b)))
		}
	}
	if err == nil {
		if existing == 0 {
			// A new region: the body first, the magic last.
			if _, err = f.WriteAt(b[4:], 4); err == nil {
				_, err = f.WriteAt(b[:4], 0)
			}
		} else {
			_, err = f.WriteAt(b, 0)
		}
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write region %s: %w", path, err)
	}
	return nil
}

// WriteField stores v into field of the open region file f, one 4-byte write at the
// layout's offset, as HAMi's monitor stores recent_kernel and utilization_switch. The layout
// is the one the file was read as; the caller re-reads the file before deciding the next
// write.
func WriteField(f io.WriterAt, layout Layout, field Field, v int32) error {
	off, ok := layout.Offset(field)
	if !ok {
		return fmt.Errorf("write %v: %w: layout %v", field, ErrUnknownLayout, layout)
	}
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], uint32(v))
	if _, err := f.WriteAt(b[:], off); err != nil {
		return fmt.Errorf("write %v: %w", field, err)
	}
	return nil
}

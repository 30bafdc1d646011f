// Package region reads and writes HAMi-core's shared region: the file (`<uuid>.cache`) that
// libvgpu.so, preloaded into every container HAMi shares a GPU with, keeps per container with
// its device limits, one slot per CUDA process (memory per device, utilisation, host PID) and
// the words HAMi's priority feedback reads and writes. HAMi's node monitor reads it to serve
// per-container metrics; package monitor builds on this one. It is pure: bytes in, fields out,
// no mapping, no cgo.
//
// # Layouts
//
// [Detect] chooses the layout by file size and version words, from an explicit table
// ([LayoutV0], [LayoutV1] for 1.1 and 1.2, [LayoutV1SeqlockFirst] for the HAMi-core shipped
// with HAMi v2.8.1, which HAMi's own monitor misreads). Anything else is [ErrUnknownLayout].
//
// # Reading untrusted bytes
//
// The region is written by the tenant's own process, so [Read] treats it as untrusted input:
// every read is a bounds-checked decode of bytes copied out of the file with ReadAt (a file
// truncated or replaced meanwhile gives [ErrTruncated], never a fault), the device count is
// clamped to [MaxDevices] and proc_num to [0, MaxSlots], and only the slots below proc_num
// are read (a few KiB, not the 2 MB file). A 1.2 region's slots carry a sequence lock:
// each is read until two reads agree with an even sequence word, so a sum never mixes a
// process's old and new counters. Errors wrap [ErrInvalid] and one class ([ErrTooSmall],
// [ErrNotInitialized], [ErrUnknownLayout], [ErrTruncated]); I/O errors are returned as they
// are.
//
// [Region.Usage] is the per-device sum HAMi v2.10.0 exports: live slots (status != 0) below
// proc_num. HAMi v2.9.0 also counts exited slots and, for v0, all 1024 slots, and panics on
// a corrupt proc_num or device count; this package does neither.
//
// # Writing
//
// [Encode] and [WriteFile] write a region byte for byte as HAMi-core does, for tests and
// simulated nodes that need real files where a monitor reads them; [WriteField] is the
// 4-byte store of the priority feedback.
//
//	reg, err := region.ReadFile(path) // <Root>/containers/<pod UID>_<container>/<uuid>.cache
//	if err != nil {
//		return err // errors.Is(err, region.ErrNotInitialized): not written yet, try later
//	}
//	for i := range reg.Devices {
//		mem, sm := reg.Usage(i)
//		fmt.Println(reg.Devices[i].UUID(), mem.Total, reg.Devices[i].MemoryLimit, sm)
//	}
package region

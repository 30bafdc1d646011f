package nvmlscan

import (
	"errors"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Sentinel errors for the classes callers branch on (test with errors.Is). The errors that
// come from NVML also match the [nvml.Return] code, e.g.
// errors.Is(err, nvml.ERROR_LIBRARY_NOT_FOUND).
var (
	// ErrInit means NVML could not be initialised; [New] returns it inside an [*InitError].
	ErrInit = errors.New("nvml init failed")
	// ErrClosed means the scanner was closed.
	ErrClosed = errors.New("scanner closed")
	// ErrAlreadyRunning means [Scanner.Run] was called while another Run of the same scanner is
	// still running.
	ErrAlreadyRunning = errors.New("scanner already running")
	// ErrMemoryNotSupported means the GPU does not report its memory (NVML returns
	// ERROR_NOT_SUPPORTED, e.g. on unified-memory parts such as GB10) and
	// Options.PreConfiguredMemory is 0, so the GPU is skipped, as HAMi does.
	ErrMemoryNotSupported = errors.New("memory query not supported and no pre-configured memory")
	// ErrNotSupported means NVML answered ERROR_NOT_SUPPORTED to a query of
	// [Scanner.Usage]: the GPU has no such value (unified memory has no device memory; a GPU
	// in MIG mode reports no utilisation). The error also matches nvml.ERROR_NOT_SUPPORTED.
	ErrNotSupported = errors.New("not supported by the GPU")
	// ErrOutOfRange means a scaled value does not fit the annotation's int32 field, so the
	// GPU is skipped (HAMi would wrap the number around).
	ErrOutOfRange = errors.New("value out of range")
	// ErrInvalidOptions means [New] rejected its Options.
	ErrInvalidOptions = errors.New("invalid options")

	// ErrNoMIGProfile means a GPU in MIG mode has no MIG profile to publish (no allowlist
	// entry matches its NVML name, or none of the entry's profiles exists on it), so a scan
	// skips it ([OpMIGProfiles]); HAMi drops such a GPU silently. The fix is an allowlist
	// entry (Options.MIGAllowlist, the chart's migProfileAllowlist) whose models name the
	// GPU's NVML name, with profiles the GPU has.
	ErrNoMIGProfile = errors.New("no MIG profile discovered")
	// ErrUnknownGPU means the MIG manager was given a GPU UUID that NVML does not know.
	ErrUnknownGPU = errors.New("unknown GPU")
	// ErrMIGNotSupported means the GPU cannot run MIG (NVML answers ERROR_NOT_SUPPORTED).
	ErrMIGNotSupported = errors.New("MIG not supported by the GPU")
	// ErrMIGModePending means the GPU's pending MIG mode differs from its current mode: a GPU
	// reset is outstanding, and no instance can be created until it happened.
	ErrMIGModePending = errors.New("MIG mode change pending: a GPU reset is outstanding")
	// ErrUnknownProfile means a MIG profile name is not one the GPU publishes.
	ErrUnknownProfile = errors.New("MIG profile not published by the GPU")
	// ErrPlacementNotPossible means a placement is not among the profile's possible
	// placements on the GPU.
	ErrPlacementNotPossible = errors.New("MIG placement not possible for the profile")
	// ErrPlacementTaken means another GPU instance occupies (part of) the placement.
	ErrPlacementTaken = errors.New("MIG placement taken by another instance")
)

// noProfileError is the cause of an [OpMIGProfiles] failure, naming the fix.
func noProfileError(name string, entry int) error {
	if entry < 0 {
		return fmt.Errorf("%w: no MIG allowlist entry matches the NVML name %q: add it to the models of an entry (migProfileAllowlist)",
			ErrNoMIGProfile, name)
	}
	return fmt.Errorf("%w: none of the profiles of MIG allowlist entry %d exists on the GPU %q: list profiles the GPU has (nvidia-smi mig -lgip)",
		ErrNoMIGProfile, entry, name)
}

// InitError is returned by [New] when nvmlInit fails. It unwraps to [ErrInit] and to the
// [nvml.Return] code. Its text starts with HAMi's wording ("nvml Init err: ERROR_…"), so
// runbooks written for HAMi's device plugin still match, and ends with the likely fix.
type InitError struct {
	// Return is the code nvmlInit returned.
	Return nvml.Return
	// Hint is the likely fix in words ("" when there is no specific advice).
	Hint string
}

// Error implements error.
func (e *InitError) Error() string {
	// HAMi logs the code with %v: the name before the library is loaded
	// (ERROR_LIBRARY_NOT_FOUND), NVML's nvmlErrorString text after.
	msg := "nvml Init err: " + e.Return.Error()
	if e.Hint != "" {
		msg += ": " + e.Hint
	}
	return msg
}

// Unwrap returns [ErrInit] and the NVML return code.
func (e *InitError) Unwrap() []error { return []error{ErrInit, e.Return} }

// newInitError classifies a failed nvmlInit and attaches the fix an operator most likely needs.
func newInitError(r nvml.Return) *InitError {
	var hint string
	switch r {
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		hint = "libnvidia-ml.so.1 is not in the container, so the container did not get the NVIDIA driver: " +
			"make nvidia the default runtime of the node's container runtime (containerd, CRI-O, Docker), " +
			"or give the device plugin pod a RuntimeClass (runtimeClassName: nvidia)"
	case nvml.ERROR_DRIVER_NOT_LOADED:
		hint = "the NVIDIA kernel driver is not loaded on this node: check nvidia-smi on the host"
	case nvml.ERROR_LIB_RM_VERSION_MISMATCH:
		hint = "the NVML library in the container does not match the kernel driver: " +
			"the driver was upgraded without a reboot, or the container ships its own libnvidia-ml"
	case nvml.ERROR_NO_PERMISSION:
		hint = "no permission to open the NVIDIA device nodes: run the device plugin privileged or with access to /dev/nvidia*"
	default:
	}
	return &InitError{Return: r, Hint: hint}
}

// Op names the NVML query that failed for one GPU.
type Op string

// The queries of a scan, in the order they are made. Their text is HAMi's wording
// ("nvml <op> error").
const (
	OpHandle Op = "new device by index"
	OpUUID   Op = "get uuid"
	OpIndex  Op = "get index"
	OpMemory Op = "get memory"
	OpName   Op = "get name"
	// OpMIGProfiles is the discovery of a MIG GPU's profiles ([ErrNoMIGProfile]).
	OpMIGProfiles Op = "discover MIG profiles"

	// OpUtilization and OpProcesses are queries of [Scanner.Usage] (which also makes
	// [OpHandle], [OpUUID], [OpName] and [OpMemory]).
	OpUtilization Op = "get utilization rates"
	OpProcesses   Op = "get compute running processes"
)

// DeviceError reports a failed query of one GPU: a GPU that a scan skipped (the other GPUs of
// the node still register), or one value of a [GPUUsage]. It unwraps to the cause: an
// [nvml.Return], [ErrMemoryNotSupported] or [ErrNotSupported] (both also matching
// nvml.ERROR_NOT_SUPPORTED), or [ErrOutOfRange].
type DeviceError struct {
	// Index is the NVML enumeration index of the GPU.
	Index int
	// UUID is the GPU UUID, "" when it could not be read.
	UUID string
	// Op is the query that failed.
	Op Op
	// Err is the cause.
	Err error
}

// Error implements error. The text starts with HAMi's wording, e.g.
// "nvml get memory error: gpu 3 (GPU-…): ERROR_UNKNOWN".
func (e *DeviceError) Error() string {
	id := fmt.Sprintf("gpu %d", e.Index)
	if e.UUID != "" {
		id += " (" + e.UUID + ")"
	}
	return fmt.Sprintf("nvml %s error: %s: %v", e.Op, id, e.Err)
}

// Unwrap returns the cause.
func (e *DeviceError) Unwrap() error { return e.Err }

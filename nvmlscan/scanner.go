package nvmlscan

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"

	"github.com/hamireg/hamireg/annotation"
)

// Scanner reads a node's GPUs from NVML and turns them into the devices of HAMi's register
// annotation. Create it with [New], call [Scanner.Scan] as often as needed (HAMi scans every
// 30 s), run [Scanner.Run] for the XID health watch, and [Scanner.Close] it at the end.
// All methods are safe for concurrent use.
type Scanner struct {
	lib     nvml.Interface
	cfg     *config
	changed chan struct{}

	// scanMu serialises scans, and Close's shutdown after them.
	scanMu sync.Mutex

	mu      sync.Mutex
	closed  bool
	running bool
	stopRun context.CancelCauseFunc
	runDone chan struct{}
	// health holds the GPUs currently unhealthy, by UUID; a GPU not in it is healthy.
	health map[string]*gpuHealth
	// pci holds the PCI bus IDs of the GPUs of the last scan, by UUID (PCIBusIDs); numaNodes
	// their NUMA nodes where the kernel knows one (NUMANodes).
	pci       map[string]string
	numaNodes map[string]int
}

// gpuHealth is the state of one unhealthy GPU.
type gpuHealth struct {
	xid        uint64
	since      time.Time
	last       time.Time
	reason     string
	persistent bool
}

// Result is the outcome of one scan.
type Result struct {
	// Devices are the GPUs to register, in canonical order ([annotation.SortDevices]), ready
	// for [annotation.Encode].
	Devices []annotation.Device
	// Failed are the GPUs skipped because a query failed, in enumeration order. Scan has
	// already logged each one.
	Failed []*DeviceError
	// Excluded is the number of GPUs left out by Options.ExcludeUUIDs and ExcludeIndexes.
	Excluded int
}

// Err joins the errors of the skipped GPUs; nil when none was skipped. A device source must
// not return it as its error: that would withhold the GPUs that did register
// ([Scanner.Devices] is the source form of a scan).
func (r Result) Err() error {
	errs := make([]error, len(r.Failed))
	for i, e := range r.Failed {
		errs[i] = e
	}
	return errors.Join(errs...)
}

// New validates opts and initialises NVML through lib, once for the scanner's lifetime
// (HAMi initialises and shuts NVML down on every scan). lib is nvml.New() on a node, or one of
// go-nvml's simulated servers in tests.
//
// When nvmlInit fails, New returns an [*InitError] (errors.Is [ErrInit] and the
// [nvml.Return], e.g. nvml.ERROR_LIBRARY_NOT_FOUND when the container did not get the driver)
// and calls nothing else on lib: calling into NVML after a failed load kills the process.
// Invalid options give an error that errors.Is [ErrInvalidOptions], before NVML is touched.
func New(lib nvml.Interface, opts Options) (*Scanner, error) {
	if lib == nil {
		return nil, fmt.Errorf("create scanner: %w: nil nvml.Interface", ErrInvalidOptions)
	}
	cfg, err := opts.config()
	if err != nil {
		return nil, fmt.Errorf("create scanner: %w", err)
	}
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return nil, newInitError(ret)
	}
	return &Scanner{
		lib:     lib,
		cfg:     cfg,
		changed: make(chan struct{}),
		health:  make(map[string]*gpuHealth),
	}, nil
}

// Close stops a running [Scanner.Run] and waits for it, waits for a scan in progress, and shuts
// NVML down. Later calls of Scan and Run return [ErrClosed]. Close is idempotent; only the
// first call can return an error (the code nvmlShutdown returned).
func (s *Scanner) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	stop, done := s.stopRun, s.runDone
	s.mu.Unlock()
	if stop != nil {
		stop(ErrClosed)
		<-done
	}
	s.scanMu.Lock()
	defer s.scanMu.Unlock()
	if ret := s.lib.Shutdown(); ret != nvml.SUCCESS {
		return fmt.Errorf("shut down nvml: %w", ret)
	}
	return nil
}

func (s *Scanner) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// Scan enumerates the GPUs and returns the devices to register with HAMi's formulas: devmem
// = whole MiB × memory scaling (truncated; unscaled in MIG mode), devcore = truncate(core
// scaling × 100) (100 in MIG mode), count = split count, type = model, prefixed "NVIDIA-"
// unless it starts with "NVIDIA", NUMA node from sysfs (0 when negative or unreadable),
// health from the XID watch (see [Scanner.Run]), NVML index and the operating mode.
//
// In [ModeMIG] with Options.MIGVersion master, each GPU also publishes the MIG profiles
// discovered through NVML ("migProfiles") and count = the largest instance count of those
// profiles; a GPU with no profile is skipped with [ErrNoMIGProfile] (see the package doc,
// "MIG").
//
// A GPU whose handle, UUID, index, memory or name query fails is skipped and reported in
// Result.Failed as a [*DeviceError] (HAMi's agent panics instead); the other GPUs are still
// returned. A GPU whose memory query is not supported gets Options.PreConfiguredMemory, or is
// skipped with [ErrMemoryNotSupported] when that is 0. Scan returns an error only when NVML
// cannot count the GPUs, when ctx ends, or after Close.
func (s *Scanner) Scan(ctx context.Context) (Result, error) {
	s.scanMu.Lock()
	defer s.scanMu.Unlock()
	if s.isClosed() {
		return Result{}, fmt.Errorf("scan devices: %w", ErrClosed)
	}
	logger := klog.FromContext(ctx)
	n, ret := s.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return Result{}, fmt.Errorf("count devices: %w", ret)
	}
	mig := s.cfg.mode == ModeMIG
	if mig {
		logger.V(3).Info("MIG mode enabled: memory scaling and core scaling are not applied")
	}
	var res Result
	pci, numaNodes := map[string]string{}, map[string]int{}
	for i := range n {
		if ctx.Err() != nil {
			return Result{}, fmt.Errorf("scan devices: %w", context.Cause(ctx))
		}
		dev, loc, excluded, err := s.scanDevice(logger, i, mig)
		switch {
		case err != nil && err.Op == OpMIGProfiles:
			logger.Error(err, "skip MIG device with no discovered profile capacity", "index", err.Index, "gpuUUID", err.UUID)
			res.Failed = append(res.Failed, err)
		case err != nil:
			logger.Error(err, "Skipping GPU", "index", err.Index, "gpuUUID", err.UUID)
			res.Failed = append(res.Failed, err)
		case excluded:
			logger.V(4).Info("GPU excluded from registration", "index", dev.Index, "gpuUUID", dev.ID)
			res.Excluded++
		default:
			logger.V(3).Info("Registered device", "gpuUUID", dev.ID, "index", dev.Index,
				"devmem", dev.Devmem, "devcore", dev.Devcore, "type", dev.Type, "numa", dev.Numa, "health", dev.Health)
			res.Devices = append(res.Devices, dev)
			if loc.busID != "" {
				pci[dev.ID] = loc.busID
			}
			if loc.numa >= 0 {
				numaNodes[dev.ID] = loc.numa
			}
		}
	}
	s.mu.Lock()
	s.pci, s.numaNodes = pci, numaNodes
	s.mu.Unlock()
	annotation.SortDevices(res.Devices)
	logger.V(3).Info("Discovered device(s) for registration", "count", len(res.Devices), "failed", len(res.Failed))
	return res, nil
}

// scanDevice queries the GPU at enumeration index i. It returns the device and its PCI bus ID
// ("" when NVML does not tell), or excluded when the options filter it out, or the error of
// the first failed query.
func (s *Scanner) scanDevice(logger klog.Logger, i int, mig bool) (annotation.Device, location, bool, *DeviceError) {
	fail := func(op Op, uuid string, err error) (annotation.Device, location, bool, *DeviceError) {
		return annotation.Device{}, location{numa: -1}, false, &DeviceError{Index: i, UUID: uuid, Op: op, Err: err}
	}
	dev, ret := s.lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return fail(OpHandle, "", ret)
	}
	uuid, ret := dev.GetUUID()
	if ret != nvml.SUCCESS {
		return fail(OpUUID, "", ret)
	}
	index, ret := dev.GetIndex()
	if ret != nvml.SUCCESS {
		return fail(OpIndex, uuid, ret)
	}
	if index < 0 {
		return fail(OpIndex, uuid, fmt.Errorf("%w: index %d", ErrOutOfRange, index))
	}
	if s.cfg.excludeUUIDs[uuid] || s.cfg.excludeIndexes[uint(index)] {
		return annotation.Device{ID: uuid, Index: uint(index)}, location{numa: -1}, true, nil
	}
	total, derr := s.memoryBytes(logger, dev, uuid)
	if derr != nil {
		return fail(OpMemory, uuid, derr)
	}
	model, ret := dev.GetName()
	if ret != nvml.SUCCESS {
		return fail(OpName, uuid, ret)
	}
	mem, err := devmem(total, s.cfg.memoryScaling, mig)
	if err != nil {
		return fail(OpMemory, uuid, err)
	}
	loc := s.locate(logger, dev, uuid, index)
	d := annotation.Device{
		ID:      uuid,
		Index:   uint(index),
		Count:   s.cfg.splitCount,
		Devmem:  mem,
		Devcore: devcore(s.cfg.coreScaling, mig),
		Type:    deviceType(model),
		Numa:    max(loc.numa, 0),
		Mode:    s.cfg.mode,
	}
	if mig && s.cfg.migVersion == annotation.VersionMaster {
		g := s.discoverMIG(logger, dev, uuid, model, total)
		if len(g.profiles) == 0 {
			return fail(OpMIGProfiles, uuid, noProfileError(model, g.entry))
		}
		d.Count = g.count()
		d.MIGProfiles = g.published()
	}
	d.Health = s.answered(logger, uuid)
	return d, loc, false, nil
}

// memoryBytes is the GPU's total memory, or Options.PreConfiguredMemory when the query is not
// supported.
func (s *Scanner) memoryBytes(logger klog.Logger, dev nvml.Device, uuid string) (uint64, error) {
	mem, ret := dev.GetMemoryInfo()
	switch {
	case ret == nvml.SUCCESS:
		return mem.Total, nil
	case ret == nvml.ERROR_NOT_SUPPORTED && s.cfg.preConfigured > 0:
		logger.V(2).Info("GetMemoryInfo not supported for device, using configured PreConfiguredDeviceMemory",
			"gpuUUID", uuid, "memoryMiB", s.cfg.preConfigured)
		return uint64(s.cfg.preConfigured) << 20, nil
	case ret == nvml.ERROR_NOT_SUPPORTED:
		return 0, fmt.Errorf("%w: %w", ErrMemoryNotSupported, ret)
	default:
		return 0, ret
	}
}

// location is where a GPU sits: its PCI bus ID (pciBusID; "" when NVML does not tell) and
// its NUMA node as the kernel reports it (-1 when unknown or without affinity).
type location struct {
	busID string
	numa  int
}

// locate reads the GPU's PCI bus ID from NVML and its NUMA node from sysfs. The register
// annotation takes max(numa, 0), as HAMi (which logs an unknown node with "failed to get numa
// information from sysfs" and writes 0).
func (s *Scanner) locate(logger klog.Logger, dev nvml.Device, uuid string, index int) location {
	pci, ret := dev.GetPciInfo()
	if ret != nvml.SUCCESS {
		logger.V(4).Info("failed to get numa information from sysfs", "index", index, "gpuUUID", uuid,
			"err", fmt.Errorf("get pci info: %w", ret))
		return location{numa: -1}
	}
	raw := busIDString(pci.BusId)
	n, err := kernelNUMANode(s.cfg.sysfs, raw)
	if err != nil {
		logger.V(4).Info("failed to get numa information from sysfs", "index", index, "gpuUUID", uuid, "err", err)
	}
	return location{busID: pciBusID(raw), numa: n}
}

// pciBusID normalises NVML's PCI bus ID ("00000000:07:00.0", an 8-digit domain, upper-case)
// to the form of sysfs and of DRA's standard attribute resource.kubernetes.io/pciBusID:
// lower-case with a 4-digit domain, "0000:07:00.0". An ID that is not domain:bus:device.function
// gives "".
func pciBusID(nvmlBusID string) string {
	id := sysfsBusID(nvmlBusID)
	parts := strings.Split(id, ":")
	if len(parts) != 3 || len(parts[0]) != 4 || len(parts[1]) != 2 || !strings.Contains(parts[2], ".") {
		return ""
	}
	return id
}

// PCIBusIDs returns the PCI bus IDs ("0000:07:00.0": lower-case, 4-digit domain) of the GPUs of the last scan, by UUID: a
// GPU whose bus ID NVML did not tell, and a skipped or excluded one, has no entry. The map is
// the caller's. It implements nodeagent's PCISource, which puts the IDs in the DRA devices.
func (s *Scanner) PCIBusIDs() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.pci)
}

// Devices is a scan in the form of a device source (package
// github.com/hamireg/hamireg/nodeagent): the devices to register, the GPUs that were skipped
// (one [*DeviceError] each, already logged), and an error only when the scan failed as a whole
// ([Scanner.Scan]'s error). Skipped GPUs do not hold back the others.
func (s *Scanner) Devices(ctx context.Context) ([]annotation.Device, []error, error) {
	res, err := s.Scan(ctx)
	if err != nil {
		return nil, nil, err
	}
	var failed []error
	for _, e := range res.Failed {
		failed = append(failed, e)
	}
	return res.Devices, failed, nil
}

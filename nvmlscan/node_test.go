package nvmlscan_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"go.uber.org/goleak"
	"k8s.io/klog/v2/ktesting"

	"github.com/hamireg/hamireg/nvmlscan"
)

func TestMain(m *testing.M) {
	// Every Run and every fake event set must be gone when the tests end.
	goleak.VerifyTestMain(m)
}

// dgxBusIDs are the PCI bus numbers of the eight GPUs of a DGX H100; GPUs 0-3 are on NUMA
// node 0, 4-7 on node 1.
var dgxBusIDs = [8]uint8{0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb}

// nvmlBusID is the bus id as NVML reports it: 8 hex digits of domain, upper case.
func nvmlBusID(bus uint8) string { return fmt.Sprintf("00000000:%02X:00.0", bus) }

// event is what the fake event set's Wait returns next.
type event struct {
	data nvml.EventData
	ret  nvml.Return
}

// node is a simulated GPU node: one of go-nvml's servers with what they do not wire filled
// in (PCI bus ids, event registration, an event set fed by a channel), and its sysfs.
type node struct {
	srv    *server.Server
	sysfs  fstest.MapFS
	events chan event
	freed  atomic.Int32
	// broken[i] makes every name query of GPU i fail with ERROR_GPU_IS_LOST.
	broken [8]atomic.Bool
}

// newNode wires srv (8 GPUs). It must be called before the scanner uses srv: the Func fields
// are plain struct fields.
func newNode(t *testing.T, srv *server.Server) *node {
	t.Helper()
	n := &node{srv: srv, sysfs: fstest.MapFS{}, events: make(chan event, 16)}
	if len(srv.Devices) > len(dgxBusIDs) {
		t.Fatalf("newNode supports up to %d GPUs, got %d", len(dgxBusIDs), len(srv.Devices))
	}
	for i := range srv.Devices {
		d := srv.Devices[i].(*server.Device)
		bus := nvmlBusID(dgxBusIDs[i])
		d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
			p := nvml.PciInfo{PciDeviceId: d.Config.PciDeviceId, Bus: uint32(dgxBusIDs[i])}
			for j, c := range bus {
				p.BusId[j] = int8(c)
			}
			return p, nvml.SUCCESS
		}
		getName := d.GetNameFunc
		d.GetNameFunc = func() (string, nvml.Return) {
			if n.broken[i].Load() {
				return "", nvml.ERROR_GPU_IS_LOST
			}
			return getName()
		}
		d.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) {
			return nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError | nvml.EventTypeSingleBitEccError, nvml.SUCCESS
		}
		d.RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.SUCCESS }
		numa := "0\n"
		if i >= 4 {
			numa = "1\n"
		}
		n.sysfs[fmt.Sprintf("bus/pci/devices/0000:%02x:00.0/numa_node", dgxBusIDs[i])] = &fstest.MapFile{Data: []byte(numa)}
	}
	srv.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		return &mock.EventSet{
			WaitFunc: func(ms uint32) (nvml.EventData, nvml.Return) {
				timer := time.NewTimer(time.Duration(ms) * time.Millisecond)
				defer timer.Stop()
				select {
				case e := <-n.events:
					return e.data, e.ret
				case <-timer.C:
					return nvml.EventData{}, nvml.ERROR_TIMEOUT
				}
			},
			FreeFunc: func() nvml.Return {
				n.freed.Add(1)
				return nvml.SUCCESS
			},
		}, nvml.SUCCESS
	}
	return n
}

func (n *node) device(i int) *server.Device { return n.srv.Devices[i].(*server.Device) }

func (n *node) uuid(i int) string { return n.device(i).UUID }

// xid queues a critical XID event on GPU i.
func (n *node) xid(i int, xid uint64) {
	n.events <- event{data: nvml.EventData{Device: n.device(i), EventType: nvml.EventTypeXidCriticalError, EventData: xid}, ret: nvml.SUCCESS}
}

// newScanner creates a scanner over the node with the node's sysfs and closes it at the end of
// the test.
func newScanner(t *testing.T, n *node, opts nvmlscan.Options) *nvmlscan.Scanner {
	t.Helper()
	if opts.Sysfs == nil {
		opts.Sysfs = n.sysfs
	}
	s, err := nvmlscan.New(n.srv, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// scan scans and fails the test on error.
func scan(ctx context.Context, t *testing.T, s *nvmlscan.Scanner) nvmlscan.Result {
	t.Helper()
	res, err := s.Scan(ctx)
	if err != nil {
		t.Fatalf("Scan: %v", err)
	}
	return res
}

// startRun runs s.Run in a goroutine and returns a function that stops it and returns its
// error.
func startRun(ctx context.Context, t *testing.T, s *nvmlscan.Scanner) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- s.Run(ctx) }()
	var stopped atomic.Bool
	stop = func() error {
		if stopped.Swap(true) {
			return nil
		}
		cancel()
		select {
		case err := <-errc:
			return err
		case <-time.After(10 * time.Second):
			t.Fatal("Run did not return 10 s after its context ended")
			return nil
		}
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return stop
}

// testContext returns a context whose logger writes to the test log.
func testContext(t *testing.T) context.Context {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	return ctx
}

// eventually polls cond until it holds or 10 s passed.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitChanged waits for a health notification.
func waitChanged(t *testing.T, s *nvmlscan.Scanner) {
	t.Helper()
	select {
	case <-s.HealthChanged():
	case <-time.After(10 * time.Second):
		t.Fatal("no health notification within 10 s")
	}
}

// drainChanged drops a pending health notification.
func drainChanged(s *nvmlscan.Scanner) {
	select {
	case <-s.HealthChanged():
	default:
	}
}

// health returns the Health field of each scanned device by index.
func health(res nvmlscan.Result) map[uint]bool {
	m := make(map[uint]bool, len(res.Devices))
	for _, d := range res.Devices {
		m[d.Index] = d.Health
	}
	return m
}

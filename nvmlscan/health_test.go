package nvmlscan_test

import (
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/hamireg/hamireg/nvmlscan"
	"github.com/hamireg/hamireg/nvmlscan/nvmlscantest"
)

// fastHealth makes Run return quickly in tests.
func fastHealth() nvmlscan.HealthOptions {
	return nvmlscan.HealthOptions{WaitTimeout: 10 * time.Millisecond}
}

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// waitTicker waits until every other goroutine of the test's synctest bubble is blocked and
// checks that Run has created its probe ticker on the fake clock by then, so that a Step
// reaches it.
func waitTicker(t *testing.T, fc *testingclock.FakeClock) {
	t.Helper()
	synctest.Wait()
	if !fc.HasWaiters() {
		t.Fatal("Run has no probe ticker on the fake clock")
	}
}

// TestHealthXIDAndRecovery walks a GPU through the recovery rule: a critical XID marks it
// unhealthy, it stays unhealthy through the quiet period (which a second XID restarts), and
// it is healthy again once the quiet period is over and it answers queries.
func TestHealthXIDAndRecovery(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx := testContext(t)
		fc := testingclock.NewFakeClock(t0)
		n := nvmlscantest.NewNode(t, dgxh100.New())
		opts := nvmlscan.Options{Clock: fc, Health: fastHealth()}
		opts.Health.QuietPeriod = 5 * time.Minute
		opts.Health.ProbeInterval = 30 * time.Second
		s := newScanner(t, n, opts)
		stop := startRun(ctx, t, s)
		waitTicker(t, fc)

		n.XID(2, 79)
		waitChanged(t, s)
		if got := health(scan(ctx, t, s)); got[2] || !got[1] || !got[3] {
			t.Fatalf("after XID 79 on GPU 2: health %v", got)
		}
		u := s.Unhealthy()
		if len(u) != 1 || u[0].UUID != n.UUID(2) || u[0].XID != 79 || !u[0].Since.Equal(t0) || u[0].Persistent {
			t.Fatalf("Unhealthy() = %+v", u)
		}

		fc.Step(4 * time.Minute)
		if got := health(scan(ctx, t, s)); got[2] {
			t.Fatal("GPU 2 healthy 4 min after its XID, before the quiet period is over")
		}

		// A second XID restarts the quiet period.
		n.XID(2, 48)
		synctest.Wait()
		if u := s.Unhealthy(); len(u) != 1 || u[0].XID != 48 {
			t.Fatalf("second XID not recorded: Unhealthy() = %+v", u)
		}
		if u := s.Unhealthy(); !u[0].LastEvent.Equal(t0.Add(4*time.Minute)) || !u[0].Since.Equal(t0) {
			t.Errorf("after second XID: %+v", u[0])
		}
		fc.Step(4 * time.Minute) // 8 min after the first XID, 4 after the second
		if got := health(scan(ctx, t, s)); got[2] {
			t.Fatal("GPU 2 healthy 4 min after its second XID")
		}

		drainChanged(s)
		fc.Step(time.Minute) // quiet for 5 min: the next probe recovers it
		waitChanged(t, s)
		if u := s.Unhealthy(); len(u) != 0 {
			t.Fatalf("Unhealthy() after recovery = %+v", u)
		}
		for i, h := range health(scan(ctx, t, s)) {
			if !h {
				t.Errorf("GPU %d unhealthy after recovery", i)
			}
		}
		if err := stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
		if n.Freed() != 1 {
			t.Errorf("event set freed %d times, want 1", n.Freed())
		}
	})
}

// TestHealthRecoveryByScan: without Run's probe (Run stopped), a scan that finds the GPU
// answering after the quiet period recovers it.
func TestHealthRecoveryByScan(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx := testContext(t)
		fc := testingclock.NewFakeClock(t0)
		n := nvmlscantest.NewNode(t, dgxh100.New())
		s := newScanner(t, n, nvmlscan.Options{Clock: fc, Health: fastHealth()})
		stop := startRun(ctx, t, s)
		n.XID(0, 94)
		waitChanged(t, s)
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		if got := health(scan(ctx, t, s)); got[0] {
			t.Fatal("GPU 0 healthy right after its XID")
		}
		fc.Step(nvmlscan.DefaultQuietPeriod)
		if got := health(scan(ctx, t, s)); !got[0] {
			t.Error("GPU 0 still unhealthy after the quiet period in which it answered the scan")
		}
		if !changedSince(s) {
			t.Error("no notification for the recovery")
		}
	})
}

// TestHealthNotAnswering: a GPU past its quiet period that does not answer queries stays
// unhealthy (and a scan skips it); once it answers, the probe recovers it.
func TestHealthNotAnswering(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx := testContext(t)
		fc := testingclock.NewFakeClock(t0)
		n := nvmlscantest.NewNode(t, dgxh100.New())
		s := newScanner(t, n, nvmlscan.Options{Clock: fc, Health: fastHealth()})
		startRun(ctx, t, s)
		waitTicker(t, fc)
		n.XID(5, 79)
		waitChanged(t, s)
		n.SetLost(5, true) // fallen off the bus: queries fail

		fc.Step(10 * time.Minute)
		res := scan(ctx, t, s)
		if _, ok := health(res)[5]; ok || len(res.Failed) != 1 || res.Failed[0].Index != 5 || !errors.Is(res.Failed[0], nvml.ERROR_GPU_IS_LOST) {
			t.Fatalf("GPU 5 not skipped as lost: devices %v, failed %v", health(res), res.Failed)
		}
		fc.Step(time.Minute) // a probe that fails
		synctest.Wait()
		if calls := len(n.Device(5).GetNameCalls()); calls < 2 {
			t.Fatalf("no failed probe: %d name queries of GPU 5, want 2 or more", calls)
		}
		if len(s.Unhealthy()) != 1 {
			t.Fatal("GPU 5 recovered although it does not answer")
		}

		n.SetLost(5, false)
		fc.Step(time.Minute)
		synctest.Wait()
		if u := s.Unhealthy(); len(u) != 0 {
			t.Fatalf("no recovery once GPU 5 answers: Unhealthy() = %+v", u)
		}
		if got := health(scan(ctx, t, s)); !got[5] {
			t.Error("GPU 5 unhealthy after it answers again")
		}
	})
}

// TestHealthPersistentXID: a GPU that saw an XID in PersistentXIDs never recovers.
func TestHealthPersistentXID(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx := testContext(t)
		fc := testingclock.NewFakeClock(t0)
		n := nvmlscantest.NewNode(t, dgxh100.New())
		opts := nvmlscan.Options{Clock: fc, Health: fastHealth()}
		opts.Health.PersistentXIDs = []uint64{95}
		s := newScanner(t, n, opts)
		startRun(ctx, t, s)
		waitTicker(t, fc)
		n.XID(1, 95)
		waitChanged(t, s)
		n.XID(1, 48) // a later non-persistent XID does not lift it
		synctest.Wait()
		if u := s.Unhealthy(); len(u) != 1 || u[0].XID != 48 {
			t.Fatalf("second XID not recorded: Unhealthy() = %+v", u)
		}
		fc.Step(time.Hour)
		if got := health(scan(ctx, t, s)); got[1] {
			t.Error("GPU 1 recovered after a persistent XID")
		}
		if u := s.Unhealthy(); len(u) != 1 || !u[0].Persistent {
			t.Errorf("Unhealthy() = %+v", u)
		}
	})
}

// TestHealthIgnoredXIDs: which events mark a GPU. Each case sends its events and then a
// marker XID on GPU 7, so that when GPU 7 is unhealthy the earlier events were handled.
func TestHealthIgnoredXIDs(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		ignored   []uint64
		eventType uint64
		xids      []uint64
		unhealthy bool
	}{
		"default ignores 13":              {xids: []uint64{13}},
		"default ignores all six":         {xids: []uint64{13, 31, 43, 45, 68, 109}},
		"default acts on 79":              {xids: []uint64{79}, unhealthy: true},
		"default acts on 48":              {xids: []uint64{48}, unhealthy: true},
		"empty list acts on 13":           {ignored: []uint64{}, xids: []uint64{13}, unhealthy: true},
		"custom list ignores 79":          {ignored: []uint64{79}, xids: []uint64{79}},
		"custom list acts on 31":          {ignored: []uint64{79}, xids: []uint64{31}, unhealthy: true},
		"double-bit ECC event not acted":  {eventType: nvml.EventTypeDoubleBitEccError, xids: []uint64{0}},
		"single-bit ECC event not acted":  {eventType: nvml.EventTypeSingleBitEccError, xids: []uint64{0}},
		"marker alone proves the harness": {},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				ctx := testContext(t)
				n := nvmlscantest.NewNode(t, dgxh100.New())
				opts := nvmlscan.Options{Health: fastHealth()}
				opts.Health.IgnoredXIDs = tc.ignored
				s := newScanner(t, n, opts)
				startRun(ctx, t, s)
				typ := tc.eventType
				if typ == 0 {
					typ = nvml.EventTypeXidCriticalError
				}
				for _, x := range tc.xids {
					n.Event(nvml.EventData{Device: n.Device(3), EventType: typ, EventData: x})
				}
				n.XID(7, 62) // marker
				synctest.Wait()
				if health(scan(ctx, t, s))[7] {
					t.Fatal("marker XID on GPU 7 not handled")
				}
				if got := !health(scan(ctx, t, s))[3]; got != tc.unhealthy {
					t.Errorf("GPU 3 unhealthy = %v, want %v", got, tc.unhealthy)
				}
			})
		})
	}
}

// TestHealthWaitFailure: when NVML fails to deliver events every watched GPU is marked
// unhealthy (as NVIDIA's plugin does); they recover by the rule once events flow again.
func TestHealthWaitFailure(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx := testContext(t)
		fc := testingclock.NewFakeClock(t0)
		n := nvmlscantest.NewNode(t, dgxh100.New())
		s := newScanner(t, n, nvmlscan.Options{Clock: fc, Health: fastHealth(), ExcludeIndexes: []uint{0}})
		startRun(ctx, t, s)
		waitTicker(t, fc)
		n.WaitError(nvml.ERROR_UNKNOWN)
		waitChanged(t, s)
		if u := s.Unhealthy(); len(u) != 7 {
			t.Fatalf("%d watched GPUs unhealthy, want 7", len(u))
		}
		for _, u := range s.Unhealthy() {
			if u.UUID == n.UUID(0) {
				t.Error("excluded GPU 0 was marked")
			}
		}
		// The waiter backs off on the fake clock; step past the back-off and the quiet period.
		drainChanged(s)
		fc.Step(nvmlscan.DefaultQuietPeriod)
		waitChanged(t, s)
		if u := s.Unhealthy(); len(u) != 0 {
			t.Fatalf("no recovery of all GPUs: Unhealthy() = %+v", u)
		}
	})
}

// TestHealthUnidentifiedGPU: an XID whose GPU cannot be identified marks every GPU.
func TestHealthUnidentifiedGPU(t *testing.T) {
	t.Parallel()
	tests := map[string]nvml.Device{
		"nil device":       nil,
		"UUID query fails": &mock.Device{GetUUIDFunc: func() (string, nvml.Return) { return "", nvml.ERROR_GPU_IS_LOST }},
	}
	for name, dev := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				ctx := testContext(t)
				n := nvmlscantest.NewNode(t, dgxh100.New())
				s := newScanner(t, n, nvmlscan.Options{Health: fastHealth()})
				startRun(ctx, t, s)
				n.Event(nvml.EventData{Device: dev, EventType: nvml.EventTypeXidCriticalError, EventData: 79})
				synctest.Wait()
				if u := s.Unhealthy(); len(u) != 8 {
					t.Fatalf("%d GPUs unhealthy, want 8", len(u))
				}
			})
		})
	}
}

// TestHealthUnwatchedGPU: an XID on an excluded GPU changes nothing.
func TestHealthUnwatchedGPU(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx := testContext(t)
		n := nvmlscantest.NewNode(t, dgxh100.New())
		s := newScanner(t, n, nvmlscan.Options{Health: fastHealth(), ExcludeUUIDs: []string{n.UUID(4)}})
		startRun(ctx, t, s)
		n.XID(4, 79)
		n.XID(7, 79) // marker
		waitChanged(t, s)
		if u := s.Unhealthy(); len(u) != 1 || u[0].UUID != n.UUID(7) {
			t.Errorf("Unhealthy() = %+v, want only GPU 7", u)
		}
		if calls := len(n.Device(4).RegisterEventsCalls()); calls != 0 {
			t.Errorf("excluded GPU 4 registered for events %d times", calls)
		}
	})
}

// TestRunDegraded: Run without usable events still blocks until its context ends, returns nil
// and frees what it created.
func TestRunDegraded(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		breakEvents func(n *nvmlscantest.Node)
		freed       int
	}{
		"event set not supported": {
			breakEvents: func(n *nvmlscantest.Node) {
				n.Server.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED }
			},
		},
		"no GPU supports XID events": {
			breakEvents: func(n *nvmlscantest.Node) {
				for i := range n.Server.Devices {
					n.Device(i).GetSupportedEventTypesFunc = func() (uint64, nvml.Return) { return nvml.EventTypePState, nvml.SUCCESS }
				}
			},
			freed: 1,
		},
		"too old for health checking": {
			breakEvents: func(n *nvmlscantest.Node) {
				for i := range n.Server.Devices {
					n.Device(i).GetSupportedEventTypesFunc = func() (uint64, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
				}
			},
			freed: 1,
		},
		"registration fails": {
			breakEvents: func(n *nvmlscantest.Node) {
				for i := range n.Server.Devices {
					n.Device(i).RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.ERROR_UNKNOWN }
				}
			},
			freed: 1,
		},
		"count fails": {
			breakEvents: func(n *nvmlscantest.Node) {
				n.Server.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
			},
			freed: 1,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				ctx := testContext(t)
				fc := testingclock.NewFakeClock(t0)
				n := nvmlscantest.NewNode(t, dgxh100.New())
				tc.breakEvents(n)
				s := newScanner(t, n, nvmlscan.Options{Clock: fc, Health: fastHealth()})
				stop := startRun(ctx, t, s)
				waitTicker(t, fc)
				if err := stop(); err != nil {
					t.Errorf("Run: %v", err)
				}
				if got := n.Freed(); got != tc.freed {
					t.Errorf("event set freed %d times, want %d", got, tc.freed)
				}
				if len(s.Unhealthy()) != 0 {
					t.Errorf("Unhealthy() = %v", s.Unhealthy())
				}
			})
		})
	}
}

func TestRunHealthDisabled(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx := testContext(t)
		n := nvmlscantest.NewNode(t, dgxh100.New())
		opts := nvmlscan.Options{Health: fastHealth()}
		opts.Health.Disabled = true
		s := newScanner(t, n, opts)
		stop := startRun(ctx, t, s)
		n.XID(0, 79)
		if err := stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
		if len(n.Server.EventSetCreateCalls()) != 0 || len(s.Unhealthy()) != 0 {
			t.Error("disabled health watch created an event set or marked a GPU")
		}
	})
}

// TestRunOnceAndClose: a second concurrent Run is refused, Close stops a running Run and waits
// for it, and Run's goroutines are gone (TestMain checks with goleak).
func TestRunOnceAndClose(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx := testContext(t)
		n := nvmlscantest.NewNode(t, dgxh100.New())
		s, err := nvmlscan.New(n.Server, nvmlscan.Options{Sysfs: n.Sysfs, Health: fastHealth()})
		if err != nil {
			t.Fatal(err)
		}
		errc := make(chan error, 1)
		go func() { errc <- s.Run(ctx) }()
		synctest.Wait()
		if calls := len(n.Server.EventSetCreateCalls()); calls != 1 {
			t.Fatalf("Run not started: %d event sets created, want 1", calls)
		}
		if err := s.Run(ctx); !errors.Is(err, nvmlscan.ErrAlreadyRunning) {
			t.Errorf("second Run: %v, want ErrAlreadyRunning", err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		// Run freed its event set before Close shut NVML down.
		if n.Freed() != 1 || len(n.Server.ShutdownCalls()) != 1 {
			t.Errorf("freed %d, shutdown %d; want 1, 1", n.Freed(), len(n.Server.ShutdownCalls()))
		}
		synctest.Wait()
		select {
		case err := <-errc:
			if err != nil {
				t.Errorf("Run stopped by Close: %v, want nil", err)
			}
		default:
			t.Fatal("Run did not return after Close")
		}
	})
}

// TestRunRestart: Run may run again after it returned, and keeps the health state.
func TestRunRestart(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx := testContext(t)
		n := nvmlscantest.NewNode(t, dgxh100.New())
		s := newScanner(t, n, nvmlscan.Options{Health: fastHealth()})
		stop := startRun(ctx, t, s)
		n.XID(3, 79)
		waitChanged(t, s)
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		startRun(ctx, t, s)
		n.XID(4, 79)
		synctest.Wait()
		if u := s.Unhealthy(); len(u) != 2 {
			t.Fatalf("second Run does not handle events: Unhealthy() = %+v", u)
		}
	})
}

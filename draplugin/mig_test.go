package draplugin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/dra"
	"github.com/hamireg/hamireg/mig"
)

// fakeMIG is a MIGDevices that refuses overlapping placements, as NVML does.
type fakeMIG struct {
	mu        sync.Mutex
	live      []mig.Instance
	next      uint32
	createErr error
	destroyed []string
}

var _ MIGDevices = (*fakeMIG)(nil)

func (f *fakeMIG) Instances(context.Context) ([]mig.Instance, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.live), nil
}

func (f *fakeMIG) Create(_ context.Context, gpu, profile string, pl mig.Placement) (mig.Instance, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.createErr != nil {
		return mig.Instance{}, f.createErr
	}
	for _, in := range f.live {
		if in.GPUUUID == gpu && mig.Overlaps(in.Placement, pl) {
			return mig.Instance{}, fmt.Errorf("placement %+v overlaps %s", pl, in.MigUUID)
		}
	}
	f.next++
	inst := mig.Instance{GPUUUID: gpu, Profile: profile, Placement: pl,
		Runtime: mig.Runtime{MigUUID: fmt.Sprintf("MIG-%d", f.next), GPUInstanceID: f.next, ComputeInstanceID: 0}}
	f.live = append(f.live, inst)
	return inst, nil
}

func (f *fakeMIG) Destroy(_ context.Context, inst mig.Instance) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.live = slices.DeleteFunc(f.live, func(in mig.Instance) bool { return in.MigUUID == inst.MigUUID })
	f.destroyed = append(f.destroyed, inst.MigUUID)
	return nil
}

func (f *fakeMIG) instances() []mig.Instance {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.live)
}

// migGPUs are the test GPUs plus GPU 2 in MIG mode with two profiles.
func migGPUs() []annotation.Device {
	gpus := testGPUs()
	return append(gpus, annotation.Device{ID: "GPU-22222222-2222-2222-2222-222222222222", Index: 2, Count: 7, Devmem: 40960, Devcore: 100,
		Type: "NVIDIA-A100-SXM4-40GB", Mode: "mig", Health: true, MIGProfiles: []annotation.MigProfile{
			{Name: "1g.10gb", MemoryMB: 9856, Core: 15, SliceCount: 1, Placements: []annotation.MigPlacement{{Start: 0, Size: 2}, {Start: 2, Size: 2}, {Start: 4, Size: 2}, {Start: 6, Size: 2}}},
			{Name: "7g.40gb", MemoryMB: 40192, Core: 100, SliceCount: 7, Placements: []annotation.MigPlacement{{Start: 0, Size: 8}}},
		}})
}

func migSlices(tb testing.TB, gpus []annotation.Device) []dra.Slice {
	tb.Helper()
	s, err := dra.Slices(gpus, dra.Options{Profile: testProfile()})
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// migClaim is an allocated claim with one result per device, without consumed capacity (MIG
// devices are not shared).
func migClaim(uid string, devices ...string) *resourcev1.ResourceClaim {
	c := &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "claim-" + uid, UID: types.UID(uid)},
		Status:     resourcev1.ResourceClaimStatus{Allocation: &resourcev1.AllocationResult{}},
	}
	for _, d := range devices {
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results,
			resourcev1.DeviceRequestAllocationResult{Request: "mig", Driver: testProfile().Driver, Pool: testNode, Device: d})
	}
	return c
}

func TestPrepareMIG(t *testing.T) {
	t.Parallel()
	client := newClient()
	opts := testOptions(t, client)
	fm := &fakeMIG{}
	opts.MIG = fm
	p := newPlugin(t, opts)
	gpus := migGPUs()
	p.SetSlices(gpus, migSlices(t, gpus))

	res := prepare(t, p, migClaim("uid-a", "gpu-2-mig-1g-10gb-6"))["uid-a"]
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	live := fm.instances()
	if len(live) != 1 || live[0].Placement != (mig.Placement{Start: 6, Size: 2}) || live[0].Profile != "1g.10gb" || live[0].GPUUUID != gpus[2].ID {
		t.Fatalf("instances after prepare: %+v", live)
	}
	if len(res.Devices) != 1 || res.Devices[0].DeviceName != "gpu-2-mig-1g-10gb-6" || len(res.Devices[0].CDIDeviceIDs) != 1 {
		t.Fatalf("prepare result: %+v", res.Devices)
	}
	spec := readSpec(t, p.claims["uid-a"].CDISpec)
	env := strings.Join(append(slices.Clone(spec.ContainerEdits.Env), spec.Devices[0].ContainerEdits.Env...), " ")
	if !strings.Contains(env, "NVIDIA_VISIBLE_DEVICES="+live[0].MigUUID) || !strings.Contains(env, "HAMIREG_DRA_DEVICE_0="+live[0].MigUUID) {
		t.Errorf("CDI env %q: want the MIG UUID %s", env, live[0].MigUUID)
	}
	if strings.Contains(env, "CUDA_DEVICE_MEMORY_LIMIT") || len(spec.ContainerEdits.Mounts) != 0 {
		t.Errorf("CDI edits of a MIG claim carry HAMi-core's limits: env %q, mounts %d", env, len(spec.ContainerEdits.Mounts))
	}
	if got := p.PreparedGPUs()[gpus[2].ID]; !slices.Equal(got, []types.UID{"uid-a"}) {
		t.Errorf("PreparedGPUs of the MIG GPU = %v, want [uid-a]", got)
	}

	// Again: the same answer, no second instance.
	if again := prepare(t, p, migClaim("uid-a", "gpu-2-mig-1g-10gb-6"))["uid-a"]; again.Err != nil || len(fm.instances()) != 1 {
		t.Fatalf("prepare again: %v, %d instances", again.Err, len(fm.instances()))
	}
	// An overlapping placement is refused before NVML is asked.
	if r := prepare(t, p, migClaim("uid-b", "gpu-2-mig-7g-40gb-0"))["uid-b"]; !errors.Is(r.Err, ErrRefused) || !strings.Contains(r.Err.Error(), "overlaps") {
		t.Errorf("overlapping claim: %v, want ErrRefused saying overlaps", r.Err)
	}
	// A claim with a MIG device and a share of a GPU is refused.
	mixed := migClaim("uid-c", "gpu-2-mig-1g-10gb-0")
	mixed.Status.Allocation.Devices.Results = append(mixed.Status.Allocation.Devices.Results, testClaim("x", "x", testProfile().Driver, "1Gi", "10", "gpu-0").Status.Allocation.Devices.Results...)
	if r := prepare(t, p, mixed)["uid-c"]; !errors.Is(r.Err, ErrRefused) || !strings.Contains(r.Err.Error(), "two claims") {
		t.Errorf("mixed claim: %v, want ErrRefused", r.Err)
	}

	// A restart: New reads the checkpoint; without a realiser it refuses, with one its
	// Unprepare destroys the instance.
	noMIG := opts
	noMIG.MIG = nil
	if _, err := New(noMIG); !errors.Is(err, ErrInvalidOptions) || !errors.Is(err, ErrNoMIG) {
		t.Errorf("New without Options.MIG over a checkpoint with MIG devices: %v", err)
	}
	p2 := newPlugin(t, opts)
	if errs := unprepare(t, p2, "uid-a"); errs["uid-a"] != nil {
		t.Fatal(errs["uid-a"])
	}
	if live := fm.instances(); len(live) != 0 {
		t.Errorf("instances after unprepare: %+v", live)
	}
	if len(p2.PreparedGPUs()) != 0 {
		t.Errorf("prepared GPUs after unprepare: %v", p2.PreparedGPUs())
	}
}

func TestPrepareMIGFailures(t *testing.T) {
	t.Parallel()
	gpus := migGPUs()
	t.Run("no realiser", func(t *testing.T) {
		t.Parallel()
		p := newPlugin(t, testOptions(t, newClient()))
		p.SetSlices(gpus, migSlices(t, gpus))
		if r := prepare(t, p, migClaim("u", "gpu-2-mig-1g-10gb-6"))["u"]; !errors.Is(r.Err, ErrRefused) || !errors.Is(r.Err, ErrNoMIG) {
			t.Errorf("prepare without Options.MIG: %v", r.Err)
		}
	})
	t.Run("create fails", func(t *testing.T) {
		t.Parallel()
		opts := testOptions(t, newClient())
		fm := &fakeMIG{}
		opts.MIG = fm
		p := newPlugin(t, opts)
		p.SetSlices(gpus, migSlices(t, gpus))
		// The second create fails: the first instance is destroyed again, nothing prepared.
		var calls int
		wrap := &countingMIG{fakeMIG: fm, failAt: 2, calls: &calls}
		p.opts.MIG = wrap
		if r := prepare(t, p, migClaim("u", "gpu-2-mig-1g-10gb-6", "gpu-2-mig-1g-10gb-4"))["u"]; r.Err == nil {
			t.Fatal("prepare succeeded")
		}
		if live := fm.instances(); len(live) != 0 {
			t.Errorf("instances left after a failed prepare: %+v", live)
		}
		if len(p.PreparedGPUs()) != 0 {
			t.Errorf("claims prepared after a failure: %v", p.PreparedGPUs())
		}
	})
	t.Run("orphan destroyed", func(t *testing.T) {
		t.Parallel()
		opts := testOptions(t, newClient())
		fm := &fakeMIG{}
		opts.MIG = fm
		// An instance at the placement that no claim records (a plugin stopped between the
		// create and the checkpoint).
		orphan, err := fm.Create(t.Context(), gpus[2].ID, "1g.10gb", mig.Placement{Start: 6, Size: 2})
		if err != nil {
			t.Fatal(err)
		}
		p := newPlugin(t, opts)
		p.SetSlices(gpus, migSlices(t, gpus))
		if r := prepare(t, p, migClaim("u", "gpu-2-mig-7g-40gb-0"))["u"]; r.Err != nil {
			t.Fatal(r.Err)
		}
		if !slices.Contains(fm.destroyed, orphan.MigUUID) {
			t.Errorf("orphan %s not destroyed", orphan.MigUUID)
		}
		if live := fm.instances(); len(live) != 1 || live[0].Profile != "7g.40gb" {
			t.Errorf("instances: %+v", live)
		}
	})
	t.Run("refused by the owner check", func(t *testing.T) {
		t.Parallel()
		opts := testOptions(t, newClient())
		fm := &fakeMIG{}
		opts.MIG = fm
		var asked []string
		opts.Refuse = func(_ context.Context, gpus []annotation.Device) error {
			for _, g := range gpus {
				asked = append(asked, g.ID)
			}
			return errors.New("GPU held by pod default/hami through HAMi")
		}
		p := newPlugin(t, opts)
		p.SetSlices(gpus, migSlices(t, gpus))
		if r := prepare(t, p, migClaim("u", "gpu-2-mig-1g-10gb-6"))["u"]; !errors.Is(r.Err, ErrRefused) || !strings.Contains(r.Err.Error(), "default/hami") {
			t.Errorf("prepare of a GPU held by HAMi: %v", r.Err)
		}
		if !slices.Equal(asked, []string{gpus[2].ID}) || len(fm.instances()) != 0 {
			t.Errorf("Refuse asked about %v, instances %v; want the MIG GPU and none created", asked, fm.instances())
		}
	})
	t.Run("unhealthy or unpublished", func(t *testing.T) {
		t.Parallel()
		opts := testOptions(t, newClient())
		opts.MIG = &fakeMIG{}
		p := newPlugin(t, opts)
		sick := migGPUs()
		sick[2].Health = false
		p.SetSlices(sick, migSlices(t, sick))
		if r := prepare(t, p, migClaim("u", "gpu-2-mig-1g-10gb-6"))["u"]; !errors.Is(r.Err, ErrRefused) || !strings.Contains(r.Err.Error(), "unhealthy") {
			t.Errorf("unhealthy GPU: %v", r.Err)
		}
		p.SetDevices(gpus, testDevices(t, opts.Profile, gpus)) // the MIG GPU not published
		if r := prepare(t, p, migClaim("v", "gpu-2-mig-1g-10gb-6"))["v"]; !errors.Is(r.Err, ErrRefused) || !strings.Contains(r.Err.Error(), "not one this node publishes") {
			t.Errorf("unpublished MIG device: %v", r.Err)
		}
	})
}

// countingMIG fails the failAt-th Create.
type countingMIG struct {
	*fakeMIG
	failAt int
	calls  *int
}

func (c *countingMIG) Create(ctx context.Context, gpu, profile string, pl mig.Placement) (mig.Instance, error) {
	*c.calls++
	if *c.calls == c.failAt {
		return mig.Instance{}, errors.New("simulated NVML failure")
	}
	return c.fakeMIG.Create(ctx, gpu, profile, pl)
}

func TestRunPublishesMIGSlices(t *testing.T) {
	t.Parallel()
	client := newClient()
	opts := testOptions(t, client)
	opts.MIG = &fakeMIG{}
	p := newPlugin(t, opts)
	gpus := migGPUs()
	p.SetSlices(gpus, migSlices(t, gpus))
	run(t, p)
	waitFor(t, "two slices", func() bool { return len(slicesOf(t, client)) == 2 })
	var counters, devices int
	for _, s := range slicesOf(t, client) {
		if s.Spec.Pool.ResourceSliceCount != 2 || s.Spec.Pool.Name != testNode {
			t.Errorf("slice %s pool %+v", s.Name, s.Spec.Pool)
		}
		counters += len(s.Spec.SharedCounters)
		devices += len(s.Spec.Devices)
		if len(s.Spec.SharedCounters) > 0 && len(s.Spec.Devices) > 0 {
			t.Errorf("slice %s has counters and devices", s.Name)
		}
	}
	if counters != 1 || devices != 2+5 {
		t.Errorf("published %d counter sets and %d devices, want 1 and 7", counters, devices)
	}
}

// A stale MIG claim (deleted from the API server without an Unprepare) is cleaned up like
// any other, and its MIG device destroyed as Unprepare would.
func TestCleanupStaleMIG(t *testing.T) {
	t.Parallel()
	client := newClient()
	opts := testOptions(t, client)
	fm := &fakeMIG{}
	opts.MIG = fm
	p := newPlugin(t, opts)
	gpus := migGPUs()
	p.SetSlices(gpus, migSlices(t, gpus))
	if res := prepare(t, p, migClaim("uid-a", "gpu-2-mig-1g-10gb-6"))["uid-a"]; res.Err != nil {
		t.Fatal(res.Err)
	}
	if len(fm.instances()) != 1 {
		t.Fatalf("instances after prepare: %+v", fm.instances())
	}
	// The claim was never created in the API server: to the cleanup it is deleted.
	if err := p.Cleanup(t.Context()); err != nil {
		t.Fatal(err)
	}
	if live := fm.instances(); len(live) != 0 {
		t.Errorf("instances after the cleanup: %+v, want none", live)
	}
	if got := p.PreparedGPUs(); len(got) != 0 {
		t.Errorf("PreparedGPUs after the cleanup: %v", got)
	}
	if st := p.Stats(); st.StaleUnprepared != 1 {
		t.Errorf("stats %+v, want 1 stale claim unprepared", st)
	}
}

package nvmlsim_test

import (
	"strings"
	"sync"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/google/go-cmp/cmp"

	"github.com/hamireg/hamireg/mig"
	"github.com/hamireg/hamireg/nvmlscan/nvmlsim"
)

func newMIGNode(t *testing.T, server string) *nvmlsim.Node {
	t.Helper()
	n, err := nvmlsim.New(server)
	if err != nil {
		t.Fatal(err)
	}
	n.EnableMIG()
	return n
}

func profileInfo(t *testing.T, d nvml.Device, enum int) nvml.GpuInstanceProfileInfo {
	t.Helper()
	info, ret := d.GetGpuInstanceProfileInfo(enum)
	if ret != nvml.SUCCESS {
		t.Fatalf("GetGpuInstanceProfileInfo(%d) = %v", enum, ret)
	}
	return info
}

// createMIG makes a GPU instance of the enum's profile at start and its compute instance
// filling it, as HAMi master's Allocate does, and returns the GPU instance.
func createMIG(t *testing.T, d nvml.Device, enum int, start uint32) nvml.GpuInstance {
	t.Helper()
	info := profileInfo(t, d, enum)
	places, ret := d.GetGpuInstancePossiblePlacements(&info)
	if ret != nvml.SUCCESS {
		t.Fatalf("GetGpuInstancePossiblePlacements = %v", ret)
	}
	var pl *nvml.GpuInstancePlacement
	for i := range places {
		if places[i].Start == start {
			pl = &places[i]
		}
	}
	if pl == nil {
		t.Fatalf("no placement at %d in %v", start, places)
	}
	gi, ret := d.CreateGpuInstanceWithPlacement(&info, pl)
	if ret != nvml.SUCCESS {
		t.Fatalf("CreateGpuInstanceWithPlacement(%d, %+v) = %v", info.Id, *pl, ret)
	}
	ciEnum := map[uint32]int{1: nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, 2: nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE,
		3: nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE, 4: nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE, 7: nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE}[info.SliceCount]
	ciInfo, ret := gi.GetComputeInstanceProfileInfo(ciEnum, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if ret != nvml.SUCCESS {
		t.Fatalf("GetComputeInstanceProfileInfo = %v", ret)
	}
	if _, ret := gi.CreateComputeInstance(&ciInfo); ret != nvml.SUCCESS {
		t.Fatalf("CreateComputeInstance = %v", ret)
	}
	return gi
}

// TestMIGProfiles checks the GPU-instance profiles answer the nvidia-smi ids, names and the
// eight-slice placements, and the A100-40GB table HAMi's vectors were fed.
func TestMIGProfiles(t *testing.T) {
	t.Parallel()
	type row struct {
		ID, Slices, Count, SMs uint32
		MiB                    uint64
		Places                 []nvml.GpuInstancePlacement
	}
	ones := []nvml.GpuInstancePlacement{{Start: 0, Size: 1}, {Start: 1, Size: 1}, {Start: 2, Size: 1},
		{Start: 3, Size: 1}, {Start: 4, Size: 1}, {Start: 5, Size: 1}, {Start: 6, Size: 1}}
	twos := []nvml.GpuInstancePlacement{{Start: 0, Size: 2}, {Start: 2, Size: 2}, {Start: 4, Size: 2}}
	fours := []nvml.GpuInstancePlacement{{Start: 0, Size: 4}, {Start: 4, Size: 4}}
	tests := map[string]struct {
		server string
		want   map[int]row
	}{
		"dgxa100 is the vectors' A100-SXM4-40GB": {server: "dgxa100", want: map[int]row{
			nvml.GPU_INSTANCE_PROFILE_1_SLICE:      {19, 1, 7, 14, 4864, ones},
			nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1: {20, 1, 1, 14, 4864, ones},
			nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2: {15, 1, 4, 14, 9856, append(twos, nvml.GpuInstancePlacement{Start: 6, Size: 2})},
			nvml.GPU_INSTANCE_PROFILE_2_SLICE:      {14, 2, 3, 28, 9856, twos},
			nvml.GPU_INSTANCE_PROFILE_3_SLICE:      {9, 3, 2, 42, 19968, fours},
			nvml.GPU_INSTANCE_PROFILE_4_SLICE:      {5, 4, 1, 56, 19968, fours[:1]},
			nvml.GPU_INSTANCE_PROFILE_7_SLICE:      {0, 7, 1, 98, 40192, []nvml.GpuInstancePlacement{{Start: 0, Size: 8}}},
		}},
		"dgxh100 keeps the preset's memory and SMs on the real layout": {server: "dgxh100", want: map[int]row{
			nvml.GPU_INSTANCE_PROFILE_1_SLICE: {19, 1, 7, 16, 10240, ones},
			nvml.GPU_INSTANCE_PROFILE_3_SLICE: {9, 3, 2, 48, 40960, fours},
			nvml.GPU_INSTANCE_PROFILE_7_SLICE: {0, 7, 1, 112, 81920, []nvml.GpuInstancePlacement{{Start: 0, Size: 8}}},
		}},
		"dgxh200 is the vectors' H200": {server: "dgxh200", want: map[int]row{
			nvml.GPU_INSTANCE_PROFILE_1_SLICE:      {19, 1, 7, 16, 16384, ones},
			nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2: {15, 1, 4, 26, 33024, append(twos, nvml.GpuInstancePlacement{Start: 6, Size: 2})},
			nvml.GPU_INSTANCE_PROFILE_2_SLICE:      {14, 2, 3, 32, 33024, twos},
			nvml.GPU_INSTANCE_PROFILE_3_SLICE:      {9, 3, 2, 60, 71168, fours},
			nvml.GPU_INSTANCE_PROFILE_4_SLICE:      {5, 4, 1, 64, 71168, fours[:1]},
			nvml.GPU_INSTANCE_PROFILE_7_SLICE:      {0, 7, 1, 132, 143104, []nvml.GpuInstancePlacement{{Start: 0, Size: 8}}},
		}},
		"dgxb200": {server: "dgxb200", want: map[int]row{
			nvml.GPU_INSTANCE_PROFILE_2_SLICE: {14, 2, 3, 36, 46080, twos},
		}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			n, err := nvmlsim.New(tc.server) // MIG mode off: the profiles answer all the same
			if err != nil {
				t.Fatal(err)
			}
			d := n.Device(0)
			got := map[int]row{}
			for enum := range tc.want {
				info := profileInfo(t, d, enum)
				places, ret := d.GetGpuInstancePossiblePlacements(&info)
				if ret != nvml.SUCCESS {
					t.Fatalf("GetGpuInstancePossiblePlacements(%d) = %v", info.Id, ret)
				}
				got[enum] = row{info.Id, info.SliceCount, info.InstanceCount, info.MultiprocessorCount, info.MemorySizeMB, places}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("profiles (-want +got):\n%s", diff)
			}
			if _, ret := d.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_COUNT); ret != nvml.ERROR_INVALID_ARGUMENT {
				t.Errorf("profile enum out of range = %v, want ERROR_INVALID_ARGUMENT", ret)
			}
			if _, ret := d.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_6_SLICE); ret != nvml.ERROR_NOT_SUPPORTED {
				t.Errorf("6-slice profile = %v, want ERROR_NOT_SUPPORTED", ret)
			}
		})
	}
}

// TestMIGRefusesOverlap proves the simulation refuses a GPU instance whose placement overlaps a
// live one, and one beyond the profile's instance count, a placement not listed and a
// disabled MIG mode.
func TestMIGRefusesOverlap(t *testing.T) {
	t.Parallel()
	for _, server := range []string{"dgxa100", "dgxh100"} {
		t.Run(server, func(t *testing.T) {
			t.Parallel()
			n := newMIGNode(t, server)
			d := n.Device(0)
			createMIG(t, d, nvml.GPU_INSTANCE_PROFILE_2_SLICE, 2) // slices 2-3
			tests := map[string]struct {
				enum int
				pl   nvml.GpuInstancePlacement
				want nvml.Return
			}{
				"same placement":              {nvml.GPU_INSTANCE_PROFILE_2_SLICE, nvml.GpuInstancePlacement{Start: 2, Size: 2}, nvml.ERROR_INSUFFICIENT_RESOURCES},
				"1g inside it":                {nvml.GPU_INSTANCE_PROFILE_1_SLICE, nvml.GpuInstancePlacement{Start: 3, Size: 1}, nvml.ERROR_INSUFFICIENT_RESOURCES},
				"3g over it":                  {nvml.GPU_INSTANCE_PROFILE_3_SLICE, nvml.GpuInstancePlacement{Start: 0, Size: 4}, nvml.ERROR_INSUFFICIENT_RESOURCES},
				"7g over it":                  {nvml.GPU_INSTANCE_PROFILE_7_SLICE, nvml.GpuInstancePlacement{Start: 0, Size: 8}, nvml.ERROR_INSUFFICIENT_RESOURCES},
				"placement not listed":        {nvml.GPU_INSTANCE_PROFILE_2_SLICE, nvml.GpuInstancePlacement{Start: 1, Size: 2}, nvml.ERROR_INVALID_ARGUMENT},
				"size not the listed one":     {nvml.GPU_INSTANCE_PROFILE_3_SLICE, nvml.GpuInstancePlacement{Start: 4, Size: 3}, nvml.ERROR_INVALID_ARGUMENT},
				"enum is not a profile id":    {-1, nvml.GpuInstancePlacement{Start: 4, Size: 4}, nvml.ERROR_INVALID_ARGUMENT},
				"next to it is free: 1g at 4": {nvml.GPU_INSTANCE_PROFILE_1_SLICE, nvml.GpuInstancePlacement{Start: 4, Size: 1}, nvml.SUCCESS},
			}
			for name, tc := range tests {
				var info nvml.GpuInstanceProfileInfo
				if tc.enum >= 0 {
					info = profileInfo(t, d, tc.enum)
				} else {
					info = profileInfo(t, d, nvml.GPU_INSTANCE_PROFILE_3_SLICE)
					info.Id = nvml.GPU_INSTANCE_PROFILE_3_SLICE // the enum, not nvidia-smi's id 9
				}
				gi, ret := d.CreateGpuInstanceWithPlacement(&info, &tc.pl)
				if ret != tc.want {
					t.Errorf("%s: CreateGpuInstanceWithPlacement = %v, want %v", name, ret, tc.want)
				}
				if ret == nvml.SUCCESS {
					if ret := gi.Destroy(); ret != nvml.SUCCESS {
						t.Fatalf("%s: Destroy = %v", name, ret)
					}
				}
			}
			if err := n.MIGOverlaps(); err != nil {
				t.Error(err)
			}
			// The 2g profile has three placements: the other two fill, a fourth is refused.
			two := profileInfo(t, d, nvml.GPU_INSTANCE_PROFILE_2_SLICE)
			for _, start := range []uint32{0, 4} {
				createMIG(t, d, nvml.GPU_INSTANCE_PROFILE_2_SLICE, start)
			}
			if c, ret := d.GetGpuInstanceRemainingCapacity(&two); ret != nvml.SUCCESS || c != 0 {
				t.Errorf("2g remaining capacity = %d, %v; want 0", c, ret)
			}
			if _, ret := d.CreateGpuInstance(&two); ret != nvml.ERROR_INSUFFICIENT_RESOURCES {
				t.Errorf("fourth 2g = %v, want ERROR_INSUFFICIENT_RESOURCES", ret)
			}
			one := profileInfo(t, d, nvml.GPU_INSTANCE_PROFILE_1_SLICE)
			if c, ret := d.GetGpuInstanceRemainingCapacity(&one); ret != nvml.SUCCESS || c != 1 {
				t.Errorf("1g remaining capacity = %d, %v; want 1 (slice 6)", c, ret)
			}
			if err := n.MIGOverlaps(); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestMIGInstanceCount checks a profile's instance count bounds its GPU instances even where
// placements are free: one 1g.5gb+me per A100.
func TestMIGInstanceCount(t *testing.T) {
	t.Parallel()
	n := newMIGNode(t, "dgxa100")
	d := n.Device(0)
	createMIG(t, d, nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 0)
	me := profileInfo(t, d, nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1)
	if _, ret := d.CreateGpuInstanceWithPlacement(&me, &nvml.GpuInstancePlacement{Start: 1, Size: 1}); ret != nvml.ERROR_INSUFFICIENT_RESOURCES {
		t.Errorf("second 1g.5gb+me = %v, want ERROR_INSUFFICIENT_RESOURCES", ret)
	}
}

// TestMIGMode checks MIG mode: off by default (no instance, no MIG device), SetMigMode applies
// at once on an idle GPU, cannot turn off under live instances, and a pending activation.
func TestMIGMode(t *testing.T) {
	t.Parallel()
	n, err := nvmlsim.New("dgxa100")
	if err != nil {
		t.Fatal(err)
	}
	d := n.Device(0)
	if cur, pend, ret := d.GetMigMode(); cur != 0 || pend != 0 || ret != nvml.SUCCESS {
		t.Errorf("GetMigMode = %d, %d, %v; want 0, 0, SUCCESS", cur, pend, ret)
	}
	info := profileInfo(t, d, nvml.GPU_INSTANCE_PROFILE_1_SLICE)
	if _, ret := d.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: 0, Size: 1}); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("create with MIG off = %v, want ERROR_NOT_SUPPORTED", ret)
	}
	if c, ret := d.GetMaxMigDeviceCount(); c != 0 || ret != nvml.SUCCESS {
		t.Errorf("GetMaxMigDeviceCount with MIG off = %d, %v; want 0, SUCCESS", c, ret)
	}
	if _, ret := d.GetMigDeviceHandleByIndex(0); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("GetMigDeviceHandleByIndex with MIG off = %v, want ERROR_NOT_FOUND", ret)
	}
	if _, ret := d.GetGpuInstances(&info); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("GetGpuInstances with MIG off = %v, want ERROR_NOT_SUPPORTED", ret)
	}
	if act, ret := d.SetMigMode(nvml.DEVICE_MIG_ENABLE); act != nvml.SUCCESS || ret != nvml.SUCCESS {
		t.Fatalf("SetMigMode(1) = %v, %v", act, ret)
	}
	if cur, pend, _ := n.Server.DeviceGetMigMode(d); cur != 1 || pend != 1 {
		t.Errorf("after SetMigMode(1): %d, %d; want 1, 1", cur, pend)
	}
	if c, _ := d.GetMaxMigDeviceCount(); c != 7 {
		t.Errorf("GetMaxMigDeviceCount = %d, want 7", c)
	}
	gi := createMIG(t, d, nvml.GPU_INSTANCE_PROFILE_1_SLICE, 0)
	if act, ret := d.SetMigMode(nvml.DEVICE_MIG_DISABLE); ret != nvml.ERROR_IN_USE {
		t.Errorf("SetMigMode(0) under a live instance = %v, %v; want ERROR_IN_USE", act, ret)
	}
	destroyAll(t, gi)
	n.SetMIGActivation(0, nvml.ERROR_RESET_REQUIRED)
	if act, ret := d.SetMigMode(nvml.DEVICE_MIG_DISABLE); act != nvml.ERROR_RESET_REQUIRED || ret != nvml.SUCCESS {
		t.Errorf("SetMigMode(0) needing a reset = %v, %v", act, ret)
	}
	if cur, pend, _ := d.GetMigMode(); cur != 1 || pend != 0 {
		t.Errorf("after a pending SetMigMode(0): %d, %d; want 1, 0", cur, pend)
	}
	if _, ret := d.SetMigMode(2); ret != nvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("SetMigMode(2) = %v", ret)
	}
}

func destroyAll(t *testing.T, gi nvml.GpuInstance) {
	t.Helper()
	info, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		t.Fatalf("gi.GetInfo = %v", ret)
	}
	for ciEnum := range nvml.COMPUTE_INSTANCE_PROFILE_COUNT {
		p, ret := gi.GetComputeInstanceProfileInfo(ciEnum, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret != nvml.SUCCESS {
			continue
		}
		cis, _ := gi.GetComputeInstances(&p)
		for _, ci := range cis {
			if ret := ci.Destroy(); ret != nvml.SUCCESS {
				t.Fatalf("ci.Destroy = %v", ret)
			}
		}
	}
	if ret := gi.Destroy(); ret != nvml.SUCCESS {
		t.Fatalf("GPU instance %d: Destroy = %v", info.Id, ret)
	}
}

// TestMIGDestroyOrder checks a GPU instance is not destroyed while its compute instance lives,
// and destroyed handles answer ERROR_INVALID_ARGUMENT.
func TestMIGDestroyOrder(t *testing.T) {
	t.Parallel()
	n := newMIGNode(t, "dgxa100")
	d := n.Device(0)
	gi := createMIG(t, d, nvml.GPU_INSTANCE_PROFILE_3_SLICE, 4)
	info, _ := gi.GetInfo()
	if ret := gi.Destroy(); ret != nvml.ERROR_IN_USE {
		t.Errorf("GPU instance Destroy with a compute instance = %v, want ERROR_IN_USE", ret)
	}
	ci, ret := gi.GetComputeInstanceById(0)
	if ret != nvml.SUCCESS {
		t.Fatalf("GetComputeInstanceById(0) = %v", ret)
	}
	md, _ := d.GetMigDeviceHandleByIndex(0)
	if ret := ci.Destroy(); ret != nvml.SUCCESS {
		t.Fatalf("ci.Destroy = %v", ret)
	}
	if ret := ci.Destroy(); ret != nvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("second ci.Destroy = %v, want ERROR_INVALID_ARGUMENT", ret)
	}
	if _, ret := md.GetUUID(); ret != nvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("GetUUID of a destroyed MIG device = %v, want ERROR_INVALID_ARGUMENT", ret)
	}
	if _, ret := d.GetMigDeviceHandleByIndex(0); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("MIG device 0 after its compute instance went = %v, want ERROR_NOT_FOUND", ret)
	}
	got, ret := d.GetGpuInstanceById(int(info.Id))
	if ret != nvml.SUCCESS || got != gi {
		t.Errorf("GetGpuInstanceById(%d) = %v, %v; want the same handle", info.Id, got, ret)
	}
	if ret := gi.Destroy(); ret != nvml.SUCCESS {
		t.Fatalf("gi.Destroy = %v", ret)
	}
	if _, ret := gi.GetInfo(); ret != nvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("GetInfo of a destroyed GPU instance = %v", ret)
	}
	if _, ret := d.GetGpuInstanceById(int(info.Id)); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("GetGpuInstanceById of a destroyed instance = %v, want ERROR_NOT_FOUND", ret)
	}
	if got := n.MIGInstances(0); len(got) != 0 {
		t.Errorf("MIGInstances after destroy = %v", got)
	}
	// The placement is free again.
	createMIG(t, d, nvml.GPU_INSTANCE_PROFILE_3_SLICE, 4)
}

// TestMIGDevices checks MIG device enumeration and identity: one MIG device per compute
// instance, by GPU-instance id, with its UUID, ids, parent, memory and the library lookups.
func TestMIGDevices(t *testing.T) {
	t.Parallel()
	n := newMIGNode(t, "dgxa100")
	d := n.Device(1)
	createMIG(t, d, nvml.GPU_INSTANCE_PROFILE_1_SLICE, 2)
	createMIG(t, d, nvml.GPU_INSTANCE_PROFILE_2_SLICE, 0)
	gi := createMIG(t, d, nvml.GPU_INSTANCE_PROFILE_3_SLICE, 4)
	giInfo, _ := gi.GetInfo()
	if giInfo.Id != 3 || giInfo.ProfileId != 9 || giInfo.Placement != (nvml.GpuInstancePlacement{Start: 4, Size: 4}) || giInfo.Device != d {
		t.Errorf("gi.GetInfo = %+v", giInfo)
	}
	got := n.MIGInstances(1)
	want := []nvmlsim.MIGInstance{
		{Profile: "1g.5gb", ProfileID: 19, Placement: mig.Placement{Start: 2, Size: 1}, GPUInstanceID: 1},
		{Profile: "2g.10gb", ProfileID: 14, Placement: mig.Placement{Start: 0, Size: 2}, GPUInstanceID: 2},
		{Profile: "3g.20gb", ProfileID: 9, Placement: mig.Placement{Start: 4, Size: 4}, GPUInstanceID: 3},
	}
	if diff := cmp.Diff(want, got, cmpIgnoreUUID()); diff != "" {
		t.Errorf("MIGInstances (-want +got):\n%s", diff)
	}
	if len(n.MIGInstances(0)) != 0 {
		t.Errorf("GPU 0 has instances: %v", n.MIGInstances(0))
	}
	if c, _ := n.Server.DeviceGetMaxMigDeviceCount(d); c != 7 {
		t.Errorf("GetMaxMigDeviceCount = %d", c)
	}
	mem := []uint64{4864, 9856, 19968}
	for i := range 7 {
		md, ret := n.Server.DeviceGetMigDeviceHandleByIndex(d, i)
		if i >= 3 {
			if ret != nvml.ERROR_NOT_FOUND {
				t.Errorf("MIG device %d = %v, want ERROR_NOT_FOUND", i, ret)
			}
			continue
		}
		if ret != nvml.SUCCESS {
			t.Fatalf("MIG device %d = %v", i, ret)
		}
		uuid, _ := md.GetUUID()
		if uuid != got[i].MigUUID || !strings.HasPrefix(uuid, "MIG-") || len(uuid) != len("MIG-")+36 {
			t.Errorf("MIG device %d UUID %q, MIGInstances says %q", i, uuid, got[i].MigUUID)
		}
		if again, _ := md.GetUUID(); again != uuid {
			t.Errorf("UUID changed: %q then %q", uuid, again)
		}
		giID, _ := md.GetGpuInstanceId()
		ciID, _ := md.GetComputeInstanceId()
		isMIG, _ := n.Server.DeviceIsMigDeviceHandle(md)
		parent, _ := md.GetDeviceHandleFromMigDeviceHandle()
		memInfo, _ := md.GetMemoryInfo()
		byUUID, ret := n.Server.DeviceGetHandleByUUID(uuid)
		if giID != i+1 || ciID != 0 || !isMIG || parent != d || memInfo.Total != mem[i]<<20 || ret != nvml.SUCCESS || byUUID != md {
			t.Errorf("MIG device %d: gi %d ci %d mig %v parent %v memory %d byUUID %v %v", i, giID, ciID, isMIG, parent == d, memInfo.Total>>20, byUUID == md, ret)
		}
		name, _ := md.GetName()
		if want := "Mock NVIDIA A100-SXM4-40GB MIG " + want[i].Profile; name != want {
			t.Errorf("MIG device %d name %q, want %q", i, name, want)
		}
	}
	if isMIG, _ := d.IsMigDeviceHandle(); isMIG {
		t.Error("the GPU says it is a MIG device")
	}
	if parent, ret := n.Server.DeviceGetHandleByUUID(n.UUID(1)); ret != nvml.SUCCESS || parent != d {
		t.Errorf("DeviceGetHandleByUUID(GPU 1) = %v, %v", parent, ret)
	}
	if err := n.MIGOverlaps(); err != nil {
		t.Error(err)
	}
	// A GPU instance without a compute instance is listed once, without a MIG UUID, and has no
	// MIG device.
	one := profileInfo(t, d, nvml.GPU_INSTANCE_PROFILE_1_SLICE)
	if _, ret := d.CreateGpuInstanceWithPlacement(&one, &nvml.GpuInstancePlacement{Start: 3, Size: 1}); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	all := n.MIGInstances(1)
	if len(all) != 4 || all[3].MigUUID != "" || all[3].GPUInstanceID != 4 {
		t.Errorf("MIGInstances = %+v", all)
	}
	if _, ret := d.GetMigDeviceHandleByIndex(3); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("MIG device 3 = %v, want ERROR_NOT_FOUND", ret)
	}
}

func cmpIgnoreUUID() cmp.Option {
	return cmp.FilterPath(func(p cmp.Path) bool { return p.Last().String() == ".MigUUID" }, cmp.Ignore())
}

// TestMIGConcurrent creates and destroys instances on every GPU from many goroutines (the
// device plugin calls NVML from gRPC goroutines): run under -race, no overlap ever.
func TestMIGConcurrent(t *testing.T) {
	t.Parallel()
	n := newMIGNode(t, "dgxa100")
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			d := n.Device(w % 8)
			info, _ := d.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_1_SLICE)
			for start := range uint32(7) {
				gi, ret := d.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: start, Size: 1})
				if ret == nvml.ERROR_INSUFFICIENT_RESOURCES {
					continue
				}
				if ret != nvml.SUCCESS {
					t.Errorf("create = %v", ret)
					return
				}
				if err := n.MIGOverlaps(); err != nil {
					t.Error(err)
				}
				_ = n.MIGInstances(w % 8)
				if start%2 == 0 {
					if ret := gi.Destroy(); ret != nvml.SUCCESS {
						t.Errorf("destroy = %v", ret)
					}
				}
			}
		})
	}
	wg.Wait()
	for i := range 8 {
		if got := len(n.MIGInstances(i)); got != 3 {
			t.Errorf("GPU %d: %d live instances, want 3 (odd starts)", i, got)
		}
	}
	if err := n.MIGOverlaps(); err != nil {
		t.Error(err)
	}
}

// TestMIGState checks the snapshot a debug endpoint serves: every GPU, its mode and instances.
func TestMIGState(t *testing.T) {
	t.Parallel()
	n, err := nvmlsim.New("dgxh100")
	if err != nil {
		t.Fatal(err)
	}
	d := n.Device(5)
	if _, ret := d.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	createMIG(t, d, nvml.GPU_INSTANCE_PROFILE_3_SLICE, 0)
	s := n.MIGState()
	if len(s.GPUs) != 8 || s.Overlaps != "" {
		t.Fatalf("MIGState = %+v", s)
	}
	for i, g := range s.GPUs {
		wantMode, wantInstances := 0, 0
		if i == 5 {
			wantMode, wantInstances = 1, 1
		}
		if g.Index != i || g.UUID != n.UUID(i) || g.MIGMode != wantMode || len(g.Instances) != wantInstances || g.Instances == nil {
			t.Errorf("GPU %d: %+v", i, g)
		}
	}
	if got := s.GPUs[5].Instances[0]; got.Profile != "3g.40gb" || got.Placement != (mig.Placement{Start: 0, Size: 4}) || got.MigUUID == "" {
		t.Errorf("instance %+v", got)
	}
}

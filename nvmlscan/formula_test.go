package nvmlscan

import (
	"errors"
	"io/fs"
	"math"
	"testing"
	"testing/fstest"
	"time"
)

const mib = 1 << 20

// The formula table of the specification (hami-registration.md §4.2), including the
// truncation cases.
func TestDevmem(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		total   uint64
		scaling float64
		mig     bool
		want    int32
		wantErr error
	}{
		"whole MiB":                    {total: 81920 * mib, scaling: 1, want: 81920},
		"partial MiB truncated":        {total: 81559*mib + mib - 1, scaling: 1, want: 81559},
		"less than one MiB":            {total: mib - 1, scaling: 1, want: 0},
		"spec example 81559 × 1.8":     {total: 81559 * mib, scaling: 1.8, want: 146806},
		"scaling 0.5":                  {total: 40960 * mib, scaling: 0.5, want: 20480},
		"scaling 1.5 truncates":        {total: 7681 * mib, scaling: 1.5, want: 11521},
		"scaling 3 on H200":            {total: 144384 * mib, scaling: 3, want: 433152},
		"scaling below a MiB":          {total: 1 * mib, scaling: 0.3, want: 0},
		"scaling applies to whole MiB": {total: 1000*mib + mib/2, scaling: 2, want: 2000},
		"mig ignores scaling":          {total: 81559 * mib, scaling: 1.8, mig: true, want: 81559},
		"largest int32":                {total: math.MaxInt32 * mib, scaling: 1, want: math.MaxInt32},
		"memory beyond int32 MiB":      {total: (math.MaxInt32 + 1) * mib, scaling: 1, wantErr: ErrOutOfRange},
		"scaled beyond int32":          {total: 81920 * mib, scaling: 30000, wantErr: ErrOutOfRange},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got, err := devmem(tc.total, tc.scaling, tc.mig)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("devmem(%d, %v, %v) error = %v, want %v", tc.total, tc.scaling, tc.mig, err, tc.wantErr)
			}
			if got != tc.want {
				t.Errorf("devmem(%d, %v, %v) = %d, want %d", tc.total, tc.scaling, tc.mig, got, tc.want)
			}
		})
	}
}

func TestDevcore(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		scaling float64
		mig     bool
		want    int32
	}{
		"default":              {scaling: 1, want: 100},
		"0.29 truncates to 28": {scaling: 0.29, want: 28},
		"0.57 truncates to 56": {scaling: 0.57, want: 56},
		"1.15 truncates to 114": {
			scaling: 1.15, want: 114,
		},
		"2.3 truncates to 229": {scaling: 2.3, want: 229},
		"0.5":                  {scaling: 0.5, want: 50},
		"0.07":                 {scaling: 0.07, want: 7},
		"0.001 gives 0":        {scaling: 0.001, want: 0},
		"mig is 100":           {scaling: 0.29, mig: true, want: 100},
		"mig ignores 2.3":      {scaling: 2.3, mig: true, want: 100},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if got := devcore(tc.scaling, tc.mig); got != tc.want {
				t.Errorf("devcore(%v, %v) = %d, want %d", tc.scaling, tc.mig, got, tc.want)
			}
		})
	}
}

func TestDeviceType(t *testing.T) {
	t.Parallel()
	tests := map[string]struct{ model, want string }{
		"NVIDIA prefix kept":        {"NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"},
		"no space required":         {"NVIDIAGeForce", "NVIDIAGeForce"},
		"Tesla gets prefix":         {"Tesla P4", "NVIDIA-Tesla P4"},
		"case sensitive":            {"nvidia a10", "NVIDIA-nvidia a10"},
		"NVIDIA not at start":       {"Mock NVIDIA A100-SXM4-40GB", "NVIDIA-Mock NVIDIA A100-SXM4-40GB"},
		"empty model":               {"", "NVIDIA-"},
		"dash after NVIDIA is kept": {"NVIDIA-A10", "NVIDIA-A10"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if got := deviceType(tc.model); got != tc.want {
				t.Errorf("deviceType(%q) = %q, want %q", tc.model, got, tc.want)
			}
		})
	}
}

func TestSysfsBusID(t *testing.T) {
	t.Parallel()
	tests := map[string]struct{ in, want string }{
		"nvml 8-digit domain":     {"00000000:3B:00.0", "0000:3b:00.0"},
		"nonzero domain":          {"00000001:3B:00.0", "0001:3b:00.0"},
		"already 4-digit domain":  {"0000:3b:00.0", "0000:3b:00.0"},
		"upper-case 4-digit":      {"0000:DB:00.0", "0000:db:00.0"},
		"surrounding whitespace":  {" 00000000:18:00.0\n", "0000:18:00.0"},
		"empty":                   {"", ""},
		"no colon left untouched": {"00000000", "00000000"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if got := sysfsBusID(tc.in); got != tc.want {
				t.Errorf("sysfsBusID(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestBusIDString(t *testing.T) {
	t.Parallel()
	var raw [32]int8
	for i, c := range "00000000:3B:00.0" {
		raw[i] = int8(c)
	}
	if got := busIDString(raw); got != "00000000:3B:00.0" {
		t.Errorf("busIDString = %q", got)
	}
	var full [32]int8
	for i := range full {
		full[i] = 'a'
	}
	if got := busIDString(full); len(got) != 32 {
		t.Errorf("busIDString without NUL = %q, want 32 bytes", got)
	}
}

func TestNumaNode(t *testing.T) {
	t.Parallel()
	sysfs := fstest.MapFS{
		"bus/pci/devices/0000:18:00.0/numa_node": {Data: []byte("0\n")},
		"bus/pci/devices/0000:9a:00.0/numa_node": {Data: []byte("1\n")},
		"bus/pci/devices/0000:ab:00.0/numa_node": {Data: []byte("-1\n")},
		"bus/pci/devices/0000:ba:00.0/numa_node": {Data: []byte("one\n")},
		"bus/pci/devices/0000:db:00.0/numa_node": {Data: []byte("3")},
	}
	tests := map[string]struct {
		busID   string
		want    int
		wantErr bool
	}{
		"node 0":                {busID: "00000000:18:00.0", want: 0},
		"node 1":                {busID: "00000000:9A:00.0", want: 1},
		"no trailing newline":   {busID: "00000000:DB:00.0", want: 3},
		"negative means none":   {busID: "00000000:AB:00.0", want: 0},
		"malformed":             {busID: "00000000:BA:00.0", want: 0, wantErr: true},
		"missing file":          {busID: "00000000:01:00.0", want: 0, wantErr: true},
		"empty bus id (mocks)":  {busID: "", want: 0, wantErr: true},
		"4-digit domain as is":  {busID: "0000:9a:00.0", want: 1},
		"path outside the tree": {busID: "../../..", want: 0, wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got, err := numaNode(sysfs, tc.busID)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("numaNode(%q) = %d, %v; want %d, error %v", tc.busID, got, err, tc.want, tc.wantErr)
			}
		})
	}
	if _, err := numaNode(sysfs, "00000000:01:00.0"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: error %v does not wrap fs.ErrNotExist", err)
	}
}

func ptr[T any](v T) *T { return &v }

func TestOptionsDefaults(t *testing.T) {
	t.Parallel()
	c, err := Options{}.config()
	if err != nil {
		t.Fatal(err)
	}
	if c.splitCount != 10 || c.memoryScaling != 1 || c.coreScaling != 1 || c.preConfigured != 0 || c.mode != ModeHAMiCore {
		t.Errorf("defaults = %+v", c)
	}
	if c.sysfs == nil || c.clock == nil {
		t.Error("sysfs or clock not defaulted")
	}
	if c.quietPeriod != 5*time.Minute || c.probeInterval != 30*time.Second || c.waitTimeout != time.Second {
		t.Errorf("health defaults = %v %v %v", c.quietPeriod, c.probeInterval, c.waitTimeout)
	}
	for _, x := range []uint64{13, 31, 43, 45, 68, 109} {
		if !c.ignored[x] {
			t.Errorf("XID %d not ignored by default", x)
		}
	}
	if len(c.ignored) != 6 || len(c.persistent) != 0 {
		t.Errorf("ignored %v persistent %v", c.ignored, c.persistent)
	}
	c, err = Options{Health: HealthOptions{IgnoredXIDs: []uint64{}}}.config()
	if err != nil || len(c.ignored) != 0 {
		t.Errorf("empty IgnoredXIDs: %v, %v", c.ignored, err)
	}
}

func TestOptionsInvalid(t *testing.T) {
	t.Parallel()
	tests := map[string]Options{
		"negative split count":       {SplitCount: -1},
		"zero memory scaling":        {MemoryScaling: ptr(0.0)},
		"negative memory scaling":    {MemoryScaling: ptr(-1.0)},
		"NaN memory scaling":         {MemoryScaling: ptr(math.NaN())},
		"infinite memory scaling":    {MemoryScaling: ptr(math.Inf(1))},
		"zero core scaling":          {CoreScaling: ptr(0.0)},
		"NaN core scaling":           {CoreScaling: ptr(math.NaN())},
		"core scaling beyond int32":  {CoreScaling: ptr(3e7)},
		"negative pre-configured":    {PreConfiguredMemory: -1},
		"pre-configured beyond int":  {PreConfiguredMemory: math.MaxInt32 + 1},
		"unknown mode":               {Mode: "exclusive"},
		"negative quiet period":      {Health: HealthOptions{QuietPeriod: -time.Second}},
		"negative probe interval":    {Health: HealthOptions{ProbeInterval: -time.Second}},
		"wait timeout below 1ms":     {Health: HealthOptions{WaitTimeout: time.Microsecond}},
		"wait timeout beyond 1 hour": {Health: HealthOptions{WaitTimeout: 2 * time.Hour}},
	}
	for name, opts := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if _, err := opts.config(); !errors.Is(err, ErrInvalidOptions) {
				t.Errorf("config() error = %v, want ErrInvalidOptions", err)
			}
		})
	}
}

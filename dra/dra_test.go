package dra_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	resourcev1 "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/dra"
)

// quantityCmp compares quantities by value, as the API server does.
var quantityCmp = cmp.Comparer(func(a, b resource.Quantity) bool { return a.Cmp(b) == 0 })

func q(s string) *resource.Quantity { v := resource.MustParse(s); return &v }

func str(s string) resourcev1.DeviceAttribute { return resourcev1.DeviceAttribute{StringValue: &s} }

func num(i int64) resourcev1.DeviceAttribute { return resourcev1.DeviceAttribute{IntValue: &i} }

func yes() *bool { b := true; return &b }

// a100 is a healthy A100 40GB split 10 ways.
func a100(index uint, id string) annotation.Device {
	return annotation.Device{ID: id, Index: index, Count: 10, Devmem: 40960, Devcore: 100, Type: "NVIDIA-A100-SXM4-40GB",
		Numa: 1, Mode: "hami-core", Health: true}
}

func TestProfiles(t *testing.T) {
	t.Parallel()
	sdk, hami := dra.SDKProfile(), dra.HAMiProfile()
	want := map[string]dra.Profile{
		"sdk":  {Name: "sdk", Driver: "gpu.hamireg.io", DevicePrefix: "gpu-", CoresDefault: 0, Shares: true},
		"hami": {Name: "hami", Driver: "hami-core-gpu.project-hami.io", DevicePrefix: "hami-gpu-", CoresDefault: 100, HAMiAttributes: true},
	}
	if diff := cmp.Diff(want, map[string]dra.Profile{"sdk": sdk, "hami": hami}); diff != "" {
		t.Errorf("profiles (-want +got):\n%s", diff)
	}
	for name, p := range want {
		got, err := dra.ProfileByName(name)
		if err != nil || got != p {
			t.Errorf("ProfileByName(%q) = %+v, %v; want %+v", name, got, err, p)
		}
	}
	for _, name := range []string{"", "SDK", "nvidia", "hami "} {
		_, err := dra.ProfileByName(name)
		if err == nil || !strings.Contains(err.Error(), `"sdk"`) || !strings.Contains(err.Error(), `"hami"`) {
			t.Errorf("ProfileByName(%q): %v; want an error naming both profiles", name, err)
		}
	}
	if got, want := sdk.UnhealthyTaint(), "gpu.hamireg.io/unhealthy"; got != want {
		t.Errorf("UnhealthyTaint = %q, want %q", got, want)
	}
	if got, want := hami.OwnedByHAMiTaint(), "hami-core-gpu.project-hami.io/owned-by-hami"; got != want {
		t.Errorf("OwnedByHAMiTaint = %q, want %q", got, want)
	}
}

func TestDeviceNameIndexOf(t *testing.T) {
	t.Parallel()
	sdk, hami := dra.SDKProfile(), dra.HAMiProfile()
	if got := sdk.DeviceName(7); got != "gpu-7" {
		t.Errorf("SDK DeviceName(7) = %q", got)
	}
	if got := hami.DeviceName(0); got != "hami-gpu-0" {
		t.Errorf("HAMi DeviceName(0) = %q", got)
	}
	maxUint := uint(math.MaxUint)
	tests := map[string]struct {
		p     dra.Profile
		name  string
		index uint
		ok    bool
	}{
		"zero":               {sdk, "gpu-0", 0, true},
		"seven":              {sdk, "gpu-7", 7, true},
		"two digits":         {sdk, "gpu-12", 12, true},
		"largest":            {sdk, fmt.Sprintf("gpu-%d", maxUint), maxUint, true},
		"hami":               {hami, "hami-gpu-3", 3, true},
		"leading zero":       {sdk, "gpu-01", 0, false},
		"double zero":        {sdk, "gpu-00", 0, false},
		"no index":           {sdk, "gpu-", 0, false},
		"plus sign":          {sdk, "gpu-+1", 0, false},
		"minus sign":         {sdk, "gpu--1", 0, false},
		"underscore":         {sdk, "gpu-1_0", 0, false},
		"hex":                {sdk, "gpu-0x1", 0, false},
		"space":              {sdk, "gpu- 1", 0, false},
		"overflow":           {sdk, "gpu-18446744073709551616", 0, false},
		"other prefix":       {sdk, "hami-gpu-1", 0, false},
		"sdk name for hami":  {hami, "gpu-1", 0, false},
		"upper case":         {sdk, "GPU-1", 0, false},
		"prefix only":        {sdk, "gpu", 0, false},
		"trailing character": {sdk, "gpu-1a", 0, false},
		"unicode digit":      {sdk, "gpu-١", 0, false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			i, ok := tc.p.IndexOf(tc.name)
			if i != tc.index || ok != tc.ok {
				t.Fatalf("IndexOf(%q) = %d, %v; want %d, %v", tc.name, i, ok, tc.index, tc.ok)
			}
			if ok && tc.p.DeviceName(i) != tc.name {
				t.Fatalf("DeviceName(IndexOf(%q)) = %q", tc.name, tc.p.DeviceName(i))
			}
		})
	}
}

func TestDevicesSDK(t *testing.T) {
	t.Parallel()
	gpu := a100(0, "GPU-aaaaaaaa-0000-0000-0000-000000000000")
	got, err := dra.Devices([]annotation.Device{gpu}, dra.Options{
		Profile: dra.SDKProfile(),
		Extras:  map[string]dra.Extra{gpu.ID: {PCIBusID: "0000:07:00.0"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []resourcev1.Device{{
		Name: "gpu-0",
		Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
			"uuid":                            str(gpu.ID),
			"index":                           num(0),
			"numa":                            num(1),
			"type":                            str("NVIDIA-A100-SXM4-40GB"),
			"productName":                     str("A100-SXM4-40GB"),
			"mode":                            str("hami-core"),
			"resource.kubernetes.io/pciBusID": str("0000:07:00.0"),
		},
		Capacity: map[resourcev1.QualifiedName]resourcev1.DeviceCapacity{
			"memory": {Value: *q("40Gi"), RequestPolicy: &resourcev1.CapacityRequestPolicy{
				Default: q("40Gi"), ValidRange: &resourcev1.CapacityRequestPolicyRange{Min: q("1Mi"), Step: q("1Mi")},
			}},
			"cores": {Value: *q("100"), RequestPolicy: &resourcev1.CapacityRequestPolicy{
				Default: q("0"), ValidRange: &resourcev1.CapacityRequestPolicyRange{Min: q("0"), Max: q("100"), Step: q("1")},
			}},
			"shares": {Value: *q("10"), RequestPolicy: &resourcev1.CapacityRequestPolicy{
				Default: q("1"), ValidValues: []resource.Quantity{*q("1")},
			}},
		},
		AllowMultipleAllocations: yes(),
	}}
	if diff := cmp.Diff(want, got, quantityCmp); diff != "" {
		t.Errorf("devices (-want +got):\n%s", diff)
	}
}

func TestDevicesHAMi(t *testing.T) {
	t.Parallel()
	gpu := a100(3, "GPU-dddd")
	gpu.Type, gpu.Devcore, gpu.Health = "NVIDIA A10", 150, false
	got, err := dra.Devices([]annotation.Device{gpu}, dra.Options{
		Profile: dra.HAMiProfile(),
		Owned:   func(annotation.Device) bool { return false },
		Extras:  map[string]dra.Extra{gpu.ID: {PCIBusID: "0000:b7:00.0"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []resourcev1.Device{{
		Name: "hami-gpu-3",
		Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
			"type":                            str("hami-gpu"),
			"uuid":                            str("GPU-dddd"),
			"minor":                           num(3),
			"productName":                     str("NVIDIA A10"),
			"pcieBusID":                       str("0000:b7:00.0"),
			"resource.kubernetes.io/pciBusID": str("0000:b7:00.0"),
		},
		Capacity: map[resourcev1.QualifiedName]resourcev1.DeviceCapacity{
			"memory": {Value: *q("40Gi"), RequestPolicy: &resourcev1.CapacityRequestPolicy{
				Default: q("40Gi"), ValidRange: &resourcev1.CapacityRequestPolicyRange{Min: q("1Mi"), Step: q("1Mi")},
			}},
			"cores": {Value: *q("150"), RequestPolicy: &resourcev1.CapacityRequestPolicy{
				Default: q("100"), ValidRange: &resourcev1.CapacityRequestPolicyRange{Min: q("0"), Max: q("150"), Step: q("1")},
			}},
		},
		Taints: []resourcev1.DeviceTaint{
			{Key: "hami-core-gpu.project-hami.io/unhealthy", Effect: resourcev1.DeviceTaintEffectNoSchedule},
			{Key: "hami-core-gpu.project-hami.io/owned-by-hami", Effect: resourcev1.DeviceTaintEffectNoSchedule},
		},
		AllowMultipleAllocations: yes(),
	}}
	if diff := cmp.Diff(want, got, quantityCmp); diff != "" {
		t.Errorf("devices (-want +got):\n%s", diff)
	}
}

// summary is what TestDevices compares of a device.
type summary struct {
	Name, UUID   string
	Taints       []string
	CoresDefault int64
}

func summarize(devs []resourcev1.Device) []summary {
	var out []summary
	for _, d := range devs {
		s := summary{Name: d.Name, UUID: *d.Attributes["uuid"].StringValue}
		for _, t := range d.Taints {
			s.Taints = append(s.Taints, t.Key)
		}
		if c := d.Capacity[dra.CapacityCores]; c.RequestPolicy != nil {
			s.CoresDefault = c.RequestPolicy.Default.Value()
		}
		out = append(out, s)
	}
	return out
}

func TestDevices(t *testing.T) {
	t.Parallel()
	mig := a100(1, "GPU-mig")
	mig.Mode = "mig"
	sick := a100(2, "GPU-sick")
	sick.Health = false
	small := a100(0, "GPU-small")
	small.Devcore = 60
	tests := map[string]struct {
		devs  []annotation.Device
		opts  dra.Options
		want  []summary
		wantE string // a part of the error message; "" for no error
	}{
		"sorted by index": {
			devs: []annotation.Device{a100(10, "GPU-j"), a100(2, "GPU-c"), a100(0, "GPU-a")},
			opts: dra.Options{Profile: dra.SDKProfile()},
			want: []summary{{Name: "gpu-0", UUID: "GPU-a"}, {Name: "gpu-2", UUID: "GPU-c"}, {Name: "gpu-10", UUID: "GPU-j"}},
		},
		"MIG left out": {
			devs: []annotation.Device{a100(0, "GPU-a"), mig, a100(2, "GPU-c")},
			opts: dra.Options{Profile: dra.SDKProfile()},
			want: []summary{{Name: "gpu-0", UUID: "GPU-a"}, {Name: "gpu-2", UUID: "GPU-c"}},
		},
		"only MIG": {
			devs: []annotation.Device{mig},
			opts: dra.Options{Profile: dra.SDKProfile()},
		},
		"unhealthy stays, tainted": {
			devs: []annotation.Device{a100(0, "GPU-a"), sick},
			opts: dra.Options{Profile: dra.SDKProfile()},
			want: []summary{{Name: "gpu-0", UUID: "GPU-a"}, {Name: "gpu-2", UUID: "GPU-sick", Taints: []string{"gpu.hamireg.io/unhealthy"}}},
		},
		"owned by HAMi": {
			devs: []annotation.Device{a100(0, "GPU-a"), a100(1, "GPU-b")},
			opts: dra.Options{Profile: dra.SDKProfile(), Owned: func(d annotation.Device) bool { return d.ID == "GPU-b" }},
			want: []summary{{Name: "gpu-0", UUID: "GPU-a", Taints: []string{"gpu.hamireg.io/owned-by-hami"}}, {Name: "gpu-1", UUID: "GPU-b"}},
		},
		"HAMi cores default capped at devcore": {
			devs: []annotation.Device{small, a100(1, "GPU-b")},
			opts: dra.Options{Profile: dra.HAMiProfile()},
			want: []summary{{Name: "hami-gpu-0", UUID: "GPU-small", CoresDefault: 60}, {Name: "hami-gpu-1", UUID: "GPU-b", CoresDefault: 100}},
		},
		"64 GPUs": {
			devs: gpus(64),
			opts: dra.Options{Profile: dra.SDKProfile()},
			want: summarize(mustDevices(t, gpus(64))),
		},
		"none": {opts: dra.Options{Profile: dra.SDKProfile()}},

		"no profile":      {devs: []annotation.Device{a100(0, "GPU-a")}, wantE: "set Options.Profile"},
		"empty ID":        {devs: []annotation.Device{a100(0, "")}, opts: dra.Options{Profile: dra.SDKProfile()}, wantE: "empty ID"},
		"duplicate index": {devs: []annotation.Device{a100(1, "GPU-a"), a100(1, "GPU-b")}, opts: dra.Options{Profile: dra.SDKProfile()}, wantE: "both have index 1"},
		"duplicate ID":    {devs: []annotation.Device{a100(0, "GPU-a"), a100(1, "GPU-a")}, opts: dra.Options{Profile: dra.SDKProfile()}, wantE: "listed twice"},
		"65 GPUs":         {devs: gpus(65), opts: dra.Options{Profile: dra.SDKProfile()}, wantE: "at most 64"},
		"no memory":       {devs: []annotation.Device{withField(a100(0, "GPU-a"), "Devmem", 0)}, opts: dra.Options{Profile: dra.SDKProfile()}, wantE: "Devmem is 0"},
		"negative cores":  {devs: []annotation.Device{withField(a100(0, "GPU-a"), "Devcore", -1)}, opts: dra.Options{Profile: dra.HAMiProfile()}, wantE: "Devcore is -1"},
		"no count":        {devs: []annotation.Device{withField(a100(0, "GPU-a"), "Count", 0)}, opts: dra.Options{Profile: dra.SDKProfile()}, wantE: "Count is 0"},
		"long type": {
			devs: []annotation.Device{{ID: "GPU-a", Count: 1, Devmem: 1, Devcore: 1, Type: strings.Repeat("x", 65), Health: true}},
			opts: dra.Options{Profile: dra.SDKProfile()}, wantE: "longer than the API's 64",
		},
		"bad prefix": {
			devs: []annotation.Device{a100(0, "GPU-a")},
			opts: dra.Options{Profile: dra.Profile{Name: "x", Driver: "x.example", DevicePrefix: "GPU_"}}, wantE: "not a DNS label",
		},
		"bad driver": {
			devs: []annotation.Device{a100(0, "GPU-a")},
			opts: dra.Options{Profile: dra.Profile{Name: "x", Driver: "X/Y", DevicePrefix: "gpu-"}}, wantE: "not a DNS subdomain",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got, err := dra.Devices(tc.devs, tc.opts)
			if tc.wantE != "" {
				if !errors.Is(err, dra.ErrInvalidDevice) || !strings.Contains(err.Error(), tc.wantE) || got != nil {
					t.Fatalf("Devices = %d devices, %v; want an ErrInvalidDevice containing %q", len(got), err, tc.wantE)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, summarize(got)); diff != "" {
				t.Errorf("devices (-want +got):\n%s", diff)
			}
			if errs := validateDevices(got); len(errs) > 0 {
				t.Errorf("invalid for the API:\n%s", strings.Join(errs, "\n"))
			}
		})
	}
}

func gpus(n int) []annotation.Device {
	out := make([]annotation.Device, n)
	for i := range out {
		out[i] = a100(uint(i), fmt.Sprintf("GPU-%03d", i))
	}
	return out
}

func mustDevices(t *testing.T, devs []annotation.Device) []resourcev1.Device {
	t.Helper()
	out, err := dra.Devices(devs, dra.Options{Profile: dra.SDKProfile()})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func withField(d annotation.Device, field string, v int32) annotation.Device {
	switch field {
	case "Devmem":
		d.Devmem = v
	case "Devcore":
		d.Devcore = v
	case "Count":
		d.Count = v
	}
	return d
}

// edgeGPUs are devices at the edges of what the API accepts.
func edgeGPUs() []annotation.Device {
	return []annotation.Device{
		a100(0, "GPU-normal"),
		{ID: "GPU-tiny", Index: 1, Count: 1, Devmem: 1, Devcore: 1, Type: "NVIDIA-T", Mode: "mps", Health: true},
		{ID: "GPU-two", Index: 2, Count: 1, Devmem: 2, Devcore: 2, Type: "NVIDIA-T", Health: true},
		{ID: "GPU-dead", Index: 3, Count: 0, Devmem: 0, Devcore: 0, Health: false},
		{ID: "GPU-neg", Index: 4, Count: -3, Devmem: -1, Devcore: -100, Health: false},
		{ID: "GPU-scaled", Index: 5, Count: 100, Devmem: math.MaxInt32, Devcore: math.MaxInt32, Type: strings.Repeat("N", 64), Numa: -1, Health: true},
	}
}

// TestDevicesValid runs every device of both profiles through the API's rules.
func TestDevicesValid(t *testing.T) {
	t.Parallel()
	for _, p := range []dra.Profile{dra.SDKProfile(), dra.HAMiProfile()} {
		devs := edgeGPUs()
		extras := map[string]dra.Extra{}
		for _, d := range devs {
			extras[d.ID] = dra.Extra{PCIBusID: "0000:07:00.0"}
		}
		got, err := dra.Devices(devs, dra.Options{Profile: p, Extras: extras, Owned: func(d annotation.Device) bool { return d.Index%2 == 0 }})
		if err != nil {
			t.Fatalf("%s: %v", p.Name, err)
		}
		if len(got) != len(devs) {
			t.Fatalf("%s: %d devices of %d", p.Name, len(got), len(devs))
		}
		if errs := validateDevices(got); len(errs) > 0 {
			t.Errorf("%s: invalid for the API:\n%s", p.Name, strings.Join(errs, "\n"))
		}
	}
}

// TestValidatorCatches makes sure the API rules of validateDevices can fail.
func TestValidatorCatches(t *testing.T) {
	t.Parallel()
	good := mustDevices(t, []annotation.Device{a100(0, "GPU-a")})[0]
	tests := map[string]func(d *resourcev1.Device){
		"name":    func(d *resourcev1.Device) { d.Name = "GPU_0" },
		"default": func(d *resourcev1.Device) { d.Capacity["cores"].RequestPolicy.Default = q("101") },
		"step": func(d *resourcev1.Device) {
			d.Capacity["memory"] = resourcev1.DeviceCapacity{Value: *q("1Mi"), RequestPolicy: d.Capacity["memory"].RequestPolicy}
		},
		"valid value": func(d *resourcev1.Device) { d.Capacity["shares"].RequestPolicy.Default = q("2") },
		"taint":       func(d *resourcev1.Device) { d.Taints = []resourcev1.DeviceTaint{{Key: "a/b/c", Effect: "NoSchedule"}} },
		"attribute":   func(d *resourcev1.Device) { d.Attributes["bad-name"] = str("x") },
		"not shared":  func(d *resourcev1.Device) { d.AllowMultipleAllocations = nil },
	}
	for name, breakIt := range tests {
		d := good.DeepCopy()
		breakIt(d)
		if errs := validateDevices([]resourcev1.Device{*d}); len(errs) == 0 {
			t.Errorf("%s: validator accepts a broken device", name)
		}
	}
}

// TestDevicesJSON: what Devices returns survives the API server's JSON unchanged, so the
// resourceslice controller sees no difference between desired and stored devices.
func TestDevicesJSON(t *testing.T) {
	t.Parallel()
	for _, p := range []dra.Profile{dra.SDKProfile(), dra.HAMiProfile()} {
		devs := append(edgeGPUs(), a100(6, "GPU-x"))
		got, err := dra.Devices(devs, dra.Options{Profile: p, Extras: map[string]dra.Extra{"GPU-x": {PCIBusID: "0000:01:00.0"}},
			Owned: func(d annotation.Device) bool { return d.Index != 6 }})
		if err != nil {
			t.Fatal(err)
		}
		b, err := json.Marshal(got)
		if err != nil {
			t.Fatal(err)
		}
		var back []resourcev1.Device
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatal(err)
		}
		if !apiequality.Semantic.DeepEqual(got, back) {
			t.Errorf("%s: round trip changed the devices (-before +after):\n%s", p.Name, cmp.Diff(got, back, quantityCmp))
		}
		again, _ := json.Marshal(back)
		if string(again) != string(b) {
			t.Errorf("%s: JSON not stable:\n%s\n%s", p.Name, b, again)
		}
	}
}

func TestDevicesDoesNotModifyInput(t *testing.T) {
	t.Parallel()
	devs := []annotation.Device{a100(2, "GPU-c"), a100(0, "GPU-a")}
	if _, err := dra.Devices(devs, dra.Options{Profile: dra.SDKProfile()}); err != nil {
		t.Fatal(err)
	}
	if devs[0].ID != "GPU-c" {
		t.Errorf("Devices sorted its input")
	}
}

func TestDeviceClass(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		p    dra.Profile
		name string
		cel  string
	}{
		"sdk":  {dra.SDKProfile(), "gpu.hamireg.io", `device.driver == "gpu.hamireg.io" && !has(device.attributes["gpu.hamireg.io"].profile)`},
		"hami": {dra.HAMiProfile(), "hami-core-gpu.project-hami.io", `device.driver == "hami-core-gpu.project-hami.io" && device.attributes["hami-core-gpu.project-hami.io"].type == "hami-gpu"`},
	}
	for name, tc := range tests {
		c := dra.DeviceClass(tc.p)
		if c.Name != tc.name || c.APIVersion != "resource.k8s.io/v1" || c.Kind != "DeviceClass" {
			t.Errorf("%s: class %s %s/%s", name, c.Name, c.APIVersion, c.Kind)
		}
		if len(c.Spec.Selectors) != 1 || c.Spec.Selectors[0].CEL == nil || c.Spec.Selectors[0].CEL.Expression != tc.cel {
			t.Errorf("%s: selectors %+v, want CEL %s", name, c.Spec.Selectors, tc.cel)
		}
	}
}

func TestConsumedFromResult(t *testing.T) {
	t.Parallel()
	sdk, hami := dra.SDKProfile(), dra.HAMiProfile()
	mig := a100(5, "GPU-mig")
	mig.Mode = "mig"
	node := []annotation.Device{a100(0, "GPU-a"), {ID: "GPU-b", Index: 1, Count: 4, Devmem: 23028, Devcore: 80, Health: true}, mig}
	res := func(driver, device string, consumed map[resourcev1.QualifiedName]resource.Quantity) resourcev1.DeviceRequestAllocationResult {
		return resourcev1.DeviceRequestAllocationResult{Request: "gpu", Driver: driver, Pool: "node-1", Device: device, ConsumedCapacity: consumed}
	}
	caps := func(kv ...string) map[resourcev1.QualifiedName]resource.Quantity {
		m := map[resourcev1.QualifiedName]resource.Quantity{}
		for i := 0; i < len(kv); i += 2 {
			m[resourcev1.QualifiedName(kv[i])] = *q(kv[i+1])
		}
		return m
	}
	tests := map[string]struct {
		p     dra.Profile
		r     resourcev1.DeviceRequestAllocationResult
		want  dra.Consumed
		wantE string
	}{
		"10Gi 30 cores":          {sdk, res(sdk.Driver, "gpu-0", caps("memory", "10Gi", "cores", "30", "shares", "1")), dra.Consumed{Index: 0, MemoryMiB: 10240, Cores: 30}, ""},
		"HAMi webhook bytes":     {hami, res(hami.Driver, "hami-gpu-1", caps("memory", "3145728000", "cores", "100")), dra.Consumed{Index: 1, MemoryMiB: 3000, Cores: 100}, ""},
		"memory rounded up":      {sdk, res(sdk.Driver, "gpu-1", caps("memory", "1048577", "cores", "0")), dra.Consumed{Index: 1, MemoryMiB: 2}, ""},
		"fraction rounded up":    {sdk, res(sdk.Driver, "gpu-1", caps("memory", "0.5", "cores", "29.5")), dra.Consumed{Index: 1, MemoryMiB: 1, Cores: 30}, ""},
		"zero memory":            {sdk, res(sdk.Driver, "gpu-1", caps("memory", "0", "cores", "1")), dra.Consumed{Index: 1, Cores: 1}, ""},
		"largest":                {sdk, res(sdk.Driver, "gpu-0", caps("memory", "9223372036854775807", "cores", "9223372036854775807")), dra.Consumed{MemoryMiB: 1 << 43, Cores: math.MaxInt64}, ""},
		"whole GPU":              {sdk, res(sdk.Driver, "gpu-1", nil), dra.Consumed{Index: 1, MemoryMiB: 23028, Cores: 80}, ""},
		"whole GPU, HAMi":        {hami, res(hami.Driver, "hami-gpu-0", caps()), dra.Consumed{Index: 0, MemoryMiB: 40960, Cores: 100}, ""},
		"CoresDefault not added": {hami, res(hami.Driver, "hami-gpu-0", caps("memory", "1Gi", "cores", "0")), dra.Consumed{MemoryMiB: 1024}, ""},

		"other driver":       {sdk, res(hami.Driver, "gpu-0", caps("memory", "1Gi", "cores", "0")), dra.Consumed{}, "is not this profile's"},
		"other profile":      {hami, res(hami.Driver, "gpu-0", nil), dra.Consumed{}, "not a device name"},
		"unknown device":     {sdk, res(sdk.Driver, "gpu-01", nil), dra.Consumed{}, "not a device name"},
		"GPU not on node":    {sdk, res(sdk.Driver, "gpu-2", nil), dra.Consumed{}, "GPU 2 is not"},
		"MIG GPU":            {sdk, res(sdk.Driver, "gpu-5", nil), dra.Consumed{}, "GPU 5 is not"},
		"missing memory":     {sdk, res(sdk.Driver, "gpu-0", caps("cores", "30")), dra.Consumed{}, "no memory"},
		"missing cores":      {sdk, res(sdk.Driver, "gpu-0", caps("memory", "1Gi", "shares", "1")), dra.Consumed{}, "no cores"},
		"negative memory":    {sdk, res(sdk.Driver, "gpu-0", caps("memory", "-1Mi", "cores", "30")), dra.Consumed{}, "negative"},
		"negative cores":     {sdk, res(sdk.Driver, "gpu-0", caps("memory", "1Mi", "cores", "-1m")), dra.Consumed{}, "negative"},
		"memory beyond":      {sdk, res(sdk.Driver, "gpu-0", caps("memory", "9223372036854775808", "cores", "1")), dra.Consumed{}, "beyond int64"},
		"cores 1E":           {sdk, res(sdk.Driver, "gpu-0", caps("memory", "1", "cores", "1E")), dra.Consumed{MemoryMiB: 1, Cores: 1e18}, ""},
		"cores far beyond":   {sdk, res(sdk.Driver, "gpu-0", caps("memory", "1", "cores", "100E")), dra.Consumed{}, "beyond int64"},
		"qualified capnames": {sdk, res(sdk.Driver, "gpu-0", caps("gpu.hamireg.io/memory", "1Gi", "gpu.hamireg.io/cores", "1")), dra.Consumed{}, "no memory"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got, err := dra.ConsumedFromResult(tc.p, tc.r, node)
			if tc.wantE != "" {
				if !errors.Is(err, dra.ErrInvalidResult) || !strings.Contains(err.Error(), tc.wantE) {
					t.Fatalf("ConsumedFromResult = %+v, %v; want an ErrInvalidResult containing %q", got, err, tc.wantE)
				}
				if !strings.Contains(err.Error(), tc.r.Device) {
					t.Errorf("error %q does not name the device %s", err, tc.r.Device)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ConsumedFromResult = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

// TestNUMANodeAttribute: both profiles publish the standard resource.kubernetes.io/numaNode
// when the scan knows the node, none when it does not or the GPU has no NUMA affinity; the
// SDK profile keeps its own numa attribute either way.
func TestNUMANodeAttribute(t *testing.T) {
	t.Parallel()
	node := func(n int) *int { return &n }
	for name, tc := range map[string]struct {
		p        dra.Profile
		numa     *int
		want     *int64
		wantNuma bool // the SDK's own "numa" attribute
	}{
		"sdk, node 1":      {p: dra.SDKProfile(), numa: node(1), want: new(int64(1)), wantNuma: true},
		"sdk, node 0":      {p: dra.SDKProfile(), numa: node(0), want: new(int64(0)), wantNuma: true},
		"sdk, unknown":     {p: dra.SDKProfile(), wantNuma: true},
		"sdk, no affinity": {p: dra.SDKProfile(), numa: node(-1), wantNuma: true},
		"hami, node 3":     {p: dra.HAMiProfile(), numa: node(3), want: new(int64(3))},
		"hami, unknown":    {p: dra.HAMiProfile()},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			gpu := a100(0, "GPU-n")
			got, err := dra.Devices([]annotation.Device{gpu}, dra.Options{Profile: tc.p,
				Extras: map[string]dra.Extra{gpu.ID: {NUMANode: tc.numa}}})
			if err != nil {
				t.Fatal(err)
			}
			a, ok := got[0].Attributes[dra.AttributeNUMANode]
			switch {
			case tc.want == nil && ok:
				t.Errorf("%s = %+v, want none", dra.AttributeNUMANode, a)
			case tc.want != nil && (!ok || a.IntValue == nil || *a.IntValue != *tc.want):
				t.Errorf("%s = %+v (present %v), want int %d", dra.AttributeNUMANode, a, ok, *tc.want)
			}
			if _, ok := got[0].Attributes["numa"]; ok != tc.wantNuma {
				t.Errorf("numa attribute present = %v, want %v", ok, tc.wantNuma)
			}
		})
	}
}

package hamicore_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	gocmp "github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/hamicore"
)

func TestParseDeviceListStrategies(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		in      string
		want    hamicore.DeviceListStrategies
		wantErr string
	}{
		"empty is envvar":       {in: "", want: hamicore.DeviceListStrategies{EnvVar: true}},
		"envvar":                {in: "envvar", want: hamicore.DeviceListStrategies{EnvVar: true}},
		"volume-mounts":         {in: "volume-mounts", want: hamicore.DeviceListStrategies{VolumeMounts: true}},
		"cdi-annotations":       {in: "cdi-annotations", want: hamicore.DeviceListStrategies{CDIAnnotations: true}},
		"cdi-cri":               {in: "cdi-cri", want: hamicore.DeviceListStrategies{CDICRI: true}},
		"envvar and cdi-cri":    {in: "cdi-cri,envvar", want: hamicore.DeviceListStrategies{EnvVar: true, CDICRI: true}},
		"both CDI":              {in: "cdi-annotations,cdi-cri", want: hamicore.DeviceListStrategies{CDIAnnotations: true, CDICRI: true}},
		"repeat":                {in: "cdi-cri,cdi-cri", want: hamicore.DeviceListStrategies{CDICRI: true}},
		"unknown":               {in: "cdi", wantErr: `"cdi" is not one of envvar, volume-mounts, cdi-annotations, cdi-cri`},
		"empty element":         {in: "envvar,", wantErr: `"" is not one of envvar`},
		"space":                 {in: "envvar, cdi-cri", wantErr: `" cdi-cri" is not one of`},
		"case":                  {in: "CDI-CRI", wantErr: "is not one of"},
		"envvar, volume-mounts": {in: "volume-mounts,envvar", wantErr: "envvar and volume-mounts both set NVIDIA_VISIBLE_DEVICES"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got, err := hamicore.ParseDeviceListStrategies(tc.in)
			if tc.wantErr != "" {
				if !errors.Is(err, hamicore.ErrInvalidOptions) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ParseDeviceListStrategies(%q) = %v, %v; want an ErrInvalidOptions saying %q", tc.in, got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ParseDeviceListStrategies(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
			}
			if got.AllCDI() != (got.AnyCDI() && !got.EnvVar && !got.VolumeMounts) {
				t.Errorf("AllCDI %v, AnyCDI %v for %+v", got.AllCDI(), got.AnyCDI(), got)
			}
		})
	}
}

func TestEnvOptionsValidate(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		opts    hamicore.EnvOptions
		wantErr string
	}{
		"zero":                {},
		"all CDI, NVIDIA's":   {opts: hamicore.EnvOptions{DeviceListStrategy: "cdi-annotations,cdi-cri", CDIKind: "nvidia.com/gpu", CDIAnnotationPrefix: "nvidia.cdi.k8s.io/", GDS: true, MOFED: true}},
		"GDRCopy with envvar": {opts: hamicore.EnvOptions{DeviceListStrategy: "envvar,cdi-cri", GDRCopy: true}},
		"GDRCopy, CDI alone":  {opts: hamicore.EnvOptions{DeviceListStrategy: "cdi-cri", GDRCopy: true}, wantErr: "NVIDIA_GDRCOPY"},
		"unknown list":        {opts: hamicore.EnvOptions{DeviceListStrategy: "mounts"}, wantErr: "envvar, volume-mounts, cdi-annotations, cdi-cri"},
		"unknown ID strategy": {opts: hamicore.EnvOptions{DeviceIDStrategy: "serial"}, wantErr: "is not uuid or index"},
		"kind without class":  {opts: hamicore.EnvOptions{CDIKind: "nvidia.com"}, wantErr: "want <vendor>/<class>"},
		"kind bad vendor":     {opts: hamicore.EnvOptions{CDIKind: "1nvidia.com/gpu"}, wantErr: "vendor"},
		"prefix without /":    {opts: hamicore.EnvOptions{CDIAnnotationPrefix: "cdi.k8s.io"}, wantErr: "DNS subdomain followed by '/'"},
		"prefix not DNS":      {opts: hamicore.EnvOptions{CDIAnnotationPrefix: "CDI_/"}, wantErr: "DNS subdomain"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			err := tc.opts.Validate()
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, hamicore.ErrInvalidOptions) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Validate = %v, want an ErrInvalidOptions saying %q", err, tc.wantErr)
			}
		})
	}
}

func TestParseCDIName(t *testing.T) {
	t.Parallel()
	valid := map[string][3]string{
		"k8s.device-plugin.nvidia.com/gpu=GPU-0a1b2c3d-0000-1111-2222-333344445555": {"k8s.device-plugin.nvidia.com", "gpu", "GPU-0a1b2c3d-0000-1111-2222-333344445555"},
		"nvidia.com/gpu=0":     {"nvidia.com", "gpu", "0"},
		"nvidia.com/gpu=0:1":   {"nvidia.com", "gpu", "0:1"},
		"a/b=c":                {"a", "b", "c"},
		"v_1.x-y/c.l_a-ss=all": {"v_1.x-y", "c.l_a-ss", "all"},
	}
	for in, want := range valid {
		v, c, n, err := hamicore.ParseCDIName(in)
		if err != nil || [3]string{v, c, n} != want {
			t.Errorf("ParseCDIName(%q) = %q, %q, %q, %v; want %q", in, v, c, n, err, want)
		}
	}
	for _, in := range []string{"", "=", "/gpu=0", "nvidia.com=0", "nvidia.com/=0", "/=0", "nvidia.com/gpu=", "nvidia.com/gpu",
		"1nvidia.com/gpu=0", "nvidia.com-/gpu=0", "nvidia.com/gpu/x=0", "nvidia.com/gpu=GPU-a[1-2]", "nvidia.com/gpu=-0", "nvidia.com/gpu=0:",
		"nvidia.com/gpu=a=b", "nvidiä.com/gpu=0", "nvidia.com/gpu=0,1"} {
		if v, c, n, err := hamicore.ParseCDIName(in); err == nil {
			t.Errorf("ParseCDIName(%q) = %q, %q, %q; want an error", in, v, c, n)
		}
	}
}

func TestContainerResponseCDI(t *testing.T) {
	t.Parallel()
	const a, b = "GPU-0a1b2c3d-0000-1111-2222-333344445555", "GPU-1a1b2c3d-0000-1111-2222-333344445555"
	devs := allocation.ContainerDevices{{UUID: a, Usedmem: 3000, Usedcores: 30}, {UUID: b, Usedmem: 4000, Usedcores: 40}}
	gpus := []annotation.Device{{ID: a, Index: 3}, {ID: b, Index: 5}}
	c := hamicore.Container{PodUID: "uid", Name: "c0", CacheID: "9b2f0c4e-6a55-4d8e-8f2b-0c1d2e3f4a5b"}
	const key = "cdi.k8s.io/nvidia-device-plugin_9b2f0c4e-6a55-4d8e-8f2b-0c1d2e3f4a5b"
	names := []string{"k8s.device-plugin.nvidia.com/gpu=" + a, "k8s.device-plugin.nvidia.com/gpu=" + b}
	tests := map[string]struct {
		opts            hamicore.EnvOptions
		c               hamicore.Container
		wantAnnotations map[string]string
		wantCDI         []string
		wantVisible     string // "" for none
		wantEnv         map[string]string
	}{
		"cdi-annotations": {
			opts:            hamicore.EnvOptions{DeviceListStrategy: "cdi-annotations"},
			wantAnnotations: map[string]string{key: strings.Join(names, ",")},
		},
		"cdi-cri": {
			opts:    hamicore.EnvOptions{DeviceListStrategy: "cdi-cri"},
			wantCDI: names,
		},
		"envvar and both CDI, index": {
			opts:            hamicore.EnvOptions{DeviceListStrategy: "envvar,cdi-annotations,cdi-cri", DeviceIDStrategy: hamicore.DeviceIDIndex},
			wantAnnotations: map[string]string{key: "k8s.device-plugin.nvidia.com/gpu=3,k8s.device-plugin.nvidia.com/gpu=5"},
			wantCDI:         []string{"k8s.device-plugin.nvidia.com/gpu=3", "k8s.device-plugin.nvidia.com/gpu=5"},
			wantVisible:     "3,5",
		},
		"GDS and MOFED as CDI devices, no variables with CDI alone": {
			opts:    hamicore.EnvOptions{DeviceListStrategy: "cdi-cri", GDS: true, MOFED: true},
			wantCDI: append(names[:2:2], "k8s.device-plugin.nvidia.com/gds=all", "k8s.device-plugin.nvidia.com/mofed=all"),
		},
		"GDS beside envvar: variable and CDI device": {
			opts:        hamicore.EnvOptions{DeviceListStrategy: "cdi-cri,envvar", GDS: true},
			wantCDI:     append(names[:2:2], "k8s.device-plugin.nvidia.com/gds=all"),
			wantVisible: a + "," + b,
			wantEnv:     map[string]string{"NVIDIA_GDS": "enabled"},
		},
		"custom kind, prefix and response ID": {
			opts:            hamicore.EnvOptions{DeviceListStrategy: "cdi-annotations", CDIKind: "nvidia.com/gpu", CDIAnnotationPrefix: "nvidia.cdi.k8s.io/"},
			c:               hamicore.Container{PodUID: "uid", Name: "c0", CacheID: "cache", ResponseID: "resp/1"},
			wantAnnotations: map[string]string{"nvidia.cdi.k8s.io/nvidia-device-plugin_resp_1": "nvidia.com/gpu=" + a + ",nvidia.com/gpu=" + b},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctr := c
			if tc.c.Name != "" {
				ctr = tc.c
			}
			r, err := hamicore.ContainerResponse(devs, ctr, gpus, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			if diff := gocmp.Diff(tc.wantAnnotations, r.Annotations); diff != "" {
				t.Errorf("annotations (-want +got):\n%s", diff)
			}
			if diff := gocmp.Diff(tc.wantCDI, r.CDIDevices); diff != "" {
				t.Errorf("CDI devices (-want +got):\n%s", diff)
			}
			if got, ok := r.Envs["NVIDIA_VISIBLE_DEVICES"]; got != tc.wantVisible || ok != (tc.wantVisible != "") {
				t.Errorf("NVIDIA_VISIBLE_DEVICES = %q (%v), want %q", got, ok, tc.wantVisible)
			}
			for k, v := range tc.wantEnv {
				if r.Envs[k] != v {
					t.Errorf("%s = %q, want %q", k, r.Envs[k], v)
				}
			}
			if _, ok := tc.wantEnv["NVIDIA_GDS"]; !ok && r.Envs["NVIDIA_GDS"] != "" {
				t.Errorf("NVIDIA_GDS = %q with CDI strategies alone", r.Envs["NVIDIA_GDS"])
			}
			// HAMi-core's limits and mounts under every strategy.
			if r.Envs["CUDA_DEVICE_MEMORY_LIMIT_1"] != "4000m" || r.Envs["CUDA_DEVICE_SM_LIMIT"] != "30" || len(r.Mounts) != 4 || r.StateDir == "" {
				t.Errorf("HAMi-core edits missing: %+v", r)
			}
			for k := range r.Annotations {
				if errs := validation.IsQualifiedName(k); len(errs) > 0 {
					t.Errorf("annotation key %q: %v", k, errs)
				}
			}
		})
	}
}

func TestContainerResponseCDIRefusals(t *testing.T) {
	t.Parallel()
	cdi := hamicore.EnvOptions{DeviceListStrategy: "cdi-cri"}
	c := hamicore.Container{PodUID: "uid", Name: "c0", CacheID: "cache"}
	migGPU := []annotation.Device{{ID: "GPU-m", Mode: allocation.ModeMIG}}
	if _, err := hamicore.ContainerResponse(allocation.ContainerDevices{{UUID: "GPU-m"}}, c, migGPU, cdi); !errors.Is(err, hamicore.ErrCDIUnsupported) {
		t.Errorf("MIG entry with cdi-cri: %v, want ErrCDIUnsupported", err)
	}
	if _, err := hamicore.MIGResponse([]string{"MIG-5a5a0000-0001-0000-1111-abcdef000001"}, cdi); !errors.Is(err, hamicore.ErrCDIUnsupported) {
		t.Errorf("MIGResponse with cdi-cri: %v, want ErrCDIUnsupported", err)
	}
	if _, err := hamicore.ClaimResponse("claim", []hamicore.ClaimDevice{{UUID: "GPU-a"}}, cdi); !errors.Is(err, hamicore.ErrCDIUnsupported) {
		t.Errorf("ClaimResponse with cdi-cri: %v, want ErrCDIUnsupported", err)
	}
	if _, err := hamicore.ContainerResponse(allocation.ContainerDevices{{UUID: "GPU-a[1-2]"}}, c, nil, cdi); err == nil || !strings.Contains(err.Error(), "no CDI device name") {
		t.Errorf("ID that is no CDI name: %v", err)
	}
	if _, err := hamicore.ContainerResponse(allocation.ContainerDevices{{UUID: "GPU-a"}}, hamicore.Container{Name: "c0"}, nil, hamicore.EnvOptions{DeviceListStrategy: "cdi-annotations"}); err == nil || !strings.Contains(err.Error(), "response ID") {
		t.Errorf("cdi-annotations without a response ID: %v", err)
	}
	long := hamicore.Container{Name: "c0", ResponseID: strings.Repeat("x", 50)}
	if _, err := hamicore.ContainerResponse(allocation.ContainerDevices{{UUID: "GPU-a"}}, long, nil, hamicore.EnvOptions{DeviceListStrategy: "cdi-annotations"}); err == nil || !strings.Contains(err.Error(), "longer than 63") {
		t.Errorf("key name over 63 bytes: %v", err)
	}
	for _, opts := range []hamicore.EnvOptions{{DeviceListStrategy: "bogus"}, {DeviceIDStrategy: "serial"}} {
		if _, err := hamicore.ContainerResponse(allocation.ContainerDevices{{UUID: "GPU-a"}}, c, nil, opts); !errors.Is(err, hamicore.ErrInvalidOptions) {
			t.Errorf("options %+v: %v, want ErrInvalidOptions", opts, err)
		}
	}
}

// FuzzParseDeviceListStrategies: the parser never panics, every error is ErrInvalidOptions,
// and what it accepts reads back the same from its String.
func FuzzParseDeviceListStrategies(f *testing.F) {
	for _, s := range []string{"", "envvar", "volume-mounts", "cdi-annotations,cdi-cri", "envvar,volume-mounts", "envvar,,", "cdi-cri,cdi-cri,envvar", "\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := hamicore.ParseDeviceListStrategies(s)
		if err != nil {
			if !errors.Is(err, hamicore.ErrInvalidOptions) {
				t.Fatalf("error %v is not ErrInvalidOptions", err)
			}
			return
		}
		if got == (hamicore.DeviceListStrategies{}) || (got.EnvVar && got.VolumeMounts) {
			t.Fatalf("%q accepted as %+v", s, got)
		}
		back, err := hamicore.ParseDeviceListStrategies(got.String())
		if err != nil || back != got {
			t.Fatalf("%q: %+v reads back from %q as %+v, %v", s, got, got.String(), back, err)
		}
	})
}

// FuzzParseCDIName: the parser never panics, and a name it accepts is its parts joined back,
// each part made of the characters the CDI specification allows.
func FuzzParseCDIName(f *testing.F) {
	for _, s := range []string{"k8s.device-plugin.nvidia.com/gpu=GPU-0a1b", "a/b=c", "/a=b", "a/b/c=d", "a/b=c=d", "nvidia.com/gpu=0:1", "x/y=", "é/b=c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, c, n, err := hamicore.ParseCDIName(s)
		if err != nil {
			return
		}
		if v+"/"+c+"="+n != s {
			t.Fatalf("%q parsed as %q, %q, %q", s, v, c, n)
		}
		if strings.ContainsAny(v+c, "/=:") || strings.ContainsAny(n, "/=,") {
			t.Fatalf("%q: a part holds a separator: %q, %q, %q", s, v, c, n)
		}
		for _, r := range s {
			if r > 127 {
				t.Fatalf("%q accepted with a non-ASCII character", s)
			}
		}
	})
}

// FuzzContainerResponseCDI builds CDI answers for random device IDs, response IDs, kinds and
// prefixes: ContainerResponse never panics, and what it answers is well formed: every CDI
// device a valid CDI name, every annotation key a valid Kubernetes annotation key whose value
// lists the same devices.
func FuzzContainerResponseCDI(f *testing.F) {
	f.Add("GPU-0a1b2c3d-0000-1111-2222-333344445555", "GPU-b", "9b2f0c4e-6a55-4d8e-8f2b-0c1d2e3f4a5b", "", "", uint8(3))
	f.Add("GPU-a[1-2]", "x,y", "a/b", "nvidia.com/gpu", "nvidia.cdi.k8s.io/", uint8(1))
	f.Add("0", "1", "-", "a/b", "x/", uint8(2))
	f.Fuzz(func(t *testing.T, id1, id2, responseID, kind, prefix string, strategy uint8) {
		opts := hamicore.EnvOptions{CDIKind: kind, CDIAnnotationPrefix: prefix, GDS: strategy&4 != 0, MOFED: strategy&8 != 0}
		switch strategy & 3 {
		case 0:
			opts.DeviceListStrategy = "cdi-annotations"
		case 1:
			opts.DeviceListStrategy = "cdi-cri"
		case 2:
			opts.DeviceListStrategy = "envvar,cdi-annotations,cdi-cri"
		default:
			opts.DeviceListStrategy = "cdi-annotations,cdi-cri"
		}
		devs := allocation.ContainerDevices{{UUID: id1}, {UUID: id2}}
		r, err := hamicore.ContainerResponse(devs, hamicore.Container{PodUID: "uid", Name: "c0", CacheID: "cache", ResponseID: responseID}, nil, opts)
		if err != nil {
			return
		}
		for _, name := range r.CDIDevices {
			if _, _, _, err := hamicore.ParseCDIName(name); err != nil {
				t.Fatalf("CDI device %q: %v", name, err)
			}
		}
		for k, v := range r.Annotations {
			if errs := validation.IsQualifiedName(k); len(errs) > 0 {
				t.Fatalf("annotation key %q: %v", k, errs)
			}
			for name := range strings.SplitSeq(v, ",") {
				if _, _, _, err := hamicore.ParseCDIName(name); err != nil {
					t.Fatalf("annotation %q lists %q: %v", k, name, err)
				}
			}
			if len(r.CDIDevices) > 0 && v != strings.Join(r.CDIDevices, ",") {
				t.Fatalf("annotation %q and CDIDevices %q differ", v, r.CDIDevices)
			}
		}
	})
}

// The answer for a container on two GPUs with the cdi-cri strategy: their CDI devices
// instead of NVIDIA_VISIBLE_DEVICES, and HAMi-core's limits as with any strategy.
func ExampleContainerResponse_cdi() {
	devs := allocation.ContainerDevices{{UUID: "GPU-a", Usedmem: 3000, Usedcores: 30}, {UUID: "GPU-b", Usedmem: 4000, Usedcores: 30}}
	c := hamicore.Container{PodUID: "uid", Name: "c0", CacheID: "9b2f0c4e-6a55-4d8e-8f2b-0c1d2e3f4a5b"}
	r, err := hamicore.ContainerResponse(devs, c, nil, hamicore.EnvOptions{DeviceListStrategy: hamicore.DeviceListCDICRI})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(r.CDIDevices)
	fmt.Println(r.Envs["NVIDIA_VISIBLE_DEVICES"] == "", r.Envs["CUDA_DEVICE_MEMORY_LIMIT_1"])
	// Output:
	// [k8s.device-plugin.nvidia.com/gpu=GPU-a k8s.device-plugin.nvidia.com/gpu=GPU-b]
	// true 4000m
}

// Package cdi_test checks the SDK's CDI device names and annotations (package hamicore's
// cdi-annotations and cdi-cri device list strategies) with the CDI project's own parser and
// annotation helpers, which container runtimes use: a name or key the SDK writes is one
// containerd and CRI-O accept, and the SDK's own name check agrees with the CDI parser.
package cdi_test

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/hamicore"
)

// TestContainerResponseWithCDIParser builds CDI answers under every strategy set with CDI,
// both device ID strategies and both kinds, and reads them back with the CDI project's
// parser: every CDI device is a qualified name of the kind, the annotation key is the one
// cdi.AnnotationKey gives, and cdi.ParseAnnotations reads the devices of Response.CDIDevices.
func TestContainerResponseWithCDIParser(t *testing.T) {
	t.Parallel()
	const a, b = "GPU-0a1b2c3d-0000-1111-2222-333344445555", "GPU-1a1b2c3d-0000-1111-2222-333344445555"
	devs := allocation.ContainerDevices{{UUID: a, Usedmem: 3000, Usedcores: 30}, {UUID: b, Usedmem: 4000, Usedcores: 40}, {UUID: a, Usedmem: 1, Usedcores: 1}}
	gpus := []annotation.Device{{ID: a, Index: 0}, {ID: b, Index: 7}}
	const responseID = "9b2f0c4e-6a55-4d8e-8f2b-0c1d2e3f4a5b"
	c := hamicore.Container{PodUID: "uid", Name: "c0", CacheID: "cache", ResponseID: responseID}
	n := 0
	for _, strategy := range []string{"cdi-annotations,cdi-cri", "envvar,cdi-annotations,cdi-cri", "volume-mounts,cdi-annotations,cdi-cri"} {
		for _, idStrategy := range []string{hamicore.DeviceIDUUID, hamicore.DeviceIDIndex} {
			for _, kind := range []string{"", "nvidia.com/gpu"} {
				for _, extra := range []bool{false, true} {
					opts := hamicore.EnvOptions{DeviceListStrategy: strategy, DeviceIDStrategy: idStrategy, CDIKind: kind, GDS: extra, MOFED: extra}
					r, err := hamicore.ContainerResponse(devs, c, gpus, opts)
					if err != nil {
						t.Fatalf("%+v: %v", opts, err)
					}
					n++
					wantKind := kind
					if wantKind == "" {
						wantKind = hamicore.DefaultCDIKind
					}
					wantVendor, _ := parser.ParseQualifier(wantKind)
					gpuDevices := 0
					for _, name := range r.CDIDevices {
						vendor, class, dev, err := parser.ParseQualifiedName(name)
						if err != nil {
							t.Fatalf("%+v: CDI device %q: %v", opts, name, err)
						}
						if vendor != wantVendor {
							t.Errorf("%+v: CDI device %q of vendor %q, want %q", opts, name, vendor, wantVendor)
						}
						if vendor+"/"+class == wantKind {
							gpuDevices++
							want := []string{a, b}
							if idStrategy == hamicore.DeviceIDIndex {
								want = []string{"0", "7"}
							}
							if !slices.Contains(want, dev) {
								t.Errorf("%+v: CDI device %q names %q, want one of %q", opts, name, dev, want)
							}
						} else if dev != "all" || (class != "gds" && class != "mofed") {
							t.Errorf("%+v: unexpected CDI device %q", opts, name)
						}
					}
					if gpuDevices != 2 {
						t.Errorf("%+v: %d GPU CDI devices in %q, want 2 (one per GPU)", opts, gpuDevices, r.CDIDevices)
					}
					wantKey, err := cdi.AnnotationKey(hamicore.CDIAnnotationPlugin, responseID)
					if err != nil {
						t.Fatal(err)
					}
					if keys := slices.Collect(maps.Keys(r.Annotations)); len(keys) != 1 || keys[0] != wantKey {
						t.Errorf("%+v: annotation keys %q, want [%s]", opts, keys, wantKey)
					}
					value, err := cdi.AnnotationValue(r.CDIDevices)
					if err != nil || r.Annotations[wantKey] != value {
						t.Errorf("%+v: annotation value %q, cdi.AnnotationValue %q, %v", opts, r.Annotations[wantKey], value, err)
					}
					keys, parsed, err := cdi.ParseAnnotations(r.Annotations)
					if err != nil || len(keys) != 1 || !slices.Equal(parsed, r.CDIDevices) {
						t.Errorf("%+v: cdi.ParseAnnotations = %q, %q, %v; want the CDI devices %q", opts, keys, parsed, err, r.CDIDevices)
					}
				}
			}
		}
	}
	t.Logf("checked %d CDI answers with the CDI project's parser", n)
}

// A custom annotation prefix replaces the CDI project's prefix and keeps the rest of its key,
// as HAMi's plugin does.
func TestAnnotationPrefixWithCDIParser(t *testing.T) {
	t.Parallel()
	c := hamicore.Container{Name: "c0", CacheID: "7c1e"}
	r, err := hamicore.ContainerResponse(allocation.ContainerDevices{{UUID: "GPU-a"}}, c, nil,
		hamicore.EnvOptions{DeviceListStrategy: "cdi-annotations", CDIAnnotationPrefix: "nvidia.cdi.k8s.io/"})
	if err != nil {
		t.Fatal(err)
	}
	key, err := cdi.AnnotationKey(hamicore.CDIAnnotationPlugin, "7c1e")
	if err != nil {
		t.Fatal(err)
	}
	want := "nvidia.cdi.k8s.io/" + strings.TrimPrefix(key, cdi.AnnotationPrefix)
	if r.Annotations[want] != hamicore.DefaultCDIKind+"=GPU-a" || len(r.Annotations) != 1 {
		t.Errorf("annotations %v, want %s", r.Annotations, want)
	}
}

// FuzzParseCDIName compares hamicore.ParseCDIName with the CDI project's
// parser.ParseQualifiedName: both accept the same names and split them the same way. The CDI
// parser panics on a one-byte vendor or class (it slices name[1:0]); such inputs are compared
// with the rule the CDI parser states for longer names (start with a letter).
func FuzzParseCDIName(f *testing.F) {
	for _, s := range []string{"k8s.device-plugin.nvidia.com/gpu=GPU-0a1b", "nvidia.com/gpu=0:1", "a/b=c", "ab/cd=e", "/a=b", "a/b/c=d",
		"ab/cd=e=f", "x/y=", "é/b=c", "ab-/cd=e", "ab/cd=-e", "ab/cd=e:", "1b/cd=e", "ab/c_d=e.f"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, c, n, err := hamicore.ParseCDIName(s)
		cv, cc, cn, cerr, panicked := cdiParse(s)
		if panicked {
			if err == nil && (len(v) != 1 && len(c) != 1) {
				t.Fatalf("the CDI parser panics on %q, which hamicore accepts with vendor %q and class %q", s, v, c)
			}
			return
		}
		if (err == nil) != (cerr == nil) {
			t.Fatalf("%q: hamicore %v, CDI parser %v", s, err, cerr)
		}
		if err == nil && (v != cv || c != cc || n != cn) {
			t.Fatalf("%q: hamicore %q %q %q, CDI parser %q %q %q", s, v, c, n, cv, cc, cn)
		}
	})
}

// cdiParse is parser.ParseQualifiedName, with its panic recovered.
func cdiParse(s string) (vendor, class, name string, err error, panicked bool) {
	defer func() {
		if recover() != nil {
			panicked = true
		}
	}()
	vendor, class, name, err = parser.ParseQualifiedName(s)
	return vendor, class, name, err, false
}

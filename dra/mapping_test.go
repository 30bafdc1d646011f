package dra_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hamireg/hamireg/dra"
)

func TestDeviceClassWith(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		name    corev1.ResourceName
		wantErr bool
	}{
		"none":                {name: ""},
		"nvidia.com/gpu":      {name: "nvidia.com/gpu"},
		"vendor sub-domain":   {name: "gpu.example.com/a100"},
		"no domain":           {name: "gpu", wantErr: true},
		"kubernetes.io":       {name: "kubernetes.io/gpu", wantErr: true},
		"sub.kubernetes.io":   {name: "deviceclass.resource.kubernetes.io/gpu.hamireg.io", wantErr: true},
		"requests prefix":     {name: "requests.nvidia.com/gpu", wantErr: true},
		"not a qualified one": {name: "nvidia.com/gpu/0", wantErr: true},
		"space":               {name: "nvidia.com/g pu", wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			for _, p := range []dra.Profile{dra.SDKProfile(), dra.HAMiProfile()} {
				c, err := dra.DeviceClassWith(p, dra.DeviceClassOptions{ExtendedResourceName: tc.name})
				if tc.wantErr {
					if !errors.Is(err, dra.ErrInvalidClass) || !strings.Contains(err.Error(), string(tc.name)) {
						t.Errorf("%s: err %v, want ErrInvalidClass naming %q", p.Name, err, tc.name)
					}
					continue
				}
				if err != nil {
					t.Fatalf("%s: %v", p.Name, err)
				}
				plain := dra.DeviceClass(p)
				if c.Name != plain.Name || c.Spec.Selectors[0].CEL.Expression != plain.Spec.Selectors[0].CEL.Expression {
					t.Errorf("%s: class %s differs from DeviceClass's beyond the mapping", p.Name, c.Name)
				}
				got := ""
				if c.Spec.ExtendedResourceName != nil {
					got = *c.Spec.ExtendedResourceName
				}
				if got != string(tc.name) {
					t.Errorf("%s: extendedResourceName %q, want %q", p.Name, got, tc.name)
				}
			}
		})
	}
}

// class is a DeviceClass created at second sec, mapping ext (none when empty).
func class(name, ext string, sec int64) *resourcev1.DeviceClass {
	c := &resourcev1.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(time.Unix(sec, 0))}}
	if ext != "" {
		c.Spec.ExtendedResourceName = &ext
	}
	return c
}

func TestMappingClass(t *testing.T) {
	t.Parallel()
	sdk := class("gpu.hamireg.io", "nvidia.com/gpu", 10)
	hami := class("hami-core-gpu.project-hami.io", "", 5)
	newer := class("z-newer", "nvidia.com/gpu", 20)
	tieA, tieB := class("a-tie", "nvidia.com/gpu", 20), class("b-tie", "nvidia.com/gpu", 20)
	tests := map[string]struct {
		name    corev1.ResourceName
		classes []*resourcev1.DeviceClass
		want    string // class name; "" for none
	}{
		"explicit":              {"nvidia.com/gpu", []*resourcev1.DeviceClass{hami, sdk}, "gpu.hamireg.io"},
		"no class maps it":      {"nvidia.com/gpu", []*resourcev1.DeviceClass{hami}, ""},
		"another name":          {"nvidia.com/gpumem", []*resourcev1.DeviceClass{sdk}, ""},
		"newest wins":           {"nvidia.com/gpu", []*resourcev1.DeviceClass{newer, sdk}, "z-newer"},
		"tie: smaller name":     {"nvidia.com/gpu", []*resourcev1.DeviceClass{tieB, sdk, tieA}, "a-tie"},
		"implicit":              {"deviceclass.resource.kubernetes.io/hami-core-gpu.project-hami.io", []*resourcev1.DeviceClass{sdk, hami}, "hami-core-gpu.project-hami.io"},
		"implicit of no class":  {"deviceclass.resource.kubernetes.io/other", []*resourcev1.DeviceClass{sdk, hami}, ""},
		"nil entries":           {"nvidia.com/gpu", []*resourcev1.DeviceClass{nil, sdk, nil}, "gpu.hamireg.io"},
		"no classes":            {"nvidia.com/gpu", nil, ""},
		"implicit, nil entries": {"deviceclass.resource.kubernetes.io/gpu.hamireg.io", []*resourcev1.DeviceClass{nil, sdk}, "gpu.hamireg.io"},
	}
	for name, tc := range tests {
		got := ""
		if c := dra.MappingClass(tc.name, tc.classes); c != nil {
			got = c.Name
		}
		if got != tc.want {
			t.Errorf("%s: class %q, want %q", name, got, tc.want)
		}
	}
}

func TestServedThroughDRA(t *testing.T) {
	t.Parallel()
	mapped := []*resourcev1.DeviceClass{class("gpu.hamireg.io", "nvidia.com/gpu", 1)}
	list := func(kv ...string) corev1.ResourceList {
		l := corev1.ResourceList{}
		for i := 0; i+1 < len(kv); i += 2 {
			l[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
		}
		return l
	}
	tests := map[string]struct {
		allocatable corev1.ResourceList
		classes     []*resourcev1.DeviceClass
		want        bool
	}{
		"all GPUs DRA's: count 0":        {list("cpu", "64", "nvidia.com/gpu", "0"), mapped, true},
		"no device plugin: absent":       {list("cpu", "64"), mapped, true},
		"nil allocatable":                {nil, mapped, true},
		"device-plugin node":             {list("nvidia.com/gpu", "10"), mapped, false},
		"one GPU left to device plugin":  {list("nvidia.com/gpu", "1"), mapped, false},
		"no mapping, count 0":            {list("nvidia.com/gpu", "0"), nil, false},
		"no mapping, absent":             {list("cpu", "64"), []*resourcev1.DeviceClass{class("gpu.hamireg.io", "", 1)}, false},
		"mapping of another name, count": {list("nvidia.com/gpu", "0"), []*resourcev1.DeviceClass{class("x", "example.com/npu", 1)}, false},
	}
	for name, tc := range tests {
		if got := dra.ServedThroughDRA("nvidia.com/gpu", tc.allocatable, tc.classes); got != tc.want {
			t.Errorf("%s: %t, want %t", name, got, tc.want)
		}
	}
}

// FuzzDeviceClassWith: any name either maps (and is written verbatim) or fails with
// ErrInvalidClass; nothing panics.
func FuzzDeviceClassWith(f *testing.F) {
	for _, s := range []string{"nvidia.com/gpu", "", "gpu", "kubernetes.io/x", "requests.a/b", "a/b/c", "x.kubernetes.io/y", "a.b/" + strings.Repeat("c", 70)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		c, err := dra.DeviceClassWith(dra.SDKProfile(), dra.DeviceClassOptions{ExtendedResourceName: corev1.ResourceName(name)})
		if err != nil {
			if !errors.Is(err, dra.ErrInvalidClass) {
				t.Fatalf("error %v is not ErrInvalidClass", err)
			}
			return
		}
		if name == "" {
			if c.Spec.ExtendedResourceName != nil {
				t.Fatal("a mapping without a name")
			}
			return
		}
		if c.Spec.ExtendedResourceName == nil || *c.Spec.ExtendedResourceName != name {
			t.Fatalf("mapping %v, want %q", c.Spec.ExtendedResourceName, name)
		}
		if !strings.Contains(name, "/") {
			t.Fatalf("accepted %q without a domain", name)
		}
	})
}

// mappingClass is the SDK profile's class mapping nvidia.com/gpu (docs/dra.md).
func mappingClass() (*resourcev1.DeviceClass, error) {
	// snippet: README
	class, err := dra.DeviceClassWith(dra.SDKProfile(), dra.DeviceClassOptions{
		ExtendedResourceName: "nvidia.com/gpu", // nvidia.com/gpu: N is N whole GPUs on DRA nodes
	})
	if err != nil {
		return nil, err // dra.ErrInvalidClass: not an extended resource name
	}
	// end snippet
	return class, nil
}

// The SDK profile's class mapping nvidia.com/gpu, and where kube-scheduler serves that name
// through it.
func ExampleDeviceClassWith() {
	c, err := mappingClass()
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(c.Name, *c.Spec.ExtendedResourceName)
	classes := []*resourcev1.DeviceClass{c}
	for _, n := range []struct {
		name        string
		allocatable corev1.ResourceList
	}{
		{"device-plugin node", corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("80")}},
		{"DRA node (every GPU DRA's)", corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("0")}},
	} {
		node := &corev1.Node{Status: corev1.NodeStatus{Allocatable: n.allocatable}}
		// snippet: README
		// true where the node's allocatable has no nvidia.com/gpu: kube-scheduler writes the claim
		viaDRA := dra.ServedThroughDRA("nvidia.com/gpu", node.Status.Allocatable, classes)
		// end snippet
		fmt.Printf("%s: through DRA %t\n", n.name, viaDRA)
	}
	// Output:
	// gpu.hamireg.io nvidia.com/gpu
	// device-plugin node: through DRA false
	// DRA node (every GPU DRA's): through DRA true
}

package nodeagent_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/hamicore"
	"github.com/hamireg/hamireg/kubeletplugin"
	"github.com/hamireg/hamireg/mig"
	"github.com/hamireg/hamireg/nodeagent"
)

// npuSource is a vendor's Source whose Allocate has a pointer receiver: a value of it is a
// Source but not an Allocator.
type npuSource struct{ devs []annotation.Device }

func (s npuSource) Devices(context.Context) ([]annotation.Device, []error, error) {
	return s.devs, nil, nil
}
func (npuSource) Changed() <-chan struct{} { return nil }

func (*npuSource) Allocate(context.Context, nodeagent.ContainerRequest) (allocation.Response, error) {
	return allocation.Response{}, nil
}

// plainSource is a vendor's Source without Allocate.
type plainSource struct{ devs []annotation.Device }

func (s plainSource) Devices(context.Context) ([]annotation.Device, []error, error) {
	return s.devs, nil, nil
}
func (plainSource) Changed() <-chan struct{} { return nil }

// noMIG is a MIGInstances that has none.
type noMIG struct{}

func (noMIG) Instances(context.Context) ([]mig.Instance, error) { return nil, nil }
func (noMIG) Create(context.Context, string, string, mig.Placement) (mig.Instance, error) {
	return mig.Instance{}, errors.New("no MIG")
}
func (noMIG) Destroy(context.Context, mig.Instance) error { return nil }

// noDRA is a DRA world that owns nothing.
type noDRA struct{}

func (noDRA) Owns(annotation.Device) bool { return false }
func (noDRA) SetDevices(context.Context, []annotation.Device, map[string]string) error {
	return nil
}
func (noDRA) PreparedGPUs() map[string][]types.UID { return nil }
func (noDRA) Run(ctx context.Context, _ nodeagent.DRAHost) error {
	<-ctx.Done()
	return nil
}

// TestNewRefusesWhatItCannotDo: a vendor other than NVIDIA without an Allocator (HAMi-core's
// NVIDIA answer would be a silent wrong one), or with MIG, DRA or topology scores, which serve
// NVIDIA only, fails New with ErrInvalidOptions and a message that names the fix.
func TestNewRefusesWhatItCannotDo(t *testing.T) {
	t.Parallel()
	acme := annotation.Vendor{Name: "ACME", RegisterKey: "hami.io/node-acme-register", ToAllocateKey: "hami.io/acme-devices-to-allocate",
		AllocatedKey: "hami.io/acme-devices-allocated", ResourceName: "acme.com/npu", Format: annotation.FormatJSON}
	npus := npuSource{devs: []annotation.Device{{ID: "npu-0", Count: 1, Health: true}}}
	own := nodeagent.AllocatorFunc(func(context.Context, nodeagent.ContainerRequest) (allocation.Response, error) {
		return allocation.Response{}, nil
	})
	for name, tc := range map[string]struct {
		src  nodeagent.Source
		opts nodeagent.Options
		want []string // nil: accepted
	}{
		"no allocator": {src: plainSource(npus), opts: nodeagent.Options{Vendor: acme},
			want: []string{`vendor "ACME" needs an Allocator`, "nodeagent_test.plainSource", "Allocate(context.Context, nodeagent.ContainerRequest) (allocation.Response, error)", "set Options.Allocator"}},
		"pointer receiver": {src: npus, opts: nodeagent.Options{Vendor: acme},
			want: []string{"nodeagent_test.npuSource has no method Allocate", "pass &nodeagent_test.npuSource instead of nodeagent_test.npuSource"}},
		"pointer passed":        {src: &npus, opts: nodeagent.Options{Vendor: acme}},
		"Options.Allocator set": {src: plainSource(npus), opts: nodeagent.Options{Vendor: acme, Allocator: own}},
		"MIG": {src: &npus, opts: nodeagent.Options{Vendor: acme, MIG: noMIG{}},
			want: []string{`no MIG for vendor "ACME"`, "leave it nil"}},
		"DRA": {src: &npus, opts: nodeagent.Options{Vendor: acme, DRA: noDRA{}},
			want: []string{`no DRA for vendor "ACME"`, "leave it nil"}},
		"topology scores": {src: &npus, opts: nodeagent.Options{Vendor: acme, TopologyScores: true},
			want: []string{`no topology scores for vendor "ACME"`, "leave it false"}},
		"NVIDIA with HAMi-core": {src: plainSource(npus), opts: nodeagent.Options{MIG: noMIG{}, DRA: noDRA{}}},
		"HAMi-core, unknown device list strategy": {src: plainSource(npus), opts: nodeagent.Options{Allocator: nodeagent.HAMiCore{Env: hamicore.EnvOptions{DeviceListStrategy: "cdi"}}},
			want: []string{"HAMiCore.Env", "envvar, volume-mounts, cdi-annotations, cdi-cri"}},
		"HAMi-core, envvar and volume-mounts": {src: plainSource(npus), opts: nodeagent.Options{Allocator: &nodeagent.HAMiCore{Env: hamicore.EnvOptions{DeviceListStrategy: "envvar,volume-mounts"}}},
			want: []string{"keep one of them"}},
		"HAMi-core, CDI": {src: plainSource(npus), opts: nodeagent.Options{Allocator: nodeagent.HAMiCore{Env: hamicore.EnvOptions{DeviceListStrategy: "cdi-annotations,cdi-cri"}}, DRA: noDRA{}}},
		"HAMi-core, CDI with MIG": {src: plainSource(npus), opts: nodeagent.Options{Allocator: nodeagent.HAMiCore{Env: hamicore.EnvOptions{DeviceListStrategy: "envvar,cdi-cri"}}, MIG: noMIG{}},
			want: []string{"with Options.MIG", "use envvar or volume-mounts on a MIG node"}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			tc.opts.Kubelet = kubeletplugin.Options{PluginDir: t.TempDir()}
			_, err := nodeagent.New(newClientset(), node, tc.src, tc.opts)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("New = %v, want an agent", err)
				}
				return
			}
			if !errors.Is(err, nodeagent.ErrInvalidOptions) {
				t.Fatalf("New = %v, want ErrInvalidOptions", err)
			}
			if strings.Contains(name, "HAMi-core") && !errors.Is(err, hamicore.ErrInvalidOptions) && !errors.Is(err, hamicore.ErrCDIUnsupported) {
				t.Errorf("New = %v, want hamicore's class too", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("New = %q, does not say %q", err, w)
				}
			}
		})
	}
}

package nodedra

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"k8s.io/klog/v2/ktesting"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/clienttest"
	"github.com/hamireg/hamireg/dra"
	"github.com/hamireg/hamireg/draplugin"
	"github.com/hamireg/hamireg/mig"
	"github.com/hamireg/hamireg/nodeagent"
)

// fakeHost is a DRAHost that says the GPUs of held are held by a pod, and counts errors.
type fakeHost struct {
	held   []string
	errors []string
}

func (h *fakeHost) HeldByHAMi(_ context.Context, uuids []string) error {
	for _, u := range uuids {
		if slices.Contains(h.held, u) {
			return fmt.Errorf("GPU %s is held by pod default/holder: %w", u, nodeagent.ErrOwnership)
		}
	}
	return nil
}

func (h *fakeHost) MIG() nodeagent.MIGInstances { return nil }

func (h *fakeHost) Error(_ context.Context, err error, msg string) {
	h.errors = append(h.errors, msg+": "+err.Error())
}

// TestRefuse: Prepare's check refuses a GPU of the device-plugin world (naming the taint and
// the option) and what the host says a pod holds; without a running agent it refuses all.
func TestRefuse(t *testing.T) {
	t.Parallel()
	_, ctx := ktesting.NewTestContext(t)
	var userErrors []string
	w, err := New(clienttest.NewClientset(), "gpu-1", Options{Plugin: draplugin.Options{Profile: dra.SDKProfile(), PluginDir: t.TempDir(), RegistrarDir: t.TempDir(),
		OnError: func(_ context.Context, err error, _ string) { userErrors = append(userErrors, err.Error()) }}, GPUs: []string{"1", "2", "3"}})
	if err != nil {
		t.Fatal(err)
	}
	gpu := func(i uint) annotation.Device { return annotation.Device{ID: fmt.Sprintf("GPU-%d", i), Index: i} }
	if err := w.refuse(ctx, []annotation.Device{gpu(1)}); !errors.Is(err, ErrNotRunning) {
		t.Errorf("refuse without an agent = %v, want ErrNotRunning", err)
	}
	var host nodeagent.DRAHost = &fakeHost{held: []string{"GPU-1"}}
	w.host.Store(&host)
	for name, tc := range map[string]struct {
		gpus []annotation.Device
		want []string // nil: allowed
	}{
		"device-plugin GPU":  {[]annotation.Device{gpu(0)}, []string{"GPU-0", "device-plugin world", dra.SDKProfile().OwnedByHAMiTaint(), "nodedra.Options.GPUs"}},
		"held by a live pod": {[]annotation.Device{gpu(2), gpu(1)}, []string{"default/holder"}},
		"free":               {[]annotation.Device{gpu(2), gpu(3)}, nil},
	} {
		err := w.refuse(ctx, tc.gpus)
		if tc.want == nil {
			if err != nil {
				t.Errorf("%s: refused: %v", name, err)
			}
			continue
		}
		if !errors.Is(err, nodeagent.ErrOwnership) {
			t.Errorf("%s: refuse = %v, want ErrOwnership", name, err)
			continue
		}
		for _, s := range tc.want {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("%s: refuse = %q, does not say %q", name, err, s)
			}
		}
	}
	w.handleError(ctx, errors.New("slice write failed"), "Publishing failed")
	if h := host.(*fakeHost); len(h.errors) != 1 || len(userErrors) != 1 {
		t.Errorf("errors: host %q, user %q; want one each", h.errors, userErrors)
	}
}

// migHost is a fakeHost that lends a MIG realiser.
type migHost struct {
	fakeHost
	realiser nodeagent.MIGInstances
}

func (h *migHost) MIG() nodeagent.MIGInstances { return h.realiser }

// recordingMIG records the placements it is asked to create.
type recordingMIG struct{ created []mig.Placement }

func (r *recordingMIG) Instances(context.Context) ([]mig.Instance, error) { return nil, nil }
func (r *recordingMIG) Create(_ context.Context, gpu, profile string, pl mig.Placement) (mig.Instance, error) {
	r.created = append(r.created, pl)
	return mig.Instance{GPUUUID: gpu, Profile: profile, Placement: pl, Runtime: mig.Runtime{MigUUID: "MIG-1"}}, nil
}
func (r *recordingMIG) Destroy(context.Context, mig.Instance) error { return nil }

// TestHostMIG: the plugin's MIG realiser is the running agent's; without a running agent, or
// an agent without one, it refuses with a classified error.
func TestHostMIG(t *testing.T) {
	t.Parallel()
	_, ctx := ktesting.NewTestContext(t)
	w, err := New(clienttest.NewClientset(), "gpu-1", Options{Plugin: draplugin.Options{Profile: dra.SDKProfile(), PluginDir: t.TempDir(), RegistrarDir: t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	h := hostMIG{w}
	if _, err := h.Create(ctx, "GPU-0", "1g.10gb", mig.Placement{Start: 0, Size: 2}); !errors.Is(err, ErrNotRunning) {
		t.Errorf("Create without an agent = %v, want ErrNotRunning", err)
	}
	var host nodeagent.DRAHost = &migHost{}
	w.host.Store(&host)
	if _, err := h.Instances(ctx); !errors.Is(err, draplugin.ErrNoMIG) {
		t.Errorf("Instances on an agent without Options.MIG = %v, want draplugin.ErrNoMIG", err)
	}
	r := &recordingMIG{}
	host = &migHost{realiser: r}
	w.host.Store(&host)
	if inst, err := h.Create(ctx, "GPU-0", "1g.10gb", mig.Placement{Start: 2, Size: 2}); err != nil || inst.MigUUID != "MIG-1" || len(r.created) != 1 {
		t.Errorf("Create through the agent = %+v, %v; realiser calls %v", inst, err, r.created)
	}
	if err := h.Destroy(ctx, mig.Instance{}); err != nil {
		t.Errorf("Destroy: %v", err)
	}
}

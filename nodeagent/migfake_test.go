package nodeagent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/hamireg/hamireg/mig"
)

// fakeProfile is a GPU-instance profile of a fake GPU: NVML's profile id and the possible
// placements, keyed by the slice prefix of the names that resolve to it ("1g", "2g", ...), as
// HAMi's manager resolves a reservation's profile name.
type fakeProfile struct {
	id         uint32
	placements []mig.Placement
}

// fakeGPU is one GPU of fakeMIG.
type fakeGPU struct {
	uuid                     string
	index                    int
	modeCurrent, modePending int
	profiles                 map[string]fakeProfile
	insts                    []mig.Instance
	nextGI                   uint32
	// noMIG is a GPU that does not support MIG (an A10): NVML answers ERROR_NOT_SUPPORTED to
	// its MIG mode and profile queries, so it lists no MIG device and Create fails.
	noMIG bool
}

// fakeMIG is a MIGInstances that behaves like the hardware for the calls the agent makes:
// Create refuses a placement the profile does not list and one overlapping an existing
// instance (NVML's ERROR_INSUFFICIENT_RESOURCES), enables MIG mode when it is off and refuses
// while the enable is pending a reset; GPU-instance ids are handed out sequentially from 1 per
// GPU and MIG UUIDs follow the vectors' synthetic pattern.
type fakeMIG struct {
	mu    sync.Mutex
	gpus  []*fakeGPU
	calls []string
	// failCreate, when set, is Create's error.
	failCreate error
}

var _ MIGInstances = (*fakeMIG)(nil)

// a100Profiles is an A100-SXM4-40GB's base profiles (NVIDIA's MIG user guide).
func a100Profiles() map[string]fakeProfile {
	ones := make([]mig.Placement, 7)
	for i := range ones {
		ones[i] = mig.Placement{Start: uint32(i), Size: 1}
	}
	return map[string]fakeProfile{
		"1g": {id: 19, placements: ones},
		"2g": {id: 14, placements: []mig.Placement{{Start: 0, Size: 2}, {Start: 2, Size: 2}, {Start: 4, Size: 2}}},
		"3g": {id: 9, placements: []mig.Placement{{Start: 0, Size: 4}, {Start: 4, Size: 4}}},
		"4g": {id: 5, placements: []mig.Placement{{Start: 0, Size: 4}}},
		"7g": {id: 0, placements: []mig.Placement{{Start: 0, Size: 8}}},
	}
}

// newFakeMIG returns a fake with A100s of these UUIDs, MIG mode on.
func newFakeMIG(uuids ...string) *fakeMIG {
	f := &fakeMIG{}
	for i, u := range uuids {
		f.gpus = append(f.gpus, &fakeGPU{uuid: u, index: i, modeCurrent: 1, modePending: 1, profiles: a100Profiles(), nextGI: 1})
	}
	return f
}

func (f *fakeMIG) gpu(uuid string) *fakeGPU {
	for _, g := range f.gpus {
		if g.uuid == uuid {
			return g
		}
	}
	return nil
}

// migUUID is the vectors' synthetic MIG UUID of GPU index i, GPU instance gi.
func migUUID(i int, gi uint32) string {
	return fmt.Sprintf("MIG-5a5a%04x-%04x-0000-1111-abcdef%04x%02x", i, gi, i, gi)
}

// add puts an instance on a GPU as if created outside the agent.
func (f *fakeMIG) add(gpuUUID, profile string, pl mig.Placement, gi uint32) mig.Instance {
	f.mu.Lock()
	defer f.mu.Unlock()
	g := f.gpu(gpuUUID)
	p := g.profiles[strings.SplitN(profile, ".", 2)[0]]
	inst := mig.Instance{GPUUUID: gpuUUID, Profile: profile, ProfileID: p.id, Placement: pl, Runtime: mig.Runtime{MigUUID: migUUID(g.index, gi), GPUInstanceID: gi}}
	g.insts = append(g.insts, inst)
	g.nextGI = max(g.nextGI, gi+1)
	return inst
}

func (f *fakeMIG) Instances(context.Context) ([]mig.Instance, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "Instances")
	var out []mig.Instance
	for _, g := range f.gpus {
		if g.noMIG {
			continue // GetMigMode: ERROR_NOT_SUPPORTED, no MIG device (as nvmlscan's Instances)
		}
		out = append(out, g.insts...)
	}
	return out, nil
}

func (f *fakeMIG) Create(_ context.Context, gpuUUID, profile string, pl mig.Placement) (mig.Instance, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, fmt.Sprintf("Create %s %s {%d,%d}", gpuUUID, profile, pl.Start, pl.Size))
	if f.failCreate != nil {
		return mig.Instance{}, f.failCreate
	}
	g := f.gpu(gpuUUID)
	if g == nil {
		return mig.Instance{}, errors.New("ERROR_NOT_FOUND")
	}
	if g.noMIG {
		return mig.Instance{}, fmt.Errorf("get MIG mode of GPU %s: ERROR_NOT_SUPPORTED", gpuUUID)
	}
	switch {
	case g.modeCurrent == 0 && g.modePending == 1:
		return mig.Instance{}, fmt.Errorf("gpu %d mig mode enable is pending; GPU reset required", g.index)
	case g.modeCurrent == 0:
		g.modeCurrent, g.modePending = 1, 1
	}
	p, ok := g.profiles[strings.SplitN(profile, ".", 2)[0]]
	if !ok {
		return mig.Instance{}, fmt.Errorf("profile %s: ERROR_NOT_SUPPORTED", profile)
	}
	if !slices.Contains(p.placements, pl) {
		return mig.Instance{}, fmt.Errorf("scheduler selected invalid placement {Start:%d Size:%d} for profile %s", pl.Start, pl.Size, profile)
	}
	if slices.ContainsFunc(g.insts, func(in mig.Instance) bool { return mig.Overlaps(in.Placement, pl) }) {
		return mig.Instance{}, fmt.Errorf("create GI profile=%s placement={Start:%d Size:%d}: ERROR_INSUFFICIENT_RESOURCES", profile, pl.Start, pl.Size)
	}
	gi := g.nextGI
	g.nextGI++
	inst := mig.Instance{GPUUUID: gpuUUID, Profile: profile, ProfileID: p.id, Placement: pl, Runtime: mig.Runtime{MigUUID: migUUID(g.index, gi), GPUInstanceID: gi}}
	g.insts = append(g.insts, inst)
	return inst, nil
}

func (f *fakeMIG) Destroy(_ context.Context, inst mig.Instance) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "Destroy "+inst.MigUUID)
	g := f.gpu(inst.GPUUUID)
	if g == nil {
		return errors.New("ERROR_NOT_FOUND")
	}
	i := slices.IndexFunc(g.insts, func(in mig.Instance) bool { return in.Runtime == inst.Runtime })
	if i < 0 {
		return fmt.Errorf("destroy %s: ERROR_NOT_FOUND", inst.MigUUID)
	}
	g.insts = slices.Delete(g.insts, i, i+1)
	return nil
}

// state returns the instances of every GPU, sorted by GPU and GPU-instance id.
func (f *fakeMIG) state() []mig.Instance {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []mig.Instance
	for _, g := range f.gpus {
		out = append(out, g.insts...)
	}
	slices.SortFunc(out, func(x, y mig.Instance) int {
		return cmp.Or(cmp.Compare(x.GPUUUID, y.GPUUUID), cmp.Compare(x.GPUInstanceID, y.GPUInstanceID))
	})
	return out
}

// noOverlap reports two live instances of one GPU that overlap, as hardware never has.
func (f *fakeMIG) noOverlap() error {
	st := f.state()
	for i, x := range st {
		for _, y := range st[i+1:] {
			if x.GPUUUID == y.GPUUUID && mig.Overlaps(x.Placement, y.Placement) {
				return fmt.Errorf("%s and %s overlap", x.MigUUID, y.MigUUID)
			}
		}
	}
	return nil
}

package dramig_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/dra"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// parentSelector selects the MIG devices of the GPU uuid.
func parentSelector(p dra.Profile, uuid string) string {
	return fmt.Sprintf("device.attributes[%q].%s == %q", p.Driver, dra.AttributeParentUUID, uuid)
}

// TestMIGClaim: the pool publishes the DRA-owned MIG GPUs as counter sets and placements
// (not the device plugin's MIG GPU), and the register annotation cordons the DRA-owned GPUs;
// a claim for a 1g.10gb of GPU 0 gets its highest placement from kube-scheduler, Prepare
// creates that instance and gives the container its MIG UUID (no HAMi-core limit); a claim
// for the whole GPU (7g.40gb) cannot be allocated while it exists, and is once the first
// claim is unprepared (instance destroyed) and released, and its instance is destroyed by a
// restarted agent's Unprepare.
func TestMIGClaim(t *testing.T) {
	t.Parallel()
	n := startMIGNode(t)
	p := n.profile
	published := n.waitForSlices(t)
	var names []string
	for _, s := range published {
		for _, d := range s.Spec.Devices {
			names = append(names, d.Name)
		}
	}
	for _, want := range []string{"gpu-0-mig-1g-10gb-6", "gpu-1-mig-7g-40gb-0", "gpu-3", "gpu-7"} {
		if !slices.Contains(names, want) {
			t.Errorf("device %s not published (%v)", want, names)
		}
	}
	for _, name := range names {
		if strings.HasPrefix(name, "gpu-2") {
			t.Errorf("%s published: GPU 2 is a MIG GPU of the device plugin", name)
		}
	}
	harness.Eventually(t, "the DRA-owned GPUs cordoned for HAMi's extender", harness.DRAWait, func() bool {
		want := []string{n.uuids[0], n.uuids[1], n.uuids[3], n.uuids[4]}
		slices.Sort(want)
		return cp.GetNode(t, n.name).Annotations[allocation.KeyDeviceCordon] == strings.Join(want, ",")
	})
	for _, d := range registered(t, n) {
		if d.Index <= 2 && (d.Mode != "mig" || len(d.MIGProfiles) != 5) {
			t.Errorf("GPU %d registered in mode %q with %d profiles, want mig with 5", d.Index, d.Mode, len(d.MIGProfiles))
		}
	}

	claimA, podA := cp.CreateClaimPod(t, n.name, "pod-a", harness.MIGClaim(n.name, "claim-a", p, "1g.10gb", parentSelector(p, n.uuids[0])))
	allocated := cp.WaitForAllocation(t, n.name, claimA.Name)
	r := result(t, allocated)
	if r.Device != "gpu-0-mig-1g-10gb-6" || r.Driver != p.Driver || r.Pool != n.name || len(r.ConsumedCapacity) != 0 {
		t.Fatalf("result %+v, want gpu-0-mig-1g-10gb-6 (the highest 1g.10gb placement) without consumed capacity", r)
	}
	podA = cp.WaitForBound(t, n.name, podA.Name)
	ids := n.prepare(t, podA)
	insts := n.sim.MIGInstances(0)
	if len(insts) != 1 || insts[0].Profile != "1g.10gb" || insts[0].Placement.Start != 6 || insts[0].Placement.Size != 2 || insts[0].MigUUID == "" {
		t.Fatalf("instances of GPU 0 after prepare: %v, want one 1g.10gb at 6+2", n.instances(0))
	}
	if len(ids) != 1 {
		t.Fatalf("CDI devices %v, want one", ids)
	}
	env := harness.ResolveCDI(t, n.cdiDir, ids[0]).EnvMap()
	if env["NVIDIA_VISIBLE_DEVICES"] != insts[0].MigUUID {
		t.Errorf("NVIDIA_VISIBLE_DEVICES = %q, want the MIG UUID %s", env["NVIDIA_VISIBLE_DEVICES"], insts[0].MigUUID)
	}
	for k := range env {
		if strings.HasPrefix(k, "CUDA_DEVICE_") {
			t.Errorf("HAMi-core variable %s=%s in a MIG device's edits", k, env[k])
		}
	}
	if got := n.world.PreparedGPUs()[n.uuids[0]]; len(got) != 1 || got[0] != claimA.UID {
		t.Errorf("prepared GPUs of GPU 0: %v, want claim-a", got)
	}

	// The whole GPU overlaps the prepared placement: its counters are taken.
	_, podB := cp.CreateClaimPod(t, n.name, "pod-b", harness.MIGClaim(n.name, "claim-b", p, "7g.40gb", parentSelector(p, n.uuids[0])))
	msg := cp.WaitForUnschedulable(t, n.name, podB.Name)
	t.Logf("7g.40gb while a 1g.10gb is allocated: %s", msg)

	n.unprepare(t, podA)
	if left := n.instances(0); len(left) != 0 {
		t.Fatalf("instances of GPU 0 after unprepare: %v, want none", left)
	}
	cp.ReleaseClaim(t, n.name, podA.Name, claimA.Name)

	allocatedB := cp.WaitForAllocation(t, n.name, "claim-b")
	if rb := result(t, allocatedB); rb.Device != "gpu-0-mig-7g-40gb-0" {
		t.Fatalf("claim-b result %+v, want gpu-0-mig-7g-40gb-0", rb)
	}
	podB = cp.WaitForBound(t, n.name, podB.Name)
	n.prepare(t, podB)
	if insts := n.sim.MIGInstances(0); len(insts) != 1 || insts[0].Profile != "7g.40gb" {
		t.Fatalf("instances of GPU 0: %v, want the 7g.40gb", n.instances(0))
	}
	// The agent restarts between Prepare and Unprepare: its MIG release keeps the claim's
	// instance, and the new DRA plugin destroys it from its checkpoint.
	n.restart(t)
	if insts := n.sim.MIGInstances(0); len(insts) != 1 || insts[0].Profile != "7g.40gb" {
		t.Fatalf("instances of GPU 0 after the restart: %v, want the claim's 7g.40gb kept", n.instances(0))
	}
	n.unprepare(t, podB)
	if left := n.instances(0); len(left) != 0 {
		t.Fatalf("instances of GPU 0 after unprepare: %v, want none", left)
	}
}

// TestFirstAvailable: the claim "a 1g.10gb MIG device, else a 10 GiB share of a GPU" gets the
// MIG device while one is free (result request gpu/mig, an instance prepared) and the share
// once both DRA-owned MIG GPUs are taken by whole-GPU profiles (result request gpu/share,
// HAMi-core's 10 GiB limit prepared).
func TestFirstAvailable(t *testing.T) {
	t.Parallel()
	n := startMIGNode(t)
	p := n.profile
	n.waitForSlices(t)

	claim1, pod1 := cp.CreateClaimPod(t, n.name, "fa-1", harness.MIGFirstAvailableClaim(n.name, "fa-1", p, "1g.10gb", "10Gi"))
	r1 := result(t, cp.WaitForAllocation(t, n.name, claim1.Name))
	if r1.Request != harness.ClaimRequestName+"/"+harness.MIGRequestName || !strings.HasPrefix(r1.Device, "gpu-0-mig-1g-10gb-") && !strings.HasPrefix(r1.Device, "gpu-1-mig-1g-10gb-") {
		t.Fatalf("first claim: result %+v, want request gpu/mig on a 1g.10gb placement", r1)
	}
	pod1 = cp.WaitForBound(t, n.name, pod1.Name)
	ids := n.prepare(t, pod1)
	gpu := 0
	if strings.HasPrefix(r1.Device, "gpu-1") {
		gpu = 1
	}
	insts := n.sim.MIGInstances(gpu)
	if len(insts) != 1 || insts[0].Profile != "1g.10gb" {
		t.Fatalf("instances of GPU %d: %v, want one 1g.10gb", gpu, n.instances(gpu))
	}
	if env := harness.ResolveCDI(t, n.cdiDir, ids[0]).EnvMap(); env["NVIDIA_VISIBLE_DEVICES"] != insts[0].MigUUID {
		t.Errorf("NVIDIA_VISIBLE_DEVICES = %q, want %s", env["NVIDIA_VISIBLE_DEVICES"], insts[0].MigUUID)
	}
	n.unprepare(t, pod1)
	cp.ReleaseClaim(t, n.name, pod1.Name, claim1.Name)

	// Both DRA-owned MIG GPUs taken whole: no 1g.10gb left.
	for i := range 2 {
		c, _ := cp.CreateClaimPod(t, n.name, fmt.Sprintf("block-%d", i), harness.MIGClaim(n.name, fmt.Sprintf("block-%d", i), p, "7g.40gb", parentSelector(p, n.uuids[i])))
		cp.WaitForAllocation(t, n.name, c.Name)
	}
	claim2, pod2 := cp.CreateClaimPod(t, n.name, "fa-2", harness.MIGFirstAvailableClaim(n.name, "fa-2", p, "1g.10gb", "10Gi"))
	r2 := result(t, cp.WaitForAllocation(t, n.name, claim2.Name))
	if r2.Request != harness.ClaimRequestName+"/"+harness.MIGShareRequestName || (r2.Device != "gpu-3" && r2.Device != "gpu-4") {
		t.Fatalf("second claim: result %+v, want request gpu/share on a DRA-owned shared GPU (gpu-3 or gpu-4)", r2)
	}
	if m := r2.ConsumedCapacity[dra.CapacityMemory]; m.Value() != 10<<30 {
		t.Errorf("consumed memory %s, want 10Gi", m.String())
	}
	pod2 = cp.WaitForBound(t, n.name, pod2.Name)
	ids = n.prepare(t, pod2)
	env := harness.ResolveCDI(t, n.cdiDir, ids[0]).EnvMap()
	idx := 3
	if r2.Device == "gpu-4" {
		idx = 4
	}
	if env["CUDA_DEVICE_MEMORY_LIMIT_0"] != "10240m" || env["NVIDIA_VISIBLE_DEVICES"] != n.uuids[idx] {
		t.Errorf("share edits: memory limit %q, visible %q; want 10240m on %s", env["CUDA_DEVICE_MEMORY_LIMIT_0"], env["NVIDIA_VISIBLE_DEVICES"], n.uuids[idx])
	}
	n.unprepare(t, pod2)
}

// registered decodes the Node's register annotation.
func registered(t *testing.T, n *migNode) []annotation.Device {
	t.Helper()
	devs, err := annotation.Decode(cp.GetNode(t, n.name).Annotations[annotation.KeyNVIDIARegister])
	if err != nil {
		t.Fatalf("decode %s: %v", annotation.KeyNVIDIARegister, err)
	}
	return devs
}

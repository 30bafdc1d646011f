// Package mig_test runs MIG end to end on real peers: kube-apiserver and etcd (harness),
// kube-scheduler configured from examples/extender's manifests calling the examples/extender
// process, the kubelet's device manager (kubeletpeer's ManagerImpl) and examples/deviceplugin
// on go-nvml's simulated DGX A100 in MIG mode (--simulate dgxa100 --mig), whose simulation
// refuses overlapping placements and enumerates the MIG devices it created. The test plays the
// kubelet's admission (ManagerImpl.Allocate as soon as a pod is bound) and asks the
// simulation's debug endpoint (--simulate-debug-address, GET /debug/nvmlsim/mig) for the live
// instances after every step.
//
// What it checks, one node of eight A100-SXM4-40GB GPUs in MIG mode:
//
//   - profiles are chosen by NVML's memory: 4000, 9000 and 19000 MiB get 1g.5gb (4864 MiB),
//     2g.10gb and 3g.20gb; 5120 MiB does not fit 1g.5gb and gets 2g.10gb;
//   - every pod's annotations are HAMi master's: the device list with the profile's memory and
//     cores, hami.io/vgpu-mig-allocations with the placement and the runtime identity the agent
//     patched in (migUUID, gpuInstanceID, computeInstanceID), bind-phase success, the node lock
//     released; the Allocate answer's NVIDIA_VISIBLE_DEVICES is that MIG UUID, an instance the
//     simulation lists, and no HAMi-core limit is set;
//   - seven 1g pods fill a GPU's seven 1g placements, the eighth goes to another GPU, and a pod
//     pinned to the full GPU (nvidia.com/use-gpuuuid) is Pending with HAMi's
//     CardTimeSlicingExhausted for it;
//   - three 2g.10gb and one 1g.5gb fill a GPU (HAMi's rounded-up cores sum to 102) and the next
//     pod goes to another GPU, while the annotations keep HAMi's per-device cores; pinned to
//     the full GPU, a zero-core pod is refused with CardMigTopologyInfeasible (HAMi:
//     CardInsufficientCore). A zero-core request HAMi refuses with a placement free cannot be
//     built on an A100: the rounding adds at most 5 % over the profiles' true share, and a
//     free 1g placement leaves at least 14 % unused;
//   - on a GPU holding two 2g.10gb (HAMi's cores 58) a pod asking 43 % cores gets the free
//     3g.20gb placement, which HAMi refuses (CardInsufficientCore): on a MIG GPU the placement
//     decides, not the sum of rounded profile cores;
//   - a pod that fits no placement is Pending with HAMi's reason in its FailedScheduling event:
//     41000 MiB (CardInsufficientMemory), a whole GPU (CardMigTopologyInfeasible);
//   - deleting a pod destroys its instance and frees its placement for the next pod;
//   - no two live instances overlap, after every step.
package mig_test

import (
	"testing"

	"github.com/hamireg/hamireg/test/e2e/harness"
)

var (
	// cp is the control plane of this test binary.
	cp *harness.ControlPlane
	// agentBin and extenderBin are examples/deviceplugin and examples/extender, built into
	// cp.Dir() (removed with it); errAgentBuild and errExtenderBuild say why one is missing.
	agentBin, extenderBin           string
	errAgentBuild, errExtenderBuild error
)

// TestMain starts the control plane and builds the two programs once.
func TestMain(m *testing.M) {
	harness.MainWithPrograms(m, race, func(c *harness.ControlPlane, p harness.Programs) {
		cp = c
		agentBin, errAgentBuild = p.DevicePlugin, p.DevicePluginErr
		extenderBin, errExtenderBuild = p.Extender, p.ExtenderErr
	})
}

package dra_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hamireg/hamireg/monitor/monitortest"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// TestMonitorDRAClaim: the node agent's monitor (nodeagent.Options.Monitor) ties a DRA
// claim's region to the pod that uses it. A claim pod is allocated by kube-scheduler and
// prepared through the kubelet's DRA manager; the driver makes the claim's folder
// <hook>/vgpu/claims/<claim UID>; once HAMi-core's region is written there (monitortest,
// on the GPU the claim was prepared on), the agent's registry serves the pod's container
// cuda in hami_vgpu_memory_used_bytes and hami_vgpu_memory_limit_bytes with the region's
// values: the monitor resolved the folder through the DRA world's prepared claims.
func TestMonitorDRAClaim(t *testing.T) {
	t.Parallel()
	n := startDRANode(t, nodeOptions{monitor: true})
	claim, pod := cp.CreateClaimPod(t, n.name, "cuda", harness.Claim(n.name, "cuda", n.profile.Driver, harness.ClaimRequest{Count: 1, Memory: "10Gi", Cores: "30"}))
	cp.WaitForAllocation(t, claim.Namespace, claim.Name)
	pod = cp.WaitForBound(t, pod.Namespace, pod.Name)
	n.prepare(t, pod)

	root := filepath.Join(n.hook, "vgpu")
	if st, err := os.Stat(filepath.Join(root, "claims", string(claim.UID))); err != nil || !st.IsDir() {
		t.Fatalf("Prepare made no claim folder: %v", err)
	}
	var uuid string
	for u, uids := range n.currentWorld().Plugin().PreparedGPUs() {
		if slices.Contains(uids, claim.UID) {
			uuid = u
		}
	}
	if uuid == "" {
		t.Fatalf("no prepared GPU holds claim %s", claim.UID)
	}
	const limit, used = 10 << 30, 3 << 30
	if _, err := monitortest.WriteClaim(root, claim.UID, monitortest.Region(4242,
		monitortest.GPU{UUID: uuid, Limit: limit, Used: used, SMUtil: 25})); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"namespace": pod.Namespace, "pod": pod.Name, "container": "cuda",
		"vdevice_index": "0", "device_uuid": (uuid + strings.Repeat("\x00", 40))[:40], "zone": "vGPU"} // HAMi's 40-byte cut
	want := map[string]float64{"hami_vgpu_memory_used_bytes": used, "hami_vgpu_memory_limit_bytes": limit}
	harness.Eventually(t, "the claim's container in the agent's metrics", 60*time.Second, func() bool {
		fams, err := n.metrics.Gather()
		if err != nil {
			t.Logf("gather: %v", err)
			return false
		}
		found := 0
		for _, f := range fams {
			v, ok := want[f.GetName()]
			if !ok {
				continue
			}
			for _, m := range f.GetMetric() {
				got := map[string]string{}
				for _, l := range m.GetLabel() {
					got[l.GetName()] = l.GetValue()
				}
				if fmt.Sprint(got) == fmt.Sprint(labels) && m.GetGauge().GetValue() == v {
					found++
				}
			}
		}
		return found == len(want)
	})
}

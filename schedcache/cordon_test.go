package schedcache

import (
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/hamireg/hamireg/allocation"
)

// TestCordon: the Node's hami.io/device-cordon reaches NodeInfo.Cordon, and a change of it
// alone publishes a new NodeInfo (so the extender reads it from the snapshot, with no lister
// lookup per candidate, and its memos of the old NodeInfo no longer match).
func TestCordon(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		node := gpuNode("n", 2, 20, requesting(t0.Add(-10*time.Second)))
		node.Annotations[allocation.KeyDeviceCordon] = "GPU-a"
		e := start(t, Options{}, node)
		e.waitState("n", StateRegistered)
		before, _ := e.cache.Node("n")
		if before.Cordon != "GPU-a" {
			t.Fatalf("Cordon = %q, want GPU-a", before.Cordon)
		}
		e.update("n", func(n *corev1.Node) { n.Annotations[allocation.KeyDeviceCordon] = "GPU-a,GPU-b" })
		e.until("the new cordon", func() bool { n, _ := e.cache.Node("n"); return n.Cordon == "GPU-a,GPU-b" })
		e.update("n", func(n *corev1.Node) { delete(n.Annotations, allocation.KeyDeviceCordon) })
		e.until("no cordon", func() bool { n, _ := e.cache.Node("n"); return n.Cordon == "" })
		if after, _ := e.cache.Node("n"); after.Registrations[0].State != StateRegistered {
			t.Errorf("registration %s after cordon changes", after.Registrations[0].State)
		}
	})
}

package preemption_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/hamireg/hamireg/allocation"
)

// classes are the priority classes of the preemption tests: victims of increasing
// importance and the preemptor.
type classes struct {
	low10, low20, low30, low40, high string
}

func newClasses(tb testing.TB) classes {
	tb.Helper()
	return classes{low10: priorityClass(tb, 10), low20: priorityClass(tb, 20), low30: priorityClass(tb, 30), low40: priorityClass(tb, 40),
		high: priorityClass(tb, 1000)}
}

// preemptionCase is one scenario: setup places the victims and returns the preemptor; the
// preemptor must then be bound on node after exactly the victims were deleted, or, when node
// is "", stay Pending with no pod deleted.
type preemptionCase struct {
	preemptor podOptions
	node      string
	victims   []string // "ns/name", sorted
	// why is what the PodScheduled condition must say when node is "": the plugin's reason
	// and kube-scheduler's preemption verdict.
	why []string
}

// TestPreemption runs kube-scheduler with the HAMiGPU plugin; the GPU memory of every
// scenario is held by lower-priority pods placed on known GPUs, and a high-priority GPU pod
// arrives. kube-scheduler's DefaultPreemption must delete the minimum set of victims — the
// plugin's Filter sees the victims removed and answers Unschedulable only where removing
// pods helps — and the preemptor must then be bound on the expected node. Where nothing can
// help (a GPU type the node lacks, a cordoned GPU, equal priority) no pod is deleted and the
// preemptor stays Pending.
func TestPreemption(t *testing.T) {
	s := startPlugin(t, map[string]any{"nodeLockWait": "10s"})
	pc := newClasses(t)

	cases := map[string]func(t *testing.T, c *cluster) preemptionCase{
		// (a) One GPU of 10000 MiB held by four pods of 2500 MiB (priorities 10–40); the
		// preemptor needs 4000 MiB: two victims suffice, the two least important.
		"minimum victims on one GPU": func(t *testing.T, c *cluster) preemptionCase {
			t.Helper()
			ns := namespace(t, "pre")
			node, devs := c.node(t, nodeOptions{gpus: 1, mem: 10000})
			for _, v := range []struct{ name, class string }{{"p10", pc.low10}, {"p20", pc.low20}, {"p30", pc.low30}, {"p40", pc.low40}} {
				c.placed(t, podOptions{ns: ns, name: v.name, scheduler: s.name, priorityClass: v.class}, node, allocation.ContainerDevices{share(devs[0], 2500)})
			}
			return preemptionCase{
				preemptor: podOptions{ns: ns, name: "high", scheduler: s.name, priorityClass: pc.high, gpus: 1, mem: 4000},
				node:      node, victims: []string{ns + "/p10", ns + "/p20"},
			}
		},
		// (b) Two GPUs, each held 6000 + 3000 MiB; the preemptor asks 2 GPUs × 5000 MiB: one
		// victim per GPU, the 6000 MiB pods (the less important on each GPU keeps 3000 MiB).
		"two GPUs each partly held": func(t *testing.T, c *cluster) preemptionCase {
			t.Helper()
			ns := namespace(t, "pre")
			node, devs := c.node(t, nodeOptions{gpus: 2, mem: 10000})
			c.placed(t, podOptions{ns: ns, name: "a6000", scheduler: s.name, priorityClass: pc.low10}, node, allocation.ContainerDevices{share(devs[0], 6000)})
			c.placed(t, podOptions{ns: ns, name: "b3000", scheduler: s.name, priorityClass: pc.low30}, node, allocation.ContainerDevices{share(devs[0], 3000)})
			c.placed(t, podOptions{ns: ns, name: "c6000", scheduler: s.name, priorityClass: pc.low20}, node, allocation.ContainerDevices{share(devs[1], 6000)})
			c.placed(t, podOptions{ns: ns, name: "d3000", scheduler: s.name, priorityClass: pc.low40}, node, allocation.ContainerDevices{share(devs[1], 3000)})
			return preemptionCase{
				preemptor: podOptions{ns: ns, name: "high", scheduler: s.name, priorityClass: pc.high, gpus: 2, mem: 5000},
				node:      node, victims: []string{ns + "/a6000", ns + "/c6000"},
			}
		},
		// GPU cores: one GPU held by 60 % (priority 10) and 30 % (priority 20) of its cores,
		// little memory; the preemptor asks 50 %: only the 60 % pod must go.
		"GPU cores": func(t *testing.T, c *cluster) preemptionCase {
			t.Helper()
			ns := namespace(t, "pre")
			node, devs := c.node(t, nodeOptions{gpus: 1, mem: 10000})
			cores := func(mem, pct int32) allocation.ContainerDevices {
				d := share(devs[0], mem)
				d.Usedcores = pct
				return allocation.ContainerDevices{d}
			}
			c.placed(t, podOptions{ns: ns, name: "c60", scheduler: s.name, priorityClass: pc.low10}, node, cores(1000, 60))
			c.placed(t, podOptions{ns: ns, name: "c30", scheduler: s.name, priorityClass: pc.low20}, node, cores(1000, 30))
			return preemptionCase{
				preemptor: podOptions{ns: ns, name: "high", scheduler: s.name, priorityClass: pc.high, gpus: 1, mem: 1000, cores: 50},
				node:      node, victims: []string{ns + "/c60"},
			}
		},
		// (c) The preemptor wants an H100 (nvidia.com/use-gputype) and the node has A100s:
		// removing pods cannot help (UnschedulableAndUnresolvable).
		"type mismatch preempts nothing": func(t *testing.T, c *cluster) preemptionCase {
			t.Helper()
			ns := namespace(t, "pre")
			node, devs := c.node(t, nodeOptions{gpus: 1, mem: 10000})
			c.placed(t, podOptions{ns: ns, name: "low", scheduler: s.name, priorityClass: pc.low10}, node, allocation.ContainerDevices{share(devs[0], 10000)})
			return preemptionCase{preemptor: podOptions{ns: ns, name: "high", scheduler: s.name, priorityClass: pc.high, gpus: 1, mem: 4000,
				annotations: map[string]string{allocation.KeyUseGPUType: "H100"}},
				why: []string{"CardTypeMismatch", "Preemption is not helpful"}}
		},
		// (c) The node's only GPU is cordoned (hami.io/device-cordon) and full of low pods.
		"cordoned GPU preempts nothing": func(t *testing.T, c *cluster) preemptionCase {
			t.Helper()
			ns := namespace(t, "pre")
			node, devs := c.node(t, nodeOptions{gpus: 1, mem: 10000})
			c.cordon(t, node, devs[0].ID)
			c.placed(t, podOptions{ns: ns, name: "low", scheduler: s.name, priorityClass: pc.low10}, node, allocation.ContainerDevices{share(devs[0], 10000)})
			return preemptionCase{preemptor: podOptions{ns: ns, name: "high", scheduler: s.name, priorityClass: pc.high, gpus: 1, mem: 4000},
				why: []string{"CardCordoned", "Preemption is not helpful"}}
		},
		// (d) The GPU is held by a pod of the preemptor's own priority: never a victim.
		"equal priority is never preempted": func(t *testing.T, c *cluster) preemptionCase {
			t.Helper()
			ns := namespace(t, "pre")
			node, devs := c.node(t, nodeOptions{gpus: 1, mem: 10000})
			c.placed(t, podOptions{ns: ns, name: "peer", scheduler: s.name, priorityClass: pc.high}, node, allocation.ContainerDevices{share(devs[0], 10000)})
			return preemptionCase{preemptor: podOptions{ns: ns, name: "high", scheduler: s.name, priorityClass: pc.high, gpus: 1, mem: 4000},
				why: []string{"CardInsufficientMemory", "No preemption victims found"}}
		},
		// (e) Two nodes of one full GPU each: on the first the victim would be the least
		// important pod (priority 10), but a PodDisruptionBudget guards it (no controller
		// runs, so disruptionsAllowed is 0); kube-scheduler prefers the node without a
		// violation and evicts the priority-20 pod there.
		"PodDisruptionBudget respected": func(t *testing.T, c *cluster) preemptionCase {
			t.Helper()
			ns := namespace(t, "pre")
			n1, d1 := c.node(t, nodeOptions{gpus: 1, mem: 10000})
			n2, d2 := c.node(t, nodeOptions{gpus: 1, mem: 10000})
			guarded := map[string]string{"app": "guarded"}
			pdb(t, ns, guarded)
			c.placed(t, podOptions{ns: ns, name: "guarded", scheduler: s.name, priorityClass: pc.low10, labels: guarded}, n1, allocation.ContainerDevices{share(d1[0], 10000)})
			c.placed(t, podOptions{ns: ns, name: "free", scheduler: s.name, priorityClass: pc.low20}, n2, allocation.ContainerDevices{share(d2[0], 10000)})
			return preemptionCase{
				preemptor: podOptions{ns: ns, name: "high", scheduler: s.name, priorityClass: pc.high, gpus: 1, mem: 5000},
				node:      n2, victims: []string{ns + "/free"},
			}
		},
		// (f) The preemptor's namespace has limits.nvidia.com/gpumem 10000 and already uses
		// 6000 (GPU 0); another namespace's less important pod holds 6000 MiB of GPU 1. The
		// preemptor (5000 MiB) fits on either GPU once its holder goes, but only evicting
		// its own namespace's pod frees the quota: that one is the victim.
		"quota-limited namespace": func(t *testing.T, c *cluster) preemptionCase {
			t.Helper()
			ns := namespace(t, "quota")
			other := namespace(t, "other")
			quota(t, ns, 10000)
			node, devs := c.node(t, nodeOptions{gpus: 2, mem: 10000})
			c.placed(t, podOptions{ns: ns, name: "same-ns", scheduler: s.name, priorityClass: pc.low20}, node, allocation.ContainerDevices{share(devs[0], 6000)})
			c.placed(t, podOptions{ns: other, name: "other-ns", scheduler: s.name, priorityClass: pc.low10}, node, allocation.ContainerDevices{share(devs[1], 6000)})
			return preemptionCase{
				preemptor: podOptions{ns: ns, name: "high", scheduler: s.name, priorityClass: pc.high, gpus: 1, mem: 5000},
				node:      node, victims: []string{ns + "/same-ns"},
			}
		},
	}
	for name, setup := range cases {
		t.Run(name, func(t *testing.T) {
			c := newCluster(t)
			tc := setup(t, c)
			start := time.Now()
			p := create(t, c.pod(tc.preemptor))
			if tc.node == "" {
				msg := c.waitUnschedulable(t, p.Namespace, p.Name, 30*time.Second)
				// PostFilter ran before the condition was written, and says there that no node
				// is a preemption candidate.
				for _, w := range append([]string{"preemption: 0/"}, tc.why...) {
					if !strings.Contains(msg, w) {
						t.Errorf("condition %q does not say %q", msg, w)
					}
				}
				// Victims would be deleted asynchronously after a nomination: give a
				// deletion a moment to show before asserting there is none.
				time.Sleep(time.Second)
				if got := c.deletedSince(start); len(got) != 0 {
					t.Errorf("pods deleted %v, want none (condition %q)", got, msg)
				}
				if cur, err := c.pods.Pods(p.Namespace).Get(p.Name); err != nil || cur.Spec.NodeName != "" || cur.Status.NominatedNodeName != "" {
					t.Errorf("preemptor bound or nominated: %v %v", cur, err)
				}
				t.Logf("preemptor pending: %s", msg)
				return
			}
			node, at := c.waitBound(t, p.Namespace, p.Name, 30*time.Second)
			if node != tc.node {
				t.Errorf("preemptor bound to %s, want %s", node, tc.node)
			}
			if diff := cmp.Diff(tc.victims, c.deletedSince(start)); diff != "" {
				t.Errorf("victims (-want +got):\n%s", diff)
			}
			t.Logf("preemptor bound %v after its create, victims %s", at.Sub(start).Round(time.Millisecond), strings.Join(tc.victims, ", "))
		})
	}
}

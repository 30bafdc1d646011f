package preemption_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hamireg/hamireg/allocation"
)

const (
	// benchNodes × benchGPUs GPUs of 40960 MiB are BenchmarkPodsPerSecond's cluster (spec §8 G2).
	benchNodes, benchGPUs = 16, 4
	// benchPods is how many pods one BenchmarkPodsPerSecond iteration creates at once.
	benchPods = 96
	// requeueTrials and preemptTrials are the trials of one iteration.
	requeueTrials, preemptTrials = 2, 3
)

// BenchmarkPodsPerSecond measures pods bound per second, from the first create of benchPods
// pods to the last pod seen bound by a watch, on benchNodes nodes × benchGPUs GPUs:
//
//   - /plugin: kube-scheduler with the HAMiGPU plugin (examples/scheduler/deploy's
//     configuration: node policy binpack, GPU policy spread), 1-GPU 1000 MiB pods;
//   - /plugin-spread: the same with nodeSchedulerPolicy spread (binds spread over the nodes'
//     locks), a diagnostic;
//   - /extender: a stock kube-scheduler calling examples/extender (HAMi's chart: binpack);
//   - /extender-spread: the same with --node-scheduler-policy=spread, beside /plugin-spread;
//   - /plain: a stock kube-scheduler, the same pods without GPU requests.
//
// Every scheduler has client QPS/burst 500/1000. The node lock is released by the allocator
// (HAMi's Allocate writes through allocationtest.Plugin) once the locked pod is bound.
// lock-floor-pods/s is the node-lock floor of spec §8: nodes ÷ mean lock hold, the hold
// measured from a Node watch (lock seen set → seen removed); lock-hold-ms is that mean and
// nodes-used how many nodes got pods. api-requests/pod and api-writes/pod are the API
// server's apiserver_request_total (every client: scheduler, extender, allocator, the
// test's creates) per pod, until the last lock is released. Each metric is the median of
// the iterations.
//
// Measured on a shared 2-core machine without GPUs (etcd, kube-apiserver, the schedulers, the
// extender and the test on the same cores), go test -bench PodsPerSecond -benchtime 3x
// -count 3, twice; median (min–max) of the 6 runs:
//
//	                 pods/s            lock-hold-ms     lock-floor-pods/s  api-writes/pod
//	plugin           20.9 (15.9–25.1)   98 (83–133)      164 (121–194)      9.0
//	plugin-spread    31.7 (25.8–34.0)  454 (434–577)      35 (28–37)        9.0
//	extender         20.1 (17.7–26.2)   92 (71–111)      174 (145–226)     10.0
//	extender-spread  37.4 (25.5–43.3)  347 (310–534)      46 (30–52)       10.0
//	plain           218 (168–273)        –                 –                3.0
//
// Goals not met here: plugin ≈ 1.0× extender (goal ≥ 2×), and with binpack 13 % of the
// floor (goal ≥ 70 %). kube-apiserver's CPU is the limit on this machine: pods/s follows the
// API writes per pod (plain: 3, extender: 10, plugin: 9 — the extender's filter patch is
// gone, the nominatedNodeName status patch of the pre-flight came), not the scheduling
// cycle, which the extender's HTTP round trip would slow on a machine with spare cores.
// Binpack fills one node after another (3 nodes used), so the rate is near one node's
// 1/hold, not nodes/hold. With spread, holds overlap and stretch under the API server's
// load (lock set → removed ≈ 0.45 s), the floor as defined sinks to the achieved rate
// (plugin-spread at 90 % of it), and the plugin stays below the extender.
func BenchmarkPodsPerSecond(b *testing.B) {
	b.Run("plugin", func(b *testing.B) {
		benchmarkPodsPerSecond(b, startPluginDefault, true)
	})
	b.Run("plugin-spread", func(b *testing.B) {
		benchmarkPodsPerSecond(b, startPluginSpread, true)
	})
	b.Run("extender", func(b *testing.B) {
		benchmarkPodsPerSecond(b, startExtenderDefault, true)
	})
	b.Run("extender-spread", func(b *testing.B) {
		benchmarkPodsPerSecond(b, startExtenderSpread, true)
	})
	b.Run("plain", func(b *testing.B) { benchmarkPodsPerSecond(b, startPlain, false) })
}

func benchmarkPodsPerSecond(b *testing.B, start func(testing.TB) *scheduler, gpu bool) {
	b.Helper()
	c := newCluster(b)
	s := start(b)
	ns := namespace(b, "bench")
	for range benchNodes {
		c.node(b, nodeOptions{gpus: benchGPUs, mem: 40960})
	}
	var rates, floors, holdsMs, used, reqs, writes []float64
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		pods := make([]*corev1.Pod, benchPods)
		keys := make([]types.NamespacedName, benchPods)
		for j := range pods {
			o := podOptions{ns: ns, name: fmt.Sprintf("p%d-%03d", i, j), scheduler: s.name}
			if gpu {
				o.gpus, o.mem = 1, 1000
			}
			pods[j] = c.pod(o)
			keys[j] = key(pods[j])
		}
		c.takeHolds()
		all0, w0 := apiRequests(b)
		b.StartTimer()
		t0 := time.Now()
		createAll(b, pods)
		var last time.Time
		c.waitFor(b, fmt.Sprintf("%d pods bound", benchPods), 3*time.Minute, func() bool {
			last = time.Time{}
			for _, k := range keys {
				at, ok := c.boundAt[k]
				if !ok {
					return false
				}
				if at.After(last) {
					last = at
				}
			}
			return true
		})
		b.StopTimer()
		rates = append(rates, benchPods/last.Sub(t0).Seconds())
		if gpu {
			c.waitUnlocked(b) // the allocator's writes are part of a GPU pod's cost
		}
		all1, w1 := apiRequests(b)
		reqs = append(reqs, (all1-all0)/benchPods)
		writes = append(writes, (w1-w0)/benchPods)
		nodes := map[string]bool{}
		for _, k := range keys {
			p, err := c.pods.Pods(k.Namespace).Get(k.Name)
			if err == nil {
				nodes[p.Spec.NodeName] = true
			}
		}
		used = append(used, float64(len(nodes)))
		if gpu {
			holds := c.takeHolds()
			m := mean(holds)
			holdsMs = append(holdsMs, float64(m)/float64(time.Millisecond))
			floors = append(floors, benchNodes/m.Seconds())
		}
		c.deleteAll(b, ns)
		b.StartTimer()
	}
	b.ReportMetric(median(rates), "pods/s")
	b.ReportMetric(median(used), "nodes-used")
	b.ReportMetric(median(reqs), "api-requests/pod")
	b.ReportMetric(median(writes), "api-writes/pod")
	if gpu {
		b.ReportMetric(median(floors), "lock-floor-pods/s")
		b.ReportMetric(median(holdsMs), "lock-hold-ms")
	}
}

// BenchmarkRequeue measures, through the plugin and through the extender (same queue
// settings: backoff 1 s initial and maximum), requeue-p99-ms: from the delete call of the
// blocker of a full one-GPU node to the waiting pod seen bound (the p99 over every trial of
// the run), and attempts/pod: scheduler_schedule_attempts_total of the profile per GPU pod
// bound (blocker and waiter), from the scheduler's /metrics. The waiting pod waits 1 s before
// the delete; in /churn a goroutine meanwhile patches a label of 8 unrelated nodes every
// 10 ms (Node/UpdateNodeLabel events). The plugin's hints skip those events, so its attempts
// must not grow with the churn; the extender's "Extender" rejector requeues on every event.
// A waiting pod not bound 5 s after the delete is nudged by an unrelated Node event every
// second (see waitRequeued): nudged/trial counts those trials, whose latency then includes
// the 5 s.
//
// Measured (same machine and runs as BenchmarkPodsPerSecond; 6 trials per run, so the p99
// is the slowest trial; median (min–max) of 6 runs):
//
//	                  requeue-p50-ms  requeue-p99-ms       attempts/pod        nudged/trial
//	plugin/quiet      35 (25–48)       49 (35–90)          1.5 (always)        0
//	plugin/churn      42 (33–74)      106 (63–163)         1.5 (always)        0
//	extender/quiet    40 (32–51)     5049 (5041–5072)      2.5 (2.3–3.0)       0.25 (0.17–0.5)
//	extender/churn    47 (27–62)       65 (39–170)        51.6 (44–53)         0
//
// The plugin's attempts do not move with the churn (blocker 1, waiter 2: its rejection and
// the bind). The extender's waiter is tried again at every unrelated Node event; and in a
// quiet cluster one trial in four is lost after the blocker's delete: kube-scheduler does
// requeue the waiter on the delete and tries it within about 10 ms, but the extender's pod
// informer has not yet seen the delete and refuses again (CardInsufficientMemory in
// kube-scheduler's log, TestRequeue logs those lines); no later event comes, so without the
// nudge the pod would wait for the unschedulable pool's flush (5 min 30 s at worst). The
// plugin reads the scheduler's own cache, in which the delete has already happened.
func BenchmarkRequeue(b *testing.B) {
	for _, sched := range []struct {
		name  string
		start func(testing.TB) *scheduler
	}{
		{"plugin", startPluginDefault},
		{"extender", startExtenderDefault},
	} {
		b.Run(sched.name, func(b *testing.B) {
			r := newRequeueRig(b, sched.start)
			var others []string
			for range 8 {
				n, _ := r.c.node(b, nodeOptions{noDevices: true})
				others = append(others, n)
			}
			for _, busy := range []bool{false, true} {
				b.Run(map[bool]string{false: "quiet", true: "churn"}[busy], func(b *testing.B) {
					var lat []time.Duration
					var attempts, bound, nudged float64
					for b.Loop() {
						before := r.s.attempts(b)
						stop := func() {}
						if busy {
							stop = churn(b, others, 10*time.Millisecond)
						}
						for range requeueTrials {
							took, n := r.trial(b, time.Second)
							lat = append(lat, took)
							if n {
								nudged++
							}
						}
						stop()
						attempts += r.s.attempts(b) - before
						bound += 2 * requeueTrials
					}
					b.ReportMetric(float64(percentile(lat, 99))/float64(time.Millisecond), "requeue-p99-ms")
					b.ReportMetric(float64(percentile(lat, 50))/float64(time.Millisecond), "requeue-p50-ms")
					b.ReportMetric(attempts/bound, "attempts/pod")
					b.ReportMetric(2*nudged/bound, "nudged/trial")
				})
			}
		})
	}
}

// BenchmarkPreemptToBound measures preempt-to-bound-p99-ms through the plugin: a one-GPU node
// (10000 MiB) is held by a low-priority pod (grace 0); a high-priority pod of 5000 MiB is
// created; the time from its create call to the watch seeing it bound, p99 over every trial.
// The extender has no baseline: kube-scheduler's preemption dry run cannot see GPU usage
// through an extender (spec §2.5), so such a pod is never bound.
//
// Measured (same machine and runs; 9 trials per run): p50 37 ms (28–52), p99 59 ms (32–86),
// median (min–max) of 6 runs; goal p99 < 2 s.
func BenchmarkPreemptToBound(b *testing.B) {
	c := newCluster(b)
	s := startPlugin(b, nil)
	pc := newClasses(b)
	ns := namespace(b, "preempt")
	node, devs := c.node(b, nodeOptions{gpus: 1, mem: 10000})
	var lat []time.Duration
	n := 0
	for b.Loop() {
		for range preemptTrials {
			b.StopTimer()
			n++
			low := c.placed(b, podOptions{ns: ns, name: fmt.Sprintf("low-%d", n), scheduler: s.name, priorityClass: pc.low10}, node,
				allocation.ContainerDevices{share(devs[0], 10000)})
			b.StartTimer()
			t0 := time.Now()
			high := create(b, c.pod(podOptions{ns: ns, name: fmt.Sprintf("high-%d", n), scheduler: s.name, priorityClass: pc.high, gpus: 1, mem: 5000}))
			got, at := c.waitBound(b, ns, high.Name, 30*time.Second)
			b.StopTimer()
			if got != node {
				b.Fatalf("preemptor bound to %s, want %s", got, node)
			}
			lat = append(lat, at.Sub(t0))
			c.waitUnlocked(b) // allocated: a pod deleted before would leave its lock to the next bind
			deletePod(b, ns, high.Name)
			c.waitGone(b, key(low), key(high))
			b.StartTimer()
		}
	}
	b.ReportMetric(float64(percentile(lat, 99))/float64(time.Millisecond), "preempt-to-bound-p99-ms")
	b.ReportMetric(float64(percentile(lat, 50))/float64(time.Millisecond), "preempt-to-bound-p50-ms")
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// The schedulers compared, as start functions.

func startPluginDefault(tb testing.TB) *scheduler {
	tb.Helper()
	return startPlugin(tb, nil)
}

func startPluginSpread(tb testing.TB) *scheduler {
	tb.Helper()
	return startPlugin(tb, map[string]any{"nodeSchedulerPolicy": "spread"})
}

func startExtenderDefault(tb testing.TB) *scheduler {
	tb.Helper()
	return startExtender(tb)
}

func startExtenderSpread(tb testing.TB) *scheduler {
	tb.Helper()
	return startExtender(tb, "--node-scheduler-policy=spread")
}

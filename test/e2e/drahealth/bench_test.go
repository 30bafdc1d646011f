package drahealth_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"

	"github.com/hamireg/hamireg/test/e2e/harness"
)

// minSamples is the fewest XIDs a benchmark injects, whatever b.N: enough for a p99.
const minSamples = 100

// BenchmarkHealthToPodStatus measures, on the real peers, the time from an XID injected on a
// simulated GPU to the pod's status showing its device Unhealthy (a watch on the pod opened
// before the XID): through the DRA driver's health stream and the kubelet's DRA manager
// (dra), and through ListAndWatch and the kubelet's device manager (device-plugin). It
// reports health-to-pod-status-p50-ms and -p99-ms (goal: p99 < 2000) over max(b.N, 100)
// XIDs, each followed by the recovery (recovery-to-pod-status-p99-ms, from the step of the
// scanner's clock past the quiet period to Healthy). The dra case's baseline, in the same
// run, is the ResourceSlice taint that carried health before: health-to-slice-taint-p50-ms
// and -p99-ms, from the same XID to the slice watch showing the device's
// <driver>/unhealthy taint. ns/op is the mean time of one XID and its recovery.
func BenchmarkHealthToPodStatus(b *testing.B) {
	for _, path := range []string{"dra", "device-plugin"} {
		b.Run(path, func(b *testing.B) {
			n := startHealthNode(b)
			gpu, device := 2, "gpu-2"
			var name corev1.ResourceName
			var pod *corev1.Pod
			var id corev1.ResourceID
			if path == "dra" {
				name = draResourceName
				pod, id = n.claimPod(b, "bench", gpu)
			} else {
				gpu = dpGPU0
				name = harness.GPUResource
				pod, id = n.devicePluginPod(b, "bench", gpu)
			}
			samples := max(b.N, minSamples)
			var toPod, toSlice, toRecovered []time.Duration
			b.ResetTimer()
			start := time.Now()
			for range samples {
				pw := watchPod(b, pod.Namespace, pod.Name)
				var sliceAt chan time.Time
				if path == "dra" {
					sw := watchSlices(b, n.name, n.profile.Driver)
					sliceAt = make(chan time.Time, 1)
					go func() { sliceAt <- firstEvent(sw, harness.DRAWait, tainted(n.profile, device)) }()
				}
				t0 := time.Now()
				n.sim.XID(gpu, 79)
				_, at := until(b, pw, "the device Unhealthy in the pod's status", healthIs(name, id, corev1.ResourceHealthStatusUnhealthy))
				toPod = append(toPod, at.Sub(t0))
				if sliceAt != nil {
					at := <-sliceAt
					if at.IsZero() {
						b.Fatalf("no slice taint on %s within %v of the XID", device, harness.DRAWait)
					}
					toSlice = append(toSlice, at.Sub(t0))
				}

				pw = watchPod(b, pod.Namespace, pod.Name)
				t1 := time.Now()
				n.recover()
				_, at = until(b, pw, "the device Healthy again in the pod's status", healthIs(name, id, corev1.ResourceHealthStatusHealthy))
				toRecovered = append(toRecovered, at.Sub(t1))
			}
			b.StopTimer()
			b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(samples), "ns/op")
			b.ReportMetric(ms(percentile(toPod, 0.50)), "health-to-pod-status-p50-ms")
			b.ReportMetric(ms(percentile(toPod, 0.99)), "health-to-pod-status-p99-ms")
			b.ReportMetric(ms(percentile(toRecovered, 0.99)), "recovery-to-pod-status-p99-ms")
			if len(toSlice) > 0 {
				b.ReportMetric(ms(percentile(toSlice, 0.50)), "health-to-slice-taint-p50-ms")
				b.ReportMetric(ms(percentile(toSlice, 0.99)), "health-to-slice-taint-p99-ms")
			}
		})
	}
}

// firstEvent returns when the first slice satisfying cond arrived on w, or the zero time
// after timeout; it stops the watch. It does not fail the benchmark (it runs beside it).
func firstEvent(w *watcher, timeout time.Duration, cond func(*resourcev1.ResourceSlice) bool) time.Time {
	defer w.w.Stop()
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		select {
		case ev, ok := <-w.w.ResultChan():
			if !ok {
				return time.Time{}
			}
			at := time.Now()
			if s, ok := ev.Object.(*resourcev1.ResourceSlice); ok && cond(s) {
				return at
			}
		case <-t.C:
			return time.Time{}
		}
	}
}

// percentile is the q-quantile of d (nearest rank).
func percentile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		panic(fmt.Sprintf("percentile of no samples (q %v)", q))
	}
	s := slices.Sorted(slices.Values(d))
	i := int(float64(len(s))*q+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

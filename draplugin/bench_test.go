package draplugin

import (
	"fmt"
	"slices"
	"testing"
	"time"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
)

// BenchmarkClaimToPrepared measures what the kubelet waits for per claim: NodePrepareResources
// of one claim over the plugin's dra.sock (the helper GETs the claim from the fake clientset,
// the plugin writes the CDI spec and the checkpoint), 20 claims on one node sharing two GPUs.
// It reports the p50 and p99 of the calls in milliseconds.
func BenchmarkClaimToPrepared(b *testing.B) {
	const n = 20
	driver := testProfile().Driver
	claims := make([]*resourcev1.ResourceClaim, n)
	objs := make([]runtime.Object, n)
	for i := range claims {
		claims[i] = testClaim(fmt.Sprintf("bench-%02d", i), fmt.Sprintf("pod-%02d-main", i), driver, "2Gi", "5", fmt.Sprintf("gpu-%d", i%2))
		objs[i] = claims[i]
	}
	client := newClient(objs...)
	opts := testOptions(b, client)
	p := newPlugin(b, opts)
	p.SetDevices(testGPUs(), testDevices(b, opts.Profile, testGPUs()))
	run(b, p)
	node := dialPlugin(b, opts.PluginDir)
	refs := make([]*drapbv1.Claim, n)
	for i, c := range claims {
		refs[i] = &drapbv1.Claim{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)}
	}

	var lat []time.Duration
	b.ResetTimer()
	for range b.N {
		for _, ref := range refs {
			start := time.Now()
			resp, err := node.NodePrepareResources(b.Context(), &drapbv1.NodePrepareResourcesRequest{Claims: []*drapbv1.Claim{ref}})
			lat = append(lat, time.Since(start))
			if err != nil {
				b.Fatal(err)
			}
			if r := resp.Claims[ref.Uid]; r == nil || r.Error != "" || len(r.Devices) != 1 {
				b.Fatalf("claim %s: %v", ref.Uid, r)
			}
		}
		b.StopTimer()
		if _, err := node.NodeUnprepareResources(b.Context(), &drapbv1.NodeUnprepareResourcesRequest{Claims: refs}); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.StopTimer()
	slices.Sort(lat)
	q := func(f float64) float64 { return float64(lat[int(f*float64(len(lat)-1))]) / float64(time.Millisecond) }
	b.ReportMetric(q(0.50), "claim-to-prepared-p50-ms")
	b.ReportMetric(q(0.99), "claim-to-prepared-p99-ms")
}

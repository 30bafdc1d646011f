package schedplugin

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/hamireg/hamireg/extender"
	"github.com/hamireg/hamireg/schedcache"
)

// Collectors returns HAMi's scheduler metric families (hami_gpu_*, hami_node_gpu_*,
// hami_vgpu_*, hami_resource_quota_*, one set per configured vendor, and hami_build_info),
// computed at scrape time from the plugin's shared node cache and usage trackers with the
// extender's rules (extender.NewHAMiCollector). Every profile's plugin of one factory returns
// collectors of the same state: register one profile's, for example on kube-scheduler's
// k8s.io/component-base/metrics/legacyregistry.Registerer(), which its /metrics serves.
func (p *Plugin) Collectors() []prometheus.Collector {
	out := []prometheus.Collector{extender.NewBuildInfoCollector(extender.DefaultBuildInfo())}
	for i, vc := range p.s.vendors {
		out = append(out, extender.NewHAMiCollector(p.sh.cache, p.sh.trackers[i], extender.HAMiMetricsOptions{Vendor: vc.vendor.Name, Config: vc.cfg}))
	}
	return out
}

// NodeCache returns the node cache every profile's plugin shares, for the binary to run the
// leader-only handshake writer on it (schedcache.NewHandshaker, under a
// schedcache.LeaseFollower of kube-scheduler's Lease) unless HAMi's own scheduler writes the
// handshakes. The plugin itself never writes them. Read-only otherwise.
func (p *Plugin) NodeCache() *schedcache.Cache { return p.sh.cache }

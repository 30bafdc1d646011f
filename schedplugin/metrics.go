package schedplugin

import (
	"iter"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/schedcache"
	"github.com/hamireg/hamireg/usage"
)

// Collectors returns HAMi's scheduler metric families (hami_gpu_*, hami_node_gpu_*,
// hami_vgpu_*, hami_resource_quota_*, one set per configured vendor, and hami_build_info),
// computed at scrape time from the plugin's shared node cache and usage trackers by the same
// code as the extender's (usage.NewHAMiCollector). Every profile's plugin of one factory returns
// collectors of the same state: register one profile's, for example on kube-scheduler's
// k8s.io/component-base/metrics/legacyregistry.Registerer(), which its /metrics serves.
//
// The factory registers them on legacyregistry itself when it builds the shared state, and
// removes them when the last profile closes.
func (p *Plugin) Collectors() []prometheus.Collector { return p.sh.collectors() }

func (sh *shared) collectors() []prometheus.Collector {
	out := []prometheus.Collector{usage.NewBuildInfoCollector(usage.DefaultBuildInfo())}
	for i, vc := range sh.settings.vendors {
		nodes := func() iter.Seq2[string, []annotation.Device] { return sh.cache.Snapshot().Registered(vc.vendor.Name) }
		out = append(out, usage.NewHAMiCollector(sh.trackers[i], nodes,
			usage.MetricsOptions{Vendor: vc.vendor.Name, Config: vc.cfg, Legacy: sh.settings.legacyMetrics}))
	}
	return out
}

// NodeCache returns the node cache every profile's plugin shares (read-only). The plugin runs
// the handshake writer on it itself, as Args.Handshake says.
func (p *Plugin) NodeCache() *schedcache.Cache { return p.sh.cache }

package usage

import (
	"iter"
	"strings"
	"testing"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
)

// TestMetricsQuotaFamilies feeds the quota seam a fake: hami_resource_quota_used (and
// QuotaUsed) for every entry with the unscaled limit as a label, and in master
// hami_resource_quota_limit only for the entries whose limit is set.
func TestMetricsQuotaFamilies(t *testing.T) {
	t.Parallel()
	quotas := []QuotaUsage{
		{Namespace: "team-a", Resource: "nvidia.com/gpumem", Limit: 10000, LimitSet: true, Used: 8000},
		{Namespace: "team-b", Resource: "nvidia.com/gpucores", Used: 25},
	}
	used := []string{
		"# HELP hami_resource_quota_used resourcequota usage for a certain device",
		"# TYPE hami_resource_quota_used gauge",
		`hami_resource_quota_used{limit="0",namespace="team-b",quota_name="nvidia.com/gpucores",zone="vGPU"} 25`,
		`hami_resource_quota_used{limit="10000",namespace="team-a",quota_name="nvidia.com/gpumem",zone="vGPU"} 8000`,
	}
	limit := []string{
		"# HELP hami_resource_quota_limit resourcequota limit for a certain device",
		"# TYPE hami_resource_quota_limit gauge",
		`hami_resource_quota_limit{namespace="team-a",quota_name="nvidia.com/gpumem",zone="vGPU"} 10000`,
	}
	legacy := []string{
		"# HELP QuotaUsed resourcequota usage for a certain device",
		"# TYPE QuotaUsed gauge",
		`QuotaUsed{limit="0",quotaName="nvidia.com/gpucores",quotanamespace="team-b",zone="vGPU"} 25`,
		`QuotaUsed{limit="10000",quotaName="nvidia.com/gpumem",quotanamespace="team-a",zone="vGPU"} 8000`,
	}
	tests := map[string]struct {
		version allocation.Version
		legacy  bool
		want    []string
	}{
		"v2.9.0":        {version: allocation.VersionV290, want: used},
		"v2.9.0/legacy": {version: allocation.VersionV290, legacy: true, want: append(append([]string{}, legacy...), used...)},
		"master":        {version: allocation.VersionMaster, want: append(append([]string{}, limit...), used...)},
		"master/legacy": {version: allocation.VersionMaster, legacy: true, want: append(append(append([]string{}, legacy...), limit...), used...)},
	}
	noNodes := func() iter.Seq2[string, []annotation.Device] { return func(func(string, []annotation.Device) bool) {} }
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg := allocation.Config{Version: tc.version}
			c := NewHAMiCollector(New(Options{Config: cfg}), noNodes, MetricsOptions{Config: cfg, Legacy: tc.legacy}).(*hamiCollector)
			c.quotas = func() []QuotaUsage { return quotas }
			text, err := testutil.CollectAndFormat(c, expfmt.TypeTextPlain, "hami_resource_quota_used", "hami_resource_quota_limit", "QuotaUsed")
			if err != nil {
				t.Fatal(err)
			}
			got := strings.Split(strings.TrimSpace(string(text)), "\n")
			if diff := gocmp.Diff(tc.want, got); diff != "" {
				t.Errorf("quota families (-want +got):\n%s", diff)
			}
		})
	}
}

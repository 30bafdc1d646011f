package harness_test

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/utils/ptr"

	"github.com/hamireg/hamireg/test/e2e/harness"
)

// HAMiSchedulerConfig is examples/scheduler/deploy/config.yaml for a test: the two profiles,
// HAMiGPU's args with the given keys replaced and the others kept, backoff 1 s, no leader
// election.
func TestHAMiSchedulerConfig(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		args map[string]any
		want map[string]any
	}{
		"the file's args": {
			want: map[string]any{"gpuSchedulerPolicy": "spread", "nodeSchedulerPolicy": "binpack", "nodeLockWait": "10s", "handshake": map[string]any{"mode": "off"}},
		},
		"keys replaced, others kept": {
			args: map[string]any{"nodeSchedulerPolicy": "spread", "vendors": []map[string]any{{"name": "ACME", "resourceName": "acme.example/npu"}}},
			want: map[string]any{"gpuSchedulerPolicy": "spread", "nodeSchedulerPolicy": "spread", "nodeLockWait": "10s", "handshake": map[string]any{"mode": "off"},
				"vendors": []any{map[string]any{"name": "ACME", "resourceName": "acme.example/npu"}}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg := harness.HAMiSchedulerConfig(t, tc.args)
			if len(cfg.Profiles) != 2 || ptr.Deref(cfg.Profiles[0].SchedulerName, "") != "default-scheduler" ||
				ptr.Deref(cfg.Profiles[1].SchedulerName, "") != harness.HAMiSchedulerName {
				t.Fatalf("profiles %+v, want default-scheduler and %s", cfg.Profiles, harness.HAMiSchedulerName)
			}
			var got map[string]any
			for _, pc := range cfg.Profiles[1].PluginConfig {
				if pc.Name == harness.HAMiPluginName {
					if err := json.Unmarshal(pc.Args.Raw, &got); err != nil {
						t.Fatal(err)
					}
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("HAMiGPU args (-want +got):\n%s", diff)
			}
			if ptr.Deref(cfg.PodInitialBackoffSeconds, 0) != 1 || ptr.Deref(cfg.PodMaxBackoffSeconds, 0) != 1 || ptr.Deref(cfg.LeaderElection.LeaderElect, true) {
				t.Errorf("backoff %v/%v, leader election %v: want 1 s, 1 s, off", cfg.PodInitialBackoffSeconds, cfg.PodMaxBackoffSeconds, cfg.LeaderElection.LeaderElect)
			}
		})
	}
}

package extender

import (
	"encoding/json"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/hamireg/hamireg/allocation"
)

// TestFilterInvalidScoringWeights: a GPU pod whose hami.io/device-scoring-weights does not
// parse gets HAMi's "calcScore failed … for pod <name>" from /filter (HTTP 200, no failed
// node, no write) and one Warning FilteringFailed Event; a simulation request (Nodes) gets the
// error without an Event; a pod without device requests, and v2.9.0 rules, ignore the value.
func TestFilterInvalidScoringWeights(t *testing.T) {
	t.Parallel()
	const bad = "slot=1,core=1"
	const msg = `calcScore failed invalid hami.io/device-scoring-weights annotation "slot=1,core=1": expected slot, core, and memory weights for pod p`
	withWeights := func(p *corev1.Pod) *corev1.Pod {
		p.Annotations = map[string]string{allocation.KeyDeviceScoringWeights: bad}
		return p
	}
	t.Run("filter", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			p := withWeights(gpuPod("p", map[string]string{"nvidia.com/gpu": "1"}))
			e := start(t, Options{}, registered("n", 1, 23028), p)
			e.client.ClearActions()
			raw, _ := json.Marshal(map[string]any{"Pod": p, "NodeNames": []string{"n"}})
			status, body := serve(e.ctx, e.ext.Handler(), "POST", PathFilter, string(raw))
			var res extenderFilterResult
			if err := json.Unmarshal([]byte(body), &res); err != nil || status != 200 || res.Error != msg || res.NodeNames != nil || len(res.FailedNodes) > 0 {
				t.Errorf("status %d, body %s; want 200 with Error %q only", status, body, msg)
			}
			if w := e.writes(); len(w) > 0 {
				t.Errorf("writes %q, want none", w)
			}
			if diff := cmp.Diff([]string{"Warning FilteringFailed " + msg}, e.events()); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
		})
	})
	t.Run("simulation", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			p := withWeights(gpuPod("p", map[string]string{"nvidia.com/gpu": "1"}))
			n := registered("n", 1, 23028)
			e := start(t, Options{}, n, p)
			e.client.ClearActions()
			res := e.ext.Filter(e.ctx, &extenderArgs{Pod: p, Nodes: &corev1.NodeList{Items: []corev1.Node{*n}}})
			if res.Error != msg || res.Nodes != nil || len(res.FailedNodes) > 0 {
				t.Errorf("result %+v, want Error %q only", res, msg)
			}
			if ev, w := e.events(), e.writes(); len(ev)+len(w) > 0 {
				t.Errorf("events %q, writes %q; want none", ev, w)
			}
		})
	})
	for name, tc := range map[string]struct {
		opts Options
		pod  *corev1.Pod
	}{
		"no device request": {pod: withWeights(gpuPod("p", map[string]string{"cpu": "1"}))},
		"v2.9.0":            {opts: Options{Config: allocation.Config{Version: allocation.VersionV290}}, pod: withWeights(gpuPod("p", map[string]string{"nvidia.com/gpu": "1"}))},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				e := start(t, tc.opts, registered("n", 1, 23028), tc.pod)
				res := e.filter(tc.pod, "n")
				if res.Error != "" || res.NodeNames == nil || len(*res.NodeNames) != 1 {
					t.Errorf("result %+v, want node n", res)
				}
				for _, ev := range e.events() {
					if strings.Contains(ev, "calcScore") {
						t.Errorf("event %q", ev)
					}
				}
			})
		})
	}
}

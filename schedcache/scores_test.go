package schedcache

import (
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/hamireg/hamireg/annotation"
)

// TestPairScores: the score annotation reaches the registration parallel to its devices; a
// malformed one keeps the node registered without scores, with the error classified and one
// Warning Event per value; a later good value brings the scores back.
func TestPairScores(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		node := gpuNode("n", 2, 20, requesting(t0.Add(-10*time.Second)))
		devs := devices(2, "n")
		good := annotation.EncodePairScores([]annotation.PairScore{
			{UUID: devs[1].ID, Scores: map[string]int{devs[0].ID: 420}},
			{UUID: "GPU-unknown", Scores: map[string]int{devs[0].ID: 1}},
		})
		node.Annotations[annotation.KeyNVIDIAScore] = good
		e := start(t, Options{}, node)
		e.waitState("n", StateRegistered)
		reg := func() Registration {
			n, _ := e.cache.Node("n")
			return n.Registrations[0]
		}
		if diff := cmp.Diff([]map[string]int{nil, {devs[0].ID: 420}}, reg().PairScores); diff != "" {
			t.Fatalf("PairScores (-want +got):\n%s", diff)
		}

		e.update("n", func(n *corev1.Node) { n.Annotations[annotation.KeyNVIDIAScore] = `[{"uuid":"x","score":{"y":"high"}}]` })
		e.until("the malformed scores", func() bool { return reg().ScoreErr != nil })
		r := reg()
		if r.State != StateRegistered || len(r.Devices) != 2 || r.PairScores != nil || !errors.Is(r.ScoreErr, annotation.ErrMalformed) {
			t.Fatalf("registration = %+v, want registered, 2 devices, no scores, ErrMalformed", r)
		}
		if e.cache.Snapshot().Len() != 1 {
			t.Error("the node left the snapshot's registered nodes")
		}
		// Another change of the Node (not of its annotations) neither decodes nor warns again.
		e.update("n", func(n *corev1.Node) { n.Labels["other"] = "x" })
		e.update("n", func(n *corev1.Node) { n.Annotations[annotation.KeyNVIDIAScore] = good })
		e.until("the good scores", func() bool { return reg().ScoreErr == nil })
		if len(reg().PairScores) != 2 {
			t.Errorf("PairScores = %v after a good value", reg().PairScores)
		}
		reasons := e.events()
		if len(reasons) != 1 || !strings.HasPrefix(reasons[0], corev1.EventTypeWarning+" "+ReasonScoreMalformed+" ") {
			t.Errorf("events = %q, want one %s", reasons, ReasonScoreMalformed)
		}
		if !e.logs.has("failed to decode pair scores; the node stays registered without topology scores", -1) {
			t.Errorf("no error log in\n%s", e.logs)
		}
	})
}

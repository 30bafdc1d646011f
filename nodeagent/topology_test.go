package nodeagent_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/kubeletplugin"
	"github.com/hamireg/hamireg/kubeletplugin/kubelettest"
	"github.com/hamireg/hamireg/nodeagent"
)

// scoringSource is a source that also scores its devices: 420 for every pair.
type scoringSource struct {
	*source
	mu       sync.Mutex
	err      error
	warnings []error
}

func (s *scoringSource) PairScores(_ context.Context, devs []annotation.Device) ([]annotation.PairScore, []error, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return nil, nil, s.err
	}
	return allPairs(devs), s.warnings, nil
}

func allPairs(devs []annotation.Device) []annotation.PairScore {
	out := make([]annotation.PairScore, len(devs))
	for i, d := range devs {
		m := map[string]int{}
		for _, p := range devs {
			if p.ID != d.ID {
				m[p.ID] = 420
			}
		}
		out[i] = annotation.PairScore{UUID: d.ID, Scores: m}
	}
	return out
}

func scoreAnnotation(t *testing.T, cs *fake.Clientset) (string, bool) {
	t.Helper()
	n, err := cs.CoreV1().Nodes().Get(t.Context(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	v, ok := n.Annotations[annotation.KeyNVIDIAScore]
	return v, ok
}

// TestTopologyScores: with Options.TopologyScores the scores reach the Node with the
// register annotation; a failed scoring still publishes the devices (with an Event), and an
// asymmetric-link warning is recorded as AsymmetricGPUP2PLink.
func TestTopologyScores(t *testing.T) {
	t.Parallel()
	cs := newClientset()
	k := kubelettest.Start(t)
	src := &scoringSource{source: newSource(gpus(2))}
	rec := record.NewFakeRecorder(10)
	_, ctx := ktesting.NewTestContext(t)
	a, err := nodeagent.New(cs, node, src, nodeagent.Options{Period: time.Hour, TopologyScores: true,
		Kubelet: kubeletplugin.Options{PluginDir: k.Dir()}, EventRecorder: rec})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})

	waitFor(t, "both annotations", func() bool {
		v, _ := scoreAnnotation(t, cs)
		return nodeAnnotation(t, cs) == annotation.Encode(gpus(2)) && v == annotation.EncodePairScores(allPairs(gpus(2)))
	})

	src.mu.Lock()
	src.err = errors.New("error getting topology for devices (0, 1): get nvlink state of link 1: ERROR_UNKNOWN")
	src.mu.Unlock()
	src.update(func(s *source) { s.devs = gpus(3) })
	waitFor(t, "the new devices without scores", func() bool { return nodeAnnotation(t, cs) == annotation.Encode(gpus(3)) })
	if v, _ := scoreAnnotation(t, cs); v != annotation.EncodePairScores(allPairs(gpus(2))) {
		t.Errorf("score annotation %s, want the last one kept", v)
	}
	wantEvent(t, rec, "Warning "+nodeagent.EventReasonTopologyFailed+" ")

	src.mu.Lock()
	src.err, src.warnings = nil, []error{errors.New("GPU GPU-0 sees 2 P2P link(s) to GPU GPU-1, which sees 1 back")}
	src.mu.Unlock()
	src.update(func(*source) {})
	waitFor(t, "the scores back", func() bool {
		v, _ := scoreAnnotation(t, cs)
		return v == annotation.EncodePairScores(allPairs(gpus(3)))
	})
	wantEvent(t, rec, "Warning "+nodeagent.EventReasonAsymmetricLink+" GPU GPU-0 sees 2")
}

func wantEvent(t *testing.T, rec *record.FakeRecorder, prefix string) {
	t.Helper()
	select {
	case e := <-rec.Events:
		if !strings.HasPrefix(e, prefix) {
			t.Errorf("event %q, want %q…", e, prefix)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("no event %q", prefix)
	}
}

func TestTopologyScoresNeedsASource(t *testing.T) {
	t.Parallel()
	_, err := nodeagent.New(newClientset(), node, newSource(gpus(1)), nodeagent.Options{TopologyScores: true})
	if !errors.Is(err, nodeagent.ErrInvalidOptions) {
		t.Errorf("err = %v, want ErrInvalidOptions", err)
	}
}

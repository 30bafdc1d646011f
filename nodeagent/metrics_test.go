package nodeagent

import (
	"errors"
	"testing"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/clienttest"
)

// TestMetrics: with Options.Registerer the agent counts served containers, refusals by kind,
// scans and device annotations that do not decode, and the register writer's writes land on
// the same Registerer.
func TestMetrics(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	ok, bad := gpuPod("ok", "main"), gpuPod("bad", "main")
	f := newFixture(t, Options{Registerer: reg}, ok, bad)
	f.schedule(t, ok, allocation.PodDevices{{dev(0, 1000, 30)}})
	if _, err := f.call("GPU-0-0"); err != nil {
		t.Fatal(err)
	}
	f.schedule(t, bad, allocation.PodDevices{{dev(1, 1000, 30)}})
	if err := f.agent.patchPod(f.ctx, types.NamespacedName{Namespace: "default", Name: "bad"},
		map[string]string{annotation.KeyNVIDIAToAllocate: "GPU-1,NVIDIA,lots,30:;"}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.call("GPU-1-0"); err == nil {
		t.Fatal("Allocate of a malformed annotation succeeded")
	}
	m := f.agent.metrics
	got := map[string]float64{
		"allocations":      testutil.ToFloat64(m.allocations),
		"errors/malformed": testutil.ToFloat64(m.allocateErrors.WithLabelValues("malformed")),
		"errors/api":       testutil.ToFloat64(m.allocateErrors.WithLabelValues("api")),
		"decode failures":  testutil.ToFloat64(m.decodeFailures),
		"scan errors":      testutil.ToFloat64(m.scans.WithLabelValues("error")),
	}
	want := map[string]float64{"allocations": 1, "errors/malformed": 1, "errors/api": 0, "decode failures": 1, "scan errors": 0}
	if diff := gocmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if n := testutil.ToFloat64(m.scans.WithLabelValues("ok")); n < 1 {
		t.Errorf("scans ok = %v, want ≥ 1", n)
	}
	names := map[string]bool{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	for _, n := range []string{"hamireg_nodeagent_allocations_total", "hamireg_nodeagent_allocate_errors_total", "hamireg_register_writes_total"} {
		if !names[n] {
			t.Errorf("no family %s in %v", n, names)
		}
	}
}

// TestMetricsRegistererConflict: a second agent of the vendor on one Registerer is refused.
func TestMetricsRegistererConflict(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	cs := clienttest.NewClientset()
	if _, err := New(cs, testNode, staticSource(testGPUs()), Options{Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	if _, err := New(cs, testNode, staticSource(testGPUs()), Options{Registerer: reg}); !errors.Is(err, ErrInvalidOptions) {
		t.Fatalf("second agent: %v, want ErrInvalidOptions", err)
	}
}

func TestKindOf(t *testing.T) {
	t.Parallel()
	for _, k := range allocateKinds {
		if got := kindOf(&AllocateError{Kind: k.err}); got != k.name {
			t.Errorf("kindOf(%v) = %q, want %q", k.err, got, k.name)
		}
	}
	if got := kindOf(errors.New("x")); got != "other" {
		t.Errorf("kindOf(other) = %q", got)
	}
}

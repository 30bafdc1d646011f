package register_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/register"
)

func TestNew(t *testing.T) {
	t.Parallel()
	cs := newClientset()
	tests := map[string]struct {
		client  *fake.Clientset
		node    string
		opts    register.Options
		wantErr error
		wantKey string
	}{
		"defaults":           {client: cs, node: "gpu-1", wantKey: annotation.KeyNVIDIARegister},
		"ascend vendor":      {client: cs, node: "gpu-1", opts: register.Options{Vendor: annotation.Ascend("Ascend910B3")}, wantKey: "hami.io/node-register-Ascend910B3"},
		"v2.9.0 shape":       {client: cs, node: "gpu-1", opts: register.Options{Shape: annotation.ShapeV290}, wantKey: annotation.KeyNVIDIARegister},
		"nil client":         {node: "gpu-1", wantErr: register.ErrInvalidOptions},
		"empty node name":    {client: cs, wantErr: register.ErrNoNodeName},
		"invalid node name":  {client: cs, node: "GPU_1", wantErr: register.ErrInvalidNodeName},
		"negative retry":     {client: cs, node: "gpu-1", opts: register.Options{RetryInitial: -time.Second}, wantErr: register.ErrInvalidOptions},
		"retry min over max": {client: cs, node: "gpu-1", opts: register.Options{RetryInitial: 10 * time.Second}, wantErr: register.ErrInvalidOptions},
		"capacity vendor":    {client: cs, node: "gpu-1", opts: register.Options{Vendor: annotation.Vendor{Name: "Metax", Format: annotation.FormatCapacity}}, wantErr: register.ErrInvalidOptions},
		"legacy vendor":      {client: cs, node: "gpu-1", opts: register.Options{Vendor: annotation.Iluvatar("BI-V150")}, wantKey: "hami.io/node-BI-V150-register"},
		"vendor format":      {client: cs, node: "gpu-1", opts: register.Options{Vendor: annotation.Vendor{Name: "Metax-SGPU", RegisterKey: "metax-tech.com/node-gpu-devices", Format: annotation.FormatVendorSpecific}}, wantErr: annotation.ErrIncompleteVendor},
		"unknown shape":      {client: cs, node: "gpu-1", opts: register.Options{Shape: 7}, wantErr: register.ErrInvalidOptions},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var w *register.Writer
			var err error
			if tc.client == nil {
				w, err = register.New(nil, tc.node, tc.opts)
			} else {
				w, err = register.New(tc.client, tc.node, tc.opts)
			}
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("New: error %v, want %v", err, tc.wantErr)
			}
			if err != nil {
				return
			}
			if w.Key() != tc.wantKey || w.NodeName() != tc.node {
				t.Errorf("Key, NodeName = %q, %q; want %q, %q", w.Key(), w.NodeName(), tc.wantKey, tc.node)
			}
		})
	}
}

func TestSync(t *testing.T) {
	t.Parallel()
	devs := gpus(8)
	tests := map[string]struct {
		annotations map[string]string
		opts        register.Options
		wantValue   string
		wantPatches int
	}{
		"first write keeps other annotations": {
			annotations: map[string]string{"other": "x"},
			wantValue:   want(devs),
			wantPatches: 1,
		},
		"value already on the node is adopted without a write": {
			annotations: map[string]string{annotation.KeyNVIDIARegister: want(devs)},
			wantValue:   want(devs),
		},
		"hand-edited value is rewritten": {
			annotations: map[string]string{annotation.KeyNVIDIARegister: `[{"id":"GPU-stale"}]`},
			wantValue:   want(devs),
			wantPatches: 1,
		},
		"v2.9.0 shape": {
			opts:        register.Options{Shape: annotation.ShapeV290},
			wantValue:   annotation.EncodeShape(annotation.Canonical(devs), annotation.ShapeV290),
			wantPatches: 1,
		},
		"other vendor key": {
			opts:        register.Options{Vendor: annotation.Ascend("Ascend910B3")},
			wantValue:   want(devs),
			wantPatches: 1,
		},
		"legacy format (DCU, Iluvatar)": {
			opts:        register.Options{Vendor: annotation.Iluvatar("BI-V150")},
			wantValue:   annotation.EncodeLegacy(annotation.Canonical(devs)),
			wantPatches: 1,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, ctx := ktesting.NewTestContext(t)
			cs := newClientset(newNode(tc.annotations))
			w, err := newWriter(cs, devs, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			// Random device order on every scan (the source shuffles): never a second write.
			for range 5 {
				if err := w.Sync(ctx); err != nil {
					t.Fatalf("Sync: %v", err)
				}
			}
			if got := count(cs, "patch"); got != tc.wantPatches {
				t.Errorf("patches = %d, want %d", got, tc.wantPatches)
			}
			got, _ := nodeAnnotation(t, cs, w.Key())
			if got != tc.wantValue {
				t.Errorf("annotation:\n got %s\nwant %s", got, tc.wantValue)
			}
			if v, _ := nodeAnnotation(t, cs, "other"); tc.annotations["other"] != v {
				t.Errorf("other annotation = %q, want %q", v, tc.annotations["other"])
			}
			s := w.Stats()
			if s.Writes != uint64(tc.wantPatches) || s.NoOps != uint64(5-tc.wantPatches) || s.Failures != 0 || s.LastError != nil {
				t.Errorf("Stats = %+v", s)
			}
		})
	}
}

// The patch is a JSON merge patch of the writer's own key and nothing else.
func TestSyncPatchBody(t *testing.T) {
	t.Parallel()
	_, ctx := ktesting.NewTestContext(t)
	cs := newClientset(newNode(nil))
	w, err := newWriter(cs, gpus(2), register.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	var patch k8stesting.PatchAction
	for _, a := range cs.Actions() {
		if p, ok := a.(k8stesting.PatchAction); ok {
			patch = p
		}
	}
	if patch == nil {
		t.Fatal("no patch sent")
	}
	if patch.GetPatchType() != types.MergePatchType {
		t.Errorf("patch type %s, want %s", patch.GetPatchType(), types.MergePatchType)
	}
	var body map[string]any
	if err := json.Unmarshal(patch.GetPatch(), &body); err != nil {
		t.Fatal(err)
	}
	wantBody := map[string]any{"metadata": map[string]any{"annotations": map[string]any{annotation.KeyNVIDIARegister: want(gpus(2))}}}
	if d := cmp.Diff(wantBody, body); d != "" {
		t.Errorf("patch body (-want +got):\n%s", d)
	}
}

// HAMi caches the new value before the patch and never retries a failed one (spec §13.1).
// The writer remembers only what the API server accepted.
func TestSyncFailedWriteIsNotCached(t *testing.T) {
	t.Parallel()
	_, ctx := ktesting.NewTestContext(t)
	cs := newClientset(newNode(nil))
	failPatches(cs, 1, apierrors.NewServiceUnavailable("etcd leader changed"))
	w, err := newWriter(cs, gpus(4), register.Options{})
	if err != nil {
		t.Fatal(err)
	}
	err = w.Sync(ctx)
	if !errors.Is(err, register.ErrAPI) || !apierrors.IsServiceUnavailable(err) {
		t.Fatalf("first Sync: %v, want ErrAPI wrapping ServiceUnavailable", err)
	}
	if s := w.Stats(); s.Failures != 1 || !errors.Is(s.LastError, register.ErrAPI) {
		t.Errorf("Stats after failure = %+v", s)
	}
	if _, ok := nodeAnnotation(t, cs, annotation.KeyNVIDIARegister); ok {
		t.Fatal("annotation written although the patch failed")
	}
	if err := w.Sync(ctx); err != nil {
		t.Fatalf("second Sync: %v", err)
	}
	if got, _ := nodeAnnotation(t, cs, annotation.KeyNVIDIARegister); got != want(gpus(4)) {
		t.Errorf("annotation after retry = %s", got)
	}
	if s := w.Stats(); s.Writes != 1 || s.LastError != nil {
		t.Errorf("Stats after retry = %+v", s)
	}
}

func TestSyncErrors(t *testing.T) {
	t.Parallel()
	nodes := schema.GroupResource{Resource: "nodes"}
	tests := map[string]struct {
		node      *corev1.Node
		patchErr  error
		noSet     bool
		wantIs    []error
		wantMsg   []string
		wantUser  string
		wantEvent bool
	}{
		"forbidden service account": {
			node:      newNode(nil),
			patchErr:  apierrors.NewForbidden(nodes, "gpu-1", errors.New(`User "system:serviceaccount:kube-system:hami-device-plugin" cannot patch resource "nodes" in API group "" at the cluster scope`)),
			wantIs:    []error{register.ErrForbidden},
			wantMsg:   []string{"ServiceAccount kube-system/hami-device-plugin may not patch nodes", "kubectl auth can-i patch nodes --as=system:serviceaccount:kube-system:hami-device-plugin"},
			wantUser:  "system:serviceaccount:kube-system:hami-device-plugin",
			wantEvent: true,
		},
		"forbidden user": {
			node:      newNode(nil),
			patchErr:  apierrors.NewForbidden(nodes, "gpu-1", errors.New(`User "alice" cannot patch resource "nodes" in API group "" at the cluster scope`)),
			wantIs:    []error{register.ErrForbidden},
			wantMsg:   []string{`user "alice" may not patch nodes`, "kubectl auth can-i patch nodes --as=alice"},
			wantUser:  "alice",
			wantEvent: true,
		},
		"forbidden without a user": {
			node:      newNode(nil),
			patchErr:  apierrors.NewForbidden(nodes, "gpu-1", errors.New("denied by webhook")),
			wantIs:    []error{register.ErrForbidden},
			wantMsg:   []string{"kubectl auth can-i patch nodes --as=system:serviceaccount:NAMESPACE:NAME"},
			wantEvent: true,
		},
		"node deleted before the patch": {
			node:      newNode(nil),
			patchErr:  apierrors.NewNotFound(nodes, "gpu-1"),
			wantIs:    []error{register.ErrNodeNotFound},
			wantEvent: true,
		},
		"conflict": {
			node:      newNode(nil),
			patchErr:  apierrors.NewConflict(nodes, "gpu-1", errors.New("try again")),
			wantIs:    []error{register.ErrAPI},
			wantEvent: true,
		},
		"no node": {
			wantIs:  []error{register.ErrNodeNotFound},
			wantMsg: []string{`get node "gpu-1": node not found`},
		},
		"no devices set yet": {
			node:    newNode(nil),
			noSet:   true,
			wantIs:  []error{register.ErrNoDevices},
			wantMsg: []string{`sync register annotation of node "gpu-1": no devices set`},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, ctx := ktesting.NewTestContext(t)
			cs := newClientset()
			if tc.node != nil {
				cs = newClientset(tc.node)
			}
			if tc.patchErr != nil {
				failPatches(cs, -1, tc.patchErr)
			}
			rec := record.NewFakeRecorder(10)
			w, err := register.New(cs, "gpu-1", register.Options{EventRecorder: rec})
			if err != nil {
				t.Fatal(err)
			}
			if !tc.noSet {
				w.SetDevices(gpus(1))
			}
			err = w.Sync(ctx)
			if err == nil {
				t.Fatal("Sync succeeded, want an error")
			}
			for _, target := range tc.wantIs {
				if !errors.Is(err, target) {
					t.Errorf("errors.Is(%v, %v) = false", err, target)
				}
			}
			if tc.patchErr != nil && !errors.Is(err, tc.patchErr) {
				t.Errorf("error %v does not wrap the API error", err)
			}
			for _, m := range tc.wantMsg {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error %q does not contain %q", err, m)
				}
			}
			if we, ok := errors.AsType[*register.WriteError](err); ok && we.User != tc.wantUser {
				t.Errorf("User = %q, want %q", we.User, tc.wantUser)
			}
			failures := uint64(1)
			if tc.noSet {
				failures = 0 // a caller's mistake, not a failed sync
			}
			if s := w.Stats(); s.Failures != failures || s.LastError == nil {
				t.Errorf("Stats = %+v", s)
			}
			select {
			case e := <-rec.Events:
				if !tc.wantEvent {
					t.Errorf("unexpected event %q", e)
				} else if !strings.HasPrefix(e, "Warning "+register.EventReasonFailed+" ") {
					t.Errorf("event %q, want a Warning %s", e, register.EventReasonFailed)
				}
			default:
				if tc.wantEvent {
					t.Error("no event recorded")
				}
			}
		})
	}
}

func TestSyncLogs(t *testing.T) {
	t.Parallel()
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true), ktesting.Verbosity(3)))
	ctx := klog.NewContext(t.Context(), logger)
	cs := newClientset(newNode(nil))
	w, err := newWriter(cs, gpus(8), register.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := w.Sync(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// The exact text and level of HAMi's lines: operators grep for them.
	levels := map[string]int{}
	for _, e := range logger.GetSink().(ktesting.Underlier).GetBuffer().Data() {
		if _, seen := levels[e.Message]; !seen {
			levels[e.Message] = e.Verbosity
		}
	}
	for msg, level := range map[string]int{
		"Updating node annotations with 8 device(s)":        0,
		"Device info unchanged, skipping annotation update": 3,
	} {
		if got, ok := levels[msg]; !ok || got != level {
			t.Errorf("log line %q: logged %v at V(%d), want V(%d)", msg, ok, got, level)
		}
	}
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	_, ctx := ktesting.NewTestContext(t)
	cs := newClientset(newNode(nil))
	failPatches(cs, 1, apierrors.NewForbidden(schema.GroupResource{Resource: "nodes"}, "gpu-1", errors.New("no")))
	reg := prometheus.NewPedanticRegistry()
	w, err := newWriter(cs, gpus(2), register.Options{Registerer: reg, EventRecorder: &record.FakeRecorder{}})
	if err != nil {
		t.Fatal(err)
	}
	_ = w.Sync(ctx) // forbidden
	_ = w.Sync(ctx) // write
	_ = w.Sync(ctx) // no-op

	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			name := f.GetName()
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" {
					name += "{" + l.GetValue() + "}"
				} else if l.GetName() != "vendor" || l.GetValue() != "NVIDIA" {
					t.Errorf("%s: unexpected label %s=%s", f.GetName(), l.GetName(), l.GetValue())
				}
			}
			got[name] = m.GetCounter().GetValue()
		}
	}
	wantMetrics := map[string]float64{
		"hamireg_register_writes_total":                   1,
		"hamireg_register_heals_total":                    0,
		"hamireg_register_noops_total":                    1,
		"hamireg_register_failures_total{forbidden}":      1,
		"hamireg_register_failures_total{node_not_found}": 0,
		"hamireg_register_failures_total{api}":            0,
	}
	if d := cmp.Diff(wantMetrics, got); d != "" {
		t.Errorf("metrics (-want +got):\n%s", d)
	}

	// A second writer for the same vendor on the same registry is refused, the first keeps
	// its counters; another vendor is fine.
	if _, err := register.New(cs, "gpu-1", register.Options{Registerer: reg}); err == nil {
		t.Error("second writer for the same vendor registered its metrics")
	}
	if _, err := register.New(cs, "gpu-1", register.Options{Registerer: reg, Vendor: annotation.Ascend("Ascend910B3")}); err != nil {
		t.Errorf("writer for another vendor: %v", err)
	}
}

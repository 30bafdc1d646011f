package schedcache

import (
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/handshake"
)

func withRegister(n *corev1.Node, value string) *corev1.Node {
	n.Annotations[annotation.KeyNVIDIARegister] = value
	return n
}

func TestStates(t *testing.T) {
	t.Parallel()
	const truncated = `[{"id":"GPU-a","count":10,"devmem":23028`
	valid := annotation.Encode(devices(1, "v"))
	tests := map[string]struct {
		node      *corev1.Node
		opts      Options
		want      State
		wantErr   error
		wantLog   string
		wantLevel int
		wantEvent string // reason; "" means no Event
		wantPatch bool
	}{
		"registered, first sighting stamps the handshake": {
			node: gpuNode("n", 8, 80, ""), want: StateRegistered, wantPatch: true,
			wantLog: "Processing node", wantLevel: 5,
		},
		"registered, fresh handshake": {
			node: gpuNode("n", 8, 80, requesting(t0.Add(-10*time.Second))), want: StateRegistered,
		},
		"registered, expired handshake with allocatable": {
			node: gpuNode("n", 8, 80, requesting(t0.Add(-120*time.Second))), want: StateRegistered,
		},
		"annotation absent": {
			node: func() *corev1.Node {
				n := gpuNode("n", 8, 80, "")
				delete(n.Annotations, annotation.KeyNVIDIARegister)
				return n
			}(),
			want: StateAbsent, wantErr: annotation.ErrAbsent, wantLog: "Failed to get node devices", wantLevel: 5,
		},
		"truncated JSON": {
			node: withRegister(gpuNode("n", 8, 80, ""), truncated), want: StateMalformed, wantErr: annotation.ErrMalformed,
			wantLog: "failed to decode node devices", wantLevel: -1, wantEvent: ReasonRegisterMalformed,
		},
		"wrong type": {
			node: withRegister(gpuNode("n", 8, 80, ""), `{"id":"GPU-a"}`), want: StateMalformed, wantErr: annotation.ErrMalformed,
			wantLog: "failed to decode node devices", wantLevel: -1, wantEvent: ReasonRegisterMalformed,
		},
		"empty list": {
			node: withRegister(gpuNode("n", 8, 80, ""), `[]`), want: StateNoDevices, wantErr: annotation.ErrNoDevices,
			wantLog: "no nvidia gpu device found", wantLevel: 0, wantEvent: ReasonRegisterEmpty,
		},
		"null": {
			node: withRegister(gpuNode("n", 8, 80, ""), `null`), want: StateNoDevices, wantErr: annotation.ErrNoDevices,
			wantLog: "no nvidia gpu device found", wantLevel: 0, wantEvent: ReasonRegisterEmpty,
		},
		"null element (HAMi crashes)": {
			node: withRegister(gpuNode("n", 8, 80, ""), `[null]`), want: StateInvalidElement, wantErr: annotation.ErrInvalidElement,
			wantLog: "failed to decode node devices", wantLevel: -1, wantEvent: ReasonRegisterInvalid,
		},
		"null element among devices": {
			node: withRegister(gpuNode("n", 8, 80, ""), `[null,`+strings.TrimPrefix(valid, "[")), want: StateInvalidElement,
			wantErr: annotation.ErrInvalidElement, wantLog: "failed to decode node devices", wantLevel: -1, wantEvent: ReasonRegisterInvalid,
		},
		// Deliberate difference: HAMi drops the node ("failed to decode pair scores"); here it
		// stays registered without scores, logged and evented once (TestMalformedScores).
		"malformed topology score keeps the node": {
			node: func() *corev1.Node {
				n := gpuNode("n", 8, 80, requesting(t0.Add(-10*time.Second)))
				n.Annotations[annotation.KeyNVIDIAScore] = `[{"uuid":1}]`
				return n
			}(),
			want: StateRegistered, wantLog: "failed to decode pair scores; the node stays registered without topology scores", wantLevel: -1,
			wantEvent: ReasonScoreMalformed,
		},
		"unhealthy: handshake expired and allocatable 0": {
			node: gpuNode("n", 8, 0, requesting(t0.Add(-120*time.Second))), want: StateUnhealthy, wantErr: ErrUnhealthy,
		},
		"unhealthy: allocatable 0 is not added by a fresh stamp": {
			node: gpuNode("n", 8, 0, ""), want: StateUnhealthy, wantErr: ErrUnhealthy, wantPatch: true,
		},
		"excluded by selector": {
			node: gpuNode("n", 8, 80, ""), opts: Options{NodeSelector: labels.SelectorFromSet(labels.Set{"gpu": "off"})},
			want: StateExcluded, wantErr: ErrExcluded, wantLog: "Using label selector for list nodes", wantLevel: 0,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				e := start(t, tc.opts, tc.node)
				e.waitState("n", tc.want)
				n, _ := e.cache.Node("n")
				r := n.Registrations[0]
				if !errors.Is(r.Err, tc.wantErr) || (tc.wantErr == nil) != (r.Err == nil) {
					t.Errorf("Err = %v, want %v", r.Err, tc.wantErr)
				}
				if (r.State == StateRegistered) != (len(r.Devices) > 0) || (r.State == StateRegistered) != n.Registered() {
					t.Errorf("state %s with %d devices, Registered() = %v", r.State, len(r.Devices), n.Registered())
				}
				snap := e.cache.Snapshot()
				if inAll := snap.Len() == 1; inAll != (tc.want == StateRegistered) {
					t.Errorf("among the snapshot's registered nodes = %v, want %v", inAll, tc.want == StateRegistered)
				}
				// The snapshot explains the node from the same point in time.
				if sn, ok := snap.Node("n"); !ok || sn.Registrations[0].State != tc.want || sn.Registrations[0].Reason != r.Reason {
					t.Errorf("snapshot's node = %+v, %v; want state %s, reason %q", sn, ok, tc.want, r.Reason)
				}
				if tc.wantLog != "" && !e.logs.has(tc.wantLog, tc.wantLevel) {
					t.Errorf("no log %q at level %d in\n%s", tc.wantLog, tc.wantLevel, e.logs)
				}
				if tc.wantPatch {
					e.until("the stamp", func() bool { return e.cache.Stats().Stamps == 1 })
					if hs, _ := e.handshakeOf("n"); hs != requesting(t0) {
						t.Errorf("handshake = %q, want %q", hs, requesting(t0))
					}
				} else if p := e.patches(); len(p) != 0 {
					t.Errorf("patches = %q, want none", p)
				}
				var reasons []string
				for _, ev := range e.events() {
					reasons = append(reasons, strings.Fields(ev)[1])
					if !strings.HasPrefix(ev, corev1.EventTypeWarning+" ") {
						t.Errorf("event %q is not a Warning", ev)
					}
				}
				var want []string
				if tc.wantEvent != "" {
					want = []string{tc.wantEvent}
				}
				if diff := cmp.Diff(want, reasons); diff != "" {
					t.Errorf("event reasons (-want +got):\n%s", diff)
				}
			})
		})
	}
}

// TestChangedAnnotationVisibleWithoutTick: a new register annotation with the same allocatable
// count is loaded from the update event, without a tick (HAMi v2.9.0 never loads it).
func TestChangedAnnotationVisibleWithoutTick(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := start(t, Options{}, gpuNode("n", 8, 80, requesting(t0)))
		e.waitState("n", StateRegistered)
		decodes := e.cache.Stats().Decodes
		devs := devices(8, "n")
		devs[3].Health = false
		devs[5].Devmem = 40000
		e.update("n", func(n *corev1.Node) { n.Annotations[annotation.KeyNVIDIARegister] = annotation.Encode(devs) })
		e.settled("new devices", func() bool {
			n, _ := e.cache.Node("n")
			got := n.Devices(annotation.NVIDIA())
			return len(got) == 8 && !got[3].Health && got[5].Devmem == 40000
		})
		if got := e.cache.Stats().Decodes - decodes; got != 1 {
			t.Errorf("decodes = %d, want 1", got)
		}
		if c := e.cache.Stats().Cycles; c != 1 {
			t.Errorf("cycles = %d, want only the first term's", c)
		}
	})
}

// TestDecodeOnlyOnChange: irrelevant updates are filtered before the queue; handshake and
// allocatable changes re-evaluate without decoding; ticks never decode.
func TestDecodeOnlyOnChange(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := start(t, Options{}, gpuNode("n", 8, 80, requesting(t0)))
		e.waitState("n", StateRegistered)
		base := e.cache.Stats()
		e.update("n", func(n *corev1.Node) {
			n.Labels["topology.kubernetes.io/zone"] = "b"
			n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue})
			n.Annotations["unrelated"] = "x"
		})
		e.settled("the filtered event", func() bool { return e.cache.Stats().EventsFiltered > base.EventsFiltered })
		e.update("n", func(n *corev1.Node) { n.Annotations[annotation.KeyNVIDIAHandshake] = requesting(t0.Add(time.Second)) })
		e.settled("the handshake", func() bool {
			n, _ := e.cache.Node("n")
			return n.Registrations[0].Handshake == requesting(t0.Add(time.Second))
		})
		e.update("n", func(n *corev1.Node) {
			n.Status.Allocatable[corev1.ResourceName(annotation.ResourceNVIDIAGPU)] = resource.MustParse("70")
		})
		e.settled("the allocatable count", func() bool { n, _ := e.cache.Node("n"); return n.Registrations[0].Allocatable == 70 })
		for range 3 {
			e.tick(DefaultTick)
		}
		s := e.cache.Stats()
		if s.Decodes != base.Decodes {
			t.Errorf("decodes went from %d to %d, want no decode", base.Decodes, s.Decodes)
		}
		if s.EventsQueued-base.EventsQueued != 2 || s.EventsFiltered-base.EventsFiltered != 1 {
			t.Errorf("queued %d filtered %d, want 2 and 1", s.EventsQueued-base.EventsQueued, s.EventsFiltered-base.EventsFiltered)
		}
		if e.state("n") != StateRegistered {
			t.Errorf("state = %s", e.state("n"))
		}
	})
}

// TestAbsentAfterRemoval: a removed annotation unregisters the node with a Warning Event.
func TestAbsentAfterRemoval(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := start(t, Options{}, gpuNode("n", 8, 80, requesting(t0)))
		e.waitState("n", StateRegistered)
		e.update("n", func(n *corev1.Node) { delete(n.Annotations, annotation.KeyNVIDIARegister) })
		e.waitState("n", StateAbsent)
		if ev := e.events(); len(ev) != 1 || !strings.Contains(ev[0], "Warning "+ReasonRegisterRemoved) {
			t.Errorf("events = %q", ev)
		}
		if e.cache.Snapshot().Len() != 0 {
			t.Error("node still in the snapshot")
		}
	})
}

// TestMalformedRemovesDevices: a corrupt annotation on a registered node removes its devices
// (HAMi keeps the stale list), and a fixed one brings them back.
func TestMalformedRemovesDevices(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := start(t, Options{}, gpuNode("n", 8, 80, requesting(t0.Add(-time.Hour))))
		e.waitState("n", StateRegistered)
		for _, bad := range []string{`[null]`, `[{"id":`, `[]`} {
			e.update("n", func(n *corev1.Node) { n.Annotations[annotation.KeyNVIDIARegister] = bad })
			e.settled("devices removed for "+bad, func() bool { n, _ := e.cache.Node("n"); return !n.Registered() })
			e.update("n", func(n *corev1.Node) { n.Annotations[annotation.KeyNVIDIARegister] = annotation.Encode(devices(8, "n")) })
			e.waitState("n", StateRegistered)
		}
		if got := len(e.events()); got != 3 {
			t.Errorf("events = %d, want 3", got)
		}
		if p := e.patches(); len(p) != 0 {
			t.Errorf("patches = %q, want none (the node was never unhealthy)", p)
		}
	})
}

// TestSelector: label changes move a node in and out of the selection.
func TestSelector(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		sel := labels.SelectorFromSet(labels.Set{"gpu": "on"})
		e := start(t, Options{NodeSelector: sel}, gpuNode("n", 8, 80, requesting(t0)))
		e.waitState("n", StateRegistered)
		e.update("n", func(n *corev1.Node) { n.Labels["gpu"] = "off" })
		e.waitState("n", StateExcluded)
		e.update("n", func(n *corev1.Node) { n.Labels["gpu"] = "on" })
		e.waitState("n", StateRegistered)
		if d := e.cache.Stats().Decodes; d != 2 {
			t.Errorf("decodes = %d, want 2 (excluded nodes are not decoded, re-selected ones are)", d)
		}
	})
}

// TestNodeDelete forgets a deleted node.
func TestNodeDelete(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := start(t, Options{}, gpuNode("a", 8, 80, requesting(t0)), gpuNode("b", 8, 80, requesting(t0)))
		e.waitState("a", StateRegistered)
		e.waitState("b", StateRegistered)
		if err := e.client.CoreV1().Nodes().Delete(e.ctx, "a", metaDelete); err != nil {
			t.Fatal(err)
		}
		e.settled("node forgotten", func() bool { _, ok := e.cache.Node("a"); return !ok })
		if got := e.cache.Snapshot().Names(); !cmp.Equal(got, []string{"b"}) {
			t.Errorf("snapshot = %v", got)
		}
	})
}

// TestHandshakeSequence replays HAMi's nvidia_wrapper_sequence through the cache: a node whose
// handshake expires while allocatable is 0 is cleaned up (the key deleted), is not re-added
// while allocatable stays 0 (HAMi re-adds it and flaps), and returns when allocatable returns.
func TestHandshakeSequence(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := start(t, Options{}, gpuNode("n", 8, 10, ""))
		// Step 1: first sighting with allocatable 10: registered, stamped.
		e.waitState("n", StateRegistered)
		e.until("stamp", func() bool { hs, _ := e.handshakeOf("n"); return hs == requesting(t0) })
		e.settled("stamp seen", func() bool { n, _ := e.cache.Node("n"); return n.Registrations[0].Handshake == requesting(t0) })
		// Steps 2-3: the stamp ages past the window; allocatable keeps the node.
		e.tick(120 * time.Second)
		if e.state("n") != StateRegistered {
			t.Fatalf("step 3: state %s", e.state("n"))
		}
		// Step 4: allocatable drops to 0 with an expired handshake: cleanup, the key is deleted.
		e.update("n", func(n *corev1.Node) {
			n.Status.Allocatable[corev1.ResourceName(annotation.ResourceNVIDIAGPU)] = resource.MustParse("0")
		})
		e.waitState("n", StateUnhealthy)
		e.until("cleanup", func() bool { return e.cache.Stats().Cleanups == 1 })
		if !e.logs.has("Device is unhealthy, cleaning up node", -1) && !strings.Contains(e.logs.String(), `"msg"="Device is unhealthy, cleaning up node"`) {
			t.Errorf("no cleanup log in\n%s", e.logs)
		}
		// Step 6: the key is gone; the cache re-stamps it (as HAMi) but does not re-add the node.
		stamp := requesting(e.clock.Now())
		e.until("re-stamp", func() bool { hs, _ := e.handshakeOf("n"); return hs == stamp })
		for range 6 {
			e.tick(DefaultTick)
			if s := e.state("n"); s != StateUnhealthy {
				t.Fatalf("re-added with allocatable 0: state %s", s)
			}
		}
		if c := e.cache.Stats().Cleanups; c != 1 {
			t.Errorf("cleanups = %d, want 1 (no flap)", c)
		}
		// Step 7: allocatable returns: registered again.
		e.update("n", func(n *corev1.Node) {
			n.Status.Allocatable[corev1.ResourceName(annotation.ResourceNVIDIAGPU)] = resource.MustParse("10")
		})
		e.waitState("n", StateRegistered)
		var reasons []string
		for _, ev := range e.events() {
			reasons = append(reasons, strings.Fields(ev)[1])
		}
		if diff := cmp.Diff([]string{ReasonDeviceUnhealthy}, reasons); diff != "" {
			t.Errorf("events (-want +got):\n%s", diff)
		}
		want := []string{
			`n {"metadata":{"annotations":{"hami.io/node-handshake":"` + requesting(t0) + `"}}}`,
			`n {"metadata":{"annotations":{"hami.io/node-handshake":null}}}`,
			`n {"metadata":{"annotations":{"hami.io/node-handshake":"` + stamp + `"}}}`,
		}
		if diff := cmp.Diff(want, e.patches()); diff != "" {
			t.Errorf("patches (-want +got):\n%s", diff)
		}
	})
}

// TestHandshakeV290Cleanup: with HAMi v2.9.0 semantics a cleanup writes Deleted_<now>.
func TestHandshakeV290Cleanup(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := start(t, Options{Handshake: handshake.Options{Version: handshake.VersionV290}}, gpuNode("n", 8, 10, requesting(t0.Add(-time.Hour))))
		e.waitState("n", StateRegistered)
		e.update("n", func(n *corev1.Node) {
			n.Status.Allocatable[corev1.ResourceName(annotation.ResourceNVIDIAGPU)] = resource.MustParse("0")
		})
		// The cleanup is written at once; what the node looks like afterwards is Decide's.
		e.settled("cleanup", func() bool { hs, _ := e.handshakeOf("n"); return hs == handshake.Deleted(t0, time.UTC) })
		if !e.logs.has("Device is unhealthy, cleaning up node", -1) {
			t.Errorf("no cleanup log in\n%s", e.logs)
		}
	})
}

// TestHandshakeVectors: every handshake value of HAMi's vectors, on a decoded node, gives the
// state and the write Decide asks for.
func TestHandshakeVectors(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		hs        string
		alloc     int64
		want      State
		wantStamp bool
	}{
		"absent":                        {"", 10, StateRegistered, true},
		"requesting fresh, alloc 0":     {requesting(t0.Add(-10 * time.Second)), 0, StateRegistered, false},
		"requesting expired, alloc 10":  {requesting(t0.Add(-120 * time.Second)), 10, StateRegistered, false},
		"requesting expired, alloc 0":   {requesting(t0.Add(-120 * time.Second)), 0, StateUnhealthy, false},
		"requesting future, alloc 0":    {requesting(t0.Add(time.Hour)), 0, StateRegistered, false},
		"deleted fresh":                 {handshake.Deleted(t0.Add(-10*time.Second), time.UTC), 10, StateRegistered, true},
		"deleted stale":                 {handshake.Deleted(t0.Add(-120*time.Second), time.UTC), 10, StateRegistered, true},
		"deleted bare":                  {"Deleted", 10, StateRegistered, true},
		"reported legacy":               {"Reported 2025-04-17 06:39:20.812216312 +0000 UTC m=+90.842043756", 10, StateRegistered, true},
		"garbage":                       {"hello", 10, StateRegistered, true},
		"requesting unparsable":         {"Requesting_yesterday", 0, StateRegistered, false},
		"requesting old dot format":     {"Requesting_2024.05.27 09:48:48", 0, StateRegistered, false},
		"requesting bare (HAMi panics)": {"Requesting", 10, StateRegistered, false},
		"substring no underscore":       {"NotRequestingAnything", 10, StateRegistered, false},
		"rfc3339":                       {"Requesting_2026-05-19T09:14:52Z", 10, StateRegistered, false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				n := gpuNode("n", 2, tc.alloc, "")
				if tc.hs != "" {
					n.Annotations[annotation.KeyNVIDIAHandshake] = tc.hs
				}
				e := start(t, Options{}, n)
				e.waitState("n", tc.want)
				if tc.wantStamp {
					e.until("stamp", func() bool { hs, _ := e.handshakeOf("n"); return hs == requesting(t0) })
				} else {
					e.tick(DefaultTick)
					if p := e.patches(); len(p) != 0 {
						t.Errorf("patches = %q, want none", p)
					}
				}
			})
		})
	}
}

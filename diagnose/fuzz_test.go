package diagnose_test

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/diagnose"
)

// FuzzNode: whatever the node's annotations and the plugin's termination message hold, Node
// returns a report with a case from 0 to 5 whose error findings each say what to do.
func FuzzNode(f *testing.F) {
	f.Add(`[{"id":"GPU-a","count":10,"health":true}]`, "Requesting_2026-11-30 11:59:50", "")
	f.Add(`[null]`, "Requesting", "nvml Init err: ERROR_LIBRARY_NOT_FOUND")
	f.Add(`[{"id":"GPU-a","devmem":1.5}]`, "Deleted_2026-11-30 11:00:00", "Node name is empty")
	f.Add(`[]`, "Reported 2024-01-23", "\xff\xfe")
	f.Add("GPU-1,10,1024,100,NVIDIA T4,0,true,0,hami-core:", "Requesting_2024.05.27 09:48:48", "")
	f.Fuzz(func(t *testing.T, register, hs, message string) {
		n := gpuNode("gpu-1")
		n.Annotations[annotation.KeyNVIDIARegister] = register
		n.Annotations[annotation.KeyNVIDIAHandshake] = hs
		objs := replace(healthyObjects("gpu-1"), n)
		if message != "" {
			objs = replace(objs, crashingPod("gpu-1", message))
		}
		r, err := diagnose.Node(t.Context(), fakeClient(true, objs...), "gpu-1", opts())
		if err != nil {
			t.Fatal(err)
		}
		if r.Case != diagnose.Healthy && !r.Case.Node() {
			t.Fatalf("case %q", r.Case)
		}
		for _, f := range r.Errors() {
			if f.Summary == "" || len(f.Fix) == 0 {
				t.Fatalf("error finding without summary or fix: %+v", f)
			}
		}
		if (r.Case == diagnose.Healthy) != (len(r.Errors()) == 0) {
			t.Fatalf("case %v with %d errors", r.Case, len(r.Errors()))
		}
	})
}

// FuzzParseMonitorScrape: whatever a node monitor answers, parsing and keeping the pod's
// series never panics, keeps only series that name the pod or sit on its GPUs, with finite
// values, and the analysis of the result is a report that JSON carries.
func FuzzParseMonitorScrape(f *testing.F) {
	f.Add(mScrape)
	f.Add("vGPU_device_memory_usage_in_bytes{podnamespace=\"team-a\",podname=\"cuda-job\",ctrname=\"cuda\",vdeviceid=\"0\",deviceuuid=\"GPU-x\"} 1e400\n")
	f.Add("hami_vgpu_memory_used_bytes{namespace=\"team-a\",pod=\"cuda-job\",container=\"\xff\"} -Inf\n# TYPE hamireg_monitor_process_memory_drift_ratio gauge\n")
	f.Add("# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_count 1\nh_sum 1\n")
	f.Add("")
	f.Fuzz(func(t *testing.T, text string) {
		pod := rtRunning("gpu-1")
		m, err := diagnose.ParseMonitorScrape(strings.NewReader(text), pod)
		if err != nil {
			if !errors.Is(err, diagnose.ErrMonitor) {
				t.Fatalf("error %v is not ErrMonitor", err)
			}
			return
		}
		for _, s := range m.Series {
			if math.IsNaN(s.Value) || math.IsInf(s.Value, 0) {
				t.Fatalf("non-finite value kept: %+v", s)
			}
			mine := s.Labels["namespace"] == rtNS && s.Labels["pod"] == rtPod
			if !mine && s.Name != diagnose.FamilyMonitorUnaccounted {
				t.Fatalf("series of another pod kept: %+v", s)
			}
		}
		ev := rtEvidence(pod)
		ev.Monitor = m
		r, err := diagnose.AnalyzePod(ev, opts())
		if err != nil {
			t.Fatal(err)
		}
		if r.Usage == nil {
			t.Fatal("no usage")
		}
		if _, err := json.Marshal(r); err != nil {
			t.Fatalf("report does not encode: %v", err)
		}
	})
}

// FuzzParseClaimResourceName: never panics; what it reads writes back to the input.
func FuzzParseClaimResourceName(f *testing.F) {
	for _, s := range []string{"claim:gpu", "claim:gpu/req", "claim:", "nvidia.com/gpu", "claim:/x", "claim:a/b/c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, r, ok := diagnose.ParseClaimResourceName(s)
		if !ok {
			if c != "" || r != "" {
				t.Fatalf("%q: not ok but %q, %q", s, c, r)
			}
			return
		}
		back := "claim:" + c
		if r != "" {
			back += "/" + r
		}
		if c == "" || strings.Contains(c, "/") || (back != s && back+"/" != s) {
			t.Fatalf("%q read as %q, %q", s, c, r)
		}
	})
}

// FuzzParseDeviceResourceID: never panics; what it reads joins back to the input.
func FuzzParseDeviceResourceID(f *testing.F) {
	for _, s := range []string{"gpu.hamireg.io/node-1/gpu-0", "d/a/b/c", "k8s.gpu.hamireg.io/gpu=uid-gpu-0", "d/x", "//", "a//b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, p, dev, ok := diagnose.ParseDeviceResourceID(s)
		if !ok {
			if d != "" || p != "" || dev != "" {
				t.Fatalf("%q: not ok but %q, %q, %q", s, d, p, dev)
			}
			return
		}
		if d == "" || p == "" || dev == "" || strings.Contains(d, "/") || strings.Contains(dev, "/") || d+"/"+p+"/"+dev != s {
			t.Fatalf("%q read as %q, %q, %q", s, d, p, dev)
		}
	})
}

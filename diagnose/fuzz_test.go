package diagnose_test

import (
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

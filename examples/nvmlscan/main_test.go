package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/nvmlscan/nvmlscantest"
)

// h100Node is a simulated DGX H100 (see nvmlscantest) with its sysfs tree written to a
// temporary directory; GPU 7 fails its memory query when brokenGPU7 is set.
func h100Node(t *testing.T, brokenGPU7 bool) (node *nvmlscantest.Node, sysfs string) {
	t.Helper()
	node = nvmlscantest.NewNode(t, dgxh100.New())
	if brokenGPU7 {
		node.Device(7).GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
			return nvml.Memory{}, nvml.ERROR_UNKNOWN
		}
	}
	sysfs = t.TempDir()
	for name, f := range node.Sysfs {
		path := filepath.Join(sysfs, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, f.Data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return node, sysfs
}

// lastLine is the raw annotation value the command printed last.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return lines[len(lines)-1]
}

// allowlistFiles are allowlist files TestRun writes for the arguments that name them.
var allowlistFiles = map[string]string{
	// HAMi's chart: no H100 model string matches "NVIDIA H100 80GB HBM3".
	"CHART": `nvidia:
  migProfileAllowlist:
    - models: ["H100-PCIE-80GB", "H100-SXM5-80GB"]
      profiles: ["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"]
`,
	"BAD": `- models: ["H100"]
  profiles: ["10gb"]
`,
}

func TestRun(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		args    []string
		broken  bool
		code    int
		stdout  []string
		stderr  []string
		devices int
	}{
		"defaults": {
			code:    0,
			stdout:  []string{"GPUs that would register (8):", "NVIDIA H100 80GB HBM3", "81920", "healthy", "Annotation hami.io/node-nvidia-register (HAMi master shape"},
			devices: 8,
		},
		"chart options and v2.9.0 shape": {
			args:    []string{"-split-count", "4", "-memory-scaling", "1.5", "-core-scaling", "0.29", "-shape", "v2.9.0"},
			code:    0,
			stdout:  []string{"122880", `"count":4`, `"devcore":28`, `"devicepairscore":{}`, "HAMi v2.9.0 shape"},
			devices: 8,
		},
		"mig mode": {
			args:    []string{"-mode", "mig", "-memory-scaling", "2"},
			code:    0,
			stdout:  []string{`"devmem":81920`, `"mode":"mig"`},
			devices: 8,
		},
		"mig profiles": {
			args: []string{"-mode", "mig", "-mig-profiles", "all"},
			code: 0,
			stdout: []string{"MIG profiles of GPU 0", "1g.10gb  10240", "0+1 1+1 2+1 3+1 4+1 5+1 6+1", "7g.80gb", `"count":7`,
				`"migProfiles":[{"name":"1g.10gb","memoryMB":10240,"core":15,"sliceCount":1,"placements":[{"start":0,"size":1}`},
			devices: 8,
		},
		"mig v2.9.0 shape": {
			args:    []string{"-mode", "mig", "-shape", "v2.9.0"},
			code:    0,
			stdout:  []string{`"count":10`, `"mode":"mig"`},
			devices: 8,
		},
		"mig allowlist file, HAMi's match": {
			args:   []string{"-mode", "mig", "-mig-allowlist", "CHART", "-mig-model-match", "substring"},
			code:   1,
			stdout: []string{"GPUs that would register (0):", `no MIG allowlist entry matches the NVML name "NVIDIA H100 80GB HBM3"`},
			stderr: []string{"skip MIG device with no discovered profile capacity"},
		},
		"bad mig match":     {args: []string{"-mig-model-match", "exact"}, code: 2, stderr: []string{"neither word nor substring"}},
		"bad mig profiles":  {args: []string{"-mig-profiles", "some"}, code: 2, stderr: []string{"neither base nor all"}},
		"no allowlist file": {args: []string{"-mig-allowlist", "/nonexistent.yaml"}, code: 2, stderr: []string{"-mig-allowlist"}},
		"bad allowlist":     {args: []string{"-mig-allowlist", "BAD"}, code: 2, stderr: []string{"invalid MIG profile allowlist"}},
		"one GPU fails": {
			broken:  true,
			code:    0,
			stdout:  []string{"GPUs that would register (7):", "GPUs left out because NVML failed (1):", "nvml get memory error: gpu 7"},
			devices: 7,
		},
		"exclusions": {
			args:    []string{"-exclude-indexes", "0, 1", "-exclude-uuids", "GPU-none"},
			code:    0,
			stdout:  []string{"GPUs that would register (6):", "excluded by -exclude-uuids/-exclude-indexes: 2"},
			devices: 6,
		},
		"everything excluded": {
			args:   []string{"-exclude-indexes", "0,1,2,3,4,5,6,7"},
			code:   1,
			stdout: []string{"GPUs that would register (0):", "\n[]\n"},
			stderr: []string{"no GPU would register"},
		},
		"bad flag":          {args: []string{"-nope"}, code: 2},
		"extra argument":    {args: []string{"scan"}, code: 2, stderr: []string{"unexpected arguments"}},
		"bad shape":         {args: []string{"-shape", "v3"}, code: 2, stderr: []string{"neither master nor v2.9.0"}},
		"bad index":         {args: []string{"-exclude-indexes", "x"}, code: 2, stderr: []string{"parse index"}},
		"invalid mode":      {args: []string{"-mode", "exclusive"}, code: 2, stderr: []string{"invalid options"}},
		"invalid scaling":   {args: []string{"-memory-scaling", "0"}, code: 2, stderr: []string{"memory scaling"}},
		"negative split":    {args: []string{"-split-count", "-1"}, code: 2, stderr: []string{"split count"}},
		"bad preconfigured": {args: []string{"-preconfigured-memory", "-5"}, code: 2, stderr: []string{"pre-configured memory"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			node, sysfs := h100Node(t, tc.broken)
			args := slices.Clone(tc.args)
			for i, a := range args {
				if content, ok := allowlistFiles[a]; ok {
					args[i] = filepath.Join(t.TempDir(), "allowlist.yaml")
					if err := os.WriteFile(args[i], []byte(content), 0o644); err != nil {
						t.Fatal(err)
					}
				}
			}
			var stdout, stderr bytes.Buffer
			code := run(t.Context(), append([]string{"-sysfs", sysfs}, args...), node.Server, &stdout, &stderr)
			t.Logf("stdout:\n%s", stdout.String())
			if code != tc.code {
				t.Errorf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tc.code, stdout.String(), stderr.String())
			}
			for _, want := range tc.stdout {
				if !strings.Contains(stdout.String(), want) {
					t.Errorf("stdout lacks %q:\n%s", want, stdout.String())
				}
			}
			for _, want := range tc.stderr {
				if !strings.Contains(stderr.String(), want) {
					t.Errorf("stderr lacks %q:\n%s", want, stderr.String())
				}
			}
			if tc.devices > 0 {
				devs, err := annotation.Decode(lastLine(stdout.String()))
				if err != nil || len(devs) != tc.devices {
					t.Errorf("printed value decodes to %d devices, %v; want %d", len(devs), err, tc.devices)
				}
				for _, d := range devs {
					if want := int(d.Index / 4); d.Numa != want {
						t.Errorf("GPU %d on NUMA node %d, want %d", d.Index, d.Numa, want)
					}
				}
			}
		})
	}
}

// TestRunWatch runs the XID watch briefly before the scan.
func TestRunWatch(t *testing.T) {
	t.Parallel()
	node, sysfs := h100Node(t, false)
	node.XID(2, 79)
	var stdout, stderr bytes.Buffer
	if code := run(t.Context(), []string{"-sysfs", sysfs, "-watch", "100ms"}, node.Server, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr.String())
	}
	uuid := node.UUID(2)
	for _, want := range []string{"UNHEALTHY", fmt.Sprintf("Unhealthy %s since", uuid), "critical XID 79"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout.String())
		}
	}
}

// TestRunInitFailure: the classified Init error and exit status 1; nothing but Init is called
// (the bare mock panics on anything else).
func TestRunInitFailure(t *testing.T) {
	t.Parallel()
	lib := &mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }}
	var stdout, stderr bytes.Buffer
	if code := run(t.Context(), nil, lib, &stdout, &stderr); code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	if want := "nvml Init err: ERROR_LIBRARY_NOT_FOUND"; !strings.Contains(stderr.String(), want) || !strings.Contains(stderr.String(), "RuntimeClass") {
		t.Errorf("stderr %q lacks %q or the fix", stderr.String(), want)
	}
	if stdout.Len() != 0 {
		t.Errorf("stdout %q, want nothing", stdout.String())
	}
}

// TestRunRealLibrary runs the command against the real NVML library: on this machine (no
// driver) it must print the classified error and exit 1 without crashing; on a GPU node it
// prints the node's GPUs.
func TestRunRealLibrary(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	code := run(t.Context(), nil, nvml.New(), &stdout, &stderr)
	t.Logf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	if code == 0 {
		return // a driver and at least one GPU are present
	}
	if code != 1 || !strings.Contains(stderr.String(), "nvml") {
		t.Errorf("exit %d, stderr %q", code, stderr.String())
	}
}

package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/hamireg/hamireg/annotation"
)

// h100Node is a simulated DGX H100 whose GPU 4 has the PCI bus id 0000:9a:00.0, on NUMA node
// 1 in the sysfs tree written to a temporary directory, and whose GPU 7 fails its memory
// query when brokenGPU7 is set.
func h100Node(t *testing.T, brokenGPU7 bool) (lib nvml.Interface, sysfs string) {
	t.Helper()
	srv := dgxh100.New()
	for _, d := range srv.Devices {
		dev := d.(*server.Device)
		dev.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
			var p nvml.PciInfo
			if dev.Index == 4 {
				for i, c := range "00000000:9A:00.0" {
					p.BusId[i] = int8(c)
				}
			}
			return p, nvml.SUCCESS
		}
	}
	if brokenGPU7 {
		srv.Devices[7].(*server.Device).GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
			return nvml.Memory{}, nvml.ERROR_UNKNOWN
		}
	}
	sysfs = t.TempDir()
	dir := filepath.Join(sysfs, "bus", "pci", "devices", "0000:9a:00.0")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "numa_node"), []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return srv, sysfs
}

// lastLine is the raw annotation value the command printed last.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return lines[len(lines)-1]
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
			lib, sysfs := h100Node(t, tc.broken)
			var stdout, stderr bytes.Buffer
			code := run(t.Context(), append([]string{"-sysfs", sysfs}, tc.args...), lib, &stdout, &stderr)
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
					if want := map[bool]int{true: 1, false: 0}[d.Index == 4]; d.Numa != want {
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
	lib, sysfs := h100Node(t, false)
	srv := lib.(*server.Server)
	srv.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		return &mock.EventSet{
			WaitFunc: func(uint32) (nvml.EventData, nvml.Return) {
				return nvml.EventData{Device: srv.Devices[2], EventType: nvml.EventTypeXidCriticalError, EventData: 79}, nvml.SUCCESS
			},
			FreeFunc: func() nvml.Return { return nvml.SUCCESS },
		}, nvml.SUCCESS
	}
	for _, d := range srv.Devices {
		dev := d.(*server.Device)
		dev.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) { return nvml.EventTypeXidCriticalError, nvml.SUCCESS }
		dev.RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.SUCCESS }
	}
	var stdout, stderr bytes.Buffer
	if code := run(t.Context(), []string{"-sysfs", sysfs, "-watch", "50ms"}, lib, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr.String())
	}
	uuid := srv.Devices[2].(*server.Device).UUID
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

package main

import (
	"slices"
	"strings"
	"testing"
)

func TestUsageLines(t *testing.T) {
	body := `# HELP hami_vgpu_memory_used_bytes vGPU device memory usage in bytes
# TYPE hami_vgpu_memory_used_bytes gauge
hami_vgpu_memory_used_bytes{container="cuda",device_uuid="GPU-7",namespace="default",pod="demo",vdevice_index="1"} 1.073741824e+09
hami_vgpu_memory_used_bytes{container="cuda",device_uuid="GPU-6",namespace="default",pod="demo",vdevice_index="0"} 3.221225472e+09
hami_vgpu_memory_used_bytes{container="cuda",device_uuid="GPU-6",namespace="team-a",pod="demo",vdevice_index="0"} 5
hami_vgpu_memory_used_bytes{container="other",device_uuid="GPU-6",namespace="default",pod="demo",vdevice_index="0"} 5
hami_vgpu_memory_limit_bytes{container="cuda",device_uuid="GPU-6",namespace="default",pod="demo",vdevice_index="0"} 1.073741824e+10
hami_vgpu_memory_limit_bytes{container="cuda",device_uuid="GPU-7",namespace="default",pod="demo",vdevice_index="1"} 1.073741824e+10
hami_container_device_utilization_ratio{container="cuda",device_uuid="GPU-6",namespace="default",pod="demo",vdevice_index="0"} 25
hami_container_device_utilization_ratio{container="cuda",device_uuid="GPU-7",namespace="default",pod="demo",vdevice_index="1"} 10
hami_vgpu_memory_context_bytes{container="cuda",device_uuid="GPU-6",namespace="default",pod="demo",vdevice_index="0"} 3.145728e+08
`
	got, err := usageLines(body, "default", "demo", "cuda", []string{"GPU-6", "GPU-7"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"default/demo cuda GPU-6: 3072 MiB of 10240 MiB, SM 25 %",
		"default/demo cuda GPU-7: 1024 MiB of 10240 MiB, SM 10 %",
	}
	if !slices.Equal(got, want) {
		t.Errorf("usageLines = %q, want %q", got, want)
	}
	// A family missing (the monitor has not adopted the region yet, or serves no SM
	// utilisation) is an error naming the GPU, never a line with a zero.
	partial := strings.ReplaceAll(body, `hami_container_device_utilization_ratio{container="cuda",device_uuid="GPU-7"`, `x{`)
	if lines, err := usageLines(partial, "default", "demo", "cuda", []string{"GPU-6", "GPU-7"}); err == nil || !strings.Contains(err.Error(), "GPU-7: 2 of the 3 families") {
		t.Errorf("usageLines without GPU-7's utilisation = %q, %v", lines, err)
	}
	// Another namespace's pod of the same name is not this one.
	if lines, err := usageLines(body, "team-a", "demo", "cuda", []string{"GPU-6"}); err == nil || !strings.Contains(err.Error(), "team-a/demo container cuda on GPU-6: 1 of the 3 families") {
		t.Errorf("usageLines of team-a/demo = %q, %v", lines, err)
	}
	// Nor another container of the pod, nor another pod.
	if lines, err := usageLines(body, "default", "demo", "other", []string{"GPU-6"}); err == nil || !strings.Contains(err.Error(), "default/demo container other on GPU-6: 1 of the 3 families") {
		t.Errorf("usageLines of container other = %q, %v", lines, err)
	}
	if lines, err := usageLines(body, "default", "web", "cuda", []string{"GPU-6"}); err == nil || !strings.Contains(err.Error(), "0 of the 3 families") {
		t.Errorf("usageLines of pod web = %q, %v", lines, err)
	}
	if _, err := usageLines("", "default", "demo", "cuda", []string{"GPU-6"}); err == nil {
		t.Error("usageLines of an empty body: no error")
	}
}

func TestParseLabels(t *testing.T) {
	got := parseLabels(`a="x",b="say \"hi\"\n",c="back\\slash",d=""`)
	want := map[string]string{"a": "x", "b": "say \"hi\"\n", "c": `back\slash`, "d": ""}
	if len(got) != len(want) {
		t.Fatalf("parseLabels = %q, want %q", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("label %s = %q, want %q", k, got[k], v)
		}
	}
	for _, bad := range []string{"", `a`, `a="unterminated`, `="x"`} {
		_ = parseLabels(bad) // no panic
	}
}

func TestPluginArgs(t *testing.T) {
	for _, tc := range []struct {
		in, want []string
	}{
		{[]string{"--device-split-count=10", "--kubelet-root-dir=/var/lib/kubelet", "--metrics-bind-address=:9394"},
			[]string{"--device-split-count=10", "--metrics-bind-address=127.0.0.1:0"}},
		{[]string{"--device-split-count=10"}, []string{"--device-split-count=10", "--metrics-bind-address=127.0.0.1:0"}},
		{[]string{"--metrics-bind-address="}, []string{"--metrics-bind-address="}},
		{[]string{"--metrics-bind-address=0"}, []string{"--metrics-bind-address=0"}},
	} {
		if got := pluginArgs(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("pluginArgs(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

package monitortest_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/hamireg/hamireg/hamicore/region"
	"github.com/hamireg/hamireg/monitor/monitortest"
)

func TestWriteContainerAndClaim(t *testing.T) {
	root := t.TempDir()
	r := monitortest.Region(4242, monitortest.GPU{UUID: "GPU-a", Limit: 10 << 30, Used: 3 << 30, SMUtil: 25},
		monitortest.GPU{UUID: "GPU-b", Used: 100 << 20})
	path, err := monitortest.WriteContainer(root, "uid-1", "cuda", "c0", r)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(root, "containers", "uid-1_cuda", "c0.cache"); path != want {
		t.Fatalf("path %s, want %s", path, want)
	}
	if st, err := os.Stat(filepath.Join(root, "containers", "uid-1_cuda", "libvgpu.so")); err != nil || st.Size() != 0 {
		t.Fatalf("libvgpu.so mount point: %v", err)
	}
	got, err := region.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	mem0, sm0 := got.Usage(0)
	mem1, _ := got.Usage(1)
	if len(got.Devices) != 2 || got.Devices[0].UUID() != "GPU-a" || got.Devices[0].MemoryLimit != 10<<30 ||
		mem0.Total != 3<<30 || sm0 != 25 || mem1.Total != 100<<20 || mem1.Context != 100<<20 || got.Slots[0].HostPID != 4242 {
		t.Fatalf("read back %+v", got)
	}
	cp, err := monitortest.WriteClaim(root, "claim-1", r)
	if err != nil || cp != filepath.Join(root, "claims", "claim-1", "claim-1.cache") {
		t.Fatalf("WriteClaim: %s, %v", cp, err)
	}
	for _, bad := range []string{"", "a/b", ".."} {
		if _, err := monitortest.WriteContainer(root, "uid", bad, "c", r); !errors.Is(err, monitortest.ErrBadName) {
			t.Errorf("container %q: %v", bad, err)
		}
	}
}

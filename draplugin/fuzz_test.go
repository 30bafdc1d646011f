package draplugin

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"
)

// FuzzCheckpoint: a checkpoint file of any content gives the claims or an error wrapping
// ErrCheckpoint that names the file, never a panic; what decodes encodes back to the same.
func FuzzCheckpoint(f *testing.F) {
	share := types.UID("s")
	valid, err := encodeCheckpoint("gpu.hamireg.io", map[types.UID]preparedClaim{
		"u1": {Namespace: "default", Name: "c", CDISpec: "/var/run/cdi/" + cdiSpecFile("u1"), StateDir: "/usr/local/vgpu/claims/u1",
			Devices: []preparedDevice{{Request: "gpu", Pool: "n", Device: "gpu-0", ShareID: &share, CDIDeviceID: cdiDeviceID("u1", "gpu-0"), UUID: "GPU-0", MemoryMiB: 1024, Cores: 30}}},
		"u2": {CDISpec: "/var/run/cdi/" + cdiSpecFile("u2"), Devices: []preparedDevice{{Request: "gpu/mig", Pool: "n", Device: "gpu-1-mig-1g-10gb-6",
			CDIDeviceID: cdiDeviceID("u2", "gpu-1-mig-1g-10gb-6"), UUID: "GPU-1", MemoryMiB: 9856, Cores: 15,
			MIG: &preparedMIG{Profile: "1g.10gb", ProfileID: 15, Start: 6, Size: 2, MigUUID: "MIG-1", GPUInstanceID: 1}}}},
	})
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{
		string(valid), "", "{}", "null", `{"version":1,"driver":"gpu.hamireg.io"}`,
		`{"version":1,"driver":"gpu.hamireg.io","claims":{"..":{}}}`,
		`{"version":1,"driver":"gpu.hamireg.io","claims":{"u":{"cdiSpec":"/etc/passwd","devices":[]}}}`,
		`{"version":2,"driver":"gpu.hamireg.io","claims":{}}`, `{"version":1,"driver":"x"} {}`,
		`{"version":1,"driver":"gpu.hamireg.io","claims":{"u":{"cdiSpec":"/c/k8s.hamireg.io-claim_u.json","devices":[{"pool":"n","device":"d","uuid":"G","cdiDeviceID":"k8s.hamireg.io/claim=u-d","mig":{"profile":"","size":0}}]}}}`,
	} {
		f.Add([]byte(s))
	}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		file := filepath.Join(dir, CheckpointFile)
		c, err := decodeCheckpoint(data)
		if err != nil {
			if err := os.WriteFile(file, data, 0o600); err != nil {
				t.Fatal(err)
			}
			_, rerr := readCheckpoint(file, "gpu.hamireg.io")
			if !errors.Is(rerr, ErrCheckpoint) || !strings.Contains(rerr.Error(), file) {
				t.Fatalf("readCheckpoint: %v, want ErrCheckpoint naming %s", rerr, file)
			}
			return
		}
		enc, err := encodeCheckpoint(c.Driver, c.Claims)
		if err != nil {
			t.Fatalf("encode what decoded: %v", err)
		}
		back, err := decodeCheckpoint(enc)
		if err != nil {
			t.Fatalf("decode what encoded: %v\n%s", err, enc)
		}
		if diff := cmp.Diff(c, back); diff != "" {
			t.Fatalf("round trip (-first +second):\n%s", diff)
		}
	})
}

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

// fuzzClaims is a valid checkpoint's claims.
func fuzzClaims() map[types.UID]preparedClaim {
	share := types.UID("s")
	return map[types.UID]preparedClaim{
		"u1": {Namespace: "default", Name: "c", CDISpec: "/var/run/cdi/" + cdiSpecFile("u1"), StateDir: "/usr/local/vgpu/claims/u1",
			Devices: []preparedDevice{{Request: "gpu", Pool: "n", Device: "gpu-0", ShareID: &share, CDIDeviceID: cdiDeviceID("u1", "gpu-0"), UUID: "GPU-0", MemoryMiB: 1024, Cores: 30}}},
		"u2": {CDISpec: "/var/run/cdi/" + cdiSpecFile("u2"), Devices: []preparedDevice{{Request: "gpu/mig", Pool: "n", Device: "gpu-1-mig-1g-10gb-6",
			CDIDeviceID: cdiDeviceID("u2", "gpu-1-mig-1g-10gb-6"), UUID: "GPU-1", MemoryMiB: 9856, Cores: 15,
			MIG: &preparedMIG{Profile: "1g.10gb", ProfileID: 15, Start: 6, Size: 2, MigUUID: "MIG-1", GPUInstanceID: 1}}}},
	}
}

// FuzzCheckpoint: a checkpoint file of any content gives the claims or an error wrapping
// ErrCheckpoint that names the file, never a panic; an error is ErrCheckpointCorrupt unless
// the file is a newer version; what decodes encodes back to the same.
func FuzzCheckpoint(f *testing.F) {
	valid, err := encodeCheckpoint("gpu.hamireg.io", fuzzClaims())
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{
		string(valid), "", "{}", "null", `{"version":1,"driver":"gpu.hamireg.io"}`,
		`{"version":1,"driver":"gpu.hamireg.io","claims":{"..":{}}}`,
		`{"version":1,"driver":"gpu.hamireg.io","claims":{"u":{"cdiSpec":"/etc/passwd","devices":[]}}}`,
		`{"version":3,"driver":"gpu.hamireg.io","claims":{}}`, `{"version":1,"driver":"x"} {}`,
		`{"version":2,"checksum":"sha256:00","driver":"gpu.hamireg.io","claims":{}}`,
		`{"version":1,"driver":"gpu.hamireg.io","claims":{"u":{"cdiSpec":"/c/k8s.hamireg.io-claim_u.json","devices":[{"pool":"n","device":"d","uuid":"G","cdiDeviceID":"k8s.hamireg.io/claim=u-d","mig":{"profile":"","size":0}}]}}}`,
		string(valid[:len(valid)/2]), strings.Replace(string(valid), "1024", "2048", 1),
	} {
		f.Add([]byte(s))
	}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		file := filepath.Join(dir, CheckpointFile)
		c, err := decodeCheckpoint(data)
		if err != nil {
			if !errors.Is(err, ErrCheckpointCorrupt) && !errors.Is(err, errNewerCheckpoint) {
				t.Fatalf("decode: %v, want ErrCheckpointCorrupt or a newer version", err)
			}
			if err := os.WriteFile(file, data, 0o600); err != nil {
				t.Fatal(err)
			}
			_, _, rerr := readCheckpoint(file, "gpu.hamireg.io")
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
		c.Version, c.Checksum = back.Version, back.Checksum // a version 1 file is written as version 2
		if diff := cmp.Diff(c, back); diff != "" {
			t.Fatalf("round trip (-first +second):\n%s", diff)
		}
	})
}

// FuzzSpecRecord: a CDI spec's record annotation of any content gives a record that
// passes the checkpoint's checks or an error, never a panic; a record encodes back to the
// same.
func FuzzSpecRecord(f *testing.F) {
	path := "/var/run/cdi/" + cdiSpecFile("u1")
	valid, err := encodeSpecRecord("gpu.hamireg.io", "u1", fuzzClaims()["u1"])
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{valid, "", "{}", "null", `{"driver":"d","uid":"u1","claim":{}}`, valid + "{}", valid[:len(valid)/2],
		strings.ReplaceAll(valid, "u1", "..")} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, value string) {
		r, err := decodeSpecRecord(path, value)
		if err != nil {
			return
		}
		if err := checkClaim(r.UID, r.Claim); err != nil || r.Claim.CDISpec != path || r.Driver == "" {
			t.Fatalf("accepted a record that fails the checks: %+v: %v", r, err)
		}
		enc, err := encodeSpecRecord(r.Driver, r.UID, r.Claim)
		if err != nil {
			t.Fatal(err)
		}
		back, err := decodeSpecRecord(path, enc)
		if err != nil {
			t.Fatalf("decode what encoded: %v", err)
		}
		if diff := cmp.Diff(r, back); diff != "" {
			t.Fatalf("round trip (-first +second):\n%s", diff)
		}
	})
}

package statedir

import (
	"os"
	"path/filepath"
	"testing"
)

func TestRecreate(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "vgpu", "claims", "uid")
	for range 2 { // the second call empties what the first left
		if err := Recreate(dir); err != nil {
			t.Fatal(err)
		}
		entries, err := os.ReadDir(dir)
		if err != nil || len(entries) != 0 {
			t.Fatalf("ReadDir(%s) = %v, %v; want an empty folder", dir, entries, err)
		}
		fi, err := os.Stat(dir)
		if err != nil || fi.Mode().Perm() != 0o777 {
			t.Fatalf("Stat(%s) = %v, %v; want mode 0777", dir, fi, err)
		}
		if err := os.WriteFile(filepath.Join(dir, "cache"), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// Package vectors finds and reads HAMi's conformance vectors for the tests across the SDK:
// the hami-<version>/ folders under $HAMIREG_VECTORS, else under the shared/testdata folder
// beside the repository. Only tests import it.
package vectors

import (
	"cmp"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// Folder is one folder of vectors, produced by one HAMi version.
type Folder struct {
	// Dir is the folder's path.
	Dir string
	// V290 is true for HAMi v2.9.0's vectors, false for master's.
	V290 bool
}

// Folders returns the vector folders, sorted by path; it fails tb when there are none.
func Folders(tb testing.TB) []Folder {
	tb.Helper()
	root := cmp.Or(os.Getenv("HAMIREG_VECTORS"), findShared())
	entries, err := os.ReadDir(root)
	if err != nil {
		tb.Fatalf("read conformance vectors: %v (set HAMIREG_VECTORS to the folder holding hami-<version>/)", err)
	}
	var out []Folder
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), "hami-") {
			out = append(out, Folder{Dir: filepath.Join(root, e.Name()), V290: strings.HasPrefix(e.Name(), "hami-v2.9.")})
		}
	}
	if len(out) == 0 {
		tb.Fatalf("no hami-* vector folders in %s", root)
	}
	slices.SortFunc(out, func(a, b Folder) int { return cmp.Compare(a.Dir, b.Dir) })
	return out
}

// Pick returns v290 for a v2.9.0 folder and master for a master folder.
func Pick[V any](f Folder, master, v290 V) V {
	if f.V290 {
		return v290
	}
	return master
}

// Name is the folder's base name, for messages.
func (f Folder) Name() string { return filepath.Base(f.Dir) }

// Read decodes the file name of the folder into v. It reports false, and logs it, when the
// folder has no such file (a folder may hold only some files); other errors fail tb.
func (f Folder) Read(tb testing.TB, name string, v any) bool {
	tb.Helper()
	data, err := os.ReadFile(filepath.Join(f.Dir, name))
	if errors.Is(err, os.ErrNotExist) {
		tb.Logf("%s: no %s, skipped", f.Dir, name)
		return false
	}
	if err != nil {
		tb.Fatal(err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		tb.Fatalf("%s/%s: %v", f.Dir, name, err)
	}
	return true
}

// findShared returns the nearest shared/testdata above the working directory, or the path
// where one is expected beside the repository when there is none (the error then names it).
func findShared() string {
	fallback := filepath.Join("..", "..", "shared", "testdata")
	dir, err := os.Getwd()
	if err != nil {
		return fallback
	}
	for {
		candidate := filepath.Join(dir, "shared", "testdata")
		if info, err := os.Stat(candidate); err == nil && info.IsDir() {
			return candidate
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return fallback
		}
		dir = parent
	}
}

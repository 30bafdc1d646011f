// Package vectors finds and reads HAMi's conformance vectors for the tests across the SDK:
// the hami-<version>/ folders under $HAMIREG_VECTORS, else under the repository's own
// testdata/ (found by walking up from the working directory to the go.mod of module
// github.com/hamireg/hamireg, so it works from any package of any module in the repository).
// Only tests import it.
package vectors

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// rootModule is the module path of the repository's root go.mod, whose folder holds testdata/.
const rootModule = "github.com/hamireg/hamireg"

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
	root := os.Getenv("HAMIREG_VECTORS")
	if root == "" {
		dir, err := repoRoot()
		if err != nil {
			tb.Fatalf("find conformance vectors: %v (set HAMIREG_VECTORS to the folder holding hami-<version>/)", err)
		}
		root = filepath.Join(dir, "testdata")
	}
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

// repoRoot returns the nearest folder at or above the working directory whose go.mod
// declares module github.com/hamireg/hamireg.
func repoRoot() (string, error) {
	start, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for dir := start; ; {
		if data, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && modulePath(data) == rootModule {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod of module %s at or above %s", rootModule, start)
		}
		dir = parent
	}
}

// modulePath returns the path of go.mod's module directive, or "" when there is none.
func modulePath(gomod []byte) string {
	for line := range strings.Lines(string(gomod)) {
		line, _, _ = strings.Cut(line, "//")
		fields := strings.Fields(line)
		if len(fields) == 2 && fields[0] == "module" {
			return strings.Trim(fields[1], "\"`")
		}
	}
	return ""
}

// OneEntryPerContainer rewrites a pod device list as HAMi wrote it by the SDK's rule that
// every container keeps its entry: gpu[i] says whether container i (init containers first)
// asks for devices; the non-empty entries of value go, in order, to those containers, and
// every other container gets an empty entry. HAMi v2.9.0 writes that already; HAMi master
// drops the entry of a GPU-less container in some pods (and its plugin then serves the
// containers shifted). It reports false when value's non-empty entries are not one per
// container asking for devices.
func OneEntryPerContainer(value string, gpu []bool) (string, bool) {
	var full []string
	for e := range strings.SplitSeq(value, ";") {
		if e != "" {
			full = append(full, e)
		}
	}
	var b strings.Builder
	for _, asks := range gpu {
		if asks {
			if len(full) == 0 {
				return "", false
			}
			b.WriteString(full[0])
			full = full[1:]
		}
		b.WriteByte(';')
	}
	return b.String(), len(full) == 0
}

package monitor

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hamireg/hamireg/hamicore/region"
	"github.com/hamireg/hamireg/internal/vectors"
)

// listerVector is one vector of monitor-lister.json: HAMi's ContainerLister.Update, step by
// step, on a containers folder.
type listerVector struct {
	Name  string `json:"name"`
	Input struct {
		Dirs                    []vectorDir `json:"dirs"`
		ContainersFolderMissing bool        `json:"containers_folder_missing"`
		ResyncIntervalSeconds   int64       `json:"resync_interval_seconds"`
	} `json:"input"`
	Steps []struct {
		Pods []struct {
			UID       string `json:"uid"`
			Namespace string `json:"namespace"`
			Name      string `json:"name"`
		} `json:"pods"`
		WantContainers []listedContainer `json:"want_containers"`
		WantLog        []string          `json:"want_log"`
		WantOnDisk     []string          `json:"want_on_disk"`
		WantError      string            `json:"want_error"`
		WantPanic      any               `json:"want_panic"`
	} `json:"steps"`
}

// vectorDir is an entry of the containers folder: a folder with entries, or a plain file
// (bytes or file set).
type vectorDir struct {
	Name       string                `json:"name"`
	AgeSeconds int64                 `json:"age_seconds"`
	Entries    []vectors.FolderEntry `json:"entries"`
	File       bool                  `json:"file"`
	Bytes      *vectors.FileBytes    `json:"bytes"`
}

func (d vectorDir) plainFile() bool { return d.File || d.Bytes != nil }

// listedContainer is a container as the lister vectors record it; Layout is the Go type HAMi
// casts to ("v0" or "v1": HAMi reads the v1.1-seqlock-first layout as v1).
type listedContainer struct {
	Container string `json:"container"`
	Key       string `json:"key"`
	Layout    string `json:"layout"`
	PodUID    string `json:"pod_uid"`
}

// promised reports whether the SDK promises HAMi's log line (the lines runbooks grep for),
// and returns the part compared: the "Failed to load cache" line up to its error text (the
// SDK's error texts are its own).
func promised(line string) (string, bool) {
	for _, p := range []string{"Adding ctr dirname ", "Removing dirname ", "Skipping dir with unexpected name format: ", "No cache file in "} {
		if strings.HasPrefix(line, p) {
			return line, true
		}
	}
	if strings.HasPrefix(line, "Failed to load cache: ") {
		if i := strings.Index(line, ", error: "); i >= 0 {
			return line[:i+len(", error: ")], true
		}
	}
	return "", false
}

func promisedLines(lines []string) []string {
	out := []string{}
	for _, l := range lines {
		if p, ok := promised(l); ok {
			out = append(out, p)
		}
	}
	return out
}

// sdkLayout is the Go type HAMi would cast a region the SDK reads as l to.
func sdkLayout(l region.Layout) string {
	switch l {
	case region.LayoutV0:
		return "v0"
	case region.LayoutV1, region.LayoutV1SeqlockFirst:
		return "v1"
	default:
		return l.String()
	}
}

// hamiPick is HAMi's choice of the cache file among entries (loadCache's count and name
// rules): v2.10.0 counts only libvgpu.so and *.cache names and takes the first name ending
// in ".cache"; v2.9.0 counts every entry and takes the first name containing ".cache" that
// does not contain libvgpu.so.
func hamiPick(entries []vectors.FolderEntry, v290 bool) (name string, countErr bool) {
	sorted := slices.Clone(entries)
	slices.SortFunc(sorted, func(a, b vectors.FolderEntry) int { return strings.Compare(a.Name, b.Name) })
	n := 0
	for _, e := range sorted {
		if v290 || strings.Contains(e.Name, libName) || strings.HasSuffix(e.Name, cacheSuffix) {
			n++
		}
	}
	if n > 2 {
		return "", true
	}
	for _, e := range sorted {
		if v290 && !strings.Contains(e.Name, libName) && strings.Contains(e.Name, cacheSuffix) ||
			!v290 && strings.HasSuffix(e.Name, cacheSuffix) {
			return e.Name, false
		}
	}
	return "", false
}

// hamiDetect is the layout HAMi casts a file of b to ("" when loadCache fails): v2.10.0
// reads 1197896 ≤ size < 2008952 as v0 and major 1 at ≥ 2008952 as v1; v2.9.0 reads exactly
// 1197897 bytes as v0 and major 1 at any size as v1.
func hamiDetect(b []byte, v290 bool) string {
	if len(b) < 12 || binary.LittleEndian.Uint32(b) != region.Magic {
		return ""
	}
	major, size := binary.LittleEndian.Uint32(b[4:]), len(b)
	switch {
	case v290 && size == 1197897, !v290 && size >= 1197896 && size < 2008952:
		return "v0"
	case major == 1 && (v290 || size >= 2008952):
		return "v1"
	}
	return ""
}

// sdkFolder is what the SDK does with a folder of a pod on the node, by its rules: the cache
// it picks (HAMi v2.10.0's), ErrCacheCount, and the layout it adopts ("" when the region
// does not read).
type sdkFolder struct {
	cache    string
	countErr bool
	layout   string
	priority int32
	// misread is a layout HAMi casts to the Go type of another (v1.1-seqlock-first as v1):
	// its field values are not HAMi's.
	misread bool
}

func sdkRules(t *testing.T, entries []vectors.FolderEntry) sdkFolder {
	t.Helper()
	var f sdkFolder
	f.cache, f.countErr = hamiPick(entries, false)
	if f.cache == "" || f.countErr {
		return f
	}
	for _, e := range entries {
		if e.Name != f.cache {
			continue
		}
		b, err := e.Content()
		if err != nil {
			t.Fatal(err)
		}
		if reg, err := region.Read(bytes.NewReader(b), int64(len(b))); err == nil {
			f.layout, f.priority, f.misread = sdkLayout(reg.Layout), reg.Priority, reg.Layout == region.LayoutV1SeqlockFirst
		}
	}
	return f
}

// departs says why HAMi (of the folder's version) treats the folder name or its entries
// otherwise than the SDK's rules: "" when it does not. The SDK takes v2.10.0's name and file
// rules for both versions, and reads the layouts by its exact table.
func departs(t *testing.T, name string, entries []vectors.FolderEntry, v290 bool) string {
	t.Helper()
	_, ctr, ok := parseFolderName(name)
	if v290 {
		parts := strings.Split(name, "_")
		if !ok || len(parts) < 2 || parts[1] != ctr {
			return "v2.9.0 splits the folder name on every '_' (and panics on a name without one)"
		}
	}
	pick, countErr := hamiPick(entries, v290)
	sdk := sdkRules(t, entries)
	if pick != sdk.cache || countErr != sdk.countErr {
		return "HAMi picks another cache file"
	}
	for _, e := range entries {
		if e.Name == pick {
			b, err := e.Content()
			if err != nil {
				t.Fatal(err)
			}
			if got := hamiDetect(b, v290); got != sdk.layout {
				return "HAMi casts the region as " + cmpOr(got, "nothing") + ", the SDK reads " + cmpOr(sdk.layout, "nothing")
			}
		}
	}
	return ""
}

func cmpOr(s, alt string) string {
	if s == "" {
		return alt
	}
	return s
}

// makeVectorDir creates d under dir with its entries and mtime now - age.
func makeVectorDir(t *testing.T, dir string, d vectorDir, now time.Time) {
	t.Helper()
	path := filepath.Join(dir, d.Name)
	if d.plainFile() {
		var content []byte
		if d.Bytes != nil {
			var err error
			if content, err = d.Bytes.Bytes(); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(path, content, 0o644); err != nil {
			t.Fatal(err)
		}
	} else {
		if err := os.MkdirAll(path, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, e := range d.Entries {
			b, err := e.Content()
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(path, e.Name), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	when := now.Add(-time.Duration(d.AgeSeconds) * time.Second)
	if err := os.Chtimes(path, when, when); err != nil {
		t.Fatal(err)
	}
}

// onDisk lists the names under dir (nil when dir is missing).
func onDisk(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return []string{}
	}
	if err != nil {
		t.Fatal(err)
	}
	out := []string{}
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// modelStep is what the SDK's rules give for one scan: HAMi v2.10.0's Update with the
// stricter rules of the package doc (identical on vectors: no file changes between steps).
type modelStep struct {
	containers []listedContainer
	onDisk     []string
	log        []string
	err        bool
}

// model runs the SDK's rules over the vector's folders, step by step.
func model(t *testing.T, v *listerVector, dir string, now time.Time) []modelStep {
	t.Helper()
	resync := time.Duration(v.Input.ResyncIntervalSeconds) * time.Second
	exists := map[string]bool{}
	for _, d := range v.Input.Dirs {
		exists[d.Name] = true
	}
	adopted := map[string]listedContainer{}
	dirs := slices.Clone(v.Input.Dirs)
	slices.SortFunc(dirs, func(a, b vectorDir) int { return strings.Compare(a.Name, b.Name) })
	var out []modelStep
	for _, step := range v.Steps {
		var ms modelStep
		pods := map[string]bool{}
		for _, p := range step.Pods {
			pods[p.UID] = true
		}
		if v.Input.ContainersFolderMissing {
			ms.err = true
		} else {
			for _, d := range dirs {
				if !exists[d.Name] || d.plainFile() {
					continue
				}
				path := filepath.Join(dir, d.Name)
				uid, ctr, ok := parseFolderName(d.Name)
				if !ok {
					ms.log = append(ms.log, "Skipping dir with unexpected name format: "+d.Name)
					continue
				}
				if !pods[string(uid)] {
					if now.Add(-time.Duration(d.AgeSeconds) * time.Second).Add(resync).After(now) {
						continue
					}
					ms.log = append(ms.log, "Removing dirname "+path+" in monitorpath")
					delete(adopted, d.Name)
					exists[d.Name] = false
					continue
				}
				if _, ok := adopted[d.Name]; ok {
					continue
				}
				f := sdkRules(t, d.Entries)
				switch {
				case f.countErr:
					ms.log = append(ms.log, "Failed to load cache: "+path+", error: ")
				case f.cache == "":
					ms.log = append(ms.log, "No cache file in "+path)
				case f.layout == "":
					ms.log = append(ms.log, "Failed to load cache: "+path+", error: ")
				default:
					adopted[d.Name] = listedContainer{Container: ctr, Key: d.Name, Layout: f.layout, PodUID: string(uid)}
					ms.log = append(ms.log, "Adding ctr dirname "+path+" in monitorpath")
				}
			}
		}
		ms.containers = []listedContainer{}
		for _, c := range adopted {
			ms.containers = append(ms.containers, c)
		}
		slices.SortFunc(ms.containers, func(a, b listedContainer) int { return strings.Compare(a.Key, b.Key) })
		ms.onDisk = []string{}
		if !v.Input.ContainersFolderMissing {
			for _, d := range dirs {
				if exists[d.Name] {
					ms.onDisk = append(ms.onDisk, d.Name)
				}
			}
		}
		out = append(out, ms)
	}
	return out
}

// without drops the items naming a departing folder.
func without[T any](items []T, departing map[string]string, name func(T) string) []T {
	return slices.DeleteFunc(slices.Clone(items), func(x T) bool {
		for d := range departing {
			if strings.Contains(name(x), d) {
				return true
			}
		}
		return false
	})
}

// TestListerConformance drives the scan through every step of monitor-lister.json. The SDK
// must do what its rules give (the model above: HAMi v2.10.0's Update); the rules must give
// what HAMi recorded, except on folders where HAMi of that version departs from them
// (v2.9.0's name split and panic, its file choice, either version's layout casts), which are
// left out of that second comparison and counted.
func TestListerConformance(t *testing.T) {
	t.Parallel()
	for _, folder := range vectors.Folders(t) {
		var f struct {
			Vectors []listerVector `json:"vectors"`
		}
		if !folder.Read(t, "monitor-lister.json", &f) {
			continue
		}
		departures := 0
		for _, v := range f.Vectors {
			t.Run(folder.Name()+"/"+v.Name, func(t *testing.T) {
				departing := map[string]string{}
				for _, d := range v.Input.Dirs {
					if why := departs(t, d.Name, d.Entries, folder.V290); why != "" && !d.plainFile() {
						departing[d.Name] = why
					}
				}
				if len(departing) > 0 {
					departures++
					t.Logf("HAMi departs from the SDK's rules on %v", departing)
				}
				b := newFolderBed(t, Options{ResyncInterval: time.Duration(v.Input.ResyncIntervalSeconds) * time.Second})
				containers := filepath.Join(b.root, ContainersDir)
				if v.Input.ContainersFolderMissing {
					if err := os.Remove(containers); err != nil {
						t.Fatal(err)
					}
				}
				for _, d := range v.Input.Dirs {
					makeVectorDir(t, containers, d, b.clock.Now())
				}
				want := model(t, &v, containers, b.clock.Now())
				hamiComparable := true
				for i, step := range v.Steps {
					var pods []*corev1.Pod
					for _, p := range step.Pods {
						pods = append(pods, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: types.UID(p.UID), Namespace: p.Namespace, Name: p.Name}})
					}
					b.setPods(nil, pods...)
					err := b.m.scan(b.ctx)
					var logLines []string
					for _, l := range b.log.take() {
						logLines = append(logLines, l.msg)
					}
					got := modelStep{containers: []listedContainer{}, onDisk: onDisk(t, containers), log: promisedLines(logLines), err: err != nil}
					for _, c := range b.m.Containers(b.ctx) {
						if c.Err != nil {
							t.Errorf("step %d: %s: %v", i, c.Key, c.Err)
							continue
						}
						got.containers = append(got.containers, listedContainer{Container: c.Name, Key: c.Key, Layout: sdkLayout(c.Region.Layout), PodUID: string(c.PodUID)})
					}
					if diff := cmp.Diff(want[i], got, cmp.AllowUnexported(modelStep{}), cmpopts.EquateEmpty()); diff != "" {
						t.Errorf("step %d: the scan against the SDK's rules (-want +got):\n%s", i, diff)
					}
					if err != nil && !errors.Is(err, fs.ErrNotExist) {
						t.Errorf("step %d: scan error %v, want one wrapping fs.ErrNotExist", i, err)
					}

					// The SDK's rules against HAMi's record.
					if !hamiComparable {
						continue
					}
					if step.WantError != "" {
						wantErr := strings.ReplaceAll(step.WantError, "{containers}", containers)
						if err == nil || !strings.Contains(err.Error(), wantErr) {
							t.Errorf("step %d: scan error %v, want one containing HAMi's %q", i, err, wantErr)
						}
					} else if want[i].err {
						t.Errorf("step %d: the SDK's rules fail the scan, HAMi does not", i)
					}
					hamiLog := make([]string, 0, len(step.WantLog))
					for _, l := range step.WantLog {
						hamiLog = append(hamiLog, strings.ReplaceAll(l, "{containers}", containers))
					}
					wantContainers := step.WantContainers
					if wantContainers == nil {
						wantContainers = []listedContainer{}
					}
					onDiskWant := step.WantOnDisk
					if onDiskWant == nil {
						onDiskWant = []string{}
					}
					hami := modelStep{containers: wantContainers, onDisk: onDiskWant, log: promisedLines(hamiLog), err: step.WantError != ""}
					rules := want[i]
					if step.WantPanic != nil {
						// HAMi stopped inside the step: only the folders it finished before the
						// panic compare, and nothing after this step.
						hamiComparable = false
						last := ""
						for name := range departing {
							if last == "" || name < last {
								last = name
							}
						}
						after := map[string]string{}
						for _, d := range v.Input.Dirs {
							if d.Name >= last {
								after[d.Name] = "after the panic"
							}
						}
						departing = after
					}
					byKey := func(c listedContainer) string { return c.Key }
					same := func(s string) string { return s }
					logName := func(s string) string { return s }
					hami.containers, rules.containers = without(hami.containers, departing, byKey), without(rules.containers, departing, byKey)
					hami.onDisk, rules.onDisk = without(hami.onDisk, departing, same), without(rules.onDisk, departing, same)
					hami.log, rules.log = without(hami.log, departing, logName), without(rules.log, departing, logName)
					if diff := cmp.Diff(hami, rules, cmp.AllowUnexported(modelStep{}), cmpopts.EquateEmpty()); diff != "" {
						t.Errorf("step %d: the SDK's rules against HAMi's record (-hami +rules):\n%s", i, diff)
					}
				}
			})
		}
		t.Logf("checked %d vectors from %s (monitor-lister.json, %d with folders HAMi treats otherwise, asserted by the SDK's rule)", len(f.Vectors), folder.Dir, departures)
	}
}

// regionVectorDir is a vector of monitor-regions.json as a folder: loadCache's outcome.
type regionVectorDir struct {
	Name  string `json:"name"`
	Input struct {
		Entries []vectors.FolderEntry `json:"entries"`
	} `json:"input"`
	WantError    string `json:"want_error"`
	WantNil      bool   `json:"want_nil"`
	WantPanic    any    `json:"want_panic"`
	WantLayout   string `json:"want_layout"`
	WantPriority *int32 `json:"want_priority"`
}

// TestRegionFoldersConformance puts each folder of monitor-regions.json under a pod on the
// node and scans it: adopted or not, and which file, by the SDK's rules; against HAMi's
// loadCache where HAMi does not depart from them (file choice, layout casts).
func TestRegionFoldersConformance(t *testing.T) {
	t.Parallel()
	for _, folder := range vectors.Folders(t) {
		var f struct {
			Vectors []regionVectorDir `json:"vectors"`
		}
		if !folder.Read(t, "monitor-regions.json", &f) {
			continue
		}
		departures := 0
		for _, v := range f.Vectors {
			t.Run(folder.Name()+"/"+v.Name, func(t *testing.T) {
				b := newFolderBed(t, Options{})
				b.setPods(nil, testPod("trainer-0", uidA, []string{"main"}))
				name := uidA + "_main"
				makeVectorDir(t, filepath.Join(b.root, ContainersDir), vectorDir{Name: name, AgeSeconds: 3600, Entries: v.Input.Entries}, b.clock.Now())
				b.scan()
				rules := sdkRules(t, v.Input.Entries)
				cs := b.m.Containers(b.ctx)
				adopted := rules.layout != "" && !rules.countErr
				if len(cs) != map[bool]int{true: 1}[adopted] {
					t.Fatalf("%d containers, want adopted=%v (cache %q, layout %q, count error %v)", len(cs), adopted, rules.cache, rules.layout, rules.countErr)
				}
				if adopted {
					c := cs[0]
					if c.Err != nil || filepath.Base(c.Path) != rules.cache || sdkLayout(c.Region.Layout) != rules.layout || c.Region.Priority != rules.priority {
						t.Errorf("adopted %s (err %v), want %s read as %s", c.Path, c.Err, rules.cache, rules.layout)
					}
				}
				if why := departs(t, name, v.Input.Entries, folder.V290); why != "" {
					departures++
					t.Logf("HAMi departs from the SDK's rules: %s", why)
					return
				}
				hamiAdopted := v.WantError == "" && !v.WantNil && v.WantPanic == nil
				if hamiAdopted != adopted || hamiAdopted && v.WantLayout != rules.layout {
					t.Errorf("HAMi: adopted %v as %q; the SDK's rules: adopted %v as %q", hamiAdopted, v.WantLayout, adopted, rules.layout)
				}
				if adopted && v.WantPriority != nil && !rules.misread && *v.WantPriority != cs[0].Region.Priority {
					t.Errorf("priority %d, HAMi read %d from its file", cs[0].Region.Priority, *v.WantPriority)
				}
			})
		}
		t.Logf("checked %d vectors from %s (monitor-regions.json as folders, %d where HAMi departs, asserted by the SDK's rule)", len(f.Vectors), folder.Dir, departures)
	}
}

package monitor

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hamireg/hamireg/hamicore/region"
)

const (
	uidA = "0b1c2d3e-0000-4000-8000-00000000000a"
	uidB = "0b1c2d3e-0000-4000-8000-00000000000b"
)

func TestScanTiesFoldersToContainers(t *testing.T) {
	t.Parallel()
	b := newFolderBed(t, Options{})
	b.setPods(nil, testPod("trainer-0", uidA, []string{"main"}, "setup", "log:always"))
	for _, ctr := range []string{"main", "setup", "log", "ghost"} {
		dir := b.folder("containers/"+uidA+"_"+ctr, time.Hour)
		writeTestRegion(t, filepath.Join(dir, "9f8e7d6c.cache"), 2, 1, 1<<30)
	}
	b.scan()
	want := []string{
		uidA + "_ghost team-a/trainer-0 ghost init=false",
		uidA + "_log team-a/trainer-0 log init=true",
		uidA + "_main team-a/trainer-0 main init=false",
		uidA + "_setup team-a/trainer-0 setup init=true",
	}
	if diff := cmp.Diff(want, b.keys()); diff != "" {
		t.Errorf("containers (-want +got):\n%s", diff)
	}
	cs := b.m.Containers(b.ctx)
	if mem, _ := cs[0].Region.Usage(1); mem.Total != 1<<30 || cs[0].PodUID != uidA || filepath.Base(cs[0].Path) != "9f8e7d6c.cache" {
		t.Errorf("ghost: usage %d, pod UID %s, path %s", mem.Total, cs[0].PodUID, cs[0].Path)
	}
	var adds, ghost int
	for _, l := range b.log.take() {
		if strings.HasPrefix(l.msg, "Adding ctr dirname "+filepath.Join(b.root, "containers", uidA+"_")) && strings.HasSuffix(l.msg, " in monitorpath") && l.level == 0 {
			adds++
		}
		if strings.HasPrefix(l.msg, "Cache folder names a container not in the pod's spec") && l.level == 2 {
			ghost++
		}
	}
	if adds != 4 || ghost != 1 {
		t.Errorf("logged %d Adding lines (want 4) and %d unknown-container lines (want 1)", adds, ghost)
	}
	// A second scan adopts nothing again and logs no Adding line.
	b.scan()
	for _, l := range b.log.take() {
		if strings.HasPrefix(l.msg, "Adding") {
			t.Errorf("second scan logged %q", l.msg)
		}
	}
}

func TestScanCleanupByAge(t *testing.T) {
	t.Parallel()
	b := newFolderBed(t, Options{ResyncInterval: 5 * time.Minute})
	b.setPods(nil, testPod("trainer-0", uidA, []string{"main"}))
	adopted := b.folder("containers/"+uidA+"_main", time.Minute)
	writeTestRegion(t, filepath.Join(adopted, "a.cache"), 1, 1, 1<<30)
	b.age(adopted, time.Minute)
	young := b.folder("containers/"+uidB+"_main", 4*time.Minute)
	writeTestRegion(t, filepath.Join(young, "b.cache"), 1, 1, 1<<30)
	b.age(young, 4*time.Minute)
	b.scan()
	if got := b.keys(); len(got) != 1 || !strings.HasPrefix(got[0], uidA) {
		t.Fatalf("containers %q, want only %s_main (the other pod is not on the node)", got, uidA)
	}

	// The pod leaves: its young folder stays adopted (HAMi's rule), the other is still kept.
	b.setPods(nil)
	b.clock.Step(2 * time.Minute) // adopted 3m old, young 6m old
	b.scan()
	if got := b.keys(); len(got) != 1 {
		t.Errorf("containers after the pod left %q, want %s_main kept until it ages out", got, uidA)
	}
	if _, err := os.Stat(young); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("folder older than the resync interval of a pod not on the node: stat %v, want removed", err)
	}
	removing := "Removing dirname " + young + " in monitorpath"
	if !slices.ContainsFunc(b.log.take(), func(l folderLogLine) bool { return l.msg == removing }) {
		t.Errorf("no log %q", removing)
	}

	b.clock.Step(2*time.Minute + time.Second) // adopted 5m1s old
	b.scan()
	if got := b.keys(); len(got) != 0 {
		t.Errorf("containers %q after the folder aged out, want none", got)
	}
	if _, err := os.Stat(adopted); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("aged-out adopted folder: stat %v, want removed", err)
	}
}

func TestScanWithoutPodsRemovesAndAdoptsNothing(t *testing.T) {
	t.Parallel()
	b := newFolderBed(t, Options{})
	b.setPods(nil, testPod("trainer-0", uidA, []string{"main"}))
	a := b.folder("containers/"+uidA+"_main", time.Hour)
	writeTestRegion(t, filepath.Join(a, "a.cache"), 1, 1, 1<<30)
	b.age(a, time.Hour)
	b.scan()
	if err := b.m.Ready(); err != nil {
		t.Fatalf("Ready after a scan: %v", err)
	}

	synced := errors.New("pod informer not synced")
	b.setPods(synced)
	stale := b.folder("containers/"+uidB+"_main", time.Hour)
	fresh := b.folder("containers/"+uidA+"_side", time.Hour)
	writeTestRegion(t, filepath.Join(fresh, "c.cache"), 1, 1, 1<<30)
	b.scan()
	if _, err := os.Stat(stale); err != nil {
		t.Errorf("folder removed while the pods were not listed: %v", err)
	}
	if got := b.keys(); len(got) != 1 || !strings.HasSuffix(strings.Fields(got[0])[0], "_main") {
		t.Errorf("containers %q without pods: want the adopted one only", got)
	}
	if err := b.m.Ready(); !errors.Is(err, ErrNotReady) || !errors.Is(err, synced) {
		t.Errorf("Ready without pods = %v, want ErrNotReady wrapping the listing error", err)
	}

	b.setPods(nil, testPod("trainer-0", uidA, []string{"main", "side"}))
	b.scan()
	if got := b.keys(); len(got) != 2 {
		t.Errorf("containers %q once the pods are listed, want main and side", got)
	}
	if _, err := os.Stat(stale); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("stale folder once the pods are listed: stat %v, want removed", err)
	}
}

func TestScanSkipsMalformedNames(t *testing.T) {
	t.Parallel()
	b := newFolderBed(t, Options{})
	b.setPods(nil, testPod("trainer-0", uidA, []string{"main"}))
	for _, name := range []string{uidA, "_main", uidA + "_"} {
		dir := b.folder("containers/"+name, 24*time.Hour)
		writeTestRegion(t, filepath.Join(dir, "a.cache"), 1, 1, 1<<30)
		b.age(dir, 24*time.Hour)
	}
	if err := os.WriteFile(filepath.Join(b.root, ContainersDir, "stray-file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for round := range 2 {
		b.scan()
		if got := b.keys(); len(got) != 0 {
			t.Errorf("round %d: containers %q, want none", round, got)
		}
		var skipped []string
		for _, l := range b.log.take() {
			if name, ok := strings.CutPrefix(l.msg, "Skipping dir with unexpected name format: "); ok {
				if want := min(round, 1) * 4; l.level != want {
					t.Errorf("round %d: %q at V(%d), want V(%d)", round, l.msg, l.level, want)
				}
				skipped = append(skipped, name)
			}
		}
		if want := []string{uidA, uidA + "_", "_main"}; !cmp.Equal(want, skipped) {
			t.Errorf("round %d: skipped %q, want %q", round, skipped, want)
		}
	}
	for _, name := range []string{uidA, "_main", uidA + "_"} {
		if _, err := os.Stat(filepath.Join(b.root, ContainersDir, name)); err != nil {
			t.Errorf("malformed folder %q removed: %v", name, err)
		}
	}
	// A folder removed and made again is news again: logged at V(0).
	if err := os.RemoveAll(filepath.Join(b.root, ContainersDir, "_main")); err != nil {
		t.Fatal(err)
	}
	b.scan()
	b.folder("containers/_main", time.Hour)
	b.log.take()
	b.scan()
	if !slices.Contains(b.log.take(), folderLogLine{0, "Skipping dir with unexpected name format: _main"}) {
		t.Errorf("a malformed folder made again was not logged at V(0)")
	}
}

func TestScanLoadErrors(t *testing.T) {
	t.Parallel()
	b := newFolderBed(t, Options{})
	b.setPods(nil, testPod("trainer-0", uidA, []string{"main", "side", "third", "four"}))
	notInit := b.folder("containers/"+uidA+"_main", time.Hour)
	if err := os.WriteFile(filepath.Join(notInit, "a.cache"), make([]byte, 2008953), 0o644); err != nil {
		t.Fatal(err)
	}
	unknown := b.folder("containers/"+uidA+"_side", time.Hour)
	writeTestRegion(t, filepath.Join(unknown, "a.cache"), 1, 1, 1<<30)
	if err := os.Truncate(filepath.Join(unknown, "a.cache"), 4096); err != nil {
		t.Fatal(err)
	}
	threeCaches := b.folder("containers/"+uidA+"_third", time.Hour)
	for _, n := range []string{"a.cache", "b.cache"} {
		writeTestRegion(t, filepath.Join(threeCaches, n), 1, 1, 1<<30)
	}
	empty := b.folder("containers/"+uidA+"_four", time.Hour)
	for round := range 2 {
		b.scan()
		if got := b.keys(); len(got) != 0 {
			t.Errorf("round %d: containers %q, want none", round, got)
		}
		levels := map[string]int{}
		for _, l := range b.log.take() {
			for _, dir := range []string{notInit, unknown, threeCaches} {
				if strings.HasPrefix(l.msg, "Failed to load cache: "+dir+", error: ") {
					levels[dir] = l.level
				}
			}
			if l.msg == "No cache file in "+empty {
				levels[empty] = l.level
			}
		}
		want := map[string]int{notInit: 4, unknown: 0, threeCaches: 0, empty: 4}
		if round > 0 {
			want[unknown], want[threeCaches] = 4, 4
		}
		if diff := cmp.Diff(want, levels); diff != "" {
			t.Errorf("round %d: log levels per folder (-want +got):\n%s", round, diff)
		}
	}
	// The region is initialised later: adopted at the next scan.
	writeTestRegion(t, filepath.Join(notInit, "a.cache"), 1, 1, 1<<30)
	b.scan()
	if got := b.keys(); len(got) != 1 {
		t.Errorf("containers %q after the region was initialised, want main", got)
	}
}

// replaceFile writes a new region at path through a rename: another inode.
func replaceFile(t *testing.T, path string, mem uint64) {
	t.Helper()
	tmp := path + ".new"
	writeTestRegion(t, tmp, 1, 1, mem)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func TestContainersAfterRegionChanges(t *testing.T) {
	t.Parallel()
	b := newFolderBed(t, Options{})
	ctrs := []string{"a", "b", "c", "d", "e"}
	b.setPods(nil, testPod("trainer-0", uidA, ctrs))
	paths := map[string]string{}
	for _, c := range ctrs {
		dir := b.folder("containers/"+uidA+"_"+c, time.Hour)
		paths[c] = filepath.Join(dir, "x.cache")
		writeTestRegion(t, paths[c], 1, 1, 1<<30)
	}
	b.scan()

	replaceFile(t, paths["a"], 2<<30)
	if err := os.Truncate(paths["b"], 4096); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(paths["c"]); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Dir(paths["d"])); err != nil {
		t.Fatal(err)
	}
	check := func(when string, want map[string]error, wantMem map[string]uint64) {
		t.Helper()
		got := map[string]error{}
		for _, c := range b.m.Containers(b.ctx) {
			got[c.Name] = c.Err
			if c.Err == nil {
				if mem, _ := c.Region.Usage(0); mem.Total != wantMem[c.Name] {
					t.Errorf("%s: %s uses %d bytes, want %d", when, c.Name, mem.Total, wantMem[c.Name])
				}
			}
		}
		if len(got) != len(want) {
			t.Errorf("%s: containers %v, want %v", when, got, want)
		}
		for name, w := range want {
			if g, ok := got[name]; !ok || (w == nil) != (g == nil) || (w != nil && !errors.Is(g, w)) {
				t.Errorf("%s: %s error %v, want %v", when, name, g, w)
			}
		}
	}
	check("before the scan", map[string]error{"a": ErrRegionChanged, "b": region.ErrInvalid, "c": fs.ErrNotExist, "d": fs.ErrNotExist, "e": nil},
		map[string]uint64{"e": 1 << 30})

	b.scan()
	// a is adopted again (other inode), b fails to load (4096 bytes), c and d are gone.
	check("after the scan", map[string]error{"a": nil, "e": nil}, map[string]uint64{"a": 2 << 30, "e": 1 << 30})
	if !slices.ContainsFunc(b.log.take(), func(l folderLogLine) bool {
		return strings.HasPrefix(l.msg, "Failed to load cache: "+filepath.Dir(paths["b"])+", error: ")
	}) {
		t.Errorf("no Failed to load cache line for the truncated region")
	}
	// A region rewritten to another size in place is adopted again.
	writeTestRegion(t, paths["b"], 1, 1, 3<<30)
	b.scan()
	check("after b was rewritten", map[string]error{"a": nil, "b": nil, "e": nil}, map[string]uint64{"a": 2 << 30, "b": 3 << 30, "e": 1 << 30})
}

// Containers keeps reading the others while one region is truncated, replaced and removed
// under it, concurrently with scans.
func TestContainersDuringRegionChanges(t *testing.T) {
	t.Parallel()
	b := newFolderBed(t, Options{})
	ctrs := []string{"a", "b", "c", "victim"}
	b.setPods(nil, testPod("trainer-0", uidA, ctrs))
	var victim string
	for _, c := range ctrs {
		dir := b.folder("containers/"+uidA+"_"+c, time.Hour)
		victim = filepath.Join(dir, "x.cache")
		writeTestRegion(t, victim, 2, 3, 1<<30)
	}
	b.scan()
	fresh := folderRegion(2, 3, 1<<30)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			switch i % 4 {
			case 0:
				_ = os.Truncate(victim, int64(i%7)*300000)
			case 1:
				_ = os.Remove(victim)
			case 2:
				if region.WriteFile(victim+".tmp", fresh) == nil {
					_ = os.Rename(victim+".tmp", victim)
				}
			default:
				_ = region.WriteFile(victim, fresh)
			}
		}
	})
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			_ = b.m.scan(b.ctx)
		}
	})
	for range 200 {
		for _, c := range b.m.Containers(b.ctx) {
			if c.Name == "victim" {
				continue
			}
			if c.Err != nil {
				t.Fatalf("%s: %v while another region changed", c.Name, c.Err)
			}
			if mem, _ := c.Region.Usage(1); mem.Total != 3<<30 {
				t.Fatalf("%s: %d bytes on GPU 1, want %d", c.Name, mem.Total, 3<<30)
			}
		}
	}
	close(stop)
	wg.Wait()
}

// claimsMap is a Claims from a map.
type claimsMap map[types.UID]types.NamespacedName

func (c claimsMap) Claim(uid types.UID) (types.NamespacedName, bool) {
	nn, ok := c[uid]
	return nn, ok
}

func TestScanClaims(t *testing.T) {
	t.Parallel()
	const claimUID, otherUID = "c1a1a1a1-0000-4000-8000-000000000001", "c1a1a1a1-0000-4000-8000-000000000002"
	b := newFolderBed(t, Options{Claims: claimsMap{claimUID: {Namespace: "team-a", Name: "trainer-gpu-x7k2p"}}})
	// trainer-0: the claim comes from a template (status), two containers and an init
	// container use it, one container does not.
	p0 := testPod("trainer-0", uidA, []string{"main", "helper", "idle"}, "warmup")
	gen := "trainer-gpu-x7k2p"
	p0.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu"}}
	p0.Status.ResourceClaimStatuses = []corev1.PodResourceClaimStatus{{Name: "gpu", ResourceClaimName: &gen}}
	for _, i := range []int{0, 1} {
		p0.Spec.Containers[i].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
	}
	p0.Spec.InitContainers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
	// trainer-1 names the claim directly.
	p1 := testPod("trainer-1", uidB, []string{"main"})
	p1.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "shared", ResourceClaimName: &gen}}
	p1.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "shared"}}
	// A pod of another namespace with a claim of the same name is not tied.
	p2 := testPod("trainer-2", "0b1c2d3e-0000-4000-8000-00000000000c", []string{"main"})
	p2.Namespace = "team-b"
	p2.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &gen}}
	p2.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
	b.setPods(nil, p0, p1, p2)

	dir := b.folder("claims/"+claimUID, 24*time.Hour)
	writeTestRegion(t, filepath.Join(dir, claimUID+".cache"), 2, 2, 1<<30)
	other := b.folder("claims/"+otherUID, 24*time.Hour)
	writeTestRegion(t, filepath.Join(other, otherUID+".cache"), 2, 2, 1<<30)
	b.age(other, 24*time.Hour)
	for range 2 {
		b.scan()
	}
	key := "claims/" + claimUID
	want := []string{
		key + " team-a/trainer-0 helper init=false",
		key + " team-a/trainer-0 main init=false",
		key + " team-a/trainer-0 warmup init=true",
		key + " team-a/trainer-1 main init=false",
	}
	if diff := cmp.Diff(want, b.keys()); diff != "" {
		t.Errorf("claim containers (-want +got):\n%s", diff)
	}
	cs := b.m.Containers(b.ctx)
	for _, c := range cs {
		if c.Claim != (types.NamespacedName{Namespace: "team-a", Name: gen}) || c.Region != cs[0].Region || filepath.Base(c.Path) != claimUID+".cache" {
			t.Errorf("%s/%s: claim %v, path %s, region shared %v", c.Pod, c.Name, c.Claim, c.Path, c.Region == cs[0].Region)
		}
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("claim folder of an unknown claim removed: %v", err)
	}
	var unknown []int
	for _, l := range b.log.take() {
		if strings.HasPrefix(l.msg, "Skipping claim folder of a claim not prepared on this node") {
			unknown = append(unknown, l.level)
		}
	}
	if !cmp.Equal(unknown, []int{0, 4}) {
		t.Errorf("unknown claim logged at levels %v, want once at V(0), then V(4)", unknown)
	}

	// The second pod goes: the claim's containers follow the pods at the next scan.
	b.setPods(nil, p0)
	b.scan()
	if got := b.keys(); len(got) != 3 {
		t.Errorf("claim containers %q after trainer-1 left, want 3", got)
	}
}

func TestScanClaimsWithoutResolver(t *testing.T) {
	t.Parallel()
	b := newFolderBed(t, Options{})
	b.setPods(nil, testPod("trainer-0", uidA, []string{"main"}))
	dir := b.folder("claims/c1", time.Hour)
	writeTestRegion(t, filepath.Join(dir, "c1.cache"), 1, 1, 1<<30)
	b.scan()
	b.scan()
	if got := b.keys(); len(got) != 0 {
		t.Errorf("containers %q without Options.Claims, want none", got)
	}
	var levels []int
	for _, l := range b.log.take() {
		if strings.HasPrefix(l.msg, "Skipping claim folders: Options.Claims is not set") {
			levels = append(levels, l.level)
		}
	}
	if !cmp.Equal(levels, []int{0, 4}) {
		t.Errorf("logged at levels %v, want once at V(0), then V(4)", levels)
	}
}

func TestReady(t *testing.T) {
	t.Parallel()
	b := newFolderBed(t, Options{})
	if err := b.m.Ready(); !errors.Is(err, ErrNotReady) {
		t.Errorf("Ready before a scan = %v, want ErrNotReady", err)
	}
	if err := os.Remove(filepath.Join(b.root, ContainersDir)); err != nil {
		t.Fatal(err)
	}
	err := b.m.scan(b.ctx)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("scan without the containers folder = %v, want ErrNotExist", err)
	}
	if err := b.m.Ready(); !errors.Is(err, ErrNotReady) || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Ready after a failed scan = %v, want ErrNotReady wrapping ErrNotExist", err)
	}
	if err := os.Mkdir(filepath.Join(b.root, ContainersDir), 0o755); err != nil {
		t.Fatal(err)
	}
	b.scan()
	if err := b.m.Ready(); err != nil {
		t.Errorf("Ready after a scan = %v", err)
	}
}

func TestParseFolderName(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		uid, ctr string
		ok       bool
	}{
		uidA + "_main":   {uidA, "main", true},
		uidA + "_main_x": {uidA, "main_x", true}, // everything after the first '_' (v2.9.0: "main")
		uidA:             {},                     // v2.9.0 panics
		"_main":          {},                     // v2.9.0 removes it as a pod not on the node
		uidA + "_":       {},
		"":               {},
		"_":              {},
	}
	for name, tt := range tests {
		uid, ctr, ok := parseFolderName(name)
		if string(uid) != tt.uid || ctr != tt.ctr || ok != tt.ok {
			t.Errorf("parseFolderName(%q) = %q, %q, %v; want %q, %q, %v", name, uid, ctr, ok, tt.uid, tt.ctr, tt.ok)
		}
	}
}

func FuzzParseFolderName(f *testing.F) {
	for _, s := range []string{uidA + "_main", uidA, "_main", "a_", "a_b_c", "", "_", "__"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		uid, ctr, ok := parseFolderName(name)
		parts := strings.SplitN(name, "_", 2)
		wantOK := len(parts) == 2 && parts[0] != "" && parts[1] != ""
		if ok != wantOK {
			t.Fatalf("parseFolderName(%q) ok = %v, want %v", name, ok, wantOK)
		}
		if ok && (string(uid)+"_"+ctr != name || strings.Contains(string(uid), "_")) {
			t.Fatalf("parseFolderName(%q) = %q, %q", name, uid, ctr)
		}
		if !ok && (uid != "" || ctr != "") {
			t.Fatalf("parseFolderName(%q) = %q, %q, false", name, uid, ctr)
		}
	})
}

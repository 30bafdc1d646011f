package monitor

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hamireg/hamireg/hamicore/region"
)

// fbWrite is one changed 4-byte word of a region file after a round.
type fbWrite struct {
	Dir      string
	Offset   int64
	From, To int32
}

func sortWrites(ws []fbWrite) []fbWrite {
	slices.SortFunc(ws, func(a, b fbWrite) int {
		return cmp.Or(strings.Compare(a.Dir, b.Dir), cmp.Compare(a.Offset, b.Offset))
	})
	return ws
}

// fbNode is a scratch node: <root>/containers/<dir>/<dir>.cache per container.
type fbNode struct {
	root string
	dirs []string // sorted
}

func newFBNode(tb testing.TB) *fbNode {
	tb.Helper()
	return &fbNode{root: tb.TempDir()}
}

func (n *fbNode) path(dir string) string {
	return filepath.Join(n.root, "containers", dir, "region.cache")
}

// put writes a container's region file from raw bytes.
func (n *fbNode) put(tb testing.TB, dir string, raw []byte) {
	tb.Helper()
	if err := os.MkdirAll(filepath.Dir(n.path(dir)), 0o755); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(n.path(dir), raw, 0o600); err != nil {
		tb.Fatal(err)
	}
	n.add(dir)
}

// putRegion writes a container's region file with region.WriteFile.
func (n *fbNode) putRegion(tb testing.TB, dir string, r *region.Region) {
	tb.Helper()
	if err := os.MkdirAll(filepath.Dir(n.path(dir)), 0o755); err != nil {
		tb.Fatal(err)
	}
	if err := region.WriteFile(n.path(dir), r); err != nil {
		tb.Fatal(err)
	}
	n.add(dir)
}

func (n *fbNode) add(dir string) {
	if i, found := slices.BinarySearch(n.dirs, dir); !found {
		n.dirs = slices.Insert(n.dirs, i, dir)
	}
}

// setField stores v into f of dir's region, as HAMi-core does through its mapping.
func (n *fbNode) setField(tb testing.TB, dir string, f region.Field, v int32) {
	tb.Helper()
	r, err := region.ReadFile(n.path(dir))
	if err != nil {
		tb.Fatal(err)
	}
	file, err := os.OpenFile(n.path(dir), os.O_RDWR, 0)
	if err != nil {
		tb.Fatal(err)
	}
	defer func() { _ = file.Close() }()
	if err := region.WriteField(file, r.Layout, f, v); err != nil {
		tb.Fatal(err)
	}
}

// snapshot returns every region file's bytes.
func (n *fbNode) snapshot(tb testing.TB) map[string][]byte {
	tb.Helper()
	out := make(map[string][]byte, len(n.dirs))
	for _, d := range n.dirs {
		b, err := os.ReadFile(n.path(d))
		if err != nil {
			tb.Fatal(err)
		}
		out[d] = b
	}
	return out
}

// diff returns every 4-byte word that changed between two snapshots.
func diff(before, after map[string][]byte) []fbWrite {
	var ws []fbWrite
	for d, a := range after {
		b := before[d]
		n := min(len(a), len(b)) &^ 3
		const chunk = 4096
		for lo := 0; lo < n; lo += chunk {
			hi := min(lo+chunk, n)
			if bytes.Equal(a[lo:hi], b[lo:hi]) {
				continue
			}
			for off := lo; off < hi; off += 4 {
				if x, y := binary.LittleEndian.Uint32(b[off:]), binary.LittleEndian.Uint32(a[off:]); x != y {
					ws = append(ws, fbWrite{Dir: d, Offset: int64(off), From: int32(x), To: int32(y)})
				}
			}
		}
	}
	return sortWrites(ws)
}

// containers reads the regions of dirs (all when nil) fresh, as the monitor's scan gives
// them to a round: Key is the folder, the pod and container come from its name and pods.
func (n *fbNode) containers(tb testing.TB, dirs []string, pods []*corev1.Pod) []Container {
	tb.Helper()
	if dirs == nil {
		dirs = n.dirs
	}
	byUID := make(map[types.UID]*corev1.Pod, len(pods))
	for _, p := range pods {
		byUID[p.UID] = p
	}
	cs := make([]Container, 0, len(dirs))
	for _, d := range dirs {
		uid, name, _ := strings.Cut(d, "_")
		c := Container{Key: d, Path: n.path(d), PodUID: types.UID(uid), Name: name}
		if p := byUID[c.PodUID]; p != nil {
			c.Pod = types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
		}
		c.Region, c.Err = region.ReadFile(c.Path)
		if c.Err != nil {
			c.Region = nil
		}
		cs = append(cs, c)
	}
	return cs
}

// newFBMonitor returns a monitor of a node whose pods are pods.
func newFBMonitor(tb testing.TB, root string, pods []*corev1.Pod, opts Options) *Monitor {
	tb.Helper()
	opts.Root, opts.NodeName = root, "node1"
	m, err := New(PodsFunc(func() ([]*corev1.Pod, error) { return pods, nil }), opts)
	if err != nil {
		tb.Fatal(err)
	}
	return m
}

// fbPod is a pod of one container per name; prio, when not nil, sets each container's
// nvidia.com/priority limit.
func fbPod(uid, name string, containers []string, prio *int64) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID(uid)},
		Spec: corev1.PodSpec{NodeName: "node1"}}
	for _, c := range containers {
		ctr := corev1.Container{Name: c}
		if prio != nil {
			ctr.Resources.Limits = corev1.ResourceList{"nvidia.com/priority": *resourceInt(*prio)}
		}
		p.Spec.Containers = append(p.Spec.Containers, ctr)
	}
	return p
}

// fbRegion is a fresh v1.2 region on gpus with the feedback words given.
func fbRegion(tb testing.TB, gpus []string, prio, rk, sw int32) *region.Region {
	tb.Helper()
	r := &region.Region{Layout: region.LayoutV1, Major: 1, Minor: 2, DeviceCount: uint64(len(gpus)),
		Priority: prio, RecentKernel: rk, UtilizationSwitch: sw, ProcNum: 1,
		Slots: []region.Slot{{Index: 0, PID: 10, HostPID: 4000, Status: 1}}}
	r.Devices = make([]region.Device, len(gpus))
	for i, g := range gpus {
		if err := r.Devices[i].SetUUID(g); err != nil {
			tb.Fatal(err)
		}
		r.Devices[i].SMLimit = 30
	}
	return r
}

// modelCtr is one container as the reference models of the rules see it.
type modelCtr struct {
	dir       string
	p, rk, sw int32
	gpus      []gpuKey
	rkOff     int64
	swOff     int64
}

func modelOf(c *Container, p int32) modelCtr {
	rkOff, _ := c.Region.Layout.Offset(region.FieldRecentKernel)
	swOff, _ := c.Region.Layout.Offset(region.FieldUtilizationSwitch)
	mc := modelCtr{dir: c.Key, p: p, rk: c.Region.RecentKernel, sw: c.Region.UtilizationSwitch, rkOff: rkOff, swOff: swOff}
	for i := range c.Region.Devices {
		if c.Region.Devices[i].ValidUUID() {
			mc.gpus = append(mc.gpus, c.Region.Devices[i].RawUUID)
		}
	}
	return mc
}

// denseCounts is HAMi's table: counts[gpu] is a slice indexed by priority.
type denseCounts map[gpuKey][]int

// masterModel is the SDK's rule (HAMi v2.10.0's Observe) written the way HAMi writes it, a
// dense slice per GPU grown to the priority, independently of the package's sparse table.
// It returns the words the round writes.
func masterModel(cs []modelCtr) []fbWrite {
	counts := denseCounts{}
	var ws []fbWrite
	rks := make([]int32, len(cs))
	for i, c := range cs {
		rks[i] = c.rk
		if c.rk <= 0 {
			continue
		}
		rks[i]--
		ws = append(ws, fbWrite{c.dir, c.rkOff, c.rk, rks[i]})
		if rks[i] > 0 && c.p >= 0 {
			for _, g := range c.gpus {
				s := counts[g]
				for int32(len(s)) <= c.p {
					s = append(s, 0)
				}
				s[c.p]++
				counts[g] = s
			}
		}
	}
	for i, c := range cs {
		blocked := denseBlocking(counts, c.p, c.gpus)
		prio := densePriority(counts, c.p, c.gpus)
		switch {
		case blocked && rks[i] >= 0:
			ws = append(ws, fbWrite{c.dir, c.rkOff, rks[i], -1})
		case !blocked && rks[i] < 0:
			ws = append(ws, fbWrite{c.dir, c.rkOff, rks[i], 0})
		}
		switch {
		case prio && c.sw != 1:
			ws = append(ws, fbWrite{c.dir, c.swOff, c.sw, 1})
		case !prio && c.sw != 0:
			ws = append(ws, fbWrite{c.dir, c.swOff, c.sw, 0})
		}
	}
	return mergeWrites(ws)
}

// denseBlocking is HAMi v2.10.0's CheckBlocking on its dense table: any j < min(p, len)
// with a count on any of the container's GPUs.
func denseBlocking(counts denseCounts, p int32, gpus []gpuKey) bool {
	for _, g := range gpus {
		s, ok := counts[g]
		if !ok {
			continue
		}
		for j := 0; j < min(int(p), len(s)); j++ {
			if s[j] > 0 {
				return true
			}
		}
	}
	return false
}

// densePriority is HAMi v2.10.0's CheckPriority on its dense table.
func densePriority(counts denseCounts, p int32, gpus []gpuKey) bool {
	if denseBlocking(counts, p, gpus) {
		return true
	}
	for _, g := range gpus {
		if s := counts[g]; p >= 0 && int(p) < len(s) && s[p] > 1 {
			return true
		}
	}
	return false
}

// v290Model is HAMi v2.9.0's Observe: a two-entry slice per GPU (priority >= 2 or < 0
// panics), CheckBlocking returning at the first of the container's GPUs in the table. It
// reports whether the round panicked (writes made before the panic are kept).
func v290Model(cs []modelCtr) (ws []fbWrite, panicked bool) {
	counts := denseCounts{}
	rks := make([]int32, len(cs))
	for i, c := range cs {
		rks[i] = c.rk
		if c.rk <= 0 {
			continue
		}
		rks[i]--
		if rks[i] > 0 {
			for _, g := range c.gpus {
				if counts[g] == nil {
					counts[g] = make([]int, 2)
				}
				if c.p < 0 || int(c.p) >= len(counts[g]) {
					return mergeWrites(ws), true
				}
				counts[g][c.p]++
			}
		}
		ws = append(ws, fbWrite{c.dir, c.rkOff, c.rk, rks[i]})
	}
	for i, c := range cs {
		blocked, bp := v290Blocking(counts, c.p, c.gpus)
		prio, pp := v290Priority(counts, c.p, c.gpus)
		if bp || pp {
			return mergeWrites(ws), true
		}
		switch {
		case blocked && rks[i] >= 0:
			ws = append(ws, fbWrite{c.dir, c.rkOff, rks[i], -1})
		case !blocked && rks[i] < 0:
			ws = append(ws, fbWrite{c.dir, c.rkOff, rks[i], 0})
		}
		switch {
		case prio && c.sw != 1:
			ws = append(ws, fbWrite{c.dir, c.swOff, c.sw, 1})
		case !prio && c.sw != 0:
			ws = append(ws, fbWrite{c.dir, c.swOff, c.sw, 0})
		}
	}
	return mergeWrites(ws), false
}

// v290Blocking is v2.9.0's CheckBlocking: the first of the container's GPUs found in the
// table decides; j < p unbounded (an index beyond the slice panics).
func v290Blocking(counts denseCounts, p int32, gpus []gpuKey) (result, panicked bool) {
	for _, g := range gpus {
		s, ok := counts[g]
		if !ok {
			continue
		}
		for j := 0; j < int(p); j++ {
			if j >= len(s) {
				return false, true
			}
			if s[j] > 0 {
				return true, false
			}
		}
		return false, false
	}
	return false, false
}

// v290Priority is v2.9.0's CheckPriority: every GPU, j < p and counts[p] unbounded.
func v290Priority(counts denseCounts, p int32, gpus []gpuKey) (result, panicked bool) {
	for _, g := range gpus {
		s, ok := counts[g]
		if !ok {
			continue
		}
		for j := 0; j < int(p); j++ {
			if j >= len(s) {
				return false, true
			}
			if s[j] > 0 {
				return true, false
			}
		}
		if p < 0 || int(p) >= len(s) {
			return false, true
		}
		if s[p] > 1 {
			return true, false
		}
	}
	return false, false
}

// mergeWrites folds successive writes of one word into one change (from the first old
// value to the last new one), drops words written back to their value, and sorts.
func mergeWrites(ws []fbWrite) []fbWrite {
	type key struct {
		dir string
		off int64
	}
	first := map[key]int{}
	var out []fbWrite
	for _, w := range ws {
		k := key{w.Dir, w.Offset}
		if i, ok := first[k]; ok {
			out[i].To = w.To
			continue
		}
		first[k] = len(out)
		out = append(out, w)
	}
	out = slices.DeleteFunc(out, func(w fbWrite) bool { return w.From == w.To })
	return sortWrites(out)
}

func resourceInt(v int64) *resource.Quantity { return resource.NewQuantity(v, resource.DecimalSI) }

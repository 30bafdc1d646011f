package monitor

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/hamireg/hamireg/hamicore/region"
)

// folderLog records the messages logged through a logr.Logger, at every verbosity.
type folderLog struct {
	mu    sync.Mutex
	lines []folderLogLine
}

type folderLogLine struct {
	level int
	msg   string
}

type folderLogSink struct{ log *folderLog }

func (s folderLogSink) Init(logr.RuntimeInfo)                 {}
func (s folderLogSink) Enabled(int) bool                      { return true }
func (s folderLogSink) WithValues(...any) logr.LogSink        { return s }
func (s folderLogSink) WithName(string) logr.LogSink          { return s }
func (s folderLogSink) Info(level int, msg string, _ ...any)  { s.log.add(level, msg) }
func (s folderLogSink) Error(err error, msg string, _ ...any) { s.log.add(0, msg+": "+err.Error()) }
func (l *folderLog) add(level int, msg string) {
	l.mu.Lock()
	l.lines = append(l.lines, folderLogLine{level, msg})
	l.mu.Unlock()
}
func (l *folderLog) context(ctx context.Context) context.Context {
	return klog.NewContext(ctx, logr.New(folderLogSink{l}))
}

// take returns the lines logged since the last take and forgets them.
func (l *folderLog) take() []folderLogLine {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.lines
	l.lines = nil
	return out
}

// folderBed is a node's <Root> with its pods, a fake clock and a monitor over them.
type folderBed struct {
	t     *testing.T
	root  string
	clock *testingclock.FakeClock
	log   *folderLog
	ctx   context.Context
	m     *Monitor

	mu      sync.Mutex
	pods    []*corev1.Pod
	podsErr error
}

func newFolderBed(t *testing.T, opts Options) *folderBed {
	t.Helper()
	b := &folderBed{t: t, root: t.TempDir(), clock: testingclock.NewFakeClock(time.Date(2026, 7, 1, 12, 0, 0, 0, time.UTC)), log: &folderLog{}}
	if err := os.MkdirAll(filepath.Join(b.root, ContainersDir), 0o755); err != nil {
		t.Fatal(err)
	}
	b.ctx = b.log.context(t.Context())
	opts.Root, opts.NodeName, opts.Clock = b.root, "node-1", b.clock
	opts.DisableFeedback = true
	m, err := New(PodsFunc(b.nodePods), opts)
	if err != nil {
		t.Fatal(err)
	}
	b.m = m
	return b
}

func (b *folderBed) nodePods() ([]*corev1.Pod, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.pods, b.podsErr
}

func (b *folderBed) setPods(err error, pods ...*corev1.Pod) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.pods, b.podsErr = pods, err
}

// scan runs one scan and fails the test on its error.
func (b *folderBed) scan() {
	b.t.Helper()
	if err := b.m.scan(b.ctx); err != nil {
		b.t.Fatalf("scan: %v", err)
	}
}

// folder creates <Root>/<rel> with mtime age before the clock's now, with libvgpu.so.
func (b *folderBed) folder(rel string, age time.Duration) string {
	b.t.Helper()
	dir := filepath.Join(b.root, rel)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, libName), nil, 0o644); err != nil {
		b.t.Fatal(err)
	}
	b.age(dir, age)
	return dir
}

// age sets path's mtime to age before the clock's now.
func (b *folderBed) age(path string, age time.Duration) {
	b.t.Helper()
	when := b.clock.Now().Add(-age)
	if err := os.Chtimes(path, when, when); err != nil {
		b.t.Fatal(err)
	}
}

// keys returns "key pod container init" of each Container, failing on a read error.
func (b *folderBed) keys() []string {
	b.t.Helper()
	var out []string
	for _, c := range b.m.Containers(b.ctx) {
		if c.Err != nil {
			b.t.Errorf("%s: %v", c.Key, c.Err)
		}
		out = append(out, fmt.Sprintf("%s %s %s init=%v", c.Key, c.Pod, c.Name, c.Init))
	}
	return out
}

// writeTestRegion writes folderRegion(devs, procs, mem) to path.
func writeTestRegion(tb testing.TB, path string, devs, procs int, mem uint64) {
	tb.Helper()
	if err := region.WriteFile(path, folderRegion(devs, procs, mem)); err != nil {
		tb.Fatal(err)
	}
}

// folderRegion is a v1.2 region of devs GPUs with procs live slots, each using every GPU with
// mem bytes (total).
func folderRegion(devs, procs int, mem uint64) *region.Region {
	r := &region.Region{Layout: region.LayoutV1, DeviceCount: uint64(devs), ProcNum: int32(procs),
		UtilizationSwitch: 1, RecentKernel: 2, Priority: 1, LastKernelTime: 1767225600}
	for i := range devs {
		d := region.Device{MemoryLimit: 8 << 30, SMLimit: 50}
		copy(d.RawUUID[:], fmt.Sprintf("GPU-%08x-1111-2222-3333-444455556666", i))
		r.Devices = append(r.Devices, d)
	}
	for k := range procs {
		s := region.Slot{Index: k, PID: int32(100 + k), HostPID: int32(4000 + k), Status: 1, Seq: 2}
		for i := range devs {
			s.Used[i] = region.Memory{Context: 300 << 20, Data: mem - 300<<20, Total: mem}
			s.MonitorUsed[i] = mem
			s.Util[i].SM = 10
		}
		r.Slots = append(r.Slots, s)
	}
	return r
}

// testPod is a pod of namespace team-a with uid, the given containers and init containers
// ("name" or "name:always" for a native sidecar).
func testPod(name string, uid types.UID, containers []string, inits ...string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name, UID: uid}}
	for _, c := range containers {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: c})
	}
	for _, c := range inits {
		n, always := strings.CutSuffix(c, ":always")
		k := corev1.Container{Name: n}
		if always {
			k.RestartPolicy = new(corev1.ContainerRestartPolicyAlways)
		}
		p.Spec.InitContainers = append(p.Spec.InitContainers, k)
	}
	return p
}

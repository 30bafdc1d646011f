package draplugin

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"
)

// lockHolderEnv makes the test binary a child that holds the plugin lock of the folder it
// names until its stdin closes (see TestLockAcrossProcesses).
const lockHolderEnv = "DRAPLUGIN_TEST_LOCK_HOLDER"

// holdLock is the child's body: lock, say "locked", wait for stdin's end.
func holdLock(dir string) int {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	f, err := os.OpenFile(filepath.Join(dir, LockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("locked")
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	return 0
}

// reserved marks c reserved for a pod.
func reserved(c *resourcev1.ResourceClaim) *resourcev1.ResourceClaim {
	c.Status.ReservedFor = []resourcev1.ResourceClaimConsumerReference{{Resource: "pods", Name: "p", UID: "pod-uid"}}
	return c
}

// robustPlugin is a plugin with state folders on temp dirs, with the GPUs set.
func robustPlugin(t *testing.T, client *fake.Clientset, mod func(*Options)) (*Plugin, Options) {
	t.Helper()
	opts := testOptions(t, client)
	opts.PrepareStateDir = true
	if mod != nil {
		mod(&opts)
	}
	p := newPlugin(t, opts)
	p.SetDevices(testGPUs(), testDevices(t, opts.Profile, testGPUs()))
	return p, opts
}

func mustPrepare(t *testing.T, p *Plugin, claims ...*resourcev1.ResourceClaim) {
	t.Helper()
	for uid, r := range prepare(t, p, claims...) {
		if r.Err != nil {
			t.Fatalf("prepare %s: %v", uid, r.Err)
		}
	}
}

func exists(path string) bool { _, err := os.Stat(path); return err == nil }

func stateDirOf(opts Options, uid types.UID) string {
	return filepath.Join(opts.Env.HookPath, "vgpu", "claims", string(uid))
}

func TestCheckpointChecksum(t *testing.T) {
	t.Parallel()
	data, err := encodeCheckpoint("gpu.hamireg.io", fuzzClaims())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), `"checksum": "sha256:`) || !strings.Contains(string(data), `"version": 2`) {
		t.Fatalf("checkpoint without a version 2 checksum:\n%s", data)
	}
	if _, err := decodeCheckpoint(data); err != nil {
		t.Fatalf("decode: %v", err)
	}
	for name, mangled := range map[string]string{
		"a value changed": strings.Replace(string(data), `"memoryMiB": 1024`, `"memoryMiB": 1025`, 1),
		"a claim renamed": strings.Replace(string(data), `"name": "c"`, `"name": "d"`, 1),
		"truncated":       string(data[:len(data)-10]),
		"not JSON":        "\x00\x01garbage",
		"empty":           "",
		"no checksum":     strings.Replace(string(data), `"checksum"`, `"x-checksum"`, 1),
	} {
		if _, err := decodeCheckpoint([]byte(mangled)); !errors.Is(err, ErrCheckpointCorrupt) || !errors.Is(err, ErrCheckpoint) {
			t.Errorf("%s: %v, want ErrCheckpointCorrupt", name, err)
		}
	}
	// Whitespace is not content: the checksum covers the values.
	if _, err := decodeCheckpoint([]byte(strings.ReplaceAll(string(data), "\n  ", "\n\t"))); err != nil {
		t.Errorf("re-indented: %v", err)
	}
	// Version 1 (no checksum) is still read; an unknown version is refused, not corrupt.
	v1 := `{"version":1,"driver":"gpu.hamireg.io","claims":{"u1":{"cdiSpec":"/var/run/cdi/k8s.hamireg.io-claim_u1.json","devices":[{"request":"gpu","pool":"n","device":"gpu-0","cdiDeviceID":"k8s.hamireg.io/claim=u1-gpu-0","uuid":"GPU-0","memoryMiB":1,"cores":1}]}}}`
	if c, err := decodeCheckpoint([]byte(v1)); err != nil || len(c.Claims) != 1 {
		t.Errorf("version 1: %v, %d claims", err, len(c.Claims))
	}
	if _, err := decodeCheckpoint([]byte(`{"version":3,"driver":"gpu.hamireg.io","claims":{}}`)); !errors.Is(err, ErrCheckpoint) || errors.Is(err, ErrCheckpointCorrupt) {
		t.Errorf("version 3: %v, want ErrCheckpoint but not ErrCheckpointCorrupt", err)
	}
}

// A corrupted checkpoint is moved aside and rebuilt from the CDI specs with nothing lost;
// Run reports it through OnError; Unprepare still works.
func TestCorruptCheckpointRecovers(t *testing.T) {
	t.Parallel()
	for name, corrupt := range map[string]func([]byte) []byte{
		"truncated": func(b []byte) []byte { return b[:len(b)/2] },
		"bit flip":  func(b []byte) []byte { return []byte(strings.Replace(string(b), `"cores": 30`, `"cores": 31`, 1)) },
		"not JSON":  func([]byte) []byte { return []byte("\x7fELF garbage") },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			driver := testProfile().Driver
			a := testClaim("uid-a", "a", driver, "10Gi", "30", "gpu-0")
			b := testClaim("uid-b", "b", driver, "5Gi", "30", "gpu-0", "gpu-1")
			client := newClient(reserved(a), reserved(b))
			p, opts := robustPlugin(t, client, nil)
			mustPrepare(t, p, a, b)
			want := p.PreparedGPUs()
			before := prepare(t, p, a, b)
			file := filepath.Join(opts.PluginDir, CheckpointFile)
			good, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			bad := corrupt(good)
			if err := os.WriteFile(file, bad, 0o600); err != nil {
				t.Fatal(err)
			}

			var mu sync.Mutex
			var reported []error
			opts.OnError = func(_ context.Context, err error, _ string) {
				mu.Lock()
				reported = append(reported, err)
				mu.Unlock()
			}
			q := newPlugin(t, opts)
			if st := q.Stats(); st.CheckpointRecoveries != 1 {
				t.Errorf("recoveries %d, want 1", st.CheckpointRecoveries)
			}
			if diff := cmp.Diff(want, q.PreparedGPUs(), cmpopts.SortSlices(func(a, b types.UID) bool { return a < b })); diff != "" {
				t.Errorf("prepared GPUs after the recovery (-before +after):\n%s", diff)
			}
			asides, _ := filepath.Glob(file + ".corrupt-*")
			if len(asides) != 1 {
				t.Fatalf("moved-aside files %v, want 1", asides)
			}
			if kept, _ := os.ReadFile(asides[0]); string(kept) != string(bad) {
				t.Errorf("the moved-aside file differs from the corrupted one")
			}
			if _, _, err := readCheckpoint(file, driver); err != nil {
				t.Errorf("the rebuilt checkpoint: %v", err)
			}
			q.SetDevices(testGPUs(), testDevices(t, opts.Profile, testGPUs()))
			if diff := cmp.Diff(before, prepare(t, q, a, b)); diff != "" {
				t.Errorf("prepare after the recovery (-before +after):\n%s", diff)
			}

			run(t, q)
			waitFor(t, "the recovery reported", func() bool { mu.Lock(); defer mu.Unlock(); return len(reported) > 0 })
			waitFor(t, "a cleanup round", func() bool { return q.Stats().Cleanups >= 1 })
			mu.Lock()
			err = reported[0]
			mu.Unlock()
			if !errors.Is(err, ErrCheckpointCorrupt) || !strings.Contains(err.Error(), file) || !strings.Contains(err.Error(), "moved it to "+asides[0]) ||
				!strings.Contains(err.Error(), "with 2 prepared claim(s)") {
				t.Errorf("reported %v; want ErrCheckpointCorrupt naming the file, where it went and what was rebuilt", err)
			}
			if st := q.Stats(); st.StaleUnprepared != 0 {
				t.Errorf("the cleanup unprepared %d claims the API server allocates here", st.StaleUnprepared)
			}
			for _, uid := range []types.UID{a.UID, b.UID} {
				if err := unprepare(t, q, uid)[uid]; err != nil {
					t.Errorf("unprepare %s: %v", uid, err)
				}
				if exists(filepath.Join(opts.CDIDir, cdiSpecFile(uid))) || exists(stateDirOf(opts, uid)) {
					t.Errorf("%s: spec or state folder left after Unprepare", uid)
				}
			}
			if len(q.PreparedGPUs()) != 0 {
				t.Errorf("prepared after Unprepare: %v", q.PreparedGPUs())
			}
		})
	}
}

func TestCheckpointNotOurs(t *testing.T) {
	t.Parallel()
	opts := testOptions(t, newClient())
	file := filepath.Join(opts.PluginDir, CheckpointFile)
	if err := os.MkdirAll(opts.PluginDir, 0o750); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		data func() []byte
		want string
	}{
		"another driver": {func() []byte { b, _ := encodeCheckpoint("other.example.com", nil); return b }, "own Options.PluginDir"},
		"newer version":  {func() []byte { return []byte(`{"version":9,"driver":"gpu.hamireg.io","claims":{}}`) }, "run the newer plugin"},
	} {
		if err := os.WriteFile(file, tc.data(), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := New(opts)
		if !errors.Is(err, ErrCheckpoint) || errors.Is(err, ErrCheckpointCorrupt) || !strings.Contains(err.Error(), file) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: New: %v, want ErrCheckpoint naming the file and %q", name, err, tc.want)
		}
	}
}

func TestCleanupStale(t *testing.T) {
	t.Parallel()
	driver := testProfile().Driver
	tests := map[string]struct {
		api       func(c *resourcev1.ResourceClaim) *resourcev1.ResourceClaim // nil: deleted
		getErr    error
		unprepare bool
	}{
		"deleted":     {api: nil, unprepare: true},
		"another UID": {api: func(c *resourcev1.ResourceClaim) *resourcev1.ResourceClaim { c.UID = "new"; return c }, unprepare: true},
		"deallocated": {api: func(c *resourcev1.ResourceClaim) *resourcev1.ResourceClaim {
			c.Status = resourcev1.ResourceClaimStatus{}
			return c
		}, unprepare: true},
		"other node": {api: func(c *resourcev1.ResourceClaim) *resourcev1.ResourceClaim {
			c.Status.Allocation.Devices.Results[0].Pool = "node-b"
			return c
		}, unprepare: true},
		"other driver": {api: func(c *resourcev1.ResourceClaim) *resourcev1.ResourceClaim {
			c.Status.Allocation.Devices.Results[0].Driver = "x.example.com"
			return c
		}, unprepare: true},
		"allocated here": {api: func(c *resourcev1.ResourceClaim) *resourcev1.ResourceClaim { return c }},
		"not reserved":   {api: func(c *resourcev1.ResourceClaim) *resourcev1.ResourceClaim { c.Status.ReservedFor = nil; return c }},
		"being deleted": {api: func(c *resourcev1.ResourceClaim) *resourcev1.ResourceClaim {
			c.DeletionTimestamp = &metav1.Time{Time: time.Unix(1, 0)}
			c.Finalizers = []string{"f"}
			return c
		}},
		"API error": {api: nil, getErr: apierrors.NewServiceUnavailable("etcd down")},
		"forbidden": {api: nil, getErr: apierrors.NewForbidden(resourcev1.Resource("resourceclaims"), "c", errors.New("RBAC"))},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			claim := reserved(testClaim("uid-c", "c", driver, "10Gi", "30", "gpu-0"))
			other := reserved(testClaim("uid-o", "o", driver, "1Gi", "10", "gpu-1"))
			var objs []runtime.Object
			objs = append(objs, other)
			if tc.api != nil {
				objs = append(objs, tc.api(claim.DeepCopy()))
			}
			client := newClient(objs...)
			if tc.getErr != nil {
				client.PrependReactor("get", "resourceclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
					if a.(k8stesting.GetAction).GetName() == claim.Name {
						return true, nil, tc.getErr
					}
					return false, nil, nil
				})
			}
			p, opts := robustPlugin(t, client, nil)
			mustPrepare(t, p, claim, other)
			err := p.Cleanup(t.Context())
			if (tc.getErr != nil) != (err != nil) || (err != nil && !strings.Contains(err.Error(), "c")) {
				t.Errorf("Cleanup: %v, want an error only for a failed GET", err)
			}
			spec := filepath.Join(opts.CDIDir, cdiSpecFile(claim.UID))
			_, prepared := p.Claim(claim.UID)
			gone := !prepared && !exists(spec) && !exists(stateDirOf(opts, claim.UID))
			if tc.unprepare != gone {
				t.Errorf("unprepared %v (prepared %v, spec %v), want %v", gone, prepared, exists(spec), tc.unprepare)
			}
			if _, ok := p.Claim(other.UID); !ok || !exists(filepath.Join(opts.CDIDir, cdiSpecFile(other.UID))) {
				t.Error("the claim still allocated here was unprepared")
			}
			want := uint64(0)
			if tc.unprepare {
				want = 1
			}
			if st := p.Stats(); st.StaleUnprepared != want {
				t.Errorf("StaleUnprepared %d, want %d", st.StaleUnprepared, want)
			}
			// A restart sees the same (the checkpoint was written).
			if _, ok := newPlugin(t, opts).Claim(claim.UID); ok == tc.unprepare {
				t.Errorf("after a restart prepared = %v", ok)
			}
			// The GPU is free again: a claim of all its memory fits.
			if tc.unprepare {
				big := testClaim("uid-big", "big", driver, "40Gi", "70", "gpu-0")
				if r := prepare(t, p, big)[big.UID]; r.Err != nil {
					t.Errorf("a claim of the whole GPU after the cleanup: %v", r.Err)
				}
			}
		})
	}
}

// A crash between the CDI spec and the checkpoint leaves an orphan spec: the cleanup adopts
// it when its claim is allocated here and reserved, and removes it otherwise; specs of other
// drivers and specs without a record are left alone.
func TestCleanupOrphans(t *testing.T) {
	t.Parallel()
	driver := testProfile().Driver
	adopt := reserved(testClaim("uid-adopt", "adopt", driver, "10Gi", "30", "gpu-0"))
	unreserved := testClaim("uid-unres", "unres", driver, "1Gi", "10", "gpu-1")
	gone := testClaim("uid-gone", "gone", driver, "1Gi", "10", "gpu-1")
	client := newClient(adopt, unreserved)
	p, opts := robustPlugin(t, client, nil)
	mustPrepare(t, p, adopt, unreserved, gone)
	answer := prepare(t, p, adopt)[adopt.UID]
	// The checkpoint never recorded them.
	if err := os.Remove(filepath.Join(opts.PluginDir, CheckpointFile)); err != nil {
		t.Fatal(err)
	}
	legacy := filepath.Join(opts.CDIDir, cdiSpecFile("uid-legacy"))
	if err := os.WriteFile(legacy, []byte(`{"cdiVersion":"0.5.0","kind":"k8s.hamireg.io/claim","devices":[]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	otherOpts := opts
	otherOpts.Profile.Driver = "hami-core-gpu.project-hami.io"
	otherOpts.PluginDir = filepath.Join(t.TempDir(), "other")
	o := newPlugin(t, otherOpts)
	o.SetDevices(testGPUs(), testDevices(t, otherOpts.Profile, testGPUs()))
	foreign := testClaim("uid-foreign", "foreign", otherOpts.Profile.Driver, "1Gi", "1", "gpu-0")
	mustPrepare(t, o, foreign)

	q := newPlugin(t, opts)
	q.SetDevices(testGPUs(), testDevices(t, opts.Profile, testGPUs()))
	if len(q.PreparedGPUs()) != 0 {
		t.Fatalf("prepared before the cleanup: %v", q.PreparedGPUs())
	}
	if err := q.Cleanup(t.Context()); err != nil {
		t.Fatal(err)
	}
	if st := q.Stats(); st.OrphansAdopted != 1 || st.OrphansRemoved != 2 || st.StaleUnprepared != 0 {
		t.Errorf("stats %+v, want 1 adopted, 2 removed", st)
	}
	if _, ok := q.Claim(adopt.UID); !ok {
		t.Error("the reserved claim was not adopted")
	}
	for _, c := range []*resourcev1.ResourceClaim{unreserved, gone} {
		if exists(filepath.Join(opts.CDIDir, cdiSpecFile(c.UID))) || exists(stateDirOf(opts, c.UID)) {
			t.Errorf("%s: the orphan's spec or state folder is left", c.Name)
		}
	}
	if !exists(legacy) || !exists(filepath.Join(opts.CDIDir, cdiSpecFile(foreign.UID))) {
		t.Error("a spec without a record or of another driver was removed")
	}
	// The kubelet's retry gets the same answer, from the adopted spec.
	if diff := cmp.Diff(answer, prepare(t, q, adopt)[adopt.UID]); diff != "" {
		t.Errorf("prepare after the adoption (-before +after):\n%s", diff)
	}
	if _, ok := newPlugin(t, opts).Claim(adopt.UID); !ok {
		t.Error("the adoption is not in the checkpoint")
	}
}

// Two plugins on one PluginDir (a rolling update): a Prepare waits for the other's lock, and
// each sees what the other prepared.
func TestLockAcrossPlugins(t *testing.T) {
	t.Parallel()
	driver := testProfile().Driver
	a := testClaim("uid-a", "a", driver, "30Gi", "50", "gpu-0")
	b := testClaim("uid-b", "b", driver, "20Gi", "50", "gpu-0")
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	p1, opts := robustPlugin(t, newClient(), func(o *Options) {
		o.AfterCDISpec = func(context.Context, types.UID) {
			once.Do(func() { close(entered); <-release })
		}
	})
	opts2 := opts
	opts2.AfterCDISpec = nil
	p2 := newPlugin(t, opts2)
	p2.SetDevices(testGPUs(), testDevices(t, opts.Profile, testGPUs()))

	done := make(chan error, 1)
	go func() {
		r, err := p1.PrepareResourceClaims(t.Context(), []*resourcev1.ResourceClaim{a})
		if err == nil {
			err = r[a.UID].Err
		}
		done <- err
	}()
	<-entered
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	_, err := p2.PrepareResourceClaims(ctx, []*resourcev1.ResourceClaim{b})
	cancel()
	if err == nil || !strings.Contains(err.Error(), LockFile) {
		t.Fatalf("prepare while the other plugin holds the lock: %v, want a lock timeout", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// p2 sees a's 30Gi on gpu-0: b's 20Gi does not fit beside it.
	if r := prepare(t, p2, b)[b.UID]; !errors.Is(r.Err, ErrRefused) {
		t.Errorf("b beside a: %v, want refused (p2 must see p1's claim)", r.Err)
	}
	// p2 unprepares a (the kubelet talks to the newer plugin); p1 sees it gone.
	if err := unprepare(t, p2, a.UID)[a.UID]; err != nil {
		t.Fatal(err)
	}
	mustPrepare(t, p1, b)
	if _, ok := p1.Claim(a.UID); ok {
		t.Error("p1 still has a after p2 unprepared it")
	}
	if _, ok := newPlugin(t, opts).Claim(b.UID); !ok {
		t.Error("the checkpoint lacks b")
	}
}

// Another process holding the lock file stalls Prepare until it lets go, or is killed.
func TestLockAcrossProcesses(t *testing.T) {
	t.Parallel()
	driver := testProfile().Driver
	p, opts := robustPlugin(t, newClient(), nil)
	for i, kill := range []bool{false, true} {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), lockHolderEnv+"="+opts.PluginDir)
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "locked\n" {
			t.Fatalf("child: %q, %v", line, err)
		}
		c := testClaim(fmt.Sprintf("uid-%d", i), "c", driver, "1Gi", "1", "gpu-0")
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		_, err = p.PrepareResourceClaims(ctx, []*resourcev1.ResourceClaim{c})
		cancel()
		if err == nil || !strings.Contains(err.Error(), "held by another process") {
			t.Fatalf("prepare while another process holds the lock: %v", err)
		}
		if kill {
			_ = cmd.Process.Kill()
		} else {
			_ = stdin.Close()
		}
		_ = cmd.Wait()
		mustPrepare(t, p, c) // waits for the lock without a deadline
	}
}

// Run checks the prepared claims when it starts and every StaleClaimPeriod.
func TestRunCleansUpPeriodically(t *testing.T) {
	t.Parallel()
	driver := testProfile().Driver
	claim := reserved(testClaim("uid-p", "p", driver, "1Gi", "1", "gpu-0"))
	client := newClient(claim)
	fc := clocktesting.NewFakeClock(time.Unix(1000, 0))
	p, _ := robustPlugin(t, client, func(o *Options) { o.Clock = fc; o.StaleClaimPeriod = time.Hour })
	mustPrepare(t, p, claim)
	run(t, p)
	waitFor(t, "the first round", func() bool { return p.Stats().Cleanups == 1 })
	if err := client.ResourceV1().ResourceClaims(claim.Namespace).Delete(t.Context(), claim.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the ticker", func() bool { return fc.HasWaiters() })
	fc.Step(time.Hour)
	waitFor(t, "the second round", func() bool { return p.Stats().Cleanups == 2 })
	if st := p.Stats(); st.StaleUnprepared != 1 || len(p.PreparedGPUs()) != 0 {
		t.Errorf("stats %+v, prepared %v; want the deleted claim unprepared", st, p.PreparedGPUs())
	}

	off, _ := robustPlugin(t, client, func(o *Options) { o.StaleClaimPeriod = -1 })
	off.startCleanup(t.Context())()
	if st := off.Stats(); st.Cleanups != 0 {
		t.Errorf("a negative period ran %d rounds", st.Cleanups)
	}
}

// A checkpoint corrupted while the plugin runs is found at the next lock: it is recovered and
// reported, and the Unprepare that found it succeeds.
func TestCorruptCheckpointWhileRunning(t *testing.T) {
	t.Parallel()
	driver := testProfile().Driver
	a := testClaim("uid-a", "a", driver, "1Gi", "10", "gpu-0")
	b := testClaim("uid-b", "b", driver, "1Gi", "10", "gpu-1")
	var reported []error
	p, opts := robustPlugin(t, newClient(), func(o *Options) {
		o.OnError = func(_ context.Context, err error, _ string) { reported = append(reported, err) }
	})
	mustPrepare(t, p, a, b)
	file := filepath.Join(opts.PluginDir, CheckpointFile)
	if err := os.WriteFile(file, []byte(`{"version":2,"checksum":"sha256:0","driver":"gpu.hamireg.io","claims":{}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := unprepare(t, p, a.UID)[a.UID]; err != nil {
		t.Fatalf("unprepare a: %v", err)
	}
	if len(reported) != 1 || !errors.Is(reported[0], ErrCheckpointCorrupt) || !strings.Contains(reported[0].Error(), "checksum") {
		t.Fatalf("reported %v, want one ErrCheckpointCorrupt about the checksum", reported)
	}
	if exists(filepath.Join(opts.CDIDir, cdiSpecFile(a.UID))) {
		t.Error("a's spec is left")
	}
	if _, ok := p.Claim(b.UID); !ok {
		t.Error("b was lost")
	}
	if _, ok := newPlugin(t, opts).Claim(b.UID); !ok {
		t.Error("the rebuilt checkpoint lacks b")
	}
	if st := p.Stats(); st.CheckpointRecoveries != 1 {
		t.Errorf("stats %+v", st)
	}
}

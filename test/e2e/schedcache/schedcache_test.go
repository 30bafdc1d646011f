package schedcache_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/handshake"
	"github.com/hamireg/hamireg/schedcache"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// Nodes register as the agent writes: first the kubelet's allocatable, then the device
// plugin's merge patch; the cache stamps the handshake under its field manager. The tick is an
// hour, so nothing here waits for it.
func TestSchedcacheRegistersAsAgentWrites(t *testing.T) {
	t.Parallel()
	test := harness.UniqueName("register")
	r := startReplica(t, cp.AdminClient(), test, schedcache.Options{Tick: time.Hour}, schedcache.HandshakerOptions{}, nil)
	names := []string{test + "-a", test + "-b", test + "-c"}
	for _, name := range names {
		createNode(t, test, name, nil, 0)
		r.waitState(t, name, schedcache.StateAbsent)
	}
	for _, name := range names {
		setAllocatable(t, name, 80)
		agentPatch(t, name, map[string]*string{annotation.KeyNVIDIARegister: ptr(annotation.Encode(gpus(8, name, 81559)))})
	}
	for _, name := range names {
		r.waitState(t, name, schedcache.StateRegistered)
		n, _ := r.cache.Node(name)
		if got := len(n.Devices(annotation.NVIDIA())); got != 8 {
			t.Errorf("%s: %d devices, want 8", name, got)
		}
		harness.Eventually(t, "handshake stamp on "+name, 10*time.Second, func() bool {
			return strings.HasPrefix(cp.GetNode(t, name).Annotations[annotation.KeyNVIDIAHandshake], handshake.PrefixRequesting)
		})
		if got := handshakeManagers(t, name); !cmp.Equal(got, []string{schedcache.DefaultFieldManager}) {
			t.Errorf("%s: handshake written by %v", name, got)
		}
	}
	if got := r.cache.Snapshot().Names(); !cmp.Equal(got, names) {
		t.Errorf("snapshot = %v, want %v", got, names)
	}
	// A stamp is counted after its PATCH response arrives, which can be after getNode saw it.
	harness.Eventually(t, "3 stamps counted", 5*time.Second, func() bool { return r.cache.Stats().Stamps >= 3 })
	if s := r.cache.Stats(); s.Stamps != 3 || s.Cycles != 1 {
		t.Errorf("stamps %d cycles %d, want 3 stamps and only the first term's cycle", s.Stamps, s.Cycles)
	}
}

// A changed register annotation with unchanged allocatable is visible at once, without the
// tick (HAMi v2.9.0 never reloads it; HAMi master waits up to 15 s).
func TestSchedcacheChangeVisibleWithoutTick(t *testing.T) {
	t.Parallel()
	test := harness.UniqueName("change")
	r := startReplica(t, cp.AdminClient(), test, schedcache.Options{Tick: time.Hour}, schedcache.HandshakerOptions{}, nil)
	name := test + "-n"
	createNode(t, test, name, map[string]string{annotation.KeyNVIDIARegister: annotation.Encode(gpus(8, name, 81559))}, 80)
	r.waitState(t, name, schedcache.StateRegistered)
	changed := gpus(8, name, 40000)
	changed[2].Health = false
	start := time.Now()
	agentPatch(t, name, map[string]*string{annotation.KeyNVIDIARegister: ptr(annotation.Encode(changed))})
	harness.Eventually(t, "the new devices", 2*time.Second, func() bool {
		n, _ := r.cache.Node(name)
		d := n.Devices(annotation.NVIDIA())
		return len(d) == 8 && d[0].Devmem == 40000 && !d[2].Health
	})
	t.Logf("new devices visible %v after the PATCH was sent", time.Since(start).Round(time.Millisecond))
	if c := r.cache.Stats().Cycles; c != 1 {
		t.Errorf("cycles = %d: a tick ran", c)
	}
}

// Bad annotations each give their state, HAMi's log line and a Warning Event, remove the
// node's devices, and crash nothing: the same cache registers the node again once fixed.
func TestSchedcacheBadAnnotations(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		value     *string // nil removes the annotation
		want      schedcache.State
		log       string
		level     int
		reason    string
		wantError bool
	}{
		"null element": {value: ptr(`[null]`), want: schedcache.StateInvalidElement, log: "failed to decode node devices", level: -1,
			reason: schedcache.ReasonRegisterInvalid},
		"truncated JSON": {value: ptr(`[{"id":"GPU-x","count":10,"devmem":8`), want: schedcache.StateMalformed, log: "failed to decode node devices",
			level: -1, reason: schedcache.ReasonRegisterMalformed},
		"empty list": {value: ptr(`[]`), want: schedcache.StateNoDevices, log: "no nvidia gpu device found", level: 0,
			reason: schedcache.ReasonRegisterEmpty},
		"missing": {value: nil, want: schedcache.StateAbsent, log: "Failed to get node devices", level: 5,
			reason: schedcache.ReasonRegisterRemoved},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			test := harness.UniqueName("bad")
			r := startReplica(t, cp.AdminClient(), test, schedcache.Options{}, schedcache.HandshakerOptions{}, nil)
			node := test + "-n"
			good := annotation.Encode(gpus(4, node, 81559))
			createNode(t, test, node, map[string]string{annotation.KeyNVIDIARegister: good}, 40)
			r.waitState(t, node, schedcache.StateRegistered)

			agentPatch(t, node, map[string]*string{annotation.KeyNVIDIARegister: tc.value})
			r.waitState(t, node, tc.want)
			if n, ok := r.cache.Snapshot().Node(node); !ok || n.Registered() || n.Registrations[0].State != tc.want {
				t.Errorf("snapshot's view of the node: %+v, %v; want it unregistered with state %s", n, ok, tc.want)
			}
			if n, _ := r.cache.Node(node); n.Devices(annotation.NVIDIA()) != nil {
				t.Error("devices still schedulable")
			}
			if !r.logs.has(tc.log, tc.level, node) {
				t.Errorf("no log %q at level %d for %s", tc.log, tc.level, node)
			}
			want := []string{corev1.EventTypeWarning + " " + tc.reason}
			harness.Eventually(t, "the Event", 10*time.Second, func() bool { return cmp.Equal(nodeEvents(t, node), want) })

			agentPatch(t, node, map[string]*string{annotation.KeyNVIDIARegister: ptr(good)})
			r.waitState(t, node, schedcache.StateRegistered)
		})
	}
}

// An expired handshake with allocatable 0 cleans up (the key is deleted, master semantics) and
// the node is not re-added until allocatable returns, although the cache re-stamps the key.
func TestSchedcacheCleanupExpiredHandshake(t *testing.T) {
	t.Parallel()
	test := harness.UniqueName("cleanup")
	const window = 2 * time.Second
	r := startReplica(t, cp.AdminClient(), test, schedcache.Options{Tick: 200 * time.Millisecond,
		Handshake: handshake.Options{Window: window}}, schedcache.HandshakerOptions{}, nil)
	node := test + "-n"

	// Record every handshake value the apiserver stores for the node.
	w, err := cp.AdminClient().CoreV1().Nodes().Watch(t.Context(), metav1.ListOptions{LabelSelector: harness.TestLabel + "=" + test})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	seen := make(chan string, 100)
	go func() {
		for ev := range w.ResultChan() {
			if n, ok := ev.Object.(*corev1.Node); ok && ev.Type == watch.Modified {
				v, ok := n.Annotations[annotation.KeyNVIDIAHandshake]
				if !ok {
					v = "<absent>"
				}
				seen <- v
			}
		}
		close(seen)
	}()

	// A fresh stamp and nothing allocatable: HAMi's rules register it until the stamp expires.
	createNode(t, test, node, map[string]string{
		annotation.KeyNVIDIARegister:  annotation.Encode(gpus(8, node, 81559)),
		annotation.KeyNVIDIAHandshake: handshake.Requesting(time.Now(), time.UTC),
	}, 0)
	r.waitState(t, node, schedcache.StateRegistered)
	r.waitState(t, node, schedcache.StateUnhealthy)
	if !r.logs.has("Device is unhealthy, cleaning up node", -1, node) && !strings.Contains(r.logs.String(), `"msg"="Device is unhealthy, cleaning up node"`) {
		t.Error("no cleanup log")
	}
	harness.Eventually(t, "cleanup written", 10*time.Second, func() bool { return r.cache.Stats().Cleanups == 1 })
	harness.Eventually(t, "the Event", 10*time.Second, func() bool {
		return slices.Contains(nodeEvents(t, node), corev1.EventTypeWarning+" "+schedcache.ReasonDeviceUnhealthy)
	})

	// Three windows later: re-stamped, never re-added, cleaned up once.
	time.Sleep(3 * window)
	if s := r.state(node); s != schedcache.StateUnhealthy {
		t.Fatalf("state %s with allocatable 0", s)
	}
	if c := r.cache.Stats().Cleanups; c != 1 {
		t.Errorf("cleanups = %d, want 1 (no flap)", c)
	}
	var values []string
	for len(seen) > 0 {
		v := <-seen
		if len(values) == 0 || values[len(values)-1] != v {
			values = append(values, v)
		}
	}
	i := slices.Index(values, "<absent>")
	if i < 0 || i == len(values)-1 || !strings.HasPrefix(values[i+1], handshake.PrefixRequesting) {
		t.Errorf("handshake values %q: want the key deleted, then re-stamped", values)
	}

	setAllocatable(t, node, 80)
	r.waitState(t, node, schedcache.StateRegistered)
}

// Two replicas with their own Lease: only the leader writes (counted per identity, and visible
// as the field manager of the handshake), the follower stays warm and ready; when the leader
// stops the other takes over within the lease duration plus one second and writes.
func TestSchedcacheTwoReplicasOnlyLeaderWrites(t *testing.T) {
	t.Parallel()
	test := harness.UniqueName("replicas")
	if err := cp.EnsureNamespace(t.Context(), test); err != nil {
		t.Fatal(err)
	}
	const leaseDuration = 2 * time.Second
	elector := func(id string) func(schedcache.Runnable) runner {
		return func(work schedcache.Runnable) runner {
			e, err := schedcache.NewElector(cp.AdminClient(), work, schedcache.ElectorOptions{Namespace: test, Name: "hamireg-schedcache",
				Identity: id, LeaseDuration: leaseDuration, RenewDeadline: time.Second, RetryPeriod: 200 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			return e
		}
	}
	a := startReplica(t, cp.AdminClient(), test, schedcache.Options{}, schedcache.HandshakerOptions{FieldManager: "schedcache-a"}, elector("replica-a"))
	ea := a.leader
	harness.Eventually(t, "replica-a leads", 20*time.Second, ea.IsLeader)
	b := startReplica(t, cp.AdminClient(), test, schedcache.Options{}, schedcache.HandshakerOptions{FieldManager: "schedcache-b"}, elector("replica-b"))
	eb := b.leader

	first := []string{test + "-1", test + "-2", test + "-3", test + "-4", test + "-5"}
	for _, name := range first {
		createNode(t, test, name, map[string]string{annotation.KeyNVIDIARegister: annotation.Encode(gpus(8, name, 81559))}, 80)
	}
	for _, name := range first {
		a.waitState(t, name, schedcache.StateRegistered)
		b.waitState(t, name, schedcache.StateRegistered)
		harness.Eventually(t, "stamp on "+name, 10*time.Second, func() bool {
			return cp.GetNode(t, name).Annotations[annotation.KeyNVIDIAHandshake] != ""
		})
	}
	time.Sleep(500 * time.Millisecond) // room for a wrong write by b to show up
	for _, name := range first {
		if got := handshakeManagers(t, name); !cmp.Equal(got, []string{"schedcache-a"}) {
			t.Errorf("%s: handshake written by %v, want only schedcache-a", name, got)
		}
	}
	sa, sb := a.cache.Stats(), b.cache.Stats()
	t.Logf("writes while a leads: replica-a %d, replica-b %d (b skipped %d as follower)", sa.Stamps, sb.Stamps, sb.SkippedNotLeader)
	if sa.Stamps != 5 || sb.Stamps != 0 || sb.Cleanups != 0 {
		t.Errorf("stamps a=%d b=%d, want 5 and 0", sa.Stamps, sb.Stamps)
	}
	if eb.IsLeader() || !b.cache.HasSynced() || !a.cache.HasSynced() {
		t.Errorf("b leader %v, synced a=%v b=%v", eb.IsLeader(), a.cache.HasSynced(), b.cache.HasSynced())
	}

	stopped := time.Now()
	a.stop()
	harness.Eventually(t, "replica-b leads", leaseDuration+time.Second, eb.IsLeader)
	took := time.Since(stopped)
	t.Logf("replica-b took over %v after replica-a stopped (lease duration %v)", took.Round(time.Millisecond), leaseDuration)

	second := []string{test + "-6", test + "-7"}
	for _, name := range second {
		createNode(t, test, name, map[string]string{annotation.KeyNVIDIARegister: annotation.Encode(gpus(8, name, 81559))}, 80)
	}
	for _, name := range second {
		harness.Eventually(t, "stamp on "+name, 10*time.Second, func() bool { return cmp.Equal(handshakeManagers(t, name), []string{"schedcache-b"}) })
	}
	// The counter moves after the PATCH response reaches b, which can be after the GET above
	// saw the write.
	harness.Eventually(t, "replica-b counts its 2 stamps", 5*time.Second, func() bool { return b.cache.Stats().Stamps >= 2 })
	if sa2, sb2 := a.cache.Stats(), b.cache.Stats(); sa2.Stamps != 5 || sb2.Stamps != 2 {
		t.Errorf("stamps after takeover a=%d b=%d, want 5 and 2", sa2.Stamps, sb2.Stamps)
	}
}

// kube-scheduler's Lease followed with an exact identity: the holder "sched-1_<uuid>" makes
// "sched-1" the leader, not "sched-" (HAMi's prefix match would make both leaders, issue
// #2154); only the leader's cache writes.
func TestSchedcacheLeaseFollowerExactIdentity(t *testing.T) {
	t.Parallel()
	test := harness.UniqueName("follow")
	if err := cp.EnsureNamespace(t.Context(), test); err != nil {
		t.Fatal(err)
	}
	holder, seconds := "sched-1_4b0c7a4e-3f7e-4f4b-9d1f-6d7f6c1b2a90", int32(15)
	now := metav1.NewMicroTime(time.Now())
	if _, err := cp.AdminClient().CoordinationV1().Leases(test).Create(t.Context(), &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "hami-scheduler", Namespace: test},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &seconds,
			AcquireTime: &now, RenewTime: &now},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	follower := func(id string) func(schedcache.Runnable) runner {
		return func(work schedcache.Runnable) runner {
			f, err := schedcache.NewLeaseFollower(cp.AdminClient(), work, schedcache.FollowerOptions{Namespace: test, Name: "hami-scheduler", Identity: id})
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	r1 := startReplica(t, cp.AdminClient(), test, schedcache.Options{}, schedcache.HandshakerOptions{FieldManager: "sched-1"}, follower("sched-1"))
	r2 := startReplica(t, cp.AdminClient(), test, schedcache.Options{}, schedcache.HandshakerOptions{FieldManager: "sched-prefix"}, follower("sched-"))
	f1, f2 := r1.leader, r2.leader
	harness.Eventually(t, "sched-1 leads", 10*time.Second, f1.IsLeader)
	name := test + "-n"
	createNode(t, test, name, map[string]string{annotation.KeyNVIDIARegister: annotation.Encode(gpus(2, name, 81559))}, 20)
	harness.Eventually(t, "the stamp", 10*time.Second, func() bool { return cmp.Equal(handshakeManagers(t, name), []string{"sched-1"}) })
	r2.waitState(t, name, schedcache.StateRegistered)
	harness.Eventually(t, "sched-1 counts its stamp", 5*time.Second, func() bool { return r1.cache.Stats().Stamps >= 1 })
	if f2.IsLeader() || r2.cache.Stats().Stamps != 0 || r1.cache.Stats().Stamps != 1 {
		t.Errorf("prefix identity leads %v; stamps r1=%d r2=%d", f2.IsLeader(), r1.cache.Stats().Stamps, r2.cache.Stats().Stamps)
	}
	l, err := cp.AdminClient().CoordinationV1().Leases(test).Get(t.Context(), "hami-scheduler", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	other := "sched-2_0c9b"
	l.Spec.HolderIdentity = &other
	if _, err := cp.AdminClient().CoordinationV1().Leases(test).Update(t.Context(), l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, "sched-1 follows", 10*time.Second, func() bool { return !f1.IsLeader() })
}

// The cache works with exactly the RBAC its doc lists: nodes get/list/watch/patch, events
// create/patch (and leases for an Elector, not used here).
func TestSchedcacheMinimalRBAC(t *testing.T) {
	t.Parallel()
	test := harness.UniqueName("rbac")
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: test},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch", "patch"}},
			{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
		},
	}
	if _, err := cp.AdminClient().RbacV1().ClusterRoles().Create(t.Context(), role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	client, err := cp.ServiceAccountClient(t.Context(), test, "scheduler", test)
	if err != nil {
		t.Fatal(err)
	}
	r := startReplica(t, client, test, schedcache.Options{}, schedcache.HandshakerOptions{}, nil)
	name := test + "-n"
	createNode(t, test, name, map[string]string{annotation.KeyNVIDIARegister: `[null]`}, 20)
	r.waitState(t, name, schedcache.StateInvalidElement)
	harness.Eventually(t, "the Event", 10*time.Second, func() bool { return len(nodeEvents(t, name)) == 1 })
	agentPatch(t, name, map[string]*string{annotation.KeyNVIDIARegister: ptr(annotation.Encode(gpus(2, name, 81559)))})
	r.waitState(t, name, schedcache.StateRegistered)
	harness.Eventually(t, "the stamp", 10*time.Second, func() bool { return r.cache.Stats().Stamps == 1 })
	if s := r.cache.Stats(); s.WriteErrors != 0 {
		t.Errorf("write errors = %d", s.WriteErrors)
	}
}

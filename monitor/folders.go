package monitor

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/hamireg/hamireg/hamicore/region"
)

// The folders under Options.Root, and the names in them.
const (
	// ContainersDir holds the device plugin's folders, <pod UID>_<container>.
	ContainersDir = "containers"
	// ClaimsDir holds the SDK's DRA driver's claim folders, <claim UID>.
	ClaimsDir = "claims"
	// cacheSuffix ends the name of a region file; libName is HAMi-core's mount point.
	cacheSuffix = ".cache"
	libName     = "libvgpu.so"
)

// ErrCacheCount is a folder holding more than two entries named libvgpu.so or *.cache: HAMi
// v2.10.0's "cache num not matched", the folder is not adopted.
var ErrCacheCount = errors.New("cache num not matched")

// folder is one adopted region folder. It is never changed once stored in Monitor.folders:
// a scan stores a new one, so that Containers can read the map's values without the lock.
type folder struct {
	// key is the folder's name under Root: "<pod UID>_<container>" or "claims/<claim UID>".
	key string
	// dir is the folder, path the region file adopted in it and info the file as adopted
	// (its inode and size: a file replaced or resized is adopted again).
	dir, path string
	info      fs.FileInfo
	// users are the containers that use the region, without Region and Err: one for a
	// container folder, one per container using the claim for a claim folder.
	users []Container
}

// parseFolderName splits a container folder's name into the pod UID and the container name
// by HAMi v2.10.0's rule: at the first '_', both parts non-empty ('<uid>_main_x' is container
// "main_x"). HAMi v2.9.0 takes the second '_'-separated field and panics on a name without '_'.
func parseFolderName(name string) (podUID types.UID, container string, ok bool) {
	uid, ctr, found := strings.Cut(name, "_")
	if !found || uid == "" || ctr == "" {
		return "", "", false
	}
	return types.UID(uid), ctr, true
}

// cacheFile returns the name of the region file in dir by HAMi v2.10.0's rule: only the
// names libvgpu.so (HAMi-core's mount point) and *.cache count, more than two of them is
// [ErrCacheCount], and the region is the first name in name order ending in ".cache". An
// empty name and a nil error mean no region yet (the container has not made its first CUDA
// call).
func cacheFile(dir string) (string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", err
	}
	n := 0
	cache := ""
	for _, e := range entries {
		name := e.Name()
		isCache := strings.HasSuffix(name, cacheSuffix)
		if isCache || strings.Contains(name, libName) {
			n++
		}
		if isCache && cache == "" {
			cache = name
		}
	}
	if n > 2 {
		return "", ErrCacheCount
	}
	return cache, nil
}

// openRegion reads the region file at path once, returning the file as read and the region.
func openRegion(path string) (fs.FileInfo, *region.Region, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer func() { _ = f.Close() }()
	st, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	reg, err := region.Read(f, st.Size())
	if err != nil {
		return nil, nil, err
	}
	return st, reg, nil
}

// unchanged reports whether the adopted file of f is still in place: the same inode (not
// replaced or removed) and the same size.
func (f *folder) unchanged() bool {
	st, err := os.Stat(f.path)
	return err == nil && os.SameFile(st, f.info) && st.Size() == f.info.Size()
}

// scanState is what one scan works with: the adopted folders before it, the pods, the
// folders adopted by it.
type scanState struct {
	logger klog.Logger
	old    map[string]*folder
	next   map[string]*folder
	pods   []*corev1.Pod
	byUID  map[types.UID]*corev1.Pod
	// podsErr is the error listing the pods: no cleanup, no new adoption this round.
	podsErr error
	// seen are the keys of the folders on disk, whose log state is kept.
	seen map[string]bool
}

// scan is one round over the folders under Options.Root, HAMi v2.10.0's
// ContainerLister.Update with the stricter rules of the package doc: it adopts the new
// region folders of the node's pods, re-validates the adopted ones, removes the container
// folders of pods gone for longer than Options.ResyncInterval and ties the claim folders to
// the containers that use them. It returns the error reading <Root>/containers (the round's
// feedback is then skipped); every other error is logged.
func (m *Monitor) scan(ctx context.Context) error {
	m.scanMu.Lock()
	defer m.scanMu.Unlock()
	logger := klog.FromContext(ctx)
	dir := filepath.Join(m.opts.Root, ContainersDir)
	entries, err := os.ReadDir(dir)
	if err != nil && errors.Is(err, fs.ErrNotExist) && m.opts.Claims != nil {
		// A node whose GPUs are all DRA's may have no container folder yet: its claim
		// folders are still scanned.
		entries, err = nil, nil
	}
	if err != nil {
		err = fmt.Errorf("read cache folders: %w", err)
		m.setScanResult(nil, err)
		return err
	}
	m.scanFailed = map[string]error{}
	s := &scanState{logger: logger, next: map[string]*folder{}, seen: map[string]bool{}}
	m.mu.Lock()
	s.old = m.folders
	m.mu.Unlock()
	s.pods, s.podsErr = m.pods.NodePods()
	if s.podsErr != nil {
		logger.V(2).Info("Pods of the node not listed, no folder adopted or removed this round", "err", s.podsErr)
	} else {
		s.byUID = make(map[types.UID]*corev1.Pod, len(s.pods))
		for _, p := range s.pods {
			s.byUID[p.UID] = p
		}
	}
	now := m.opts.Clock.Now()
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		m.scanContainerFolder(s, dir, e, now)
	}
	m.scanClaims(s)
	m.forget(s.seen)
	for key, f := range s.old {
		if _, kept := s.next[key]; !kept {
			logger.V(2).Info("Dropping ctr dirname "+f.dir+" from monitorpath", "reason", "folder or region gone")
		}
	}
	if s.podsErr != nil {
		m.setScanResult(s.next, fmt.Errorf("list the node's pods: %w", s.podsErr))
		return nil
	}
	m.setScanResult(s.next, nil)
	return nil
}

// setScanResult stores a scan's folders (nil: keep them), the regions it could not load and
// its outcome for Ready.
func (m *Monitor) setScanResult(next map[string]*folder, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if next != nil {
		m.folders = next
		m.failed = m.scanFailed
	}
	m.scanFailed = nil
	if err == nil {
		m.scanned = true
	}
	m.scanErr = err
}

// scanContainerFolder applies HAMi's rules to one folder under <Root>/containers.
func (m *Monitor) scanContainerFolder(s *scanState, dir string, e fs.DirEntry, now time.Time) {
	name := e.Name()
	path := filepath.Join(dir, name)
	s.seen[name] = true
	uid, ctr, ok := parseFolderName(name)
	if !ok {
		m.once(s.logger, "skip/"+name, "Skipping dir with unexpected name format: "+name)
		return
	}
	old := s.old[name]
	pod, onNode := s.byUID[uid]
	if s.podsErr == nil && !onNode {
		info, err := e.Info()
		if err != nil {
			return // removed meanwhile
		}
		if info.ModTime().Add(m.opts.ResyncInterval).After(now) {
			// A pod gone for less than the resync interval (or not in the informer yet):
			// kept as it is, adopted or not, as HAMi does.
			if old != nil && old.unchanged() {
				s.next[name] = old
			}
			return
		}
		s.logger.Info("Removing dirname " + path + " in monitorpath")
		delete(m.loadErrs, name)
		if err := os.RemoveAll(path); err != nil {
			s.logger.Error(err, "Failed to remove the folder of a pod no longer on the node", "folder", path)
		}
		return
	}
	if old != nil && old.unchanged() {
		s.next[name] = old
		return
	}
	if s.podsErr != nil {
		// Without the pods a new region cannot be tied to its pod: retried next round.
		return
	}
	users := []Container{containerOf(s.logger, pod, name, ctr)}
	if f := m.adopt(s.logger, name, path, users); f != nil {
		s.next[name] = f
		s.logger.Info("Adding ctr dirname "+path+" in monitorpath", "pod", klog.KObj(pod), "container", ctr)
	}
}

// adopt picks and reads the region file of the folder dir; it returns nil (after logging
// why) when there is none yet or it cannot be read, and the folder is tried again next round.
func (m *Monitor) adopt(logger klog.Logger, key, dir string, users []Container) *folder {
	name, err := cacheFile(dir)
	if err != nil {
		m.loadFailed(logger, key, dir, err)
		return nil
	}
	if name == "" {
		logger.V(4).Info("No cache file in " + dir)
		return nil
	}
	path := filepath.Join(dir, name)
	info, _, err := openRegion(path)
	if err != nil {
		m.loadFailed(logger, key, dir, err)
		return nil
	}
	delete(m.loadErrs, key)
	for i := range users {
		users[i].Key, users[i].Path = key, path
	}
	return &folder{key: key, dir: dir, path: path, info: info, users: users}
}

// loadFailed logs HAMi's "Failed to load cache" line: at V(0) the first time a folder fails
// with an error, at V(4) when it fails the same way again (HAMi logs it every 5 s) and when
// the region is not initialised yet (HAMi-core is creating it: normal for a moment).
func (m *Monitor) loadFailed(logger klog.Logger, key, dir string, err error) {
	if m.scanFailed != nil {
		m.scanFailed[key] = err
	}
	msg := "Failed to load cache: " + dir + ", error: " + err.Error()
	if errors.Is(err, region.ErrNotInitialized) || errors.Is(err, region.ErrTooSmall) || m.loadErrs[key] == err.Error() {
		logger.V(4).Info(msg)
		return
	}
	m.loadErrs[key] = err.Error()
	logger.Info(msg)
}

// once logs msg at V(0) the first time it is logged under key, later at V(4).
func (m *Monitor) once(logger klog.Logger, key, msg string, kv ...any) {
	if _, seen := m.logged[key]; seen {
		logger.V(4).Info(msg, kv...)
		return
	}
	m.logged[key] = struct{}{}
	logger.Info(msg, kv...)
}

// forget drops the log state of the folders no longer on disk.
func (m *Monitor) forget(seen map[string]bool) {
	for key := range m.loadErrs {
		if !seen[key] {
			delete(m.loadErrs, key)
		}
	}
	for key := range m.logged {
		if _, name, ok := strings.Cut(key, "/"); ok && !seen[name] {
			delete(m.logged, key)
		}
	}
}

// containerOf is the container folder ctr of pod (folder name key): Init for an init
// container (native sidecars included); a name not in the pod's spec is still reported.
func containerOf(logger klog.Logger, pod *corev1.Pod, key, ctr string) Container {
	c := Container{Pod: types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}, PodUID: pod.UID, Name: ctr}
	switch {
	case slices.ContainsFunc(pod.Spec.InitContainers, func(k corev1.Container) bool { return k.Name == ctr }):
		c.Init = true
	case slices.ContainsFunc(pod.Spec.Containers, func(k corev1.Container) bool { return k.Name == ctr }):
	default:
		logger.V(2).Info("Cache folder names a container not in the pod's spec", "folder", key, "pod", klog.KObj(pod), "container", ctr)
	}
	return c
}

// scanClaims adopts the claim folders under <Root>/claims that Options.Claims knows and ties
// each to the containers using its claim. Claim folders are never removed: the DRA driver
// owns them (it removes a claim's folder when it unprepares the claim).
func (m *Monitor) scanClaims(s *scanState) {
	dir := filepath.Join(m.opts.Root, ClaimsDir)
	entries, err := os.ReadDir(dir)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			// Keep the adopted claim folders: the folder could not be read this round.
			s.logger.Error(err, "Failed to read the claim folders")
			for key, f := range s.old {
				if strings.HasPrefix(key, ClaimsDir+"/") && f.unchanged() {
					s.next[key] = f
				}
			}
		}
		return
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		uid := types.UID(e.Name())
		key := ClaimsDir + "/" + e.Name()
		path := filepath.Join(dir, e.Name())
		s.seen[key] = true
		if m.opts.Claims == nil {
			m.once(s.logger, "claims", "Skipping claim folders: Options.Claims is not set", "folder", dir)
			return
		}
		claim, known := m.opts.Claims.Claim(uid)
		if !known {
			m.once(s.logger, "claim/"+key, "Skipping claim folder of a claim not prepared on this node", "folder", path)
			continue
		}
		old := s.old[key]
		if s.podsErr != nil {
			if old != nil && old.unchanged() {
				s.next[key] = old
			}
			continue
		}
		users := claimUsers(s.pods, claim, key)
		if old != nil && old.unchanged() {
			f := *old
			for i := range users {
				users[i].Key, users[i].Path = key, f.path
			}
			f.users = users
			s.next[key] = &f
			continue
		}
		if f := m.adopt(s.logger, key, path, users); f != nil {
			s.next[key] = f
			s.logger.Info("Adding claim dirname "+path+" in monitorpath", "claim", klog.KRef(claim.Namespace, claim.Name), "containers", len(users))
		}
	}
}

// claimUsers are the containers of pods (init containers too) that use the ResourceClaim
// claim: pods of its namespace that name it in spec.resourceClaims (resourceClaimName) or
// whose status.resourceClaimStatuses resolves one of their claims to it (a claim generated
// from a template), and their containers whose resources.claims name that pod claim.
func claimUsers(pods []*corev1.Pod, claim types.NamespacedName, key string) []Container {
	var out []Container
	for _, pod := range pods {
		if pod.Namespace != claim.Namespace {
			continue
		}
		var podClaims []string
		for _, rc := range pod.Spec.ResourceClaims {
			if rc.ResourceClaimName != nil && *rc.ResourceClaimName == claim.Name {
				podClaims = append(podClaims, rc.Name)
			}
		}
		for _, st := range pod.Status.ResourceClaimStatuses {
			if st.ResourceClaimName != nil && *st.ResourceClaimName == claim.Name && !slices.Contains(podClaims, st.Name) {
				podClaims = append(podClaims, st.Name)
			}
		}
		if len(podClaims) == 0 {
			continue
		}
		add := func(ctrs []corev1.Container, init bool) {
			for _, c := range ctrs {
				if slices.ContainsFunc(c.Resources.Claims, func(r corev1.ResourceClaim) bool { return slices.Contains(podClaims, r.Name) }) {
					out = append(out, Container{Key: key, Pod: types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name},
						PodUID: pod.UID, Name: c.Name, Init: init, Claim: claim})
				}
			}
		}
		add(pod.Spec.InitContainers, true)
		add(pod.Spec.Containers, false)
	}
	return out
}

// Containers returns a fresh read of every adopted region, one [Container] per container
// using it (a claim's region once per container of its pods that uses the claim), sorted by
// namespace, pod, container name and key. Each region file is read once per call with
// [region.Read] (never mapped); a file truncated, replaced or removed since the scan that
// adopted it gives its Containers an Err (ErrRegionChanged for a replaced file) and never
// stops the others. Containers sharing a claim share one *region.Region: treat it as
// read-only. Safe for concurrent use with Run.
func (m *Monitor) Containers(_ context.Context) []Container {
	m.mu.Lock()
	folders := make([]*folder, 0, len(m.folders))
	n := 0
	for _, f := range m.folders {
		folders = append(folders, f)
		n += len(f.users)
	}
	m.mu.Unlock()
	out := make([]Container, 0, n)
	for _, f := range folders {
		if len(f.users) == 0 {
			continue
		}
		reg, err := f.read()
		for _, u := range f.users {
			u.Region, u.Err = reg, err
			out = append(out, u)
		}
	}
	slices.SortFunc(out, func(a, b Container) int {
		return cmp.Or(cmp.Compare(a.Pod.Namespace, b.Pod.Namespace), cmp.Compare(a.Pod.Name, b.Pod.Name),
			cmp.Compare(a.Name, b.Name), cmp.Compare(a.Key, b.Key))
	})
	return out
}

// failedLoads returns the errors of the region folders the last scan could not load (not
// adopted, tried again next round), by folder key, for hamireg_monitor_regions.
func (m *Monitor) failedLoads() map[string]error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.failed
}

// read reads f's region once, refusing a file that is not the one adopted.
func (f *folder) read() (*region.Region, error) {
	file, err := os.Open(f.path)
	if err != nil {
		return nil, fmt.Errorf("read region of %s: %w", f.key, err)
	}
	defer func() { _ = file.Close() }()
	st, err := file.Stat()
	if err != nil {
		return nil, fmt.Errorf("read region of %s: %w", f.key, err)
	}
	if !os.SameFile(st, f.info) {
		return nil, fmt.Errorf("read region of %s: %w: the file was replaced (adopted again at the next scan)", f.key, ErrRegionChanged)
	}
	reg, err := region.Read(file, st.Size())
	if err != nil {
		return nil, fmt.Errorf("read region of %s: %w", f.key, err)
	}
	return reg, nil
}

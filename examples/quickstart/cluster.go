package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hamireg/hamireg/envtest"
	"github.com/hamireg/hamireg/envtest/kubeletpeer"
	"github.com/hamireg/hamireg/envtest/proc"
	"github.com/hamireg/hamireg/internal/manifests"
)

// What the examples' manifests name (kube-system, HAMi's chart names).
const (
	namespace          = "kube-system"
	schedulerName      = "hami-scheduler" // Deployment, ServiceAccount, Lease, profile
	pluginName         = "hami-device-plugin"
	extenderContainer  = "vgpu-scheduler-extender"
	pluginContainer    = "device-plugin"
	leaseRole          = "hami-scheduler-lease"
	kubeSchedulerUser  = "system:kube-scheduler" // envtest's kube-scheduler authenticates as it
	workPrefix         = "hamireg-qs-"
	schedulerPodSuffix = "-7c9d5f6b8-qs4xp" // as a ReplicaSet names its Pods
	pluginPodSuffix    = "-qs7kz"           // as a DaemonSet names its Pods
)

// quickstart is one run: what it started, in the order it stops them (reversed).
type quickstart struct {
	opts  options
	out   *printer
	start time.Time
	work  string

	spawner *proc.Spawner
	dm      *kubeletpeer.DeviceManager
	cp      *envtest.ControlPlane
	sched   *envtest.Scheduler
	procs   []*proc.Process
	kubelet *kubelet
	stops   []func() error
	stopped int

	bin         string // the example programs
	extenderURL string
	plugin      *proc.Process
	extender    *proc.Process
	scores      bool              // the device plugin publishes topology scores
	metricsURL  string            // the extender's /metrics
	demoGPUs    []string          // the UUIDs of the demo pod's GPUs
	demoEnv     map[string]string // the env the demo pod's Allocate returned
	demoUID     types.UID         // the demo pod's UID
	klogOut     *lateWriter       // where klog's global logger writes (nil in tests)
	// hook is the device plugin's --hook-path: HAMi-core's folders under vgpu/ (the
	// DaemonSet's hostPath /usr/local/vgpu); pluginMetricsURL is the running plugin's
	// /metrics, once learnt from its log.
	hook             string
	pluginMetricsURL string
	objects          []runtime.Object
}

func (q *quickstart) since() time.Duration { return round(time.Since(q.start)) }

// onStop registers f to run at stop, before what was registered earlier.
func (q *quickstart) onStop(f func() error) { q.stops = append(q.stops, f) }

// stop stops everything that was started, newest first, and removes the work folder.
func (q *quickstart) stop() error {
	var errs []error
	for _, f := range slices.Backward(q.stops) {
		if err := f(); err != nil {
			errs = append(errs, err)
		}
	}
	q.stops = nil
	if q.work != "" {
		if err := os.RemoveAll(q.work); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// spawn starts a program whose log goes to the work folder, stopped at stop.
func (q *quickstart) spawn(o proc.Options) (*proc.Process, error) {
	if q.spawner == nil {
		q.spawner = proc.NewSpawner()
		sp := q.spawner
		q.onStop(func() error { sp.Close(); return nil }) // runs last: kills anything left
	}
	o.LogPath = filepath.Join(q.work, o.Name+".log")
	p, err := q.spawner.Start(o)
	if err != nil {
		return nil, err
	}
	q.procs = append(q.procs, p)
	q.onStop(func() error {
		q.stopped++
		return p.Stop(20 * time.Second)
	})
	return p, nil
}

// failed wraps err with the last lines of a program's log.
func failed(err error, name string, p interface{ LogTail(int) string }) error {
	if p == nil {
		return err
	}
	return fmt.Errorf("%w\n--- last lines of %s's log:\n%s", err, name, p.LogTail(25))
}

// up is step 0: the kubelet's device manager first (it tells at once whether this machine
// can host it), the peer binaries and the programs, the control plane, the manifests, the
// node with its kubelet, the extender and kube-scheduler.
func (q *quickstart) up(ctx context.Context) error {
	envtest.RemoveStaleDirs(workPrefix)
	work, err := envtest.MakeTempDir(workPrefix)
	if err != nil {
		return err
	}
	q.work = work
	q.out.linef("quickstart: a HAMi-compatible GPU cluster on 127.0.0.1, in %s", work)
	q.out.step(0, time.Since(q.start), "the peers and the programs")

	t := time.Now()
	dm, err := kubeletpeer.StartDeviceManager(ctx, kubeletpeer.DeviceManagerOptions{Dir: filepath.Join(work, "kubelet", "device-plugins")})
	if err != nil {
		return fmt.Errorf("start the kubelet's device manager: %w", err)
	}
	q.dm = dm
	q.onStop(func() error { q.stopped++; return dm.Stop() })
	q.out.item("kubelet", "device manager (k8s.io/kubernetes ManagerImpl) serving %s in %v", dm.SocketPath(), round(time.Since(t)))

	bins, err := q.peerBinaries(ctx)
	if err != nil {
		return err
	}
	if q.bin, err = q.buildPrograms(ctx); err != nil {
		return err
	}

	t = time.Now()
	cp, err := envtest.Start(ctx, envtest.Options{BinDir: bins, QPS: 200, Burst: 400, Logf: func(string, ...any) {}})
	if err != nil {
		return fmt.Errorf("start etcd and kube-apiserver: %w", err)
	}
	q.cp = cp
	q.onStop(func() error { q.stopped += 2; return cp.Stop() })
	q.out.item("apiserver", "etcd %s and kube-apiserver %s (TLS, RBAC) ready in %v at %s", cp.EtcdVersion(), cp.Version(), round(time.Since(t)), cp.Host())

	if err := q.apply(ctx); err != nil {
		return err
	}
	if err := q.startNode(ctx); err != nil {
		return err
	}
	if err := q.startExtender(ctx); err != nil {
		return err
	}
	return q.startScheduler(ctx)
}

// apply creates the objects of examples/extender/deploy and examples/deviceplugin/deploy, as
// `kubectl apply -f deploy/` would, except the webhook configuration: it points at the
// in-cluster Service, which nothing serves here (the demo pod names its scheduler itself).
func (q *quickstart) apply(ctx context.Context) error {
	var files []string
	for _, pattern := range []string{"examples/extender/deploy/*.yaml", "examples/deviceplugin/deploy/*.yaml"} {
		m, err := filepath.Glob(filepath.Join(q.opts.repo, pattern))
		if err != nil {
			return err
		}
		files = append(files, m...)
	}
	files = slices.DeleteFunc(files, func(f string) bool { return filepath.Base(f) == "webhook.yaml" })
	objs, err := manifests.Read(files...)
	if err != nil {
		return fmt.Errorf("read the deploy manifests: %w", err)
	}
	q.objects = objs
	c := q.cp.AdminClient()
	for _, o := range objs {
		var err error
		switch o := o.(type) {
		case *corev1.ServiceAccount:
			_, err = c.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *corev1.ConfigMap:
			_, err = c.CoreV1().ConfigMaps(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *corev1.Service:
			_, err = c.CoreV1().Services(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRole:
			_, err = c.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRoleBinding:
			_, err = c.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.Role:
			_, err = c.RbacV1().Roles(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.RoleBinding:
			// kube-scheduler runs here as the user system:kube-scheduler, not as the Pod's
			// ServiceAccount: it gets the Lease Role too.
			if o.Name == leaseRole {
				o = o.DeepCopy()
				o.Subjects = append(o.Subjects, rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: kubeSchedulerUser})
			}
			_, err = c.RbacV1().RoleBindings(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *appsv1.Deployment:
			_, err = c.AppsV1().Deployments(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *appsv1.DaemonSet:
			_, err = c.AppsV1().DaemonSets(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *coordinationv1.Lease:
			_, err = c.CoordinationV1().Leases(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *resourcev1.DeviceClass:
			_, err = c.ResourceV1().DeviceClasses().Create(ctx, o, metav1.CreateOptions{})
		default:
			err = fmt.Errorf("the quickstart does not know how to create a %T", o)
		}
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("apply the deploy manifests: %w", err)
		}
	}
	q.out.item("manifests", "applied %d objects of examples/extender/deploy and examples/deviceplugin/deploy (all but webhook.yaml)", len(objs))
	return nil
}

// find returns the manifest object of type T named name.
func find[T interface {
	runtime.Object
	GetName() string
}](q *quickstart, name string) (T, error) {
	v, ok := manifests.Find[T](q.objects, name)
	if !ok {
		return v, fmt.Errorf("the deploy manifests have no %T named %s", v, name)
	}
	return v, nil
}

// container returns the container named name of spec.
func container(spec *corev1.PodSpec, name string) (*corev1.Container, error) {
	for i := range spec.Containers {
		if spec.Containers[i].Name == name {
			return &spec.Containers[i], nil
		}
	}
	return nil, fmt.Errorf("no container %q in the manifest's pod template", name)
}

// standInPod is the Pod that a controller would create from template for the process the
// quickstart runs instead: the kubelet here reports it Running, so that kubectl and the
// doctor see the cluster a user would.
func standInPod(name string, template corev1.PodTemplateSpec, node string) *corev1.Pod {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: template.Labels, Annotations: template.Annotations},
		Spec:       *template.Spec.DeepCopy(),
	}
	pod.Spec.NodeName = node
	return pod
}

// startExtender runs examples/extender with the Deployment's arguments (plain HTTP on a free
// loopback port instead of TLS on 443 with client certificates), as the ServiceAccount hami-scheduler and with the
// scheduler Pod's host name, which its leader election follows.
func (q *quickstart) startExtender(ctx context.Context) error {
	t := time.Now()
	dep, err := find[*appsv1.Deployment](q, schedulerName)
	if err != nil {
		return err
	}
	ctr, err := container(&dep.Spec.Template.Spec, extenderContainer)
	if err != nil {
		return err
	}
	ports, err := envtest.FreePorts(2)
	if err != nil {
		return err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", ports[1])
	kubeconfig, err := q.cp.ServiceAccountKubeconfig(ctx, mkdir(q.work, "extender"), namespace, schedulerName, schedulerName)
	if err != nil {
		return fmt.Errorf("credentials of ServiceAccount %s/%s: %w", namespace, schedulerName, err)
	}
	var args []string
	metricsSet := false
	for _, a := range ctr.Args {
		switch {
		case strings.HasPrefix(a, "--http_bind=") || strings.HasPrefix(a, "--cert_file=") || strings.HasPrefix(a, "--key_file=") ||
			strings.HasPrefix(a, "--client_ca_file=") || strings.HasPrefix(a, "--allowed_client_names="):
			continue // plain HTTP here: no serving certificate, so no client certificates either
		case strings.HasPrefix(a, "--metrics-bind-address="): // the Pod's :9395, a free loopback port here
			metricsSet = true
			if a != "--metrics-bind-address=" { // empty: no /metrics
				a = "--metrics-bind-address=" + metricsAddr
				q.metricsURL = "http://" + metricsAddr + "/metrics"
			}
		}
		args = append(args, a)
	}
	if !metricsSet { // the extender's default, :9395, could be taken here
		args = append(args, "--metrics-bind-address="+metricsAddr)
		q.metricsURL = "http://" + metricsAddr + "/metrics"
	}
	args = append(args, "--http_bind="+addr, "--kubeconfig="+kubeconfig, fmt.Sprintf("-v=%d", q.opts.verbosity))
	po, err := envtest.WithHostname(proc.Options{Name: "extender", Path: filepath.Join(q.bin, "extender"), Args: args}, q.schedulerPod())
	if err != nil {
		return err
	}
	p, err := q.spawn(po)
	if err != nil {
		return err
	}
	q.extender = p
	q.extenderURL = "http://" + addr
	wctx, cancel := context.WithTimeout(ctx, q.opts.timeout)
	defer cancel()
	hc := &http.Client{Timeout: 2 * time.Second}
	defer hc.CloseIdleConnections()
	if err := p.WaitUntil(wctx, 50*time.Millisecond, envtest.Readyz(hc, q.extenderURL+"/readyz", "")); err != nil {
		return failed(fmt.Errorf("examples/extender not ready: %w", err), "extender", p)
	}
	q.out.item("extender", "examples/extender ready in %v at %s, with the Deployment's arguments:", round(time.Since(t)), q.extenderURL)
	q.out.item("", "%s", strings.Join(args[:len(args)-2], " "))
	return nil
}

// startScheduler runs kube-scheduler with the KubeSchedulerConfiguration of
// scheduler-config.yaml, its extender pointed at the extender process, and the scheduler Pod's
// host name; it returns once kube-scheduler leads the Lease.
func (q *quickstart) startScheduler(ctx context.Context) error {
	t := time.Now()
	cm, err := find[*corev1.ConfigMap](q, "hami-scheduler-config")
	if err != nil {
		return err
	}
	cfg, err := manifests.SchedulerConfig(cm)
	if err != nil {
		return fmt.Errorf("scheduler-config.yaml: %w", err)
	}
	if len(cfg.Profiles) != 1 || cfg.Profiles[0].SchedulerName == nil {
		return fmt.Errorf("scheduler-config.yaml has %d profiles, want one, named", len(cfg.Profiles))
	}
	if err := manifests.ExtenderOverHTTP(cfg, q.extenderURL); err != nil {
		return fmt.Errorf("scheduler-config.yaml: %w", err)
	}
	sched, err := q.cp.StartScheduler(ctx, envtest.SchedulerOptions{Config: cfg, Hostname: q.schedulerPod()})
	if err != nil {
		return fmt.Errorf("start kube-scheduler: %w", err)
	}
	q.sched = sched
	q.onStop(func() error { q.stopped++; return sched.Stop() })
	leases := q.cp.AdminClient().CoordinationV1().Leases(namespace)
	holder := ""
	err = q.poll(ctx, func() bool {
		l, err := leases.Get(ctx, schedulerName, metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return false
		}
		holder = *l.Spec.HolderIdentity
		return strings.HasPrefix(holder, q.schedulerPod()+"_")
	})
	if err != nil {
		return failed(fmt.Errorf("kube-scheduler does not lead Lease %s/%s (holder %q): %w", namespace, schedulerName, holder, err), "kube-scheduler", sched)
	}
	q.out.item("scheduler", "kube-scheduler %s (profile %s, the extender's filter and bind) leads Lease %s/%s as %s in %v",
		q.cp.Version(), *cfg.Profiles[0].SchedulerName, namespace, schedulerName, holder, round(time.Since(t)))
	return nil
}

func (q *quickstart) schedulerPod() string { return schedulerName + schedulerPodSuffix }
func (q *quickstart) pluginPod() string    { return pluginName + pluginPodSuffix }

// poll calls cond every 20 ms until it is true, the step's timeout passes or ctx ends.
func (q *quickstart) poll(ctx context.Context, cond func() bool) error {
	ctx, cancel := context.WithTimeoutCause(ctx, q.opts.timeout, fmt.Errorf("not within %v", q.opts.timeout))
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-tick.C:
		}
	}
	return nil
}

// mkdir creates dir/name and returns it; a failure shows up when the folder is used.
func mkdir(dir, name string) string {
	d := filepath.Join(dir, name)
	_ = os.MkdirAll(d, 0o750)
	return d
}

package diagnose_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/diagnose"
	"github.com/hamireg/hamireg/handshake"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// What the fixtures install: the values of HAMi's Helm chart (release "hami"), in a
// namespace of the scenario's own instead of kube-system.
const (
	componentLabel     = "app.kubernetes.io/component"
	pluginName         = "hami-device-plugin" // DaemonSet, ServiceAccount and component label
	pluginContainer    = "device-plugin"
	monitorContainer   = "vgpu-monitor"
	schedulerName      = "hami-scheduler" // Deployment, ServiceAccount, Lease and component label
	extenderContainer  = "vgpu-scheduler-extender"
	kubeSchedContainer = "kube-scheduler"
	hamiImage          = "docker.io/projecthami/hami:v2.8.0"
	kubeSchedImage     = "registry.k8s.io/kube-scheduler:v1.33.4"
	pluginPath         = "/var/lib/kubelet/device-plugins"

	// gpuLabel=gpuOn is the DaemonSet's nodeSelector; poolLabel=poolValue the scheduler's
	// --node-label-selector.
	gpuLabel  = "gpu"
	gpuOn     = "on"
	poolLabel = "gpu-pool"
	poolValue = "hami"

	gpusPerNode = 8
	splitCount  = 10
	h100        = "NVIDIA H100 80GB HBM3"
	h100MiB     = 81559

	resourceGPU = corev1.ResourceName(annotation.ResourceNVIDIAGPU)
)

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// randomSuffix is a generated-name suffix as the controllers write it (no vowels).
func randomSuffix(n int) string {
	const alphabet = "bcdfghjklmnpqrstvwxz2456789"
	b := make([]byte, n)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}

// randomUUID is a version-4 UUID in its text form.
func randomUUID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b)
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

func containerID() string { return "containerd://" + randomHex(32) }

// h100s returns the node's 8 H100s as HAMi's device plugin publishes them: split 10,
// hami-core, the first half on NUMA node 0, the second on 1.
func h100s() []annotation.Device {
	const n = gpusPerNode
	out := make([]annotation.Device, n)
	for i := range out {
		out[i] = annotation.Device{ID: "GPU-" + randomUUID(), Index: uint(i), Count: splitCount, Devmem: h100MiB,
			Devcore: 100, Type: h100, Numa: i * 2 / n, Mode: "hami-core", Health: true}
	}
	return out
}

// devicesWithoutHealth writes the devices as JSON by hand, every key but "health": what a
// device plugin that considers no GPU healthy leaves (HAMi omits health when false).
func devicesWithoutHealth(devs []annotation.Device) string {
	parts := make([]string, len(devs))
	for i, d := range devs {
		parts[i] = fmt.Sprintf(`{"id":%q,"index":%d,"count":%d,"devmem":%d,"devcore":%d,"type":%q,"numa":%d,"mode":%q}`,
			d.ID, d.Index, d.Count, d.Devmem, d.Devcore, d.Type, d.Numa, d.Mode)
	}
	return "[" + strings.Join(parts, ",") + "]"
}

// gpuNode is a registered GPU node as the kubelet, HAMi's device plugin and HAMi's scheduler
// leave it: labelled for the DaemonSet and the scheduler, 8 H100s split 10 ways in the
// register annotation and in allocatable (80), a Requesting_ handshake stamped now. The
// status has no addresses: the API server then answers log reads for its Pods at once
// instead of dialling a kubelet that does not exist.
func gpuNode(name string, now time.Time) *corev1.Node {
	q := resource.MustParse
	gpus := *resource.NewQuantity(gpusPerNode*splitCount, resource.DecimalSI)
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: name,
			Labels: map[string]string{
				"kubernetes.io/hostname":           name,
				"kubernetes.io/os":                 "linux",
				"kubernetes.io/arch":               "amd64",
				"node.kubernetes.io/instance-type": "p5.48xlarge",
				gpuLabel:                           gpuOn,
				poolLabel:                          poolValue,
			},
			Annotations: map[string]string{
				"node.alpha.kubernetes.io/ttl":                           "0",
				"volumes.kubernetes.io/controller-managed-attach-detach": "true",
				annotation.KeyNVIDIARegister:                             annotation.Encode(h100s()),
				annotation.KeyNVIDIAHandshake:                            handshake.Requesting(now, time.Local),
			},
		},
		Spec: corev1.NodeSpec{PodCIDR: "10.244.7.0/24", PodCIDRs: []string{"10.244.7.0/24"}},
		Status: corev1.NodeStatus{
			Capacity: corev1.ResourceList{
				corev1.ResourceCPU: q("192"), corev1.ResourceMemory: q("2113393456Ki"), corev1.ResourcePods: q("110"),
				corev1.ResourceEphemeralStorage: q("3750771456Ki"), resourceGPU: gpus,
			},
			Allocatable: corev1.ResourceList{
				corev1.ResourceCPU: q("191500m"), corev1.ResourceMemory: q("2112242480Ki"), corev1.ResourcePods: q("110"),
				corev1.ResourceEphemeralStorage: q("3456711450614"), resourceGPU: gpus,
			},
			Conditions: []corev1.NodeCondition{
				{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientMemory", Message: "kubelet has sufficient memory available"},
				{Type: corev1.NodeDiskPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasNoDiskPressure", Message: "kubelet has no disk pressure"},
				{Type: corev1.NodePIDPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientPID", Message: "kubelet has sufficient PID available"},
				{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", Message: "kubelet is posting ready status"},
			},
			NodeInfo: corev1.NodeSystemInfo{
				KubeletVersion: "v1.33.4", ContainerRuntimeVersion: "containerd://1.7.27", OSImage: "Ubuntu 22.04.5 LTS",
				KernelVersion: "5.15.0-139-generic", OperatingSystem: "linux", Architecture: "amd64",
			},
		},
	}
}

// withoutPlugin removes what a device plugin writes (the register annotation, the device
// count) and the scheduler's handshake: a node the plugin never ran on.
func withoutPlugin(n *corev1.Node) {
	delete(n.Annotations, annotation.KeyNVIDIARegister)
	delete(n.Annotations, annotation.KeyNVIDIAHandshake)
	delete(n.Status.Capacity, resourceGPU)
	delete(n.Status.Allocatable, resourceGPU)
}

// setGPUs sets the node's capacity and allocatable nvidia.com/gpu, as the kubelet does.
func setGPUs(n *corev1.Node, count int64) {
	n.Status.Capacity[resourceGPU] = *resource.NewQuantity(count, resource.DecimalSI)
	n.Status.Allocatable[resourceGPU] = *resource.NewQuantity(count, resource.DecimalSI)
}

// createNode creates the node, then writes its status as the kubelet does (a create drops
// the status). The TaintNodesByCondition admission plugin taints every new node
// node.kubernetes.io/not-ready:NoSchedule, which the node lifecycle controller removes once
// the kubelet reports Ready; no controller runs here, so createNode puts the node's own
// taints back itself. Nodes are cluster-wide: the name must be unique, and the node is
// deleted at the end of the test.
func createNode(t *testing.T, n *corev1.Node) {
	t.Helper()
	nodes := cp.AdminClient().CoreV1().Nodes()
	created := cp.CreateNode(t, n)
	if !slices.Equal(created.Spec.Taints, n.Spec.Taints) {
		created.Spec.Taints = n.Spec.Taints
		var err error
		if created, err = nodes.Update(t.Context(), created, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("untaint node %s: %v", n.Name, err)
		}
	}
	created.Status = n.Status
	if _, err := nodes.UpdateStatus(t.Context(), created, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update status of node %s: %v", n.Name, err)
	}
}

// leaseState is what becomes of the scheduler's Lease.
type leaseState int

const (
	// leaseHeld: the scheduler Pod's kube-scheduler holds the Lease and renews it.
	leaseHeld leaseState = iota
	// leaseExpired: held by the scheduler Pod, last renewed 10 minutes ago.
	leaseExpired
	// leaseMissing: no Lease (kube-scheduler never led).
	leaseMissing
	// leaseForeign: held and renewed by an identity that is none of the scheduler Pods.
	leaseForeign
)

// install says how a scenario's HAMi differs from the chart's defaults.
type install struct {
	// DaemonSet edits the device plugin DaemonSet before it is created.
	DaemonSet func(ds *appsv1.DaemonSet)
	// NoDaemonSet installs no device plugin DaemonSet.
	NoDaemonSet bool
	// NoNodeRBAC leaves the plugin's ServiceAccount without the ClusterRole to patch nodes.
	NoNodeRBAC bool
	// RuntimeClass, when set, creates a RuntimeClass <namespace>-nvidia with this handler and
	// names it in the DaemonSet's Pod template.
	RuntimeClass string
	// Lease is what becomes of the scheduler's Lease.
	Lease leaseState
	// Scheduler edits the scheduler Deployment before it is created.
	Scheduler func(d *appsv1.Deployment)
	// NoScheduler installs no scheduler (no Deployment, Pod or Lease).
	NoScheduler bool
}

// hami is one installation of HAMi in a namespace of its own.
type hami struct {
	ns           string
	ds           *appsv1.DaemonSet // nil without a DaemonSet
	runtimeClass string
	schedulerPod string
	lease        leaseState
	now          time.Time
}

// installHAMi installs HAMi as the chart does, in a new namespace: the device plugin's
// ServiceAccount with its node RBAC, the DaemonSet, the scheduler's ServiceAccount,
// Deployment, one running scheduler Pod and kube-scheduler's Lease held by it.
func installHAMi(t *testing.T, in install) *hami {
	t.Helper()
	ctx := t.Context()
	c := cp.AdminClient()
	h := &hami{ns: harness.UniqueName("hami"), lease: in.Lease, now: time.Now()}
	if err := cp.EnsureNamespace(ctx, h.ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.CoreV1().Namespaces().Delete(context.WithoutCancel(ctx), h.ns, metav1.DeleteOptions{})
	})
	createServiceAccount(t, h.ns, pluginName)
	if !in.NoNodeRBAC {
		grantNodeAccess(t, h.ns, pluginName)
	}
	if in.RuntimeClass != "" {
		h.runtimeClass = h.ns + "-nvidia"
		rc := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: h.runtimeClass}, Handler: in.RuntimeClass}
		if _, err := c.NodeV1().RuntimeClasses().Create(ctx, rc, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create runtime class: %v", err)
		}
		t.Cleanup(func() {
			_ = c.NodeV1().RuntimeClasses().Delete(context.WithoutCancel(ctx), h.runtimeClass, metav1.DeleteOptions{})
		})
	}
	if !in.NoDaemonSet {
		ds := pluginDaemonSet(h.ns)
		if h.runtimeClass != "" {
			ds.Spec.Template.Spec.RuntimeClassName = &h.runtimeClass
		}
		if in.DaemonSet != nil {
			in.DaemonSet(ds)
		}
		created, err := c.AppsV1().DaemonSets(h.ns).Create(ctx, ds, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create daemonset: %v", err)
		}
		h.ds = created
	}

	if in.NoScheduler {
		h.lease = leaseMissing
		return h
	}
	createServiceAccount(t, h.ns, schedulerName)
	d := schedulerDeployment(h.ns)
	if in.Scheduler != nil {
		in.Scheduler(d)
	}
	deploy, err := c.AppsV1().Deployments(h.ns).Create(ctx, d, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create scheduler deployment: %v", err)
	}
	pod := schedulerPod(deploy)
	h.schedulerPod = pod.Name
	createPod(t, pod, running)

	holder := h.schedulerPod + "_" + randomUUID()
	renewed := h.now
	switch in.Lease {
	case leaseMissing:
		return h
	case leaseExpired:
		renewed = h.now.Add(-10 * time.Minute)
	case leaseForeign:
		holder = "hami-scheduler-5f7b8c9d4-" + randomSuffix(5) + "_" + randomUUID()
	case leaseHeld:
	}
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: schedulerName, Namespace: h.ns},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       &holder,
			LeaseDurationSeconds: new(int32(15)),
			AcquireTime:          &metav1.MicroTime{Time: h.now.Add(-3 * time.Hour)},
			RenewTime:            &metav1.MicroTime{Time: renewed},
			LeaseTransitions:     new(int32(2)),
		},
	}
	if _, err := c.CoordinationV1().Leases(h.ns).Create(ctx, lease, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create lease: %v", err)
	}
	return h
}

// renewLease renews a held Lease as its holder's kube-scheduler does every 2 s, so that a
// slow run (race detector, parallel tests) does not see it expire.
func (h *hami) renewLease(t *testing.T) {
	t.Helper()
	if h.lease != leaseHeld && h.lease != leaseForeign {
		return
	}
	leases := cp.AdminClient().CoordinationV1().Leases(h.ns)
	l, err := leases.Get(t.Context(), schedulerName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get lease: %v", err)
	}
	l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
	if _, err := leases.Update(t.Context(), l, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("renew lease: %v", err)
	}
}

// diagnose diagnoses the node with the admin client and the scenario's namespace; the report
// is logged when the test fails.
func (h *hami) diagnose(t *testing.T, node string) *diagnose.Report {
	t.Helper()
	h.renewLease(t)
	r, err := diagnose.Node(t.Context(), cp.AdminClient(), node, diagnose.Options{Namespace: h.ns})
	if err != nil {
		t.Fatalf("diagnose node %s: %v", node, err)
	}
	logOnFailure(t, r)
	return r
}

func logOnFailure(t *testing.T, v any) {
	t.Helper()
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := json.MarshalIndent(v, "", "  ")
			t.Logf("report:\n%s", b)
		}
	})
}

func createServiceAccount(t *testing.T, ns, name string) {
	t.Helper()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
		Labels: map[string]string{"app.kubernetes.io/managed-by": "Helm"}}}
	if _, err := cp.AdminClient().CoreV1().ServiceAccounts(ns).Create(t.Context(), sa, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create service account %s/%s: %v", ns, name, err)
	}
}

// grantNodeAccess gives the ServiceAccount the device plugin's ClusterRole (nodes and pods)
// through a ClusterRoleBinding, both named after the namespace since they are cluster-wide,
// and waits until the RBAC authorizer allows it to patch nodes.
func grantNodeAccess(t *testing.T, ns, sa string) {
	t.Helper()
	ctx := t.Context()
	bindClusterRole(t, ns+"-device-plugin", ns, sa,
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch", "patch"}},
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch", "update", "patch"}})
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:               "system:serviceaccount:" + ns + ":" + sa,
		Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
		ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "patch", Resource: "nodes", Version: "v1"},
	}}
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		res, err := cp.AdminClient().AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
		if err != nil {
			return false, err
		}
		return res.Status.Allowed, nil
	})
	if err != nil {
		t.Fatalf("wait for RBAC to let %s patch nodes: %v", sar.Spec.User, err)
	}
}

// bindClusterRole creates a ClusterRole with the rules and binds it to the ServiceAccount,
// both named name (cluster-wide: unique per test), deleted at the end of the test.
func bindClusterRole(t *testing.T, name, ns, sa string, rules ...rbacv1.PolicyRule) {
	t.Helper()
	ctx := t.Context()
	rbac := cp.AdminClient().RbacV1()
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: sa}},
	}
	if _, err := rbac.ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create cluster role: %v", err)
	}
	t.Cleanup(func() { _ = rbac.ClusterRoles().Delete(context.WithoutCancel(ctx), name, metav1.DeleteOptions{}) })
	if _, err := rbac.ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create cluster role binding: %v", err)
	}
	t.Cleanup(func() {
		_ = rbac.ClusterRoleBindings().Delete(context.WithoutCancel(ctx), name, metav1.DeleteOptions{})
	})
}

// hamiLabels are the selector labels the chart gives a component.
func hamiLabels(component string) map[string]string {
	return map[string]string{componentLabel: component, "app.kubernetes.io/name": "hami", "app.kubernetes.io/instance": "hami"}
}

func helmMeta(name, ns, component string) metav1.ObjectMeta {
	labels := hamiLabels(component)
	labels["app.kubernetes.io/managed-by"] = "Helm"
	labels["helm.sh/chart"] = "hami-2.8.0"
	return metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels,
		Annotations: map[string]string{"meta.helm.sh/release-name": "hami", "meta.helm.sh/release-namespace": ns}}
}

func hostPathVolume(name, path string, typ corev1.HostPathType) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path, Type: &typ}}}
}

var nodeNameEnv = corev1.EnvVar{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "spec.nodeName"}}}

// pluginDaemonSet is the chart's device plugin DaemonSet: nodeSelector gpu=on, the plugin and
// the monitor containers with NODE_NAME from spec.nodeName, the kubelet's device-plugins
// folder mounted from the host. The plugin's termination message falls back to its log,
// so a crash shows its last lines in the Pod status.
func pluginDaemonSet(ns string) *appsv1.DaemonSet {
	labels := hamiLabels(pluginName)
	return &appsv1.DaemonSet{
		ObjectMeta: helmMeta(pluginName, ns, pluginName),
		Spec: appsv1.DaemonSetSpec{
			Selector:       &metav1.LabelSelector{MatchLabels: labels},
			UpdateStrategy: appsv1.DaemonSetUpdateStrategy{Type: appsv1.RollingUpdateDaemonSetStrategyType},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: map[string]string{"checksum/hami-device-plugin-config": randomHex(32)}},
				Spec: corev1.PodSpec{
					ServiceAccountName: pluginName,
					PriorityClassName:  "system-node-critical",
					HostPID:            true,
					NodeSelector:       map[string]string{gpuLabel: gpuOn},
					Tolerations:        []corev1.Toleration{{Key: "CriticalAddonsOnly", Operator: corev1.TolerationOpExists}},
					Containers: []corev1.Container{
						{
							Name:            pluginContainer,
							Image:           hamiImage,
							ImagePullPolicy: corev1.PullIfNotPresent,
							Command:         []string{"nvidia-device-plugin", "--config-file=/device-config.yaml", "--mig-strategy=none", "--disable-core-limit=false", "-v=false"},
							Env: []corev1.EnvVar{
								nodeNameEnv,
								{Name: "NVIDIA_MIG_MONITOR_DEVICES", Value: "all"},
								{Name: "HOOK_PATH", Value: "/usr/local"},
							},
							SecurityContext: &corev1.SecurityContext{
								AllowPrivilegeEscalation: new(false),
								Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: []corev1.Capability{"SYS_ADMIN"}},
							},
							VolumeMounts: []corev1.VolumeMount{
								{Name: "device-plugin", MountPath: pluginPath},
								{Name: "lib", MountPath: "/usr/local/vgpu"},
								{Name: "usrbin", MountPath: "/usrbin"},
								{Name: "deviceconfig", MountPath: "/config"},
								{Name: "hosttmp", MountPath: "/tmp"},
							},
							TerminationMessagePath:   corev1.TerminationMessagePathDefault,
							TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
						},
						{
							Name:            monitorContainer,
							Image:           hamiImage,
							ImagePullPolicy: corev1.PullIfNotPresent,
							Command:         []string{"vGPUmonitor"},
							Env: []corev1.EnvVar{
								{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"},
								{Name: "NVIDIA_MIG_MONITOR_DEVICES", Value: "all"},
								{Name: "HOOK_PATH", Value: "/usr/local/vgpu"},
								nodeNameEnv,
							},
							Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: 9394, Protocol: corev1.ProtocolTCP}},
							VolumeMounts: []corev1.VolumeMount{
								{Name: "ctrs", MountPath: "/usr/local/vgpu/containers"},
								{Name: "dockers", MountPath: "/run/docker"},
								{Name: "containerds", MountPath: "/run/containerd"},
								{Name: "sysinfo", MountPath: "/sysinfo"},
								{Name: "hostvar", MountPath: "/hostvar"},
							},
							TerminationMessagePath:   corev1.TerminationMessagePathDefault,
							TerminationMessagePolicy: corev1.TerminationMessageReadFile,
						},
					},
					Volumes: []corev1.Volume{
						{Name: "ctrs", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/usr/local/vgpu/containers"}}},
						hostPathVolume("hosttmp", "/tmp", ""),
						hostPathVolume("dockers", "/run/docker", ""),
						hostPathVolume("containerds", "/run/containerd", ""),
						hostPathVolume("device-plugin", pluginPath, ""),
						hostPathVolume("lib", "/usr/local/vgpu", ""),
						hostPathVolume("usrbin", "/usr/bin", ""),
						hostPathVolume("sysinfo", "/sys", ""),
						hostPathVolume("hostvar", "/var", ""),
						{Name: "deviceconfig", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
							LocalObjectReference: corev1.LocalObjectReference{Name: pluginName}}}},
					},
				},
			},
		},
	}
}

// setPluginHostPath mounts another host folder where the plugin expects the kubelet's
// device-plugins folder (the chart's devicePlugin.pluginPath).
func setPluginHostPath(ds *appsv1.DaemonSet, path string) {
	for i, v := range ds.Spec.Template.Spec.Volumes {
		if v.Name == "device-plugin" {
			ds.Spec.Template.Spec.Volumes[i] = hostPathVolume("device-plugin", path, "")
		}
	}
}

// pluginContainerOf returns the device plugin container of a Pod spec.
func pluginContainerOf(spec *corev1.PodSpec) *corev1.Container {
	i := slices.IndexFunc(spec.Containers, func(c corev1.Container) bool { return c.Name == pluginContainer })
	return &spec.Containers[i]
}

// pluginPod is the Pod the DaemonSet controller creates on the node: the template, owned by
// the DaemonSet, bound to the node, pinned by node affinity, with the daemon tolerations.
func (h *hami) pluginPod(node string) *corev1.Pod {
	tmpl := h.ds.Spec.Template.DeepCopy()
	labels := tmpl.Labels
	labels["controller-revision-hash"] = "6c9f7b8d5"
	labels["pod-template-generation"] = "1"
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: h.ds.Name + "-" + randomSuffix(5), Namespace: h.ns, Labels: labels, Annotations: tmpl.Annotations,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: h.ds.Name, UID: h.ds.UID,
				Controller: new(true), BlockOwnerDeletion: new(true)}},
		},
		Spec: tmpl.Spec,
	}
	p.Spec.NodeName = node
	p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
		}}},
	}}
	for _, k := range []string{corev1.TaintNodeNotReady, corev1.TaintNodeUnreachable} {
		p.Spec.Tolerations = append(p.Spec.Tolerations, corev1.Toleration{Key: k, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute})
	}
	for _, k := range []string{corev1.TaintNodeDiskPressure, corev1.TaintNodeMemoryPressure, corev1.TaintNodePIDPressure, corev1.TaintNodeUnschedulable} {
		p.Spec.Tolerations = append(p.Spec.Tolerations, corev1.Toleration{Key: k, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule})
	}
	return p
}

// addPluginPod creates the DaemonSet's Pod on the node and gives it a status.
func (h *hami) addPluginPod(t *testing.T, node string, status func(*corev1.Pod)) *corev1.Pod {
	t.Helper()
	return createPod(t, h.pluginPod(node), status)
}

// createPod creates the Pod and writes its status as its kubelet would.
func createPod(t *testing.T, p *corev1.Pod, status func(*corev1.Pod)) *corev1.Pod {
	t.Helper()
	pods := cp.AdminClient().CoreV1().Pods(p.Namespace)
	created, err := pods.Create(t.Context(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s/%s: %v", p.Namespace, p.Name, err)
	}
	status(created)
	updated, err := pods.UpdateStatus(t.Context(), created, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("update status of pod %s/%s: %v", p.Namespace, p.Name, err)
	}
	return updated
}

// Statuses a kubelet writes. started is when the Pod started, an hour ago.
var started = metav1.NewTime(time.Now().Add(-time.Hour).Truncate(time.Second))

func conditions(initialized, ready bool, notReady string) []corev1.PodCondition {
	cond := func(c corev1.PodConditionType, ok bool, reason, msg string) corev1.PodCondition {
		pc := corev1.PodCondition{Type: c, Status: corev1.ConditionTrue, LastTransitionTime: started}
		if !ok {
			pc.Status, pc.Reason, pc.Message = corev1.ConditionFalse, reason, msg
		}
		return pc
	}
	return []corev1.PodCondition{
		cond(corev1.PodReadyToStartContainers, true, "", ""),
		cond(corev1.PodInitialized, initialized, "ContainersNotInitialized", "containers with incomplete status: ["+notReady+"]"),
		cond(corev1.PodReady, ready, "ContainersNotReady", "containers with unready status: ["+notReady+"]"),
		cond(corev1.ContainersReady, ready, "ContainersNotReady", "containers with unready status: ["+notReady+"]"),
		cond(corev1.PodScheduled, true, "", ""),
	}
}

func runningContainer(c *corev1.Container) corev1.ContainerStatus {
	return corev1.ContainerStatus{
		Name: c.Name, Image: c.Image, ImageID: c.Image[:strings.LastIndex(c.Image, ":")] + "@sha256:" + randomHex(32), ContainerID: containerID(),
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: started}},
		Ready: true, Started: new(true),
	}
}

// setStatus writes the Pod-level fields of a status; the kubelet sorts container statuses by
// name.
func setStatus(p *corev1.Pod, phase corev1.PodPhase, conds []corev1.PodCondition, inits, ctrs []corev1.ContainerStatus) {
	p.Status.Phase = phase
	p.Status.Conditions = conds
	p.Status.HostIP = "10.0.12.34"
	p.Status.HostIPs = []corev1.HostIP{{IP: "10.0.12.34"}}
	if phase == corev1.PodRunning {
		p.Status.PodIP = "10.244.7." + strconv.Itoa(10+len(p.Name)%200)
		p.Status.PodIPs = []corev1.PodIP{{IP: p.Status.PodIP}}
	}
	p.Status.StartTime = &started
	slices.SortFunc(ctrs, func(a, b corev1.ContainerStatus) int { return strings.Compare(a.Name, b.Name) })
	p.Status.InitContainerStatuses = inits
	p.Status.ContainerStatuses = ctrs
}

// running: every container running and ready.
func running(p *corev1.Pod) {
	var ctrs []corev1.ContainerStatus
	for i := range p.Spec.Containers {
		ctrs = append(ctrs, runningContainer(&p.Spec.Containers[i]))
	}
	setStatus(p, corev1.PodRunning, conditions(true, true, ""), nil, ctrs)
}

// crashLoop: the plugin container exited with the code and the termination message (its last
// log lines) after restarts restarts and waits in CrashLoopBackOff; the others run.
func crashLoop(exitCode int32, message string, restarts int32) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		var ctrs []corev1.ContainerStatus
		for i := range p.Spec.Containers {
			c := &p.Spec.Containers[i]
			st := runningContainer(c)
			if c.Name == pluginContainer {
				finished := metav1.NewTime(time.Now().Add(-40 * time.Second).Truncate(time.Second))
				st.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff",
					Message: fmt.Sprintf("back-off 5m0s restarting failed container=%s pod=%s_%s(%s)", c.Name, p.Name, p.Namespace, p.UID)}}
				st.LastTerminationState = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
					ExitCode: exitCode, Reason: "Error", Message: message, ContainerID: st.ContainerID,
					StartedAt: metav1.NewTime(finished.Add(-2 * time.Second)), FinishedAt: finished}}
				st.RestartCount, st.Ready, st.Started = restarts, false, new(false)
			}
			ctrs = append(ctrs, st)
		}
		setStatus(p, corev1.PodRunning, conditions(true, false, pluginContainer), nil, ctrs)
	}
}

// imagePullBackOff: the plugin's image cannot be pulled; the Pod never started.
func imagePullBackOff(p *corev1.Pod) {
	var ctrs []corev1.ContainerStatus
	for i := range p.Spec.Containers {
		c := &p.Spec.Containers[i]
		st := corev1.ContainerStatus{Name: c.Name, Image: c.Image, Started: new(false),
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff",
				Message: fmt.Sprintf("Back-off pulling image %q: ErrImagePull: failed to pull and unpack image %q: failed to resolve reference %q: unexpected status from HEAD request: 429 Too Many Requests", c.Image, c.Image, c.Image)}}}
		ctrs = append(ctrs, st)
	}
	setStatus(p, corev1.PodPending, conditions(true, false, pluginContainer+" "+monitorContainer), nil, ctrs)
}

// waitingInInit: the first init container runs (waits), the containers wait for it.
func waitingInInit(p *corev1.Pod) {
	init := &p.Spec.InitContainers[0]
	inits := []corev1.ContainerStatus{runningContainer(init)}
	inits[0].Ready = false
	var ctrs []corev1.ContainerStatus
	for i := range p.Spec.Containers {
		c := &p.Spec.Containers[i]
		ctrs = append(ctrs, corev1.ContainerStatus{Name: c.Name, Image: c.Image, Started: new(false),
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "PodInitializing"}}})
	}
	setStatus(p, corev1.PodPending, conditions(false, false, pluginContainer+" "+monitorContainer), inits, ctrs)
	p.Status.Conditions[1].Message = "containers with incomplete status: [" + init.Name + "]"
}

// toolkitValidation is the init container that holds the plugin until the NVIDIA Container
// Toolkit (GPU Operator) has written toolkit-ready on the host.
func toolkitValidation(ds *appsv1.DaemonSet) {
	spec := &ds.Spec.Template.Spec
	spec.InitContainers = append(spec.InitContainers, corev1.Container{
		Name:    "toolkit-validation",
		Image:   "nvcr.io/nvidia/cloud-native/gpu-operator-validator:v24.9.2",
		Command: []string{"sh", "-c"},
		Args:    []string{"until [ -f /run/nvidia/validations/toolkit-ready ]; do echo waiting for nvidia container stack to be setup; sleep 5; done"},
		VolumeMounts: []corev1.VolumeMount{{Name: "run-nvidia-validations", MountPath: "/run/nvidia/validations",
			MountPropagation: new(corev1.MountPropagationHostToContainer)}},
		TerminationMessagePath: corev1.TerminationMessagePathDefault, TerminationMessagePolicy: corev1.TerminationMessageReadFile,
	})
	spec.Volumes = append(spec.Volumes, hostPathVolume("run-nvidia-validations", "/run/nvidia/validations", corev1.HostPathDirectoryOrCreate))
}

// logForwarder adds a native sidecar (an init container that restarts always) that ships the
// plugin's logs; it runs beside the plugin for the Pod's whole life.
func logForwarder(ds *appsv1.DaemonSet) {
	spec := &ds.Spec.Template.Spec
	spec.InitContainers = append(spec.InitContainers, corev1.Container{
		Name:          "log-forwarder",
		Image:         "cr.fluentbit.io/fluent/fluent-bit:3.2.4",
		RestartPolicy: new(corev1.ContainerRestartPolicyAlways),
		Args:          []string{"--config=/fluent-bit/etc/fluent-bit.yaml"},
		VolumeMounts:  []corev1.VolumeMount{{Name: "hostvar", MountPath: "/hostvar", ReadOnly: true}},
	})
}

// withSidecar runs the Pod's native sidecars (started and ready) and then applies status.
func withSidecar(status func(*corev1.Pod)) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		status(p)
		var inits []corev1.ContainerStatus
		for i := range p.Spec.InitContainers {
			inits = append(inits, runningContainer(&p.Spec.InitContainers[i]))
		}
		p.Status.InitContainerStatuses = inits
	}
}

// legacyNodeNameEnv replaces the plugin's NODE_NAME with the NodeName variable older
// manifests set.
func legacyNodeNameEnv(ds *appsv1.DaemonSet) {
	c := pluginContainerOf(&ds.Spec.Template.Spec)
	for i := range c.Env {
		if c.Env[i].Name == "NODE_NAME" {
			c.Env[i].Name = "NodeName"
		}
	}
}

// Logs of a failing device plugin, as the kubelet copies them into the termination message.
const (
	nvmlLog = `I0527 09:48:47.938491       1 main.go:235] Starting FS watcher.
I0527 09:48:47.938573       1 main.go:242] Starting OS watcher.
I0527 09:48:47.939012       1 main.go:257] Starting Plugins.
I0527 09:48:47.939044       1 main.go:314] Loading configuration.
E0527 09:48:47.940711       1 main.go:132] nvml Init err: ERROR_LIBRARY_NOT_FOUND
F0527 09:48:47.940788       1 main.go:290] error starting plugins: failed to initialize NVML: could not load NVML library: libnvidia-ml.so.1: cannot open shared object file: No such file or directory
`
	nvmlShortLog = `I0527 10:02:13.114201       1 main.go:257] Starting Plugins.
E0527 10:02:13.116920       1 factory.go:112] nvml Init err: ERROR_LIBRARY_NOT_FOUND
`
	nodeNameLog = `I0527 09:51:02.104417       1 main.go:235] Starting FS watcher.
I0527 09:51:02.104483       1 main.go:242] Starting OS watcher.
F0527 09:51:02.104511       1 main.go:96] Node name is empty
`
	panicLog = `I0527 09:55:40.201387       1 main.go:257] Starting Plugins.
panic: runtime error: invalid memory address or nil pointer dereference
[signal SIGSEGV: segmentation violation code=0x1 addr=0x18 pc=0x1d4f2a6]

goroutine 1 [running]:
main.start(0xc0001c6000)
	/k8s-vgpu/cmd/device-plugin/nvidiadevice/main.go:301 +0x3c6
`
)

// schedulerDeployment is the chart's scheduler: kube-scheduler with HAMi's extender beside
// it, which registers only nodes labelled gpu-pool=hami.
func schedulerDeployment(ns string) *appsv1.Deployment {
	labels := hamiLabels(schedulerName)
	return &appsv1.Deployment{
		ObjectMeta: helmMeta(schedulerName, ns, schedulerName),
		Spec: appsv1.DeploymentSpec{
			Replicas: new(int32(1)),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					ServiceAccountName: schedulerName,
					PriorityClassName:  "system-node-critical",
					Containers: []corev1.Container{
						{
							Name:  kubeSchedContainer,
							Image: kubeSchedImage,
							Command: []string{"kube-scheduler", "--config=/config/config.yaml", "-v=4", "--leader-elect=true",
								"--leader-elect-resource-name=" + schedulerName, "--leader-elect-resource-namespace=" + ns},
							VolumeMounts: []corev1.VolumeMount{{Name: "scheduler-config", MountPath: "/config"}},
						},
						{
							Name:  extenderContainer,
							Image: hamiImage,
							Command: []string{"scheduler", "--http_bind=0.0.0.0:443", "--cert_file=/tls/tls.crt", "--key_file=/tls/tls.key",
								"--scheduler-name=hami-scheduler", "--metrics-bind-address=:9395", "--node-scheduler-policy=binpack",
								"--gpu-scheduler-policy=spread", "--node-label-selector=" + poolLabel + "=" + poolValue,
								"--leader-elect=true", "--leader-elect-resource-namespace=" + ns, "-v=4"},
							Ports:        []corev1.ContainerPort{{Name: "http", ContainerPort: 443, Protocol: corev1.ProtocolTCP}},
							VolumeMounts: []corev1.VolumeMount{{Name: "tls-config", MountPath: "/tls"}},
						},
					},
					Volumes: []corev1.Volume{
						{Name: "tls-config", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "hami-scheduler-tls"}}},
						{Name: "scheduler-config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
							LocalObjectReference: corev1.LocalObjectReference{Name: "hami-scheduler-newversion"}}}},
					},
				},
			},
		},
	}
}

// schedulerPod is the Deployment's Pod, running on a control-plane node.
func schedulerPod(d *appsv1.Deployment) *corev1.Pod {
	tmpl := d.Spec.Template.DeepCopy()
	hash := "7d9f8c6b5"
	tmpl.Labels["pod-template-hash"] = hash
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: d.Name + "-" + hash + "-" + randomSuffix(5), Namespace: d.Namespace, Labels: tmpl.Labels},
		Spec:       tmpl.Spec,
	}
	p.Spec.NodeName = "control-plane-" + d.Namespace
	return p
}

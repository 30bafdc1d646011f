package main

import (
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/hamireg/hamireg/dra"
	"github.com/hamireg/hamireg/draplugin"
	"github.com/hamireg/hamireg/hamicore"
	"github.com/hamireg/hamireg/internal/manifests"
	"github.com/hamireg/hamireg/kubeletplugin"
	"github.com/hamireg/hamireg/nodeagent"
	"github.com/hamireg/hamireg/nodeagent/nodedra"
	"github.com/hamireg/hamireg/register"
)

func TestManifests(t *testing.T) {
	t.Parallel()
	var (
		ds      *appsv1.DaemonSet
		sa      *corev1.ServiceAccount
		role    *rbacv1.ClusterRole
		crb     *rbacv1.ClusterRoleBinding
		draRole *rbacv1.ClusterRole
		draCRB  *rbacv1.ClusterRoleBinding
		capRole *rbacv1.ClusterRole // deploy/node-capacity.yaml, with --report-node-capacity
		capCRB  *rbacv1.ClusterRoleBinding
		classes = map[string]*resourcev1.DeviceClass{}
		svc     *corev1.Service // deploy/monitor-service.yaml
	)
	for _, obj := range manifests.Glob(t, "deploy/*.yaml") {
		switch o := obj.(type) {
		case *appsv1.DaemonSet:
			ds = o
		case *corev1.ServiceAccount:
			sa = o
		case *rbacv1.ClusterRole:
			switch {
			case strings.HasSuffix(o.Name, "-node-capacity"):
				capRole = o
			case strings.HasSuffix(o.Name, "-dra"):
				draRole = o
			default:
				role = o
			}
		case *rbacv1.ClusterRoleBinding:
			switch {
			case strings.HasSuffix(o.Name, "-node-capacity"):
				capCRB = o
			case strings.HasSuffix(o.Name, "-dra"):
				draCRB = o
			default:
				crb = o
			}
		case *resourcev1.DeviceClass:
			classes[o.Name] = o
		case *corev1.Service:
			svc = o
		default:
			t.Errorf("unexpected object %T", obj)
		}
	}
	if ds == nil || sa == nil || role == nil || crb == nil || draRole == nil || draCRB == nil {
		t.Fatalf("want a DaemonSet, a ServiceAccount, two ClusterRoles and two ClusterRoleBindings (one of each for --dra); got %v %v %v %v %v %v",
			ds != nil, sa != nil, role != nil, crb != nil, draRole != nil, draCRB != nil)
	}
	// --dra: the DeviceClass of each profile, as package dra writes it, and its extra RBAC.
	for _, p := range []dra.Profile{dra.SDKProfile(), dra.HAMiProfile()} {
		for _, want := range []*resourcev1.DeviceClass{dra.DeviceClass(p), dra.MIGDeviceClass(p)} {
			got, ok := classes[want.Name]
			if !ok {
				t.Errorf("no DeviceClass %s (profile %s)", want.Name, p.Name)
				continue
			}
			if diff := cmp.Diff(want.Spec, got.Spec); diff != "" {
				t.Errorf("DeviceClass %s differs from package dra's (-want +got):\n%s", want.Name, diff)
			}
		}
	}
	// deploy/mapping: the SDK class with the extended-resource mapping of nvidia.com/gpu.
	mapped := manifests.Glob(t, "deploy/mapping/*.yaml")
	wantClass, err := dra.DeviceClassWith(dra.SDKProfile(), dra.DeviceClassOptions{ExtendedResourceName: "nvidia.com/gpu"})
	if err != nil {
		t.Fatal(err)
	}
	if len(mapped) != 1 {
		t.Errorf("deploy/mapping holds %d objects, want the one DeviceClass", len(mapped))
	} else if got, ok := mapped[0].(*resourcev1.DeviceClass); !ok || got.Name != wantClass.Name {
		t.Errorf("deploy/mapping holds %T, want DeviceClass %s", mapped[0], wantClass.Name)
	} else if diff := cmp.Diff(wantClass.Spec, got.Spec); diff != "" {
		t.Errorf("deploy/mapping's DeviceClass differs from dra.DeviceClassWith (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(nodedra.ClusterRoleRules(), draRole.Rules); diff != "" {
		t.Errorf("ClusterRole %s rules differ from nodedra.ClusterRoleRules() (-want +got):\n%s", draRole.Name, diff)
	}
	wantDRARef := rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: draRole.Name}
	if draCRB.RoleRef != wantDRARef || !cmp.Equal(draCRB.Subjects, []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa.Name, Namespace: sa.Namespace}}) {
		t.Errorf("ClusterRoleBinding %s binds %+v to %+v, want %+v to the ServiceAccount", draCRB.Name, draCRB.RoleRef, draCRB.Subjects, wantDRARef)
	}

	// --report-node-capacity: its own ClusterRole, which with the main one covers what the
	// agent needs with Options.NodeCapacity.
	if capRole == nil || capCRB == nil {
		t.Fatal("want a ClusterRole and a ClusterRoleBinding named *-node-capacity (deploy/node-capacity.yaml)")
	}
	if diff := cmp.Diff(nodeagent.NodeCapacityRules(), capRole.Rules); diff != "" {
		t.Errorf("ClusterRole %s rules differ from nodeagent.NodeCapacityRules() (-want +got):\n%s", capRole.Name, diff)
	}
	if missing := manifests.Uncovered(append(slices.Clone(role.Rules), capRole.Rules...), nodeagent.ClusterRoleRulesFor(nodeagent.Options{NodeCapacity: true})); len(missing) != 0 {
		t.Errorf("with --report-node-capacity the ClusterRoles miss %v", missing)
	}
	wantCapRef := rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: capRole.Name}
	if capCRB.RoleRef != wantCapRef || !cmp.Equal(capCRB.Subjects, []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa.Name, Namespace: sa.Namespace}}) {
		t.Errorf("ClusterRoleBinding %s binds %+v to %+v, want %+v to the ServiceAccount", capCRB.Name, capCRB.RoleRef, capCRB.Subjects, wantCapRef)
	}

	if diff := cmp.Diff(nodeagent.ClusterRoleRules(), role.Rules); diff != "" {
		t.Errorf("ClusterRole rules differ from nodeagent.ClusterRoleRules() (-want +got):\n%s", diff)
	}
	wantRef := rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name}
	wantSubjects := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa.Name, Namespace: sa.Namespace}}
	if crb.RoleRef != wantRef || !cmp.Equal(crb.Subjects, wantSubjects) {
		t.Errorf("ClusterRoleBinding binds %+v to %+v, want %+v to %+v", crb.RoleRef, crb.Subjects, wantRef, wantSubjects)
	}

	if ds.Namespace != "kube-system" || ds.Name != "hami-device-plugin" || sa.Namespace != "kube-system" {
		t.Errorf("DaemonSet %s/%s, ServiceAccount namespace %s: want kube-system/hami-device-plugin", ds.Namespace, ds.Name, sa.Namespace)
	}
	spec := ds.Spec.Template.Spec
	if spec.ServiceAccountName != sa.Name || spec.PriorityClassName != "system-node-critical" {
		t.Errorf("serviceAccountName %q priorityClassName %q", spec.ServiceAccountName, spec.PriorityClassName)
	}
	if diff := cmp.Diff(map[string]string{"gpu": "on"}, spec.NodeSelector); diff != "" {
		t.Errorf("nodeSelector (-want +got):\n%s", diff)
	}
	wantTolerations := []corev1.Toleration{
		{Key: "CriticalAddonsOnly", Operator: corev1.TolerationOpExists},
		{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
	}
	if diff := cmp.Diff(wantTolerations, spec.Tolerations); diff != "" {
		t.Errorf("tolerations (-want +got):\n%s", diff)
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(spec.Containers))
	}
	c := spec.Containers[0]
	envs := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		envs[e.Name] = e
	}
	if f := envs[register.EnvNodeName].ValueFrom; f == nil || f.FieldRef == nil || f.FieldRef.FieldPath != "spec.nodeName" {
		t.Errorf("env %s is not from fieldRef spec.nodeName: %+v", register.EnvNodeName, envs[register.EnvNodeName])
	}
	if v := envs["HOOK_PATH"].Value; v != hamicore.DefaultHookPath {
		t.Errorf("HOOK_PATH = %q, want %q", v, hamicore.DefaultHookPath)
	}
	// Scores always published: a pod may ask topology-aware by annotation under any default.
	if v := envs["ENABLE_TOPOLOGY_SCORE"].Value; v != "true" {
		t.Errorf("ENABLE_TOPOLOGY_SCORE = %q, want \"true\"", v)
	}
	hostPaths := map[string]string{}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	mounts := map[string]string{} // host path -> container path
	for _, m := range c.VolumeMounts {
		mounts[hostPaths[m.Name]] = m.MountPath
	}
	want := map[string]string{
		filepath.Clean(kubeletplugin.DefaultPluginDir):  filepath.Clean(kubeletplugin.DefaultPluginDir),
		filepath.Join(hamicore.DefaultHookPath, "vgpu"): filepath.Join(hamicore.DefaultHookPath, "vgpu"),
		// --dra: the registrar's and the plugin's folders under the kubelet's root, the CDI folder.
		draplugin.DefaultRegistrarDir:  draplugin.DefaultRegistrarDir,
		draplugin.DefaultPluginDirBase: draplugin.DefaultPluginDirBase,
		draplugin.DefaultCDIDir:        draplugin.DefaultCDIDir,
	}
	if diff := cmp.Diff(want, mounts); diff != "" {
		t.Errorf("hostPath mounts, host path -> container path (-want +got):\n%s", diff)
	}
	if c.Image == "" {
		t.Error("no image")
	}
	checkMetrics(t, ds, svc)
	var stderr syncBuffer // the container's arguments parse (NODE_NAME unset: status 2 after parsing)
	if code := run(t.Context(), c.Args, &stderr, host{getenv: func(string) string { return "" }}); code != 2 || !strings.Contains(stderr.String(), "NODE_NAME") {
		t.Errorf("the DaemonSet's args do not parse: status %d, %s", code, stderr.String())
	}
}

// checkMetrics: the container serves /metrics and the probes on HAMi's monitor port 9394, named
// metrics, which the kubelet probes (/healthz liveness, /readyz readiness), and HAMi's monitor
// Service hami-device-plugin-monitor sends NodePort 31992 of each node to that node's plugin.
func checkMetrics(t *testing.T, ds *appsv1.DaemonSet, svc *corev1.Service) {
	t.Helper()
	c := ds.Spec.Template.Spec.Containers[0]
	bind := defaultMetricsBindAddress
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--metrics-bind-address="); ok {
			bind = v
		}
	}
	_, port, err := net.SplitHostPort(bind)
	if err != nil || port != "9394" || bind != defaultMetricsBindAddress {
		t.Errorf("--metrics-bind-address %q, want HAMi's monitor address %s", bind, defaultMetricsBindAddress)
	}
	var metricsPort *corev1.ContainerPort
	for i, p := range c.Ports {
		if p.Name == "metrics" {
			metricsPort = &c.Ports[i]
		}
	}
	if metricsPort == nil || metricsPort.ContainerPort != 9394 {
		t.Fatalf("container ports %+v, want metrics: 9394", c.Ports)
	}
	probes := map[string]struct {
		probe *corev1.Probe
		path  string
	}{"livenessProbe": {c.LivenessProbe, nodeagent.PathHealthz}, "readinessProbe": {c.ReadinessProbe, nodeagent.PathReadyz}}
	for name, p := range probes {
		if p.probe == nil || p.probe.HTTPGet == nil || p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Port != intstr.FromString("metrics") {
			t.Errorf("%s %+v, want GET %s on port metrics", name, p.probe, p.path)
		}
	}

	if svc == nil {
		t.Fatal("no Service (deploy/monitor-service.yaml)")
	}
	if svc.Name != "hami-device-plugin-monitor" || svc.Namespace != "kube-system" || svc.Spec.Type != corev1.ServiceTypeNodePort ||
		svc.Spec.ExternalTrafficPolicy != corev1.ServiceExternalTrafficPolicyLocal || !svc.Spec.PublishNotReadyAddresses {
		t.Errorf("Service %s/%s type %s externalTrafficPolicy %s publishNotReadyAddresses %v, want kube-system/hami-device-plugin-monitor NodePort Local true",
			svc.Namespace, svc.Name, svc.Spec.Type, svc.Spec.ExternalTrafficPolicy, svc.Spec.PublishNotReadyAddresses)
	}
	if diff := cmp.Diff(ds.Spec.Selector.MatchLabels, svc.Spec.Selector); diff != "" {
		t.Errorf("Service selector differs from the DaemonSet's (-DaemonSet +Service):\n%s", diff)
	}
	for k, v := range svc.Spec.Selector {
		if ds.Spec.Template.Labels[k] != v {
			t.Errorf("Service selects %s=%s, which the DaemonSet's pods do not carry", k, v)
		}
	}
	if len(svc.Spec.Ports) != 1 {
		t.Fatalf("Service ports %+v, want one", svc.Spec.Ports)
	}
	if p := svc.Spec.Ports[0]; p.NodePort != 31992 || p.TargetPort != intstr.FromString(metricsPort.Name) {
		t.Errorf("Service port %+v, want nodePort 31992 to the container port %s", p, metricsPort.Name)
	}
}

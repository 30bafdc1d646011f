package main

import (
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/hamireg/hamireg/internal/manifests"
	"github.com/hamireg/hamireg/kubeletplugin"
	"github.com/hamireg/hamireg/nodeagent"
	"github.com/hamireg/hamireg/register"
)

// The manifests are a DaemonSet running the plugin with the node name and the host's
// device-plugins folder and /dev, and RBAC of exactly nodeagent.ClusterRoleRules().
func TestManifests(t *testing.T) {
	t.Parallel()
	objs := manifests.Glob(t, "deploy/*.yaml")
	ds, okDS := manifests.Find[*appsv1.DaemonSet](objs, "acme-device-plugin")
	sa, okSA := manifests.Find[*corev1.ServiceAccount](objs, "acme-device-plugin")
	role, okRole := manifests.Find[*rbacv1.ClusterRole](objs, "acme-device-plugin")
	crb, okCRB := manifests.Find[*rbacv1.ClusterRoleBinding](objs, "acme-device-plugin")
	if len(objs) != 4 || !okDS || !okSA || !okRole || !okCRB {
		t.Fatalf("want the DaemonSet, ServiceAccount, ClusterRole and ClusterRoleBinding acme-device-plugin and nothing else; got %d objects: %v %v %v %v",
			len(objs), okDS, okSA, okRole, okCRB)
	}

	if diff := cmp.Diff(nodeagent.ClusterRoleRules(), role.Rules); diff != "" {
		t.Errorf("ClusterRole rules differ from nodeagent.ClusterRoleRules() (-want +got):\n%s", diff)
	}
	wantRef := rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name}
	wantSubjects := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa.Name, Namespace: sa.Namespace}}
	if crb.RoleRef != wantRef || !cmp.Equal(crb.Subjects, wantSubjects) {
		t.Errorf("ClusterRoleBinding binds %+v to %+v, want %+v to %+v", crb.RoleRef, crb.Subjects, wantRef, wantSubjects)
	}

	spec := ds.Spec.Template.Spec
	if ds.Namespace != sa.Namespace || spec.ServiceAccountName != sa.Name {
		t.Errorf("DaemonSet %s/%s runs as %q, want ServiceAccount %s/%s", ds.Namespace, ds.Name, spec.ServiceAccountName, sa.Namespace, sa.Name)
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(spec.Containers))
	}
	c := spec.Containers[0]
	var nodeName *corev1.EnvVar
	for i := range c.Env {
		if c.Env[i].Name == register.EnvNodeName {
			nodeName = &c.Env[i]
		}
	}
	if nodeName == nil || nodeName.ValueFrom == nil || nodeName.ValueFrom.FieldRef == nil || nodeName.ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
		t.Errorf("env %s is not from fieldRef spec.nodeName: %+v", register.EnvNodeName, nodeName)
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
	want := map[string]string{filepath.Clean(kubeletplugin.DefaultPluginDir): filepath.Clean(kubeletplugin.DefaultPluginDir), "/dev": "/dev"}
	if diff := cmp.Diff(want, mounts); diff != "" {
		t.Errorf("hostPath mounts, host path -> container path (-want +got):\n%s", diff)
	}
	// /metrics and the probes on the port named metrics, which the kubelet probes.
	bind := defaultMetricsBindAddress
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--metrics-bind-address="); ok {
			bind = v
		}
	}
	_, port, err := net.SplitHostPort(bind)
	if err != nil {
		t.Fatalf("--metrics-bind-address %q: %v", bind, err)
	}
	var metricsPort int32
	for _, p := range c.Ports {
		if p.Name == "metrics" {
			metricsPort = p.ContainerPort
		}
	}
	if metricsPort == 0 || strconv.Itoa(int(metricsPort)) != port {
		t.Errorf("container ports %+v, want metrics: %s (--metrics-bind-address %s)", c.Ports, port, bind)
	}
	for name, p := range map[string]struct {
		probe *corev1.Probe
		path  string
	}{"livenessProbe": {c.LivenessProbe, nodeagent.PathHealthz}, "readinessProbe": {c.ReadinessProbe, nodeagent.PathReadyz}} {
		if p.probe == nil || p.probe.HTTPGet == nil || p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Port != intstr.FromString("metrics") {
			t.Errorf("%s %+v, want GET %s on port metrics", name, p.probe, p.path)
		}
	}
	var stderr syncBuffer // the container's arguments parse (NODE_NAME unset: status 2 after parsing)
	if code := run(t.Context(), c.Args, &stderr, env(nil), nil); code != 2 || !strings.Contains(stderr.String(), "NODE_NAME") {
		t.Errorf("the DaemonSet's args do not parse: status %d, %s", code, stderr.String())
	}
}

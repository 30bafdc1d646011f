package main

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/extender"
	"github.com/hamireg/hamireg/internal/manifests"
	"github.com/hamireg/hamireg/schedcache"
)

// find returns the object of type T named name, nil when there is none.
func find[T interface {
	runtime.Object
	GetName() string
}](objs []runtime.Object, name string) T {
	v, _ := manifests.Find[T](objs, name)
	return v
}

// TestManifests: every manifest decodes; the RBAC covers the packages' rules and kube-scheduler
// is bound to its roles; the KubeSchedulerConfiguration's extender entry agrees with the
// extender's flags and routes, with the managed resources ignored by the scheduler.
func TestManifests(t *testing.T) {
	t.Parallel()
	objs := manifests.Glob(t, "deploy/*.yaml")
	role := find[*rbacv1.ClusterRole](objs, "hami-scheduler")
	if role == nil {
		t.Fatal("no ClusterRole hami-scheduler")
	}
	if m := manifests.Uncovered(role.Rules, append(extender.ClusterRoleRules(), schedcache.ClusterRoleRules()...)); len(m) > 0 {
		t.Errorf("ClusterRole misses %v", m)
	}
	if lease := find[*rbacv1.Role](objs, "hami-scheduler-lease"); lease == nil || len(manifests.Uncovered(lease.Rules, schedcache.LeaseRoleRules())) > 0 {
		t.Errorf("lease Role missing or short: %v", lease)
	}
	var bound []string
	for _, o := range objs {
		if b, ok := o.(*rbacv1.ClusterRoleBinding); ok && len(b.Subjects) == 1 && b.Subjects[0].Name == "hami-scheduler" {
			bound = append(bound, b.RoleRef.Name)
		}
	}
	slices.Sort(bound)
	if want := []string{"hami-scheduler", "system:kube-scheduler", "system:volume-scheduler"}; !slices.Equal(bound, want) {
		t.Errorf("service account bound to %v, want %v", bound, want)
	}

	dep := find[*appsv1.Deployment](objs, "hami-scheduler")
	if dep == nil || len(dep.Spec.Template.Spec.Containers) != 2 {
		t.Fatalf("Deployment: %v", dep)
	}
	var ext corev1.Container
	for _, c := range dep.Spec.Template.Spec.Containers {
		if c.Name == "vgpu-scheduler-extender" {
			ext = c
		}
	}
	// Liveness is the process serving, readiness the caches synced: a liveness probe on
	// /readyz would restart an extender still listing a large cluster.
	for probe, want := range map[string]struct {
		p    *corev1.Probe
		path string
	}{"liveness": {ext.LivenessProbe, extender.PathHealthz}, "readiness": {ext.ReadinessProbe, extender.PathReadyz}} {
		if want.p == nil || want.p.HTTPGet == nil || want.p.HTTPGet.Path != want.path {
			t.Errorf("%s probe %+v, want an HTTP GET of %s", probe, want.p, want.path)
		}
	}
	fs := pflag.NewFlagSet("extender", pflag.ContinueOnError)
	f := newFlags(fs)
	fs.IntP("v", "v", 0, "klog verbosity (main adds klog's flags)")
	if err := fs.Parse(ext.Args); err != nil {
		t.Fatalf("extender args %q: %v", ext.Args, err)
	}

	cm := find[*corev1.ConfigMap](objs, "hami-scheduler-config")
	if cm == nil {
		t.Fatal("no ConfigMap hami-scheduler-config")
	}
	cfg, err := manifests.SchedulerConfig(cm)
	if err != nil {
		t.Fatalf("KubeSchedulerConfiguration: %v", err)
	}
	if len(cfg.Profiles) != 1 || cfg.Profiles[0].SchedulerName == nil || *cfg.Profiles[0].SchedulerName != f.schedulerName {
		t.Errorf("profiles %+v, want one named %s", cfg.Profiles, f.schedulerName)
	}
	le := cfg.LeaderElection
	if le.LeaderElect == nil || *le.LeaderElect != f.leaderElect || le.ResourceName != f.leaseName || le.ResourceNamespace != f.leaseNamespace {
		t.Errorf("leaderElection %+v does not match --leader-elect %v %s/%s", le, f.leaderElect, f.leaseNamespace, f.leaseName)
	}
	if len(cfg.Extenders) != 1 {
		t.Fatalf("extenders: %+v", cfg.Extenders)
	}
	x := cfg.Extenders[0]
	u, err := url.Parse(x.URLPrefix)
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(f.httpBind)
	if u.Port() != port || (u.Scheme == "https") != (f.certFile != "") || x.EnableHTTPS != (f.certFile != "") {
		t.Errorf("urlPrefix %s (enableHTTPS %v) does not reach --http_bind %s with cert %q", x.URLPrefix, x.EnableHTTPS, f.httpBind, f.certFile)
	}
	if "/"+x.FilterVerb != extender.PathFilter || "/"+x.BindVerb != extender.PathBind || !x.NodeCacheCapable || x.PrioritizeVerb != "" || x.Ignorable {
		t.Errorf("extender entry %+v", x)
	}
	var managed []string
	for _, r := range x.ManagedResources {
		if r.IgnoredByScheduler {
			managed = append(managed, r.Name)
		}
	}
	for _, name := range []string{"nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpucores", "nvidia.com/gpumem-percentage"} {
		if !slices.Contains(managed, name) {
			t.Errorf("%s is not a managed resource ignored by the scheduler (%v)", name, managed)
		}
	}
	wh := find[*admissionMutating](objs, "hami-webhook")
	if wh == nil || len(wh.Webhooks) != 1 || wh.Webhooks[0].ClientConfig.Service == nil ||
		wh.Webhooks[0].ClientConfig.Service.Path == nil || *wh.Webhooks[0].ClientConfig.Service.Path != extender.PathWebhook {
		t.Fatalf("webhook configuration %+v", wh)
	}
	// Trust: every pod's creations and updates are sent, whatever its labels.
	hook := wh.Webhooks[0]
	if hook.ObjectSelector != nil && (len(hook.ObjectSelector.MatchLabels) > 0 || len(hook.ObjectSelector.MatchExpressions) > 0) {
		t.Errorf("webhook objectSelector %+v lets a pod skip the allocation annotation guard", hook.ObjectSelector)
	}
	if len(hook.Rules) != 1 || !slices.Contains(hook.Rules[0].Operations, admissionregistrationv1.Create) ||
		!slices.Contains(hook.Rules[0].Operations, admissionregistrationv1.Update) || !slices.Equal(hook.Rules[0].Resources, []string{"pods"}) {
		t.Errorf("webhook rules %+v, want pods CREATE and UPDATE", hook.Rules)
	}
	// The client certificates: kube-scheduler presents one, the probes are on a port without.
	if f.clientCAFile == "" || !slices.Equal(f.allowedClientNames, []string{"kube-scheduler", "kube-apiserver"}) {
		t.Errorf("--client_ca_file %q, --allowed_client_names %v", f.clientCAFile, f.allowedClientNames)
	}
	if x.TLSConfig == nil || x.TLSConfig.Insecure || x.TLSConfig.CertFile == "" || x.TLSConfig.KeyFile == "" || x.TLSConfig.CAFile == "" {
		t.Errorf("extender tlsConfig %+v, want a verified server and a client certificate", x.TLSConfig)
	}
	for _, p := range []*corev1.Probe{ext.LivenessProbe, ext.ReadinessProbe} {
		if p != nil && p.HTTPGet != nil && p.HTTPGet.Port.String() != "metrics" {
			t.Errorf("probe on port %s: the kubelet has no client certificate for --http_bind", p.HTTPGet.Port.String())
		}
	}
}

// TestRun: the program's run serves the extender over a fake cluster and returns nil on
// cancellation, after everything it started ended.
func TestRun(t *testing.T) {
	t.Parallel()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	fs := pflag.NewFlagSet("extender", pflag.ContinueOnError)
	f := newFlags(fs)
	if err := fs.Parse([]string{"--node-label-selector=gpu=on,zone=a", "--gpu-scheduler-policy=binpack"}); err != nil {
		t.Fatal(err)
	}
	if got := f.selector().String(); got != "gpu=on,zone=a" {
		t.Errorf("selector %q", got)
	}
	if f.metricsBind != extender.DefaultMetricsBindAddress || f.legacyMetrics {
		t.Errorf("metrics flags default to %q, legacy %v; HAMi's are %q, false", f.metricsBind, f.legacyMetrics, extender.DefaultMetricsBindAddress)
	}
	f.legacyMetrics = true
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	metricsLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	client := fake.NewClientset()
	go func() { done <- run(ctx, client, client, f, ln, metricsLn) }()
	base := "http://" + ln.Addr().String()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(base + extender.PathReadyz)
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	resp, err := http.Post(base+extender.PathFilter, "application/json", strings.NewReader(`{"Pod":{"metadata":{"name":"p"}},"NodeNames":["a"]}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"NodeNames":["a"]`) {
		t.Errorf("filter = %d %s", resp.StatusCode, body)
	}
	if resp, err = http.Get("http://" + metricsLn.Addr().String() + "/metrics"); err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	for _, want := range []string{"# TYPE hami_build_info gauge", `hamireg_extender_filter_duration_seconds_count{result="no_gpu"} 1`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics without %q:\n%s", want, body)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("run = %v", err)
	}
}

type admissionMutating = admissionregistrationv1.MutatingWebhookConfiguration

// --vendor chooses the vendor scheduled: NVIDIA by default, a vendor of the SDK's generic fit
// by its flags, and one of HAMi's own by its table entry (which the extender then refuses).
func TestVendorFlags(t *testing.T) {
	for _, tc := range []struct {
		args                []string
		name, resource, mem string
	}{
		{nil, "NVIDIA", "nvidia.com/gpu", "nvidia.com/gpumem"},
		{[]string{"--vendor", "ACME", "--vendor-resource-name", "acme.example/npu", "--vendor-memory-resource-name", "acme.example/npu-memory"}, "ACME", "acme.example/npu", "acme.example/npu-memory"},
		{[]string{"--vendor", "MLU"}, "MLU", "cambricon.com/vmlu", "cambricon.com/mlu.smlu.vmemory"},
	} {
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		f := newFlags(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		v := f.vendor()
		if v.Name != tc.name || v.ResourceName != tc.resource || v.ResourceMemoryName != tc.mem {
			t.Errorf("%v: vendor %+v, want %s %s %s", tc.args, v, tc.name, tc.resource, tc.mem)
		}
	}
}

func TestAccountingFlag(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		want    allocation.Accounting
		refused bool
	}{
		{nil, allocation.AccountingKubernetes, false},
		{[]string{"--accounting", "hami"}, allocation.AccountingHAMi, false},
		{[]string{"--accounting", "kubernetes"}, allocation.AccountingKubernetes, false},
		{[]string{"--accounting", "k8s"}, "", true},
	} {
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		f := newFlags(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		c, err := f.config().WithDefaults()
		if tc.refused {
			if !errors.Is(err, allocation.ErrInvalidConfig) {
				t.Errorf("%v: WithDefaults error %v, want ErrInvalidConfig", tc.args, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if got := c.EffectiveAccounting(); got != tc.want {
			t.Errorf("%v: accounting %q, want %q", tc.args, got, tc.want)
		}
	}
}

package main

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/apis/config/scheme"
	"k8s.io/kubernetes/pkg/scheduler/apis/config/validation"
	"sigs.k8s.io/yaml"

	"github.com/hamireg/hamireg/extender"
	"github.com/hamireg/hamireg/internal/manifests"
	"github.com/hamireg/hamireg/nodelock"
	"github.com/hamireg/hamireg/schedcache"
	"github.com/hamireg/hamireg/schedplugin"
)

// find returns the object of type T named name, nil when there is none.
func find[T interface {
	runtime.Object
	GetName() string
}](objs []runtime.Object, name string) T {
	v, _ := manifests.Find[T](objs, name)
	return v
}

// pluginRules are what the HAMiGPU plugin and the webhook do beyond system:kube-scheduler:
// the node lock (nodes get and patch), the node cache (nodes list and watch; Events), HAMi's
// pod annotations (pods patch; get, list and watch for the usage), the quota (resourcequotas
// list and watch).
func pluginRules() []rbacv1.PolicyRule {
	return append(append(nodelock.ClusterRoleRules(), schedcache.ClusterRoleRules()...),
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch", "patch"}},
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"resourcequotas"}, Verbs: []string{"list", "watch"}},
	)
}

// schedulerConfig decodes deploy/config.yaml's KubeSchedulerConfiguration as kube-scheduler
// does (its scheme, strict, defaults applied) and validates it with its validation package.
func schedulerConfig(t *testing.T, objs []runtime.Object) *config.KubeSchedulerConfiguration {
	t.Helper()
	cm := find[*corev1.ConfigMap](objs, "hami-scheduler-config")
	if cm == nil {
		t.Fatal("no ConfigMap hami-scheduler-config")
	}
	obj, gvk, err := scheme.Codecs.UniversalDecoder().Decode([]byte(cm.Data["config.yaml"]), nil, nil)
	if err != nil {
		t.Fatalf("decode config.yaml: %v", err)
	}
	cfg, ok := obj.(*config.KubeSchedulerConfiguration)
	if !ok {
		t.Fatalf("config.yaml is a %v, want KubeSchedulerConfiguration", gvk)
	}
	if err := validation.ValidateKubeSchedulerConfiguration(cfg); err != nil {
		t.Fatalf("validate config.yaml: %v", err)
	}
	return cfg
}

// TestConfig: deploy/config.yaml loads as kube-scheduler loads it; the profile hami-scheduler
// enables HAMiGPU at every extension point with weight 10 and args the plugin decodes
// strictly, NodeResourcesFit ignores HAMi's per-GPU resources (not nvidia.com/gpu, which the
// device plugin advertises), every node is scored, leader election is on under the
// hami-scheduler Lease and the client's rate is raised.
func TestConfig(t *testing.T) {
	t.Parallel()
	cfg := schedulerConfig(t, manifests.Glob(t, "deploy/config.yaml"))
	var names []string
	for _, p := range cfg.Profiles {
		names = append(names, p.SchedulerName)
	}
	if want := []string{corev1.DefaultSchedulerName, extender.DefaultSchedulerName}; !slices.Equal(names, want) {
		t.Fatalf("profiles %v, want %v", names, want)
	}
	if p := cfg.Profiles[0]; slices.ContainsFunc(p.Plugins.MultiPoint.Enabled, func(pl config.Plugin) bool { return pl.Name == schedplugin.Name }) {
		t.Error("default-scheduler enables HAMiGPU, want upstream's defaults")
	}
	hami := cfg.Profiles[1]
	i := slices.IndexFunc(hami.Plugins.MultiPoint.Enabled, func(pl config.Plugin) bool { return pl.Name == schedplugin.Name })
	if i < 0 || hami.Plugins.MultiPoint.Enabled[i].Weight != 10 {
		t.Errorf("hami-scheduler multiPoint %+v, want HAMiGPU with weight 10", hami.Plugins.MultiPoint.Enabled)
	}
	var sawArgs, sawFit bool
	for _, pc := range hami.PluginConfig {
		switch pc.Name {
		case schedplugin.Name:
			sawArgs = true
			u, ok := pc.Args.(*runtime.Unknown)
			if !ok {
				t.Fatalf("HAMiGPU args are a %T, want *runtime.Unknown (an out-of-tree plugin's)", pc.Args)
			}
			var args schedplugin.Args
			if err := yaml.UnmarshalStrict(u.Raw, &args); err != nil {
				t.Errorf("HAMiGPU args %s: %v", u.Raw, err)
			}
			if args.GPUSchedulerPolicy != "spread" || args.NodeSchedulerPolicy != "binpack" {
				t.Errorf("HAMiGPU policies %q/%q, want HAMi's chart spread/binpack", args.GPUSchedulerPolicy, args.NodeSchedulerPolicy)
			}
		case "NodeResourcesFit":
			sawFit = true
			fit, ok := pc.Args.(*config.NodeResourcesFitArgs)
			if !ok {
				t.Fatalf("NodeResourcesFit args are a %T", pc.Args)
			}
			want := []string{"nvidia.com/gpumem", "nvidia.com/gpucores", "nvidia.com/gpumem-percentage", "nvidia.com/priority"}
			if !slices.Equal(fit.IgnoredResources, want) {
				t.Errorf("NodeResourcesFit ignoredResources %v, want %v", fit.IgnoredResources, want)
			}
		}
	}
	if !sawArgs || !sawFit {
		t.Errorf("pluginConfig of hami-scheduler: HAMiGPU %v, NodeResourcesFit %v, want both", sawArgs, sawFit)
	}
	if cfg.PercentageOfNodesToScore == nil || *cfg.PercentageOfNodesToScore != 100 {
		t.Errorf("percentageOfNodesToScore %v, want 100", cfg.PercentageOfNodesToScore)
	}
	if le := cfg.LeaderElection; !le.LeaderElect || le.ResourceName != extender.DefaultSchedulerName || le.ResourceNamespace != "kube-system" {
		t.Errorf("leader election %+v, want on with the Lease kube-system/hami-scheduler", le)
	}
	if cc := cfg.ClientConnection; cc.QPS < 100 || cc.Burst < 200 {
		t.Errorf("client QPS %v burst %d, want them raised (a GPU pod costs several writes)", cc.QPS, cc.Burst)
	}
}

// TestManifests: every manifest decodes strictly; the RBAC covers the plugin's and the
// webhook's rules and binds kube-scheduler's roles; the Deployment runs both modes of this
// binary with flags they accept and the ConfigMap where --config points; the webhook
// configuration reaches the webhook mode through the Service.
func TestManifests(t *testing.T) {
	t.Parallel()
	objs := manifests.Glob(t, "deploy/*.yaml")
	role := find[*rbacv1.ClusterRole](objs, "hami-scheduler")
	if role == nil {
		t.Fatal("no ClusterRole hami-scheduler")
	}
	if m := manifests.Uncovered(role.Rules, pluginRules()); len(m) > 0 {
		t.Errorf("ClusterRole misses %v", m)
	}
	electorRules := []rbacv1.PolicyRule{{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "list", "watch", "create", "update"}}}
	if lease := find[*rbacv1.Role](objs, "hami-scheduler-lease"); lease == nil || len(manifests.Uncovered(lease.Rules, electorRules)) > 0 {
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
	if sa := dep.Spec.Template.Spec.ServiceAccountName; sa != "hami-scheduler" {
		t.Errorf("service account %q", sa)
	}
	cs := dep.Spec.Template.Spec.Containers
	sched, hook := cs[0], cs[1]
	if sched.Image != hook.Image {
		t.Errorf("images %q and %q, want one image in two modes", sched.Image, hook.Image)
	}
	if len(sched.Command) == 0 || len(hook.Command) < 2 || hook.Command[1] != webhookMode {
		t.Fatalf("commands %q and %q, want the scheduler and its webhook mode", sched.Command, hook.Command)
	}
	sc := command(sched.Command[1:])
	if err := sc.ParseFlags(sched.Command[1:]); err != nil {
		t.Errorf("scheduler flags %q: %v", sched.Command[1:], err)
	}
	if got := sc.Flags().Lookup("config").Value.String(); len(sched.VolumeMounts) != 1 || got != sched.VolumeMounts[0].MountPath+"/config.yaml" {
		t.Errorf("--config %q, mounts %+v: want config.yaml of the mounted ConfigMap", got, sched.VolumeMounts)
	}
	wc := command(hook.Command[1:])
	if wc.Name() != webhookMode {
		t.Fatalf("command(%q) is %q, want the webhook", hook.Command[1:], wc.Name())
	}
	if err := wc.ParseFlags(hook.Command[2:]); err != nil {
		t.Errorf("webhook flags %q: %v", hook.Command[2:], err)
	}
	for probe, want := range map[string]struct {
		p    *corev1.Probe
		path string
	}{"liveness": {hook.LivenessProbe, extender.PathHealthz}, "readiness": {hook.ReadinessProbe, extender.PathReadyz}} {
		if want.p == nil || want.p.HTTPGet == nil || want.p.HTTPGet.Path != want.path {
			t.Errorf("webhook %s probe %+v, want an HTTP GET of %s", probe, want.p, want.path)
		}
	}
	if v := dep.Spec.Template.Spec.Volumes; !slices.ContainsFunc(v, func(v corev1.Volume) bool {
		return v.ConfigMap != nil && v.ConfigMap.Name == "hami-scheduler-config"
	}) {
		t.Errorf("volumes %+v, want the ConfigMap hami-scheduler-config", v)
	}

	svc := find[*corev1.Service](objs, "hami-scheduler")
	mwc := find[*admissionregistrationv1.MutatingWebhookConfiguration](objs, "hami-webhook")
	if svc == nil || mwc == nil || len(mwc.Webhooks) != 1 {
		t.Fatalf("Service %v, MutatingWebhookConfiguration %v", svc, mwc)
	}
	ref := mwc.Webhooks[0].ClientConfig.Service
	if ref == nil || ref.Name != svc.Name || ref.Namespace != svc.Namespace || ref.Path == nil || *ref.Path != extender.PathWebhook ||
		ref.Port == nil || *ref.Port != svc.Spec.Ports[0].Port {
		t.Errorf("webhook client config %+v, want the Service %s port %d path %s", ref, svc.Name, svc.Spec.Ports[0].Port, extender.PathWebhook)
	}
	if *mwc.Webhooks[0].FailurePolicy != admissionregistrationv1.Ignore {
		t.Errorf("failurePolicy %v, want Ignore (HAMi's: pods are created when the webhook is down)", *mwc.Webhooks[0].FailurePolicy)
	}
}

// TestCommand: the word webhook selects the webhook's command; anything else is
// kube-scheduler's, whose flags are upstream's.
func TestCommand(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		args     []string
		want     string
		flag     string
		wantFlag bool
	}{
		"no arguments: kube-scheduler":        {want: "kube-scheduler", flag: "config", wantFlag: true},
		"scheduler flags":                     {args: []string{"--config=x.yaml"}, want: "kube-scheduler", flag: "bind", wantFlag: false},
		"webhook":                             {args: []string{"webhook", "--bind=:8443"}, want: webhookMode, flag: "bind", wantFlag: true},
		"webhook has no kube-scheduler flags": {args: []string{"webhook"}, want: webhookMode, flag: "config", wantFlag: false},
		"the word elsewhere is an argument":   {args: []string{"--v=2", "webhook"}, want: "kube-scheduler", flag: "config", wantFlag: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cmd := command(tc.args)
			if cmd.Name() != tc.want {
				t.Errorf("command(%q) = %q, want %q", tc.args, cmd.Name(), tc.want)
			}
			if got := cmd.Flags().Lookup(tc.flag) != nil; got != tc.wantFlag {
				t.Errorf("flag --%s defined %v, want %v", tc.flag, got, tc.wantFlag)
			}
		})
	}
}

// TestWebhookCommandHelp: the webhook's help names its flags and no kube-scheduler flag.
func TestWebhookCommandHelp(t *testing.T) {
	t.Parallel()
	cmd := command([]string{"webhook", "--help"})
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"--bind", "--cert-file", "--scheduler-name", "/webhook"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("help lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "--config") {
		t.Errorf("help names kube-scheduler's --config:\n%s", out.String())
	}
}

// TestWebhookHandler: the webhook mode serves the extender's admission routes and nothing of
// its scheduling API.
func TestWebhookHandler(t *testing.T) {
	t.Parallel()
	ext := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ext " + r.URL.Path)) })
	h := webhookHandler(ext)
	for path, want := range map[string]int{
		extender.PathWebhook: http.StatusOK, extender.PathHealthz: http.StatusOK, extender.PathReadyz: http.StatusOK,
		extender.PathFilter: http.StatusNotFound, extender.PathBind: http.StatusNotFound, "/": http.StatusNotFound,
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), http.MethodPost, path, http.NoBody))
		if rec.Code != want {
			t.Errorf("%s: status %d, want %d", path, rec.Code, want)
		}
	}
}

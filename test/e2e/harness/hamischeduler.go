package harness

import (
	"encoding/json"
	"fmt"
	"maps"
	"path/filepath"
	"sync"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kubeschedulerconfigv1 "k8s.io/kube-scheduler/config/v1"
	"k8s.io/utils/ptr"

	"github.com/hamireg/hamireg/envtest"
	"github.com/hamireg/hamireg/internal/manifests"
)

// HAMi scheduler's names, as examples/scheduler/deploy has them.
const (
	// HAMiSchedulerName is the profile of the HAMiGPU plugin (the name HAMi's webhook gives
	// GPU pods).
	HAMiSchedulerName = "hami-scheduler"
	// HAMiPluginName is the plugin's name in the configuration (schedplugin.Name).
	HAMiPluginName = "HAMiGPU"
	// hamiSchedulerDeploy is examples/scheduler/deploy, from a test package's folder.
	hamiSchedulerDeploy = "../../../examples/scheduler/deploy"
	// hamiSchedulerBindingName binds the ClusterRole of deploy/rbac.yaml to the user the
	// control plane's schedulers run as.
	hamiSchedulerBindingName = "hamireg-e2e-hami-scheduler"
)

// hamiScheduler is examples/scheduler built once per test binary, and its RBAC created once.
var hamiScheduler struct {
	build    sync.Once
	bin      string
	buildErr error
	rbac     sync.Once
	rbacErr  error
}

// HAMiSchedulerConfig reads the KubeSchedulerConfiguration of examples/scheduler/deploy
// (the ConfigMap hami-scheduler-config's config.yaml, found from a test package's folder
// test/e2e/<package>): the profiles default-scheduler (upstream's defaults) and
// hami-scheduler (HAMiGPU at every extension point, weight 10, NodeResourcesFit ignoring
// HAMi's per-GPU resources). The keys of args replace those of the file's HAMiGPU args (e.g.
// {"vendors": []map[string]any{{"name": "ACME", "resourceName": "acme.example/npu"}}});
// nil keeps the file's. For tests, the pod backoff is 1 s (initial and maximum) and leader
// election is off; the file's client QPS and burst stay (envtest sets the kubeconfig).
func HAMiSchedulerConfig(tb testing.TB, args map[string]any) *kubeschedulerconfigv1.KubeSchedulerConfiguration {
	tb.Helper()
	cm, ok := manifests.Find[*corev1.ConfigMap](manifests.Glob(tb, filepath.Join(hamiSchedulerDeploy, "config.yaml")), "hami-scheduler-config")
	if !ok {
		tb.Fatal("examples/scheduler/deploy/config.yaml: no ConfigMap hami-scheduler-config")
	}
	cfg, err := manifests.SchedulerConfig(cm)
	if err != nil {
		tb.Fatalf("examples/scheduler/deploy/config.yaml: %v", err)
	}
	var prof *kubeschedulerconfigv1.KubeSchedulerProfile
	for i := range cfg.Profiles {
		if ptr.Deref(cfg.Profiles[i].SchedulerName, "") == HAMiSchedulerName {
			prof = &cfg.Profiles[i]
		}
	}
	if prof == nil {
		tb.Fatalf("examples/scheduler/deploy/config.yaml: no profile %s", HAMiSchedulerName)
	}
	// No handshakes: leader election is off here, and the tests' nodes carry their own.
	merged := map[string]any{"handshake": map[string]any{"mode": "off"}}
	maps.Copy(merged, args)
	if err := mergePluginArgs(prof, HAMiPluginName, merged); err != nil {
		tb.Fatalf("examples/scheduler/deploy/config.yaml: %v", err)
	}
	cfg.PodInitialBackoffSeconds = ptr.To[int64](1)
	cfg.PodMaxBackoffSeconds = ptr.To[int64](1)
	cfg.LeaderElection.LeaderElect = ptr.To(false)
	return cfg
}

// mergePluginArgs sets the keys of args in the pluginConfig of plugin in prof (added when
// the profile has none).
func mergePluginArgs(prof *kubeschedulerconfigv1.KubeSchedulerProfile, plugin string, args map[string]any) error {
	idx := -1
	for i, pc := range prof.PluginConfig {
		if pc.Name == plugin {
			idx = i
		}
	}
	if idx < 0 {
		prof.PluginConfig = append(prof.PluginConfig, kubeschedulerconfigv1.PluginConfig{Name: plugin})
		idx = len(prof.PluginConfig) - 1
	}
	merged := map[string]any{}
	if raw := prof.PluginConfig[idx].Args.Raw; len(raw) > 0 {
		if err := json.Unmarshal(raw, &merged); err != nil {
			return fmt.Errorf("%s args: %w", plugin, err)
		}
	}
	maps.Copy(merged, args)
	raw, err := json.Marshal(merged)
	if err != nil {
		return fmt.Errorf("%s args: %w", plugin, err)
	}
	prof.PluginConfig[idx].Args = runtime.RawExtension{Raw: raw}
	return nil
}

// HAMiSchedulerBinary builds examples/scheduler (kube-scheduler with the HAMiGPU plugin, a
// module of its own) once per test binary into the control plane's folder, with the race
// detector when the test binary has it, and returns its path; it fails tb when the build
// fails.
func (cp *ControlPlane) HAMiSchedulerBinary(tb testing.TB) string {
	tb.Helper()
	hamiScheduler.build.Do(func() {
		hamiScheduler.bin, hamiScheduler.buildErr = BuildProgram(filepath.Join(cp.Dir(), "hami-scheduler"), "./examples/scheduler", raceEnabled)
	})
	if hamiScheduler.buildErr != nil {
		tb.Fatalf("build examples/scheduler: %v", hamiScheduler.buildErr)
	}
	return hamiScheduler.bin
}

// StartHAMiScheduler runs examples/scheduler (built once per test binary, see
// HAMiSchedulerBinary) with cfg (e.g. from HAMiSchedulerConfig) through
// envtest.ControlPlane.StartScheduler, and returns when it is ready. It runs as the user
// system:kube-scheduler, to which the ClusterRole hami-scheduler of
// examples/scheduler/deploy/rbac.yaml is bound (created once per test binary), so that the
// plugin works with the example's permissions. The scheduler is stopped at the end of the
// test; its log tail is printed when the test failed.
func (cp *ControlPlane) StartHAMiScheduler(tb testing.TB, cfg *kubeschedulerconfigv1.KubeSchedulerConfiguration) *envtest.Scheduler {
	tb.Helper()
	bin := cp.HAMiSchedulerBinary(tb)
	hamiScheduler.rbac.Do(func() { hamiScheduler.rbacErr = cp.bindHAMiSchedulerRole(tb) })
	if hamiScheduler.rbacErr != nil {
		tb.Fatalf("examples/scheduler RBAC: %v", hamiScheduler.rbacErr)
	}
	s, err := cp.StartScheduler(tb.Context(), envtest.SchedulerOptions{Config: cfg, Binary: bin})
	if err != nil {
		tb.Fatalf("start examples/scheduler: %v", err)
	}
	tb.Cleanup(func() {
		if err := s.Stop(); err != nil {
			tb.Errorf("stop examples/scheduler: %v", err)
		}
		if tb.Failed() {
			tb.Logf("examples/scheduler log (%s):\n%s", s.LogPath(), s.LogTail(80))
		}
	})
	return s
}

// bindHAMiSchedulerRole creates the ClusterRole hami-scheduler of
// examples/scheduler/deploy/rbac.yaml and binds it to the user system:kube-scheduler.
func (cp *ControlPlane) bindHAMiSchedulerRole(tb testing.TB) error {
	tb.Helper()
	ctx := tb.Context()
	objs, err := manifests.Read(filepath.Join(hamiSchedulerDeploy, "rbac.yaml"))
	if err != nil {
		return err
	}
	role, ok := manifests.Find[*rbacv1.ClusterRole](objs, HAMiSchedulerName)
	if !ok {
		return fmt.Errorf("rbac.yaml: no ClusterRole %s", HAMiSchedulerName)
	}
	c := cp.AdminClient().RbacV1()
	if _, err := c.ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	b := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: hamiSchedulerBindingName},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "system:kube-scheduler"}},
	}
	if _, err := c.ClusterRoleBindings().Create(ctx, b, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	// The authorizer sees the binding through its informer: wait, so that the plugin's
	// first writes are not refused.
	Eventually(tb, "the RBAC authorizer to see "+hamiSchedulerBindingName, 30*time.Second, func() bool {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:               "system:kube-scheduler",
			ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "patch", Resource: "nodes"},
		}}
		r, err := cp.AdminClient().AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
		return err == nil && r.Status.Allowed
	})
	return nil
}

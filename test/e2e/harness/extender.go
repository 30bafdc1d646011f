package harness

import (
	"fmt"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubeschedulerconfigv1 "k8s.io/kube-scheduler/config/v1"
	"k8s.io/utils/ptr"

	"github.com/hamireg/hamireg/envtest/proc"
	"github.com/hamireg/hamireg/internal/manifests"
	"github.com/hamireg/hamireg/nodeagent"
)

// ExtenderSchedulerConfig reads the KubeSchedulerConfiguration of examples/extender/deploy
// (the ConfigMap's config.yaml, found from a test package's folder test/e2e/<package>) and
// points its extender at url over plain HTTP; leader election is off, as one scheduler runs.
func ExtenderSchedulerConfig(tb testing.TB, url string) *kubeschedulerconfigv1.KubeSchedulerConfiguration {
	tb.Helper()
	cm, ok := manifests.Find[*corev1.ConfigMap](manifests.Glob(tb, filepath.Join("..", "..", "..", "examples", "extender", "deploy", "scheduler-config.yaml")), "hami-scheduler-config")
	if !ok {
		tb.Fatal("scheduler-config.yaml: no ConfigMap hami-scheduler-config")
	}
	cfg, err := manifests.SchedulerConfig(cm)
	if err != nil {
		tb.Fatalf("scheduler-config.yaml: %v", err)
	}
	if err := manifests.ExtenderOverHTTP(cfg, url); err != nil {
		tb.Fatalf("scheduler-config.yaml: %v", err)
	}
	cfg.LeaderElection.LeaderElect = ptr.To(false)
	return cfg
}

// StartExtender runs the examples/extender binary bin on a free port of 127.0.0.1 with the
// control plane's admin kubeconfig, without leader election and without metrics (the test
// packages share a control plane, not ports), and extra flags; it waits for /readyz and
// returns the extender's URL. The process is stopped at the end of the test (its log tail is
// printed when the test failed).
func (cp *ControlPlane) StartExtender(tb testing.TB, bin string, extra ...string) string {
	tb.Helper()
	return cp.StartExtenderAt(tb, bin, fmt.Sprintf("127.0.0.1:%d", FreePort(tb)), extra...)
}

// StartExtenderAt is StartExtender on the address addr ("127.0.0.1:port"), e.g. the port a
// kube-scheduler configuration already names.
func (cp *ControlPlane) StartExtenderAt(tb testing.TB, bin, addr string, extra ...string) string {
	tb.Helper()
	sp := proc.NewSpawner()
	args := append([]string{"--http_bind", addr, "--metrics-bind-address=", "--kubeconfig", cp.Kubeconfig(), "--leader-elect=false", "-v", "2"}, extra...)
	p, err := sp.Start(proc.Options{Name: "extender", Path: bin, Args: args, LogPath: filepath.Join(tb.TempDir(), "extender.log")})
	if err != nil {
		sp.Close()
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := p.Stop(20 * time.Second); err != nil {
			tb.Errorf("stop extender: %v", err)
		}
		sp.Close()
		if tb.Failed() {
			tb.Logf("extender log:\n%s", p.LogTail(60))
		}
	})
	url := "http://" + addr
	Eventually(tb, "extender /readyz", 60*time.Second, func() bool {
		req, err := http.NewRequestWithContext(tb.Context(), http.MethodGet, url+"/readyz", http.NoBody)
		if err != nil {
			tb.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return url
}

// agentRoles remembers the ClusterRoles AgentKubeconfig created, once per name and binary.
var agentRoles sync.Map // role name → *agentRole

type agentRole struct {
	once sync.Once
	err  error
}

// AgentKubeconfig writes a kubeconfig for the ServiceAccount <ns>/hami-device-plugin, bound
// to the ClusterRole role with the node agent's rules (nodeagent.ClusterRoleRules, those of
// examples/deviceplugin/deploy/rbac.yaml; the role is created once per test binary), and
// returns its path.
func (cp *ControlPlane) AgentKubeconfig(tb testing.TB, ns, role string) string {
	tb.Helper()
	ctx := tb.Context()
	v, _ := agentRoles.LoadOrStore(role, &agentRole{})
	r := v.(*agentRole)
	r.once.Do(func() {
		cr := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: role}, Rules: nodeagent.ClusterRoleRules()}
		if _, err := cp.AdminClient().RbacV1().ClusterRoles().Create(ctx, cr, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			r.err = err
		}
	})
	if r.err != nil {
		tb.Fatalf("create cluster role %s: %v", role, r.err)
	}
	path, err := cp.ServiceAccountKubeconfig(ctx, tb.TempDir(), ns, "hami-device-plugin", role)
	if err != nil {
		tb.Fatal(err)
	}
	return path
}

package envtest

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/hamireg/hamireg/envtest/proc"
)

// EnvKeep names the environment variable that, set to 1, keeps the control plane's
// temporary folder (logs, etcd data) after Stop and prints where it is.
const EnvKeep = "HAMIREG_E2E_KEEP"

// ErrStopped is returned by methods of a [ControlPlane] after [ControlPlane.Stop].
var ErrStopped = errors.New("control plane stopped")

// tempPrefix names the control planes' temporary folders; Start removes those whose test
// binary is gone (one killed by a test timeout cannot clean up after itself).
const tempPrefix = "hamireg-e2e-"

// Options configures [Start]. The zero value is valid.
type Options struct {
	// BinDir is the first folder searched for the peer binaries; then come $HAMIREG_K8S_BIN
	// ([EnvBinDir]) and $KUBEBUILDER_ASSETS ([EnvKubebuilderAssets]), and each binary is
	// taken from the first folder that holds it. Start needs etcd and kube-apiserver,
	// StartScheduler kube-scheduler. Default: "", only the environment variables.
	BinDir string
	// APIServerFlags are appended to the control plane's kube-apiserver flags; for a flag given
	// twice the later one wins. Default: none.
	APIServerFlags []string
	// QPS and Burst of the clients the control plane returns. Default: 1000 and 2000 (client-go's
	// 5 QPS would make creating 2,000 Nodes take minutes).
	QPS   float32
	Burst int
	// StartTimeout bounds Start and each StartAPIServer. Default: 90 s.
	StartTimeout time.Duration
	// Logf receives one line per lifecycle step, e.g. "etcd 3.7.0 ready in 120ms;
	// kube-apiserver v1.37.2 ready in 2.3s at https://127.0.0.1:40123".
	// Default: standard error, each line prefixed "envtest: ".
	Logf func(format string, args ...any)
	// KeepDir keeps the temporary folder (logs, etcd data, certificates) after Stop.
	// Default: false, or true when $HAMIREG_E2E_KEEP is 1.
	KeepDir bool
}

func (o *Options) defaults() {
	if o.QPS == 0 {
		o.QPS = 1000
	}
	if o.Burst == 0 {
		o.Burst = 2000
	}
	if o.StartTimeout == 0 {
		o.StartTimeout = 90 * time.Second
	}
	if o.Logf == nil {
		o.Logf = func(format string, args ...any) {
			fmt.Fprintf(os.Stderr, "envtest: "+format+"\n", args...)
		}
	}
	if os.Getenv(EnvKeep) == "1" {
		o.KeepDir = true
	}
}

// ControlPlane is etcd and kube-apiserver on 127.0.0.1, started by [Start] and stopped by
// [ControlPlane.Stop]. Its methods are safe for concurrent use, except that
// StopAPIServer, StartAPIServer and RestartAPIServer must not overlap each other.
type ControlPlane struct {
	opts    Options
	folders []binFolder       // searched for the binaries, in order
	bins    map[string]string // etcd and kube-apiserver: their paths
	dir     string
	pki     *pki
	spawner *proc.Spawner

	etcdPort, etcdPeerPort, apiPort int

	mu         sync.Mutex
	stopped    bool
	etcd       *proc.Process
	apiserver  *proc.Process
	schedulers []*Scheduler

	version     string
	etcdVersion string
	admin       *kubernetes.Clientset
}

// Start starts etcd and kube-apiserver on free 127.0.0.1 ports with TLS, a static admin
// token (group system:masters), service-account token signing and
// --authorization-mode=Node,RBAC, and returns when /readyz answers ok. On error nothing is
// left running and the temporary folder is removed.
//
// Start needs etcd and kube-apiserver (a folder made by setup-envtest has both); each is
// taken from the first of Options.BinDir, $HAMIREG_K8S_BIN and $KUBEBUILDER_ASSETS that
// holds it. Without them Start returns a [*BinaryNotFoundError] wrapping
// [ErrBinariesMissing] that names what is missing, where it looked and how to get it.
func Start(ctx context.Context, opts Options) (_ *ControlPlane, err error) {
	opts.defaults()
	start := time.Now()
	folders := binFolders(opts.BinDir, os.Getenv)
	bins, err := findBinaries(folders, "Start", binEtcd, binAPIServer)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeoutCause(ctx, opts.StartTimeout,
		fmt.Errorf("control plane not ready within %v", opts.StartTimeout))
	defer cancel()

	RemoveStaleDirs(tempPrefix)
	dir, err := MakeTempDir(tempPrefix)
	if err != nil {
		return nil, err
	}
	cp := &ControlPlane{opts: opts, folders: folders, bins: bins, dir: dir, spawner: proc.NewSpawner()}
	defer func() {
		if err != nil {
			_ = cp.Stop()
		}
	}()
	if cp.pki, err = newPKI(dir, time.Now()); err != nil {
		return nil, err
	}
	ports, err := FreePorts(3)
	if err != nil {
		return nil, err
	}
	cp.etcdPort, cp.etcdPeerPort, cp.apiPort = ports[0], ports[1], ports[2]

	if err := cp.startEtcd(ctx); err != nil {
		return nil, err
	}
	etcdReady := time.Since(start)
	cp.admin, err = kubernetes.NewForConfig(cp.RESTConfig())
	if err != nil {
		return nil, fmt.Errorf("create admin client: %w", err)
	}
	if err := cp.StartAPIServer(ctx); err != nil {
		return nil, err
	}
	if err := cp.writeKubeconfig(cp.Kubeconfig(), cp.pki.adminToken); err != nil {
		return nil, err
	}
	opts.Logf("etcd %s ready in %v; kube-apiserver %s ready in %v at %s",
		cp.etcdVersion, etcdReady.Round(time.Millisecond), cp.version, time.Since(start).Round(time.Millisecond), cp.Host())
	return cp, nil
}

func (cp *ControlPlane) startEtcd(ctx context.Context) error {
	client := fmt.Sprintf("http://127.0.0.1:%d", cp.etcdPort)
	peer := fmt.Sprintf("http://127.0.0.1:%d", cp.etcdPeerPort)
	p, err := cp.spawn(proc.Options{
		Name: binEtcd,
		Path: cp.bins[binEtcd],
		Args: []string{
			"--name=default",
			"--data-dir=" + filepath.Join(cp.dir, "etcd"),
			"--listen-client-urls=" + client,
			"--advertise-client-urls=" + client,
			"--listen-peer-urls=" + peer,
			"--initial-advertise-peer-urls=" + peer,
			"--initial-cluster=default=" + peer,
			"--initial-cluster-state=new",
			// A throwaway single-member cluster: skip fsync and elect a leader in ~0.1 s.
			"--unsafe-no-fsync",
			"--heartbeat-interval=10",
			"--election-timeout=100",
			"--log-level=warn",
		},
		LogPath: filepath.Join(cp.dir, "etcd.log"),
	})
	if err != nil {
		return err
	}
	cp.mu.Lock()
	cp.etcd = p
	cp.mu.Unlock()
	hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	err = p.WaitUntil(ctx, 20*time.Millisecond, func(ctx context.Context) bool {
		var health struct {
			Health string `json:"health"`
		}
		if getJSON(ctx, hc, client+"/health", &health) != nil || health.Health != "true" {
			return false
		}
		var v struct {
			Server string `json:"etcdserver"`
		}
		if getJSON(ctx, hc, client+"/version", &v) == nil {
			cp.etcdVersion = v.Server
		}
		return true
	})
	return err
}

func getJSON(ctx context.Context, hc *http.Client, url string, into any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(into)
}

func (cp *ControlPlane) spawn(opts proc.Options) (*proc.Process, error) {
	cp.mu.Lock()
	stopped := cp.stopped
	cp.mu.Unlock()
	if stopped {
		return nil, ErrStopped
	}
	return cp.spawner.Start(opts)
}

func (cp *ControlPlane) apiServerArgs() []string {
	p := cp.pki
	args := []string{
		fmt.Sprintf("--etcd-servers=http://127.0.0.1:%d", cp.etcdPort),
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(cp.apiPort),
		// With --advertise-address=127.0.0.1 the default endpoint reconciler exits at once
		// (loopback is not a valid endpoint); no Service traffic is needed here.
		"--advertise-address=127.0.0.1",
		"--endpoint-reconciler-type=none",
		"--cert-dir=" + filepath.Join(cp.dir, "apiserver-certs"),
		"--tls-cert-file=" + p.certFile,
		"--tls-private-key-file=" + p.keyFile,
		"--client-ca-file=" + p.caFile,
		"--token-auth-file=" + p.tokenFile,
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + p.saKeyFile,
		"--service-account-signing-key-file=" + p.saKeyFile,
		"--authorization-mode=Node,RBAC",
		"--service-cluster-ip-range=10.0.0.0/24",
		"--allow-privileged=true",
		// No controller-manager runs, so no "default" ServiceAccount is ever created; the
		// ServiceAccount admission plugin would reject every Pod.
		"--disable-admission-plugins=ServiceAccount",
		"--profiling=false",
		"--v=1",
	}
	return append(args, cp.opts.APIServerFlags...)
}

// StartAPIServer starts kube-apiserver (again) on the control plane's port, against the same
// etcd, and returns when /readyz answers ok. Clients made earlier keep working.
func (cp *ControlPlane) StartAPIServer(ctx context.Context) error {
	cp.mu.Lock()
	running := cp.apiserver != nil
	cp.mu.Unlock()
	if running {
		return errors.New("start kube-apiserver: already running")
	}
	ctx, cancel := context.WithTimeoutCause(ctx, cp.opts.StartTimeout,
		fmt.Errorf("kube-apiserver not ready within %v", cp.opts.StartTimeout))
	defer cancel()
	p, err := cp.spawn(proc.Options{
		Name:    binAPIServer,
		Path:    cp.bins[binAPIServer],
		Args:    cp.apiServerArgs(),
		LogPath: filepath.Join(cp.dir, "kube-apiserver.log"),
	})
	if err != nil {
		return err
	}
	cp.mu.Lock()
	cp.apiserver = p
	cp.mu.Unlock()
	hc, err := cp.httpClient()
	if err != nil {
		return err
	}
	defer hc.CloseIdleConnections()
	if err := p.WaitUntil(ctx, 50*time.Millisecond, Readyz(hc, cp.Host()+"/readyz", cp.pki.adminToken)); err != nil {
		return err
	}
	v, err := cp.admin.Discovery().ServerVersion()
	if err != nil {
		return fmt.Errorf("get kube-apiserver version: %w", err)
	}
	cp.mu.Lock()
	cp.version = v.GitVersion
	cp.mu.Unlock()
	return nil
}

// Readyz is a probe for proc.Process.WaitUntil: GET url answers 200. A token, when set, is
// sent as a bearer token.
func Readyz(hc *http.Client, url, token string) func(context.Context) bool {
	return func(ctx context.Context) bool {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return false
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return false
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
}

// StopAPIServer stops kube-apiserver (SIGTERM, SIGKILL after 15 s) and leaves etcd running,
// so that StartAPIServer can bring the same cluster back; clients see connection errors
// in between.
func (cp *ControlPlane) StopAPIServer() error {
	cp.mu.Lock()
	p := cp.apiserver
	cp.apiserver = nil
	cp.mu.Unlock()
	if p == nil {
		return nil
	}
	return p.Stop(15 * time.Second)
}

// RestartAPIServer is StopAPIServer followed by StartAPIServer.
func (cp *ControlPlane) RestartAPIServer(ctx context.Context) error {
	if err := cp.StopAPIServer(); err != nil {
		return err
	}
	return cp.StartAPIServer(ctx)
}

// APIServerPid returns the process id of the running kube-apiserver, or 0.
func (cp *ControlPlane) APIServerPid() int {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if cp.apiserver == nil {
		return 0
	}
	return cp.apiserver.Pid()
}

// EtcdPid returns the process id of etcd, or 0.
func (cp *ControlPlane) EtcdPid() int {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if cp.etcd == nil {
		return 0
	}
	return cp.etcd.Pid()
}

// Stop stops every scheduler started through the control plane, kube-apiserver and etcd,
// and removes the temporary folder (unless Options.KeepDir). It is safe to call more than
// once.
func (cp *ControlPlane) Stop() error {
	cp.mu.Lock()
	if cp.stopped {
		cp.mu.Unlock()
		return nil
	}
	cp.stopped = true
	scheds := cp.schedulers
	cp.schedulers = nil
	etcd := cp.etcd
	cp.mu.Unlock()

	var errs []error
	for _, s := range scheds {
		errs = append(errs, s.Stop())
	}
	errs = append(errs, cp.StopAPIServer())
	if etcd != nil {
		errs = append(errs, etcd.Stop(10*time.Second))
	}
	cp.spawner.Close()
	if cp.opts.KeepDir {
		cp.opts.Logf("kept %s", cp.dir)
	} else if err := os.RemoveAll(cp.dir); err != nil {
		errs = append(errs, fmt.Errorf("remove %s: %w", cp.dir, err))
	}
	return errors.Join(errs...)
}

// Dir is the control plane's temporary folder: logs (etcd.log, kube-apiserver.log,
// scheduler-N/kube-scheduler.log), certificates and the admin kubeconfig.
func (cp *ControlPlane) Dir() string { return cp.dir }

// Host is the apiserver's URL, https://127.0.0.1:<port>.
func (cp *ControlPlane) Host() string { return fmt.Sprintf("https://127.0.0.1:%d", cp.apiPort) }

// Version is the gitVersion that the apiserver's /version reported, e.g. "v1.37.2".
func (cp *ControlPlane) Version() string {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return cp.version
}

// EtcdVersion is the server version that etcd's /version reported, e.g. "3.7.0".
func (cp *ControlPlane) EtcdVersion() string { return cp.etcdVersion }

// CACert is the PEM certificate of the CA that signed the apiserver's serving certificate.
func (cp *ControlPlane) CACert() []byte { return append([]byte(nil), cp.pki.caPEM...) }

// Kubeconfig is the path of an admin kubeconfig file, for programs run by tests.
func (cp *ControlPlane) Kubeconfig() string { return filepath.Join(cp.dir, "admin.kubeconfig") }

// LogPath is the log file of "etcd" or "kube-apiserver".
func (cp *ControlPlane) LogPath(name string) string { return filepath.Join(cp.dir, name+".log") }

// RESTConfig returns a new admin config (user in group system:masters, QPS raised) that
// the caller may modify.
func (cp *ControlPlane) RESTConfig() *rest.Config {
	return cp.configWithToken(cp.pki.adminToken)
}

// AdminClient returns a clientset for the admin config. It is shared; do not modify it.
func (cp *ControlPlane) AdminClient() *kubernetes.Clientset { return cp.admin }

func (cp *ControlPlane) configWithToken(token string) *rest.Config {
	return &rest.Config{
		Host:            cp.Host(),
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: cp.CACert()},
		QPS:             cp.opts.QPS,
		Burst:           cp.opts.Burst,
		UserAgent:       "hamireg-e2e",
	}
}

func (cp *ControlPlane) httpClient() (*http.Client, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(cp.pki.caPEM) {
		return nil, errors.New("parse CA certificate")
	}
	return &http.Client{
		Timeout:   2 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}},
	}, nil
}

func (cp *ControlPlane) writeKubeconfig(path, token string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["e2e"] = &clientcmdapi.Cluster{Server: cp.Host(), CertificateAuthorityData: cp.CACert()}
	cfg.AuthInfos["e2e"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["e2e"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: "e2e"}
	cfg.CurrentContext = "e2e"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("write kubeconfig: %w", err)
	}
	return nil
}

// ServiceAccountConfig makes (or reuses) namespace ns, ServiceAccount ns/name and a
// ClusterRoleBinding of it to clusterRole, waits until the RBAC authorizer sees the binding,
// requests a token (TokenRequest, 1 h) and returns a config that authenticates as
// system:serviceaccount:<ns>:<name>. clusterRole may be created before or after; "" binds
// nothing.
func (cp *ControlPlane) ServiceAccountConfig(ctx context.Context, ns, name, clusterRole string) (*rest.Config, error) {
	c := cp.admin
	if err := cp.EnsureNamespace(ctx, ns); err != nil {
		return nil, err
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
	if _, err := c.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("create service account %s/%s: %w", ns, name, err)
	}
	user := "system:serviceaccount:" + ns + ":" + name
	if clusterRole != "" {
		crb := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "e2e:" + ns + ":" + name + ":" + clusterRole},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: clusterRole},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name}},
		}
		if _, err := c.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("create cluster role binding %s: %w", crb.Name, err)
		}
		if err := cp.waitForBinding(ctx, user, clusterRole); err != nil {
			return nil, err
		}
	}
	tr, err := c.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: new(int64(3600))},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("request token for %s/%s: %w", ns, name, err)
	}
	return cp.configWithToken(tr.Status.Token), nil
}

// waitForBinding waits until user is allowed the first concrete rule of clusterRole, so
// that callers do not race the RBAC authorizer's informers. A role that does not exist
// (yet) or has no concrete rule is not waited for.
func (cp *ControlPlane) waitForBinding(ctx context.Context, user, clusterRole string) error {
	role, err := cp.admin.RbacV1().ClusterRoles().Get(ctx, clusterRole, metav1.GetOptions{})
	if err != nil {
		return nil //nolint:nilerr // a missing role is allowed; nothing to wait for
	}
	var attrs *authorizationv1.ResourceAttributes
	for _, r := range role.Rules {
		if len(r.Verbs) > 0 && len(r.Resources) > 0 && len(r.APIGroups) > 0 {
			attrs = &authorizationv1.ResourceAttributes{Verb: r.Verbs[0], Group: r.APIGroups[0], Resource: r.Resources[0]}
			break
		}
	}
	if attrs == nil {
		return nil
	}
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: user, Groups: []string{"system:serviceaccounts", "system:authenticated"}, ResourceAttributes: attrs,
	}}
	err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		res, err := cp.admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
		if err != nil {
			return false, err
		}
		return res.Status.Allowed, nil
	})
	if err != nil {
		return fmt.Errorf("wait for RBAC to allow %s %s/%s to %s: %w", attrs.Verb, attrs.Group, attrs.Resource, user, err)
	}
	return nil
}

// ServiceAccountKubeconfig is ServiceAccountConfig writing a kubeconfig file for the
// ServiceAccount (for a program run as a process) into dir; it returns the file's path.
func (cp *ControlPlane) ServiceAccountKubeconfig(ctx context.Context, dir, ns, name, clusterRole string) (string, error) {
	cfg, err := cp.ServiceAccountConfig(ctx, ns, name, clusterRole)
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "kubeconfig")
	if err := cp.writeKubeconfig(path, cfg.BearerToken); err != nil {
		return "", err
	}
	return path, nil
}

// ServiceAccountClient is ServiceAccountConfig returning a clientset.
func (cp *ControlPlane) ServiceAccountClient(ctx context.Context, ns, name, clusterRole string) (*kubernetes.Clientset, error) {
	cfg, err := cp.ServiceAccountConfig(ctx, ns, name, clusterRole)
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}

// EnsureNamespace creates namespace ns unless it exists.
func (cp *ControlPlane) EnsureNamespace(ctx context.Context, ns string) error {
	_, err := cp.admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", ns, err)
	}
	return nil
}

// PatchNodeAnnotations sets annotations on the Node with a JSON merge patch (a nil value
// removes the key), as HAMi's device plugin and `kubectl annotate` do, as fieldManager
// (empty: the client's default).
func (cp *ControlPlane) PatchNodeAnnotations(ctx context.Context, name, fieldManager string, annotations map[string]*string) error {
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
	if err != nil {
		return fmt.Errorf("encode annotation patch: %w", err)
	}
	if _, err := cp.admin.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, body, metav1.PatchOptions{FieldManager: fieldManager}); err != nil {
		return fmt.Errorf("patch node %s: %w", name, err)
	}
	return nil
}

// FreePorts returns n distinct free TCP ports on 127.0.0.1 (listen on port 0, close).
func FreePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// MakeTempDir creates a folder under os.TempDir() named prefix+random and records the calling
// process's pid in it, so that RemoveStaleDirs can tell when its owner is gone.
func MakeTempDir(prefix string) (string, error) {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return "", fmt.Errorf("create temp dir: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
		_ = os.RemoveAll(dir)
		return "", fmt.Errorf("write owner pid: %w", err)
	}
	return dir, nil
}

// RemoveStaleDirs removes folders made by MakeTempDir with this prefix whose owner process
// no longer exists (a test binary killed by a timeout or SIGKILL cannot clean up).
func RemoveStaleDirs(prefix string) {
	matches, _ := filepath.Glob(filepath.Join(os.TempDir(), prefix+"*"))
	for _, dir := range matches {
		b, err := os.ReadFile(filepath.Join(dir, "owner.pid"))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			_ = os.RemoveAll(dir)
		}
	}
}

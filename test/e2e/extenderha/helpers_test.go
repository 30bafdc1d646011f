package extenderha_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"maps"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hamireg/hamireg/internal/manifests"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/envtest"
	"github.com/hamireg/hamireg/envtest/proc"
	"github.com/hamireg/hamireg/extender"
	"github.com/hamireg/hamireg/register"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

const (
	// deployDir holds the example's manifests, which the tests derive their objects from.
	deployDir = "../../../examples/extender/deploy"
	// extenderRole is the ClusterRole the extenders run with: the rules of deploy/rbac.yaml's
	// ClusterRole hami-scheduler.
	extenderRole = "e2e-hami-scheduler"
	// serviceAccount is the example's ServiceAccount name, made in each test's namespace.
	serviceAccount = "hami-scheduler"
	// kubeSchedulerUser is the user the harness runs kube-scheduler as.
	kubeSchedulerUser = "system:kube-scheduler"
)

// manifest returns the object of type T named name in deploy/<file>.
func manifest[T interface {
	runtime.Object
	GetName() string
}](tb testing.TB, file, name string) T {
	tb.Helper()
	if v, ok := manifests.Find[T](manifests.Glob(tb, filepath.Join(deployDir, file)), name); ok {
		return v
	}
	var zero T
	tb.Fatalf("deploy/%s has no %T %s", file, zero, name)
	return zero
}

// servingCert is a CA made by the test and a serving certificate for 127.0.0.1 signed by it.
type servingCert struct {
	caPEM             []byte
	certFile, keyFile string
}

// newServingCert makes an ECDSA P-256 CA and a serving certificate for 127.0.0.1 and writes
// the certificate and key to files.
func newServingCert(tb testing.TB) servingCert {
	tb.Helper()
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "extenderha-e2e-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, BasicConstraintsValid: true, IsCA: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		tb.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		tb.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "hami-scheduler"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		tb.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		tb.Fatal(err)
	}
	dir := tb.TempDir()
	s := servingCert{caPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		certFile: filepath.Join(dir, "tls.crt"), keyFile: filepath.Join(dir, "tls.key")}
	if err := os.WriteFile(s.certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(s.keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		tb.Fatal(err)
	}
	return s
}

var roleOnce struct {
	sync.Once
	err error
}

// extenderKubeconfig makes namespace ns with the example's RBAC in it: ServiceAccount
// ns/hami-scheduler bound to extenderRole (deploy/rbac.yaml's ClusterRole hami-scheduler) and
// the Role hami-scheduler-lease bound to it and to kube-scheduler's user (in a cluster both
// containers share the ServiceAccount). It writes a kubeconfig for the ServiceAccount and
// returns its path.
func extenderKubeconfig(tb testing.TB, ns string) string {
	tb.Helper()
	ctx := tb.Context()
	admin := cp.AdminClient()
	roleOnce.Do(func() {
		role := manifest[*rbacv1.ClusterRole](tb, "rbac.yaml", "hami-scheduler").DeepCopy()
		role.ObjectMeta = metav1.ObjectMeta{Name: extenderRole}
		if _, err := admin.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			roleOnce.err = err
		}
	})
	if roleOnce.err != nil {
		tb.Fatalf("create cluster role %s: %v", extenderRole, roleOnce.err)
	}
	path, err := cp.ServiceAccountKubeconfig(ctx, tb.TempDir(), ns, serviceAccount, extenderRole)
	if err != nil {
		tb.Fatal(err)
	}
	lease := manifest[*rbacv1.Role](tb, "rbac.yaml", "hami-scheduler-lease").DeepCopy()
	lease.ObjectMeta = metav1.ObjectMeta{Name: lease.Name, Namespace: ns}
	if _, err := admin.RbacV1().Roles(ns).Create(ctx, lease, metav1.CreateOptions{}); err != nil {
		tb.Fatal(err)
	}
	binding := manifest[*rbacv1.RoleBinding](tb, "rbac.yaml", "hami-scheduler-lease").DeepCopy()
	binding.ObjectMeta = metav1.ObjectMeta{Name: binding.Name, Namespace: ns}
	for i := range binding.Subjects {
		binding.Subjects[i].Namespace = ns
	}
	binding.Subjects = append(binding.Subjects, rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: kubeSchedulerUser})
	if _, err := admin.RbacV1().RoleBindings(ns).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		tb.Fatal(err)
	}
	return path
}

// extenderArgs returns the arguments of the Deployment's extender container (deploy/
// deployment.yaml) with the flags of set replaced (or added), in the file's order.
func extenderArgs(tb testing.TB, set map[string]string) []string {
	tb.Helper()
	dep := manifest[*appsv1.Deployment](tb, "deployment.yaml", "hami-scheduler")
	var args []string
	for _, c := range dep.Spec.Template.Spec.Containers {
		if c.Name == "vgpu-scheduler-extender" {
			args = c.Args
		}
	}
	if args == nil {
		tb.Fatal("deploy/deployment.yaml has no extender container with args")
	}
	set = maps.Clone(set)
	if _, ok := set["metrics-bind-address"]; !ok { // the Deployment's :9395 is one port for every test binary at once
		set["metrics-bind-address"] = "127.0.0.1:" + strconv.Itoa(harness.FreePort(tb))
	}
	// The Deployment's client CA is a Secret's file: these tests call the extender without
	// client certificates (test/e2e/attack covers them).
	for _, name := range []string{"client_ca_file", "allowed_client_names"} {
		if _, ok := set[name]; !ok {
			set[name] = ""
		}
	}
	var out []string
	done := map[string]bool{}
	for _, a := range args {
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if v, ok := set[name]; ok {
			a, done[name] = "--"+name+"="+v, true
		}
		out = append(out, a)
	}
	for name, v := range set {
		if !done[name] {
			out = append(out, "--"+name+"="+v)
		}
	}
	return out
}

// extenderProc is one examples/extender process.
type extenderProc struct {
	name    string
	p       *proc.Process
	spawner *proc.Spawner
	url     string // https://127.0.0.1:<port>
	killed  bool
}

// startExtender starts the extender with args, serving TLS on 127.0.0.1:port with host name
// host ("" keeps the machine's), and waits until its /readyz answers 200 over TLS verified
// with the test's CA. When tb ends it is stopped with SIGTERM and must exit 0 (a race the
// detector found exits 66), unless the test killed it.
func startExtender(tb testing.TB, name, host string, port int, cert servingCert, args []string) *extenderProc {
	tb.Helper()
	if errExtenderBuild != nil {
		tb.Fatal(errExtenderBuild)
	}
	e := &extenderProc{name: name, spawner: proc.NewSpawner(), url: "https://127.0.0.1:" + strconv.Itoa(port)}
	opts := proc.Options{Name: name, Path: extenderBin, Args: args, LogPath: filepath.Join(tb.TempDir(), name+".log")}
	if host != "" {
		var err error
		if opts, err = envtest.WithHostname(opts, host); err != nil {
			e.spawner.Close()
			tb.Fatal(err)
		}
	}
	p, err := e.spawner.Start(opts)
	if err != nil {
		e.spawner.Close()
		tb.Fatal(err)
	}
	e.p = p
	tb.Cleanup(func() {
		if !e.killed {
			e.stop(tb)
		}
		e.spawner.Close()
		if tb.Failed() {
			tb.Logf("%s log:\n%s", name, p.LogTail(60))
		}
	})
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(cert.caPEM)
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	defer hc.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(tb.Context(), 60*time.Second)
	defer cancel()
	if err := p.WaitUntil(ctx, 20*time.Millisecond, envtest.Readyz(hc, e.url+extender.PathReadyz, "")); err != nil {
		tb.Fatalf("%s not ready: %v", name, err)
	}
	return e
}

// stop sends SIGTERM and fails tb unless the process exits 0 within 20 s.
func (e *extenderProc) stop(tb testing.TB) {
	tb.Helper()
	select {
	case <-e.p.Exited():
		tb.Errorf("%s had exited before SIGTERM: %v\n%s", e.name, e.p.ExitError(), e.p.LogTail(40))
		return
	default:
	}
	if err := e.p.Stop(20 * time.Second); err != nil {
		tb.Errorf("%v\n%s", err, e.p.LogTail(40))
		return
	}
	if ee := (*exec.ExitError)(nil); errors.As(e.p.ExitError(), &ee) {
		tb.Errorf("%s exited with %v after SIGTERM, want 0\n%s", e.name, ee, e.p.LogTail(40))
	}
}

// kill sends SIGKILL to the process group and waits until the process is gone.
func (e *extenderProc) kill(tb testing.TB) {
	tb.Helper()
	e.killed = true
	if err := syscall.Kill(-e.p.Pid(), syscall.SIGKILL); err != nil {
		tb.Fatalf("kill %s: %v", e.name, err)
	}
	<-e.p.Exited()
}

// logLines returns the process's log lines that contain every one of parts.
func (e *extenderProc) logLines(tb testing.TB, parts ...string) []string {
	tb.Helper()
	return grepLog(tb, e.p.LogPath(), parts...)
}

// grepLog returns the lines of the log file at path that contain every one of parts.
func grepLog(tb testing.TB, path string, parts ...string) []string {
	tb.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	var out []string
lines:
	for line := range strings.SplitSeq(string(data), "\n") {
		for _, p := range parts {
			if !strings.Contains(line, p) {
				continue lines
			}
		}
		out = append(out, line)
	}
	return out
}

// gpus returns n devices as a device plugin publishes them.
func gpus(n int, node string) []annotation.Device {
	out := make([]annotation.Device, n)
	for i := range out {
		out[i] = annotation.Device{ID: fmt.Sprintf("GPU-%s-%d", node, i), Index: uint(i), Count: 10, Devmem: 81559, Devcore: 100,
			Type: "NVIDIA-NVIDIA H100 80GB HBM3", Numa: i / 4, Mode: "hami-core", Health: true}
	}
	return out
}

// createGPUNode creates a Node labelled for test, ready and untainted as a kubelet and the
// node lifecycle controller would leave it, with allocatable nvidia.com/gpu n×10 in its
// status, and registers n GPUs on it with a register.Writer that runs until tb ends.
func createGPUNode(tb testing.TB, test, name string, n int) {
	tb.Helper()
	ctx := tb.Context()
	nodes := cp.AdminClient().CoreV1().Nodes()
	node := cp.CreateNode(tb, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{harness.TestLabel: test}}})
	node.Spec.Taints = nil
	node, err := nodes.Update(ctx, node, metav1.UpdateOptions{})
	if err != nil {
		tb.Fatalf("remove taints of %s: %v", name, err)
	}
	res := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("8"),
		corev1.ResourceMemory: resource.MustParse("32Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
		corev1.ResourceName(annotation.ResourceNVIDIAGPU): *resource.NewQuantity(int64(n*10), resource.DecimalSI),
	}
	node.Status.Capacity, node.Status.Allocatable = res, res
	node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: metav1.Now()}}
	if _, err := nodes.UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		tb.Fatalf("update status of %s: %v", name, err)
	}
	w, err := register.New(cp.AdminClient(), name, register.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	w.SetDevices(gpus(n, name))
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	tb.Cleanup(func() {
		if err := <-done; err != nil {
			tb.Errorf("register writer of %s: %v", name, err)
		}
	})
	if err := w.WaitForSync(ctx); err != nil {
		tb.Fatalf("register %s: %v", name, err)
	}
}

// createNamespace creates namespace ns with labels.
func createNamespace(tb testing.TB, ns string, labels map[string]string) {
	tb.Helper()
	if _, err := cp.AdminClient().CoreV1().Namespaces().Create(tb.Context(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: labels}}, metav1.CreateOptions{}); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_ = cp.AdminClient().CoreV1().Namespaces().Delete(context.WithoutCancel(tb.Context()), ns, metav1.DeleteOptions{})
	})
}

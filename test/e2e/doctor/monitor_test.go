package doctor_test

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hamireg/hamireg/diagnose"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// monitorMetrics is the node monitor's answer for pod <ns>/train: 1 GiB of 3000 MiB used on
// GPU-a, and a process without a HAMi-core slot on it.
func monitorMetrics(ns string) string {
	l := fmt.Sprintf(`container="cuda",device_uuid="GPU-a",namespace=%q,pod="train",vdevice_index="0",zone="vGPU"`, ns)
	return "# TYPE hami_vgpu_memory_used_bytes gauge\nhami_vgpu_memory_used_bytes{" + l + "} 1.073741824e+09\n" +
		"# TYPE hami_vgpu_memory_limit_bytes gauge\nhami_vgpu_memory_limit_bytes{" + l + "} 3.145728e+09\n" +
		"# TYPE hamireg_monitor_unaccounted_process_memory_bytes gauge\nhamireg_monitor_unaccounted_process_memory_bytes{" +
		fmt.Sprintf(`container="cuda",device_index="0",device_uuid="GPU-a",namespace=%q,pid="31337",pod="train",zone="vGPU"`, ns) + "} 5.24288e+08\n"
}

// proxyableIP is an address of this host that the API server's pod proxy accepts (not
// loopback nor link-local), "" when there is none.
func proxyableIP() string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return ""
	}
	for _, a := range addrs {
		n, ok := a.(*net.IPNet)
		if ok && n.IP.To4() != nil && n.IP.IsGlobalUnicast() && !n.IP.IsLinkLocalUnicast() {
			return n.IP.String()
		}
	}
	return ""
}

// TestMonitorThroughPodProxy: the doctor reads the node monitor through the real API
// server's pod proxy (GET pods/proxy on the device plugin Pod's port named metrics, which a
// Pod with status.podIP on this host serves), with an identity bound to exactly
// diagnose.PodClusterRoleRules(); without pods/proxy in its rules the usage is NotChecked
// with the fix.
func TestMonitorThroughPodProxy(t *testing.T) {
	ip := proxyableIP()
	if ip == "" {
		t.Skip("no non-loopback IPv4 address on this host for the pod proxy to reach")
	}
	ctx, admin := t.Context(), cp.AdminClient()
	ns := harness.UniqueName("monitor")
	if err := cp.EnsureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Skipf("listen on %s: %v", ip, err)
	}
	var mu sync.Mutex
	var served []string
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		served = append(served, r.URL.Path)
		mu.Unlock()
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_, _ = w.Write([]byte(monitorMetrics(ns)))
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	port := int32(ln.Addr().(*net.TCPAddr).Port)

	node := harness.UniqueName("gpu")
	plugin, err := admin.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "hami-device-plugin-m1", Namespace: ns, Labels: map[string]string{"app.kubernetes.io/component": "hami-device-plugin"}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: diagnose.DefaultPluginContainer, Image: "registry.invalid/hami:0",
			Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: port}}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	plugin.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}
	if _, err := admin.CoreV1().Pods(ns).UpdateStatus(ctx, plugin, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := gpuPod(ns, "train", diagnose.DefaultSchedulerName, map[string]string{harness.GPUResource: "1", "nvidia.com/gpumem": "3000"},
		map[string]string{"hami.io/vgpu-node": node, "hami.io/bind-phase": "success", "hami.io/vgpu-devices-allocated": "GPU-a,NVIDIA,3000,0:;"})
	pod.Spec.NodeName = node
	pod = create(t, pod)
	pod.Status.Phase = corev1.PodRunning
	if _, err := admin.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	opts := diagnose.Options{Namespace: ns}

	// An identity with exactly the pod rules reads the monitor.
	role := harness.UniqueName("hami-doctor-pod")
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: role}, Rules: diagnose.PodClusterRoleRules()}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c, err := cp.ServiceAccountClient(ctx, ns, "doctor", role)
	if err != nil {
		t.Fatal(err)
	}
	var r *diagnose.PodReport
	harness.Eventually(t, "the pod rules to read the monitor", 30*time.Second, func() bool {
		r, err = diagnose.Pod(ctx, c, ns, "train", opts)
		if err != nil && !errors.Is(err, diagnose.ErrAPI) {
			t.Fatal(err)
		}
		return err == nil && r.Usage != nil && r.Usage.Error == ""
	})
	u := r.Usage
	mu.Lock()
	defer mu.Unlock()
	t.Logf("usage through %s: %+v", u.Endpoint, u.GPUs)
	if len(u.GPUs) != 1 || !u.GPUs[0].Reported || u.GPUs[0].UsedMiB() != 1024 || u.GPUs[0].LimitMiB() != 3000 || len(served) == 0 || served[0] != "/metrics" {
		t.Errorf("usage %+v, served %q", u, served)
	}
	if f, ok := r.Finding(diagnose.CodeProcessWithoutSlot); !ok || f.Severity != diagnose.SeverityError || r.Case != diagnose.P8RunningWithoutLimits {
		t.Errorf("case %s, finding %+v", r.Case, f)
	}

	// Without pods/proxy: NotChecked, naming the permission.
	noProxy := harness.UniqueName("hami-doctor-noproxy")
	var rules []rbacv1.PolicyRule
	for _, rule := range diagnose.PodClusterRoleRules() {
		if !slices.Contains(rule.Resources, "pods/proxy") {
			rules = append(rules, rule)
		}
	}
	if len(rules) == len(diagnose.PodClusterRoleRules()) {
		t.Fatal("PodClusterRoleRules has no rule on pods/proxy")
	}
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: noProxy}, Rules: rules}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{role, noProxy} {
		t.Cleanup(func() { _ = admin.RbacV1().ClusterRoles().Delete(ctx, name, metav1.DeleteOptions{}) })
	}
	limited, err := cp.ServiceAccountClient(ctx, ns, "doctor-noproxy", noProxy)
	if err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, "the proxy read to be refused", 30*time.Second, func() bool {
		r, err = diagnose.Pod(ctx, limited, ns, "train", opts)
		return err == nil && r.Usage != nil && r.Usage.Error != ""
	})
	if !strings.Contains(r.Usage.Error, "forbidden") {
		t.Errorf("usage error %q, want forbidden", r.Usage.Error)
	}
	found := false
	for _, f := range r.Findings {
		if f.Code == diagnose.CodePodNotChecked && strings.Contains(f.Summary, "node monitor") && containsLine(f.Fix, "kubectl auth can-i get pods/proxy -n "+ns) {
			found = true
		}
	}
	if !found {
		t.Errorf("no NotChecked finding naming pods/proxy: %+v", r.Findings)
	}
}

package attack_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	kubeschedulerconfigv1 "k8s.io/kube-scheduler/config/v1"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/envtest"
	"github.com/hamireg/hamireg/envtest/proc"
	"github.com/hamireg/hamireg/extender"
	"github.com/hamireg/hamireg/internal/manifests"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

const (
	// attackerRole lets the attacker's ServiceAccount do to pods what a namespace's user may.
	attackerRole = "e2e-attacker"
	deployDir    = "../../../examples/extender/deploy"
)

// stack is one test's cluster part: a GPU node (examples/deviceplugin on the kubelet's device
// manager), examples/extender over TLS requiring client certificates, kube-scheduler calling
// it with its client certificate, and the extender's webhook, which the API server calls with
// its client certificate, registered for the node's namespace.
type stack struct {
	g  *harness.GPUNode
	ns string
	// scheduler is the stack's scheduler name (profile and --scheduler-name): tests in
	// parallel must not take each other's pods.
	scheduler    string
	url, metrics string
	attacker     kubernetes.Interface
}

func newStack(t *testing.T) *stack {
	t.Helper()
	if progs.DevicePluginErr != nil || progs.ExtenderErr != nil {
		t.Fatalf("build: %v %v", progs.DevicePluginErr, progs.ExtenderErr)
	}
	s := &stack{}
	s.g = cp.StartGPUNode(t, harness.GPUNodeOptions{Bin: progs.DevicePlugin})
	s.g.MakeReady(t)
	s.ns = s.g.Namespace
	s.scheduler = harness.UniqueName("hami-scheduler")
	port, mport := harness.FreePort(t), harness.FreePort(t)
	s.url, s.metrics = fmt.Sprintf("https://127.0.0.1:%d", port), fmt.Sprintf("http://127.0.0.1:%d", mport)
	startExtender(t, []string{"--http_bind", fmt.Sprintf("127.0.0.1:%d", port), "--metrics-bind-address", fmt.Sprintf("127.0.0.1:%d", mport),
		"--kubeconfig", cp.Kubeconfig(), "--leader-elect=false", "-v", "2", cp.LabelNodes(t, s.g), "--scheduler-name", s.scheduler,
		"--cert_file", certs.serverCert, "--key_file", certs.serverKey,
		"--client_ca_file", certs.clientCA, "--allowed_client_names", cnScheduler + "," + cnAPIServer,
		// The node agent runs as <ns>/hami-device-plugin here; the extender as the admin
		// (system:masters).
		"--trusted_users", "system:serviceaccount:" + s.ns + ":hami-device-plugin", "--trusted_groups", "system:masters",
	}, s.metrics)
	sched, err := cp.StartScheduler(harness.Context(t), envtest.SchedulerOptions{Config: s.schedulerConfig(t, port)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kube-scheduler log:\n%s", sched.LogTail(40))
		}
		_ = sched.Stop()
	})
	s.registerWebhook(t)
	s.attacker = attackerClient(t, s.ns)
	return s
}

// startExtender runs examples/extender with args until the test ends and waits for its
// readiness on the metrics address (the probes' port: the serving port wants a client
// certificate).
func startExtender(t *testing.T, args []string, metrics string) {
	t.Helper()
	sp := proc.NewSpawner()
	p, err := sp.Start(proc.Options{Name: "extender", Path: progs.Extender, Args: args, LogPath: filepath.Join(t.TempDir(), "extender.log")})
	if err != nil {
		sp.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Stop(20 * time.Second); err != nil {
			t.Errorf("stop extender: %v", err)
		}
		sp.Close()
		if t.Failed() {
			t.Logf("extender log:\n%s", p.LogTail(80))
		}
	})
	harness.Eventually(t, "extender /readyz", 60*time.Second, func() bool {
		resp, err := http.Get(metrics + extender.PathReadyz) //nolint:noctx // a probe of a local process
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// schedulerConfig is deploy/scheduler-config.yaml with its extender at port and its
// tlsConfig's files the test's: kube-scheduler verifies the extender with the serving CA and
// presents its client certificate.
func (s *stack) schedulerConfig(t *testing.T, port int) *kubeschedulerconfigv1.KubeSchedulerConfiguration {
	t.Helper()
	cm, ok := manifests.Find[*corev1.ConfigMap](manifests.Glob(t, filepath.Join(deployDir, "scheduler-config.yaml")), "hami-scheduler-config")
	if !ok {
		t.Fatal("scheduler-config.yaml: no ConfigMap hami-scheduler-config")
	}
	cfg, err := manifests.SchedulerConfig(cm)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Extenders) != 1 || cfg.Extenders[0].TLSConfig == nil || cfg.Extenders[0].TLSConfig.Insecure || !cfg.Extenders[0].EnableHTTPS {
		t.Fatalf("scheduler-config.yaml: want one extender over verified HTTPS: %+v", cfg.Extenders)
	}
	x := &cfg.Extenders[0]
	x.URLPrefix = fmt.Sprintf("https://127.0.0.1:%d", port)
	tc := x.TLSConfig
	tc.CertFile, tc.KeyFile, tc.CAFile = certs.client[cnScheduler].cert, certs.client[cnScheduler].key, certs.servingCA
	f := false
	cfg.LeaderElection.LeaderElect = &f
	if len(cfg.Profiles) != 1 {
		t.Fatalf("scheduler-config.yaml: %d profiles, want 1", len(cfg.Profiles))
	}
	cfg.Profiles[0].SchedulerName = &s.scheduler
	return cfg
}

// registerWebhook creates deploy/webhook.yaml for this test: the extender's URL instead of the
// Service, the serving CA as caBundle, and the namespaceSelector narrowed to the test's
// namespace; rules, failurePolicy (Ignore: a failed call would admit the pod) and the absent
// objectSelector are the file's. It waits until the API server calls it.
func (s *stack) registerWebhook(t *testing.T) {
	t.Helper()
	wh, ok := manifests.Find[*admissionregistrationv1.MutatingWebhookConfiguration](manifests.Glob(t, filepath.Join(deployDir, "webhook.yaml")), "hami-webhook")
	if !ok || len(wh.Webhooks) != 1 || wh.Webhooks[0].NamespaceSelector == nil {
		t.Fatal("webhook.yaml: want one webhook with a namespaceSelector")
	}
	wh = wh.DeepCopy()
	wh.Name = s.ns
	w := &wh.Webhooks[0]
	if w.ObjectSelector != nil && len(w.ObjectSelector.MatchExpressions)+len(w.ObjectSelector.MatchLabels) > 0 {
		t.Fatalf("webhook.yaml has an objectSelector: %+v", w.ObjectSelector)
	}
	u := s.url + extender.PathWebhook
	w.ClientConfig = admissionregistrationv1.WebhookClientConfig{URL: &u, CABundle: certs.servingCAPEM}
	w.NamespaceSelector.MatchExpressions = append(w.NamespaceSelector.MatchExpressions,
		metav1.LabelSelectorRequirement{Key: corev1.LabelMetadataName, Operator: metav1.LabelSelectorOpIn, Values: []string{s.ns}})
	hooks := cp.AdminClient().AdmissionregistrationV1().MutatingWebhookConfigurations()
	if _, err := hooks.Create(t.Context(), wh, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = hooks.Delete(context.WithoutCancel(t.Context()), wh.Name, metav1.DeleteOptions{}) })
	probe := forgedPod("probe", "x", s.g.Name)
	harness.Eventually(t, "the API server calls the webhook", 60*time.Second, func() bool {
		_, err := cp.AdminClient().CoreV1().Pods(s.ns).Create(t.Context(), probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), "scheduler-owned annotation")
	})
}

// attackerClient is a client of the ServiceAccount ns/attacker, which may do to pods what a
// namespace's user may (create, update, patch, delete), nothing more.
func attackerClient(t *testing.T, ns string) kubernetes.Interface {
	t.Helper()
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: attackerRole}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
	}}
	if _, err := cp.AdminClient().RbacV1().ClusterRoles().Create(t.Context(), role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	path, err := cp.ServiceAccountKubeconfig(t.Context(), t.TempDir(), ns, "attacker", attackerRole)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The authorizer sees the binding through its informer.
	harness.Eventually(t, "the attacker's RBAC", 30*time.Second, func() bool {
		_, err := c.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{})
		return err == nil
	})
	return c
}

// forgedPod is a pod that claims a GPU of node with the scheduler's annotations, as issue
// #3041's attacker creates it: another scheduler, HAMi's opt-out label, 40 GB of gpu.
func forgedPod(name, gpu, node string) *corev1.Pod {
	devices := gpu + ",NVIDIA,40000,100:;"
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"hami.io/webhook": "ignore"}, Annotations: map[string]string{
			annotation.KeyNVIDIAToAllocate: devices, annotation.KeyNVIDIAAllocated: devices, allocation.KeyNode: node,
			allocation.KeyBindPhase: string(allocation.PhaseAllocating), allocation.KeyBindTime: strconv.FormatInt(time.Now().Unix(), 10),
		}},
		Spec: corev1.PodSpec{SchedulerName: "volcano", NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/cuda:0",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{harness.GPUResource: resource.MustParse("1")}}}}},
	}
}

// gpuPod is a pod of the test's scheduler asking one GPU with mem MiB and cores percent.
func (s *stack) gpuPod(name string, mem, cores int64) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.ns},
		Spec: corev1.PodSpec{SchedulerName: s.scheduler, Containers: []corev1.Container{{Name: "cuda", Image: "registry.invalid/cuda:0",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
				harness.GPUResource:   *resource.NewQuantity(1, resource.DecimalSI),
				"nvidia.com/gpumem":   *resource.NewQuantity(mem, resource.DecimalSI),
				"nvidia.com/gpucores": *resource.NewQuantity(cores, resource.DecimalSI),
			}},
		}}},
	}
}

// plainPod is a pod no scheduler of the cluster takes (schedulerName "nobody").
func (s *stack) plainPod(name string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.ns},
		Spec: corev1.PodSpec{SchedulerName: "nobody", Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/busybox:0"}}}}
}

func (s *stack) get(t *testing.T, name string) *corev1.Pod {
	t.Helper()
	p, err := cp.AdminClient().CoreV1().Pods(s.ns).Get(harness.Context(t), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// admit plays the kubelet for a pod the scheduler binds to the node: once it is bound
// (bind-phase allocating), the device manager's Allocate for its GPU containers; the device
// plugin then writes bind-phase success and releases the node lock.
func (s *stack) admit(t *testing.T, name string, within time.Duration) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	harness.Eventually(t, name+" bound", within, func() bool {
		pod = s.get(t, name)
		return pod.Spec.NodeName == s.g.Name && pod.Annotations[allocation.KeyBindPhase] == string(allocation.PhaseAllocating)
	})
	if _, err := s.g.Admit(harness.Context(t), pod); err != nil {
		t.Fatalf("admit %s: %v", name, err)
	}
	harness.Eventually(t, name+" allocated", 30*time.Second, func() bool {
		pod = s.get(t, name)
		return pod.Annotations[allocation.KeyBindPhase] == string(allocation.PhaseSuccess)
	})
	return pod
}

// post sends body to the extender's route with the client certificate kp (none: empty) and
// returns the answer's body.
func (s *stack) post(t *testing.T, kp keyPair, route string, body any) ([]byte, int, error) {
	t.Helper()
	tc, err := certs.tlsClient(kp)
	if err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}
	defer client.CloseIdleConnections()
	req, err := http.NewRequestWithContext(harness.Context(t), http.MethodPost, s.url+route, bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer func() { _ = resp.Body.Close() }()
	out, err := io.ReadAll(resp.Body)
	return out, resp.StatusCode, err
}

// podSeries returns the extender's hami_vgpu_memory_allocated_bytes lines of pod: what its
// usage holds for the pod, as served on /metrics.
func (s *stack) podSeries(t *testing.T, pod string) []string {
	t.Helper()
	resp, err := http.Get(s.metrics + "/metrics") //nolint:noctx // a local process
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for line := range strings.Lines(string(body)) {
		if strings.HasPrefix(line, "hami_vgpu_memory_allocated_bytes{") && strings.Contains(line, `pod="`+pod+`"`) &&
			strings.Contains(line, `namespace="`+s.ns+`"`) {
			out = append(out, strings.TrimSpace(line))
		}
	}
	return out
}

// gpuUse is what the pods hold of one GPU.
type gpuUse struct {
	mem, cores, slots int64
	pods              []string
}

// doubleBooked audits the whole cluster as the API server has it: for every pod that holds
// devices by its annotations (hami.io/vgpu-node, and the allocated list, else the to-allocate
// list, which a device plugin serves; terminated pods hold nothing), what it holds of each
// GPU, summed per GPU and compared with the GPU's register annotation on that node (memory,
// cores, split count). It returns the GPUs held beyond what they offer, or that a registered
// node does not offer at all, with their holders. Pods on a Node that no longer exists or
// registers nothing (an earlier test's: no namespace controller deletes its pods) hold no GPU
// that can be booked twice.
func doubleBooked(t *testing.T) []string {
	t.Helper()
	ctx := harness.Context(t)
	nodes, err := cp.AdminClient().CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	offered := map[string]map[string]annotation.Device{} // node → UUID → device
	for _, n := range nodes.Items {
		devs, err := annotation.Decode(n.Annotations[annotation.KeyNVIDIARegister])
		if err != nil {
			continue
		}
		offered[n.Name] = map[string]annotation.Device{}
		for _, d := range devs {
			offered[n.Name][d.ID] = d
		}
	}
	pods, err := cp.AdminClient().CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	used := map[[2]string]*gpuUse{}
	for _, p := range pods.Items {
		node := p.Annotations[allocation.KeyNode]
		if node == "" || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		value := p.Annotations[annotation.KeyNVIDIAAllocated]
		if value == "" {
			value = p.Annotations[annotation.KeyNVIDIAToAllocate]
		}
		pd, err := allocation.DecodePodDevices(value, allocation.VersionMaster)
		if err != nil {
			t.Errorf("pod %s/%s: devices %q: %v", p.Namespace, p.Name, value, err)
			continue
		}
		for _, ctr := range pd {
			for _, d := range ctr {
				k := [2]string{node, d.GPU()}
				u := used[k]
				if u == nil {
					u = &gpuUse{}
					used[k] = u
				}
				u.mem, u.cores, u.slots = u.mem+int64(d.Usedmem), u.cores+int64(d.Usedcores), u.slots+1
				u.pods = append(u.pods, p.Namespace+"/"+p.Name)
			}
		}
	}
	var out []string
	for k, u := range used {
		devs, registered := offered[k[0]]
		if !registered {
			continue // a Node deleted (an earlier test's) or not registered: no GPU there to book
		}
		d, ok := devs[k[1]]
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("%s %s: not offered, held by %v", k[0], k[1], u.pods))
		case u.mem > int64(d.Devmem) || u.cores > int64(d.Devcore) || u.slots > int64(d.Count):
			out = append(out, fmt.Sprintf("%s %s: %d MiB, %d%% cores, %d slots of %d, %d, %d, held by %v", k[0], k[1],
				u.mem, u.cores, u.slots, d.Devmem, d.Devcore, d.Count, u.pods))
		}
	}
	return out
}

// audit fails the test when any GPU of the cluster is double-booked.
func audit(t *testing.T, step string) {
	t.Helper()
	if over := doubleBooked(t); len(over) > 0 {
		t.Errorf("after %s: %d GPUs double-booked: %v", step, len(over), over)
	}
}

// isTLSRefusal reports whether err is the TLS handshake's refusal of the client's
// certificate (with TLS 1.3 the client learns it at its first read: "remote error: tls:
// certificate required", "… bad certificate", "… unknown certificate authority"), not an
// HTTP answer.
func isTLSRefusal(err error) bool {
	return err != nil && strings.Contains(err.Error(), "remote error: tls: ")
}

package doctor_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/diagnose"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// bundleRole is the ClusterRole of the bundle's identity: exactly diagnose.BundleClusterRoleRules().
const bundleRole = "e2e-doctor-bundle"

// Values the bundle must never hold: a Secret's data, a kubeconfig's token and key, the
// webhook's CA bundle.
const (
	secretValue  = "secret-value-that-must-not-leak"
	tokenValue   = "eyJhbGciOiJSUzI1NiJ9.token-that-must-not-leak"
	keyValue     = "a2V5LXRoYXQtbXVzdC1ub3QtbGVhaw=="
	caBundleText = "-----BEGIN CERTIFICATE-----\nMIIBcertificate-that-must-not-leak\n-----END CERTIFICATE-----\n"
	bearerValue  = "bearer-token-of-the-leader-log-that-must-not-leak"
)

// The lines the kubelet stand-in serves as the logs of the chart's Pods: the leader's
// extender log (an old line, a recognisable line, a line with a bearer token), the plugin's,
// and a follower's, which the bundle must not collect.
const (
	leaderOldLine   = "I0102 10:00:00.000000       1 scheduler.go:80] e2e leader: an old line beyond a tail of 2"
	leaderLine      = "I0102 10:00:01.000000       1 routes.go:120] e2e leader: vgpu-scheduler-extender serves filter and bind"
	leaderTokenLine = "I0102 10:00:02.000000       1 client.go:33] e2e leader: GET /api/v1/nodes Authorization: Bearer " + bearerValue
	pluginLine      = "I0102 09:59:00.000000       1 register.go:61] e2e plugin: registered 8 GPUs"
	followerLine    = "I0102 10:00:03.000000       1 leaderelection.go:250] e2e follower: attempting to acquire leader lease"
)

// chart installs, in the GPU node's namespace, the objects of HAMi's chart the bundle reads:
// the device plugin DaemonSet and its Pod on the node, the scheduler Deployment with one Pod
// holding the Lease and a follower Pod, all three on the node, the KubeSchedulerConfiguration
// ConfigMap (with a kubeconfig whose token and key must be redacted), a
// MutatingWebhookConfiguration of the test's own name (with a CA bundle; its objectSelector
// matches no pod) and a Secret the bundle must not read. It returns the webhook's name and
// the three Pods.
func chart(t *testing.T, g *harness.GPUNode) (webhook string, plugin, leader, follower *corev1.Pod) {
	t.Helper()
	ctx, c, ns := t.Context(), cp.AdminClient(), g.Namespace
	fail := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("create %s: %v", what, err)
		}
	}
	pluginLabels := map[string]string{"app.kubernetes.io/component": "hami-device-plugin"}
	schedLabels := map[string]string{"app.kubernetes.io/component": "hami-scheduler"}
	ctr := func(names ...string) []corev1.Container {
		var out []corev1.Container
		for _, n := range names {
			out = append(out, corev1.Container{Name: n, Image: "registry.invalid/hami:v2.9.0"})
		}
		return out
	}
	_, err := c.AppsV1().DaemonSets(ns).Create(ctx, &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: diagnose.DefaultDaemonSet, Namespace: ns},
		Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: pluginLabels}, Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: pluginLabels}, Spec: corev1.PodSpec{Containers: ctr(diagnose.DefaultPluginContainer)}}}}, metav1.CreateOptions{})
	fail("daemonset", err)
	plugin, err = c.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "hami-device-plugin-x1", Namespace: ns, Labels: pluginLabels},
		Spec: corev1.PodSpec{NodeName: g.Name, Containers: ctr(diagnose.DefaultPluginContainer)}}, metav1.CreateOptions{})
	fail("plugin pod", err)
	_, err = c.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: diagnose.DefaultScheduler, Namespace: ns},
		Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: schedLabels}, Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: schedLabels}, Spec: corev1.PodSpec{Containers: ctr("kube-scheduler", diagnose.DefaultExtenderContainer)}}}}, metav1.CreateOptions{})
	fail("deployment", err)
	leader, err = c.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "hami-scheduler-7d9f-abcde", Namespace: ns, Labels: schedLabels},
		Spec: corev1.PodSpec{NodeName: g.Name, Containers: ctr("kube-scheduler", diagnose.DefaultExtenderContainer)}}, metav1.CreateOptions{})
	fail("scheduler pod", err)
	follower, err = c.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "hami-scheduler-7d9f-fghij", Namespace: ns, Labels: schedLabels},
		Spec: corev1.PodSpec{NodeName: g.Name, Containers: ctr("kube-scheduler", diagnose.DefaultExtenderContainer)}}, metav1.CreateOptions{})
	fail("follower scheduler pod", err)
	holder := leader.Name + "_0c5c6a4e-2a3b-4c5d-8e9f-0a1b2c3d4e5f"
	_, err = c.CoordinationV1().Leases(ns).Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: diagnose.DefaultLease, Namespace: ns},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: new(int32(3600)), RenewTime: &metav1.MicroTime{Time: time.Now()}}}, metav1.CreateOptions{})
	fail("lease", err)
	kubeconfig := "apiVersion: v1\nkind: Config\nusers:\n- name: hami\n  user:\n    token: " + tokenValue + "\n    client-key-data: " + keyValue + "\n"
	_, err = c.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: diagnose.DefaultSchedulerConfigMap, Namespace: ns},
		Data: map[string]string{"config.yaml": "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n", "kubeconfig": kubeconfig}}, metav1.CreateOptions{})
	fail("configmap", err)
	_, err = c.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "hami-scheduler-tls", Namespace: ns},
		StringData: map[string]string{"tls.key": secretValue}}, metav1.CreateOptions{})
	fail("secret", err)

	webhook = harness.UniqueName("hami-webhook")
	ignore, none := admissionregistrationv1.Ignore, admissionregistrationv1.SideEffectClassNone
	_, err = c.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: webhook},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name: "vgpu.hami.io", AdmissionReviewVersions: []string{"v1"}, SideEffects: &none, FailurePolicy: &ignore,
			ObjectSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"e2e.hamireg.io/never": "matched"}},
			ClientConfig: admissionregistrationv1.WebhookClientConfig{CABundle: []byte(caBundleText),
				Service: &admissionregistrationv1.ServiceReference{Namespace: ns, Name: diagnose.DefaultScheduler, Path: new("/webhook")}},
		}},
	}, metav1.CreateOptions{})
	fail("mutatingwebhookconfiguration", err)
	t.Cleanup(func() {
		_ = c.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(context.WithoutCancel(ctx), webhook, metav1.DeleteOptions{})
	})
	return webhook, plugin, leader, follower
}

// bundleClient is a client of a ServiceAccount bound to diagnose.BundleClusterRoleRules(),
// once the RBAC authorizer has seen the binding.
func bundleClient(t *testing.T, ns string) kubernetes.Interface {
	t.Helper()
	cr := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: bundleRole}, Rules: diagnose.BundleClusterRoleRules()}
	if _, err := cp.AdminClient().RbacV1().ClusterRoles().Create(t.Context(), cr, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	c, err := cp.ServiceAccountClient(t.Context(), ns, "hami-doctor", bundleRole)
	if err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, "the RBAC authorizer to see the bundle's binding", 30*time.Second, func() bool {
		_, err := c.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{})
		return err == nil
	})
	if _, err := c.CoreV1().Secrets(ns).List(t.Context(), metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("the bundle's identity may list Secrets (%v): the rules are not read-only without Secrets", err)
	}
	return c
}

// openBundle reads a .tar.gz: the file paths under root and their contents.
func openBundle(t *testing.T, data []byte, root string) map[string]string {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("the bundle is not gzip: %v", err)
	}
	tr := tar.NewReader(zr)
	files := map[string]string{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("the bundle is not a tar: %v", err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		rel, ok := strings.CutPrefix(h.Name, root+"/")
		if !ok {
			t.Errorf("file %s is not under the bundle's folder %s", h.Name, root)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[rel] = string(b)
	}
	return files
}

// bundleRoot is the folder a .tar.gz's first entry is in: the bundle's root.
func bundleRoot(t *testing.T, data []byte) string {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("the bundle is not gzip: %v", err)
	}
	h, err := tar.NewReader(zr).Next()
	if err != nil {
		t.Fatalf("the bundle is not a tar, or empty: %v", err)
	}
	root, _, _ := strings.Cut(h.Name, "/")
	return root
}

// wantBundle checks a bundle's files: the paths wanted, the index, each log file of logs
// holding its lines, no Missing line about pods/log (the stand-in kubelet serves every log
// the bundle reads), none of absent in any file, and no Secret, token, key or certificate
// anywhere.
func wantBundle(t *testing.T, idx *diagnose.BundleIndex, files map[string]string, want []string, logs map[string][]string, absent []string) {
	t.Helper()
	for _, p := range append([]string{"index.txt", "index.json"}, want...) {
		if _, ok := files[p]; !ok {
			t.Errorf("the bundle has no %s; it has %v", p, slices.Sorted(maps.Keys(files)))
		}
	}
	var fromJSON diagnose.BundleIndex
	if err := json.Unmarshal([]byte(files["index.json"]), &fromJSON); err != nil || len(fromJSON.Files) != len(idx.Files) {
		t.Errorf("index.json: %v, %d files, want the index's %d", err, len(fromJSON.Files), len(idx.Files))
	}
	for _, m := range idx.Missing {
		if strings.HasPrefix(m, "pods/log ") {
			t.Errorf("a Missing line for a log the kubelet stand-in serves: %s", m)
		}
	}
	for p, lines := range logs {
		got, ok := files[p]
		if !ok {
			t.Errorf("the bundle has no log %s; it has %v", p, slices.Sorted(maps.Keys(files)))
			continue
		}
		for _, line := range lines {
			if !strings.Contains(got, line) {
				t.Errorf("%s lacks %q:\n%s", p, line, got)
			}
		}
	}
	b64 := base64.StdEncoding.EncodeToString
	for p, content := range files {
		if strings.HasPrefix(p, "secrets/") || strings.Contains(content, "hami-scheduler-tls") {
			t.Errorf("%s: a Secret in the bundle", p)
		}
		for _, leak := range []string{secretValue, b64([]byte(secretValue)), tokenValue, keyValue, bearerValue, "MIIBcertificate", b64([]byte(caBundleText)), "BEGIN CERTIFICATE"} {
			if strings.Contains(content, leak) {
				t.Errorf("%s holds %q: not redacted", p, leak)
			}
		}
		for _, text := range absent {
			if strings.Contains(content, text) {
				t.Errorf("%s holds %q, which the bundle must not collect", p, text)
			}
		}
	}
}

// TestBundle writes the support bundle of a bound GPU pod and of its node from a live
// cluster, with an identity bound to exactly diagnose.BundleClusterRoleRules(), opens both
// archives and checks the objects (Node, Pod, DaemonSet, plugin Pod, Deployment, Lease,
// leader Pod, ConfigMap, webhook, the diagnosis added as files), the index, the logs of the
// plugin Pod and of the leader read for real through the API server's pods/log from a
// stand-in of the node's kubelet (the last LogLines lines, a bearer token redacted; a
// follower's log not collected, no Missing line about pods/log), and that no Secret, token,
// key or certificate is in them.
func TestBundle(t *testing.T) {
	t.Parallel()
	g := gpuNode(t)
	harness.BuildDoctor(t, cp.Dir()) // before the chart, so the subtests run right after it
	webhook, plugin, leader, follower := chart(t, g)
	ns := g.Namespace
	ext, dp := diagnose.DefaultExtenderContainer, diagnose.DefaultPluginContainer
	kubelet := cp.ServeContainerLogs(t, g.Name, map[string]string{
		ns + "/" + leader.Name + "/" + ext:           leaderOldLine + "\n" + leaderLine + "\n" + leaderTokenLine + "\n",
		ns + "/" + leader.Name + "/kube-scheduler":   "I0102 10:00:00.000000       1 server.go:150] kube-scheduler of the leader\n",
		ns + "/" + follower.Name + "/" + ext:         followerLine + "\n",
		ns + "/" + follower.Name + "/kube-scheduler": followerLine + "\n",
		ns + "/" + plugin.Name + "/" + dp:            pluginLine + "\n",
	})
	leaderLog, pluginLog := path.Join("logs", ns, leader.Name, ext+".log"), path.Join("logs", ns, plugin.Name, dp+".log")
	redactedToken := "Authorization: Bearer " + diagnose.Redacted
	// HAMi's scheduler bound the pod (allocationtest plays it, under a name no kube-scheduler
	// of the cluster has): the bundle's pod is at S2.
	name := newSchedulerName()
	pod := g.Schedule(t, create(t, gpuPod(g.Namespace, "bundled", name, map[string]string{harness.GPUResource: "1"}, nil)), allocation.PodDevices{{g.Share(0, 4000, 20)}})
	opts := doctorOptions(g, name)
	opts.Webhook = webhook
	r := doctor(t, g.Namespace, pod.Name, opts)
	report, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	client := bundleClient(t, g.Namespace)

	t.Run("pod", func(t *testing.T) {
		var buf bytes.Buffer
		idx, err := diagnose.WriteBundle(t.Context(), client, diagnose.BundleTarget{Namespace: ns, Pod: pod.Name}, &buf, diagnose.BundleOptions{Options: opts, LogLines: 2,
			Files: []diagnose.BundleFile{{Name: "report.json", Data: report}, {Name: "report.txt", Data: []byte(r.Reason)}}})
		if err != nil {
			t.Fatalf("WriteBundle: %v", err)
		}
		t.Logf("pod bundle: %d bytes, %d files, missing:\n%s", buf.Len(), len(idx.Files), strings.Join(idx.Missing, "\n"))
		if idx.Target.Node != g.Name {
			t.Errorf("the index's node %q, want the pod's %s", idx.Target.Node, g.Name)
		}
		files := openBundle(t, buf.Bytes(), idx.Root)
		wantBundle(t, idx, files, []string{
			path.Join("nodes", g.Name+".yaml"), path.Join("pods", ns, pod.Name+".yaml"),
			path.Join("pods", ns, plugin.Name+".yaml"), path.Join("pods", ns, leader.Name+".yaml"),
			path.Join("daemonsets", ns, diagnose.DefaultDaemonSet+".yaml"), path.Join("deployments", ns, diagnose.DefaultScheduler+".yaml"),
			path.Join("leases", ns, diagnose.DefaultLease+".yaml"), path.Join("configmaps", ns, diagnose.DefaultSchedulerConfigMap+".yaml"),
			path.Join("mutatingwebhookconfigurations", webhook+".yaml"),
			"diagnosis/report.json", "diagnosis/report.txt",
		}, map[string][]string{leaderLog: {leaderLine, redactedToken}, pluginLog: {pluginLine}}, []string{followerLine, leaderOldLine})
		if got := files[path.Join("pods", ns, pod.Name+".yaml")]; !strings.Contains(got, allocation.KeyBindPhase) || !strings.Contains(got, "nodeName: "+g.Name) {
			t.Errorf("the pod's YAML lacks its bind-phase or node:\n%s", got)
		}
		if got := files["diagnosis/report.json"]; !strings.Contains(got, `"stage": "S2"`) {
			t.Errorf("diagnosis/report.json is not the pod's diagnosis at S2:\n%s", got)
		}
	})

	t.Run("node", func(t *testing.T) {
		var buf bytes.Buffer
		idx, err := diagnose.WriteBundle(t.Context(), client, diagnose.BundleTarget{Node: g.Name}, &buf, diagnose.BundleOptions{Options: opts})
		if err != nil {
			t.Fatalf("WriteBundle: %v", err)
		}
		t.Logf("node bundle: %d bytes, %d files, missing:\n%s", buf.Len(), len(idx.Files), strings.Join(idx.Missing, "\n"))
		files := openBundle(t, buf.Bytes(), idx.Root)
		wantBundle(t, idx, files, []string{
			path.Join("nodes", g.Name+".yaml"), path.Join("pods", ns, plugin.Name+".yaml"),
			path.Join("daemonsets", ns, diagnose.DefaultDaemonSet+".yaml"), path.Join("leases", ns, diagnose.DefaultLease+".yaml"),
		}, map[string][]string{leaderLog: {leaderOldLine, leaderLine, redactedToken}, pluginLog: {pluginLine}}, []string{followerLine})
		if got := files[path.Join("nodes", g.Name+".yaml")]; !strings.Contains(got, annotation.KeyNVIDIARegister) {
			t.Errorf("the Node's YAML lacks the register annotation:\n%.600s", got)
		}
	})
	t.Run("plugin binary", func(t *testing.T) {
		// kubectl hami-doctor bundle NS/POD -f FILE as the read-only ServiceAccount.
		kc, err := cp.ServiceAccountKubeconfig(t.Context(), t.TempDir(), ns, "hami-doctor", bundleRole)
		if err != nil {
			t.Fatal(err)
		}
		file := filepath.Join(t.TempDir(), "b.tar.gz")
		run := doctorCLI(t, kc, opts, "bundle", ns+"/"+pod.Name, "-f", file, "--log-lines", "2")
		if run.Code != 0 || !strings.Contains(run.Stdout, "Wrote "+file) {
			t.Fatalf("bundle %s/%s: exit %d, want 0 and the file written:\n%s%s", ns, pod.Name, run.Code, run.Stdout, run.Stderr)
		}
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		files := openBundle(t, data, bundleRoot(t, data))
		var idx diagnose.BundleIndex
		if err := json.Unmarshal([]byte(files["index.json"]), &idx); err != nil {
			t.Fatalf("index.json: %v", err)
		}
		wantBundle(t, &idx, files, []string{
			path.Join("nodes", g.Name+".yaml"), path.Join("pods", ns, pod.Name+".yaml"), path.Join("pods", ns, leader.Name+".yaml"),
			"diagnosis/diagnosis.json", "diagnosis/diagnosis.txt",
		}, map[string][]string{leaderLog: {leaderLine, redactedToken}, pluginLog: {pluginLine}}, []string{followerLine, leaderOldLine})
		if got := files["diagnosis/diagnosis.json"]; !strings.Contains(got, `"stage": "S2"`) {
			t.Errorf("diagnosis/diagnosis.json is not the pod's diagnosis at S2:\n%s", got)
		}
		if got := files["diagnosis/diagnosis.txt"]; !strings.HasPrefix(got, "Pod "+ns+"/"+pod.Name+": ") {
			t.Errorf("diagnosis/diagnosis.txt is not the pod's diagnosis:\n%.400s", got)
		}
	})
	// The bundles asked the kubelet for the leader's and the plugin's logs, the last LogLines
	// lines, and never for a follower's.
	reqs := kubelet.Requests()
	t.Logf("kubelet log requests: %q", reqs)
	wantTail := "/containerLogs/" + ns + "/" + leader.Name + "/" + ext + "?"
	if !slices.ContainsFunc(reqs, func(r string) bool { return strings.HasPrefix(r, wantTail) && strings.Contains(r, "tailLines=2") }) {
		t.Errorf("no request %stailLines=2… among %q", wantTail, reqs)
	}
	if slices.ContainsFunc(reqs, func(r string) bool { return strings.Contains(r, "/"+follower.Name+"/") }) {
		t.Errorf("the follower %s's log was asked for: %q", follower.Name, reqs)
	}
}

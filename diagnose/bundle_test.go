package diagnose_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/diagnose"
)

// Secrets in the bundle's fixtures: none may appear in a bundle.
const (
	secretValue    = "c3VwZXJzZWNyZXQtcGFzc3dvcmQ="                             // a Secret's data
	kubeToken      = "sha256~Zm9vYmFyYmF6cXV4LXRoaXMtaXMtYS10b2tlbg"            // token: in a kubeconfig
	clientKeyData  = "LS0tLS1CRUdJTiBSU0EgUFJJVkFURSBLRVktLS0tLQpNSUlFb3dJQkFB" // client-key-data:
	caBundleValue  = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUREekNDQWZlZ0F3"
	logBearer      = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW0ifQ.c2lnbmF0dXJl"
	pemBody        = "MIIDDzCCAfegAwIBAgIUQm9ndXNDZXJ0aWZpY2F0ZUJvZHk"
	leaderName     = "hami-scheduler-7d9f8b6c5-lead1"
	followerName   = "hami-scheduler-7d9f8b6c5-follo"
	bundleTestPod  = "train"
	bundleTestNode = "gpu-1"
)

// schedulerConfigMap is HAMi's KubeSchedulerConfiguration with a kubeconfig beside it.
func schedulerConfigMap() *corev1.ConfigMap {
	kubeconfig := "apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n    certificate-authority-data: " + caBundleValue +
		"\n    server: https://10.0.0.1:6443\n  name: c\nusers:\n- name: u\n  user:\n    token: " + kubeToken +
		"\n    client-key-data: " + clientKeyData + "\n"
	pem := "-----BEGIN CERTIFICATE-----\n" + pemBody + "\n-----END CERTIFICATE-----\n"
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: diagnose.DefaultSchedulerConfigMap, Namespace: ns},
		Data: map[string]string{
			"config.yaml": "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nextenders:\n- urlPrefix: https://127.0.0.1:443\n  filterVerb: filter\n",
			"kubeconfig":  kubeconfig,
			"ca.crt":      pem,
		}}
}

func hamiWebhook() *admissionregistrationv1.MutatingWebhookConfiguration {
	return &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: diagnose.DefaultWebhook},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{Name: "vgpu.hami.io",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{CABundle: []byte("-----BEGIN CERTIFICATE-----\n" + pemBody + "\n-----END CERTIFICATE-----\n"),
				Service: &admissionregistrationv1.ServiceReference{Namespace: ns, Name: "hami-scheduler"}}}}}
}

func bundleSchedulerPod(name string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
		Labels: map[string]string{"app.kubernetes.io/component": "hami-scheduler"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "kube-scheduler"}, {Name: diagnose.DefaultExtenderContainer}}}}
}

func gpuPod() *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: bundleTestPod, Namespace: "default", UID: "uid-train",
		Annotations:   map[string]string{allocation.KeyNode: bundleTestNode},
		ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply}}},
		Spec: corev1.PodSpec{SchedulerName: "hami-scheduler", Containers: []corev1.Container{{Name: "cuda",
			Env: []corev1.EnvVar{{Name: "HF_TOKEN", Value: secretValue}, {Name: "CUDA_DISABLE_CONTROL", Value: "true"}}}}}}
}

func event(name, namespace, kind, object, message string) *corev1.Event {
	return &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		InvolvedObject: corev1.ObjectReference{Kind: kind, Name: object, Namespace: namespace},
		Message:        message, LastTimestamp: metav1.NewTime(now.Add(-time.Minute))}
}

// bundleObjects is a complete installation around the pod default/train on gpu-1, with a
// Secret beside it that the bundle must not hold.
func bundleObjects() []runtime.Object {
	objs := healthyObjects(bundleTestNode)
	objs = without(objs, func(o runtime.Object) bool {
		p, ok := o.(*corev1.Pod)
		return ok && p.Name == schedulerPod().Name
	})
	objs = replace(objs, lease(leaderName+"_2b1c0f7e-5f1d-4e7a-9a57-0c3f1f0b6d11", now.Add(-2*time.Second)))
	return append(objs, runningPod("gpu-2"), bundleSchedulerPod(leaderName), bundleSchedulerPod(followerName),
		schedulerConfigMap(), hamiWebhook(), gpuPod(),
		event("train.1", "default", "Pod", bundleTestPod, "0/2 nodes are available"),
		event("other.1", "default", "Pod", "other", "an event of another pod"),
		event("gpu-1.1", "default", "Node", bundleTestNode, "Node gpu-1 status is now: NodeReady"),
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "hami-scheduler-tls", Namespace: ns},
			Data: map[string][]byte{"tls.key": []byte(secretValue)}, StringData: map[string]string{"password": secretValue}},
	)
}

// pluginLog makes the device plugin's log hold a bearer token.
func pluginLog(c *fake.Clientset) {
	c.PrependReactor("get", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		g, ok := a.(k8stesting.GenericAction)
		if !ok || a.GetSubresource() != "log" {
			return false, nil, nil
		}
		if o, _ := g.GetValue().(*corev1.PodLogOptions); o != nil && o.Container == diagnose.DefaultPluginContainer {
			return true, &runtime.Unknown{Raw: []byte("I1130 register.go:93] patching node\nAuthorization: Bearer " + logBearer + "\n")}, nil
		}
		return false, nil, nil
	})
}

// forbid makes get on the resource (and subresource) forbidden.
func forbid(c *fake.Clientset, resource, subresource string) {
	const verb = "get"
	c.PrependReactor(verb, resource, func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != subresource {
			return false, nil, nil
		}
		gr := schema.GroupResource{Resource: resource}
		if subresource != "" {
			gr.Resource += "/" + subresource
		}
		return true, nil, apierrors.NewForbidden(gr, "", errors.New(`User "doctor" cannot `+verb+" "+gr.Resource))
	})
}

func bundleOptions() diagnose.BundleOptions {
	return diagnose.BundleOptions{Options: opts(), Files: []diagnose.BundleFile{{Name: "report.txt", Data: []byte("P3 no node fits\n")}}}
}

// readBundle opens the archive: file contents by path under the root, and the paths in
// archive order.
func readBundle(t *testing.T, data []byte, root string) (map[string]string, []string) {
	t.Helper()
	gz, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	files := map[string]string{}
	var order []string
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(h.Name, root+"/") {
			t.Fatalf("%s is outside the root %s", h.Name, root)
		}
		if h.Typeflag == tar.TypeDir {
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		rel := strings.TrimPrefix(h.Name, root+"/")
		files[rel] = string(b)
		order = append(order, rel)
	}
	return files, order
}

// A bundle about a pod holds the pod, its node, their Events, HAMi's objects, the node's
// plugin log and the leader's log, the caller's files and the index, in a fixed order,
// and no secret.
func TestWriteBundlePod(t *testing.T) {
	t.Parallel()
	c := fakeClient(true, bundleObjects()...)
	pluginLog(c)
	var buf bytes.Buffer
	idx, err := diagnose.WriteBundle(t.Context(), c, diagnose.BundleTarget{Namespace: "default", Pod: bundleTestPod}, &buf, bundleOptions())
	if err != nil {
		t.Fatal(err)
	}
	root := "hami-doctor-pod-default-train-20261130-120000"
	if idx.Root != root || idx.Target.Node != bundleTestNode || !idx.Created.Equal(now) {
		t.Errorf("index root %q, target %+v, created %v", idx.Root, idx.Target, idx.Created)
	}
	files, order := readBundle(t, buf.Bytes(), root)
	want := []string{
		"index.txt",
		"index.json",
		"configmaps/kube-system/hami-scheduler-newversion.yaml",
		"daemonsets/kube-system/hami-device-plugin.yaml",
		"deployments/kube-system/hami-scheduler.yaml",
		"diagnosis/report.txt",
		"events/nodes/gpu-1.yaml",
		"events/pods/default/train.yaml",
		"leases/kube-system/hami-scheduler.yaml",
		"logs/kube-system/hami-device-plugin-gpu-1/device-plugin.log",
		"logs/kube-system/" + leaderName + "/vgpu-scheduler-extender.log",
		"mutatingwebhookconfigurations/hami-webhook.yaml",
		"nodes/gpu-1.yaml",
		"pods/default/train.yaml",
		"pods/kube-system/hami-device-plugin-gpu-1.yaml",
		"pods/kube-system/" + leaderName + ".yaml",
	}
	if !slices.Equal(order, want) {
		t.Errorf("files\n%s\nwant\n%s", strings.Join(order, "\n"), strings.Join(want, "\n"))
	}
	for i, f := range idx.Files {
		if i >= len(want) || f != root+"/"+want[i] {
			t.Errorf("index file %d %q", i, f)
		}
	}
	if len(idx.Missing) != 0 {
		t.Errorf("missing: %q", idx.Missing)
	}
	if got := files["logs/kube-system/"+leaderName+"/vgpu-scheduler-extender.log"]; got != "fake logs" {
		t.Errorf("leader log %q", got)
	}
	checks := []struct{ file, has, lacks string }{
		{"pods/default/train.yaml", "kind: Pod", "managedFields"},
		{"pods/default/train.yaml", "schedulerName: hami-scheduler", ""},
		{"pods/default/train.yaml", "- name: HF_TOKEN\n      value: '[REDACTED]'", ""},
		{"pods/default/train.yaml", "- name: CUDA_DISABLE_CONTROL\n      value: \"true\"", ""},
		{"events/pods/default/train.yaml", "0/2 nodes are available", "another pod"},
		{"events/nodes/gpu-1.yaml", "NodeReady", "0/2 nodes"},
		{"configmaps/kube-system/hami-scheduler-newversion.yaml", "token: [REDACTED]", kubeToken},
		{"configmaps/kube-system/hami-scheduler-newversion.yaml", "client-key-data: [REDACTED]", clientKeyData},
		{"configmaps/kube-system/hami-scheduler-newversion.yaml", "certificate-authority-data: [REDACTED]", caBundleValue},
		{"configmaps/kube-system/hami-scheduler-newversion.yaml", "[REDACTED PEM BLOCK]", pemBody},
		{"configmaps/kube-system/hami-scheduler-newversion.yaml", "urlPrefix: https://127.0.0.1:443", ""},
		{"mutatingwebhookconfigurations/hami-webhook.yaml", "caBundle: [REDACTED]", "LS0t"},
		{"logs/kube-system/hami-device-plugin-gpu-1/device-plugin.log", "Authorization: Bearer [REDACTED]", logBearer},
		{"diagnosis/report.txt", "P3 no node fits", ""},
		{"index.txt", "target: pod default/train (node gpu-1)", ""},
		{"index.txt", "not collected: nothing", ""},
		{"index.txt", "  " + root + "/nodes/gpu-1.yaml\n", ""},
	}
	for _, c := range checks {
		got, ok := files[c.file]
		if !ok {
			t.Errorf("no %s", c.file)
			continue
		}
		if c.has != "" && !strings.Contains(got, c.has) {
			t.Errorf("%s lacks %q:\n%s", c.file, c.has, got)
		}
		if c.lacks != "" && strings.Contains(got, c.lacks) {
			t.Errorf("%s holds %q:\n%s", c.file, c.lacks, got)
		}
	}
	for name, content := range files {
		for _, secret := range []string{secretValue, "hami-scheduler-tls", "-----BEGIN"} {
			if strings.Contains(content, secret) {
				t.Errorf("%s holds %q", name, secret)
			}
		}
	}
	var fromJSON diagnose.BundleIndex
	if err := json.Unmarshal([]byte(files["index.json"]), &fromJSON); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(fromJSON.Files, idx.Files) || fromJSON.Target != idx.Target {
		t.Errorf("index.json %+v, returned %+v", fromJSON, idx)
	}
}

// What may not be read is a line of the index, with the rule to grant, not an error; without
// the Lease the leader is unknown, so every scheduler Pod's log is wanted instead.
func TestWriteBundleMissing(t *testing.T) {
	t.Parallel()
	c := fakeClient(true, bundleObjects()...)
	forbid(c, "pods", "log")
	forbid(c, "leases", "")
	forbid(c, "mutatingwebhookconfigurations", "")
	var buf bytes.Buffer
	idx, err := diagnose.WriteBundle(t.Context(), c, diagnose.BundleTarget{Node: bundleTestNode}, &buf, bundleOptions())
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		`pods/log kube-system/hami-device-plugin-gpu-1 container device-plugin: pods/log is forbidden: User "doctor" cannot get pods/log (grant get pods/log)`,
		`leases kube-system/hami-scheduler: `,
		`mutatingwebhookconfigurations hami-webhook: `,
		`the leader scheduler Pod: the Lease could not be read (` + followerName + `, ` + leaderName + `); the logs of 2 scheduler Pod(s) are collected instead`,
		`pods/log kube-system/` + followerName + ` container vgpu-scheduler-extender: `,
		`pods/log kube-system/` + leaderName + ` container vgpu-scheduler-extender: `,
	}
	t.Logf("missing:\n%s", strings.Join(idx.Missing, "\n"))
	for _, w := range want {
		if !slices.ContainsFunc(idx.Missing, func(m string) bool { return strings.HasPrefix(m, w) }) {
			t.Errorf("missing lacks %q:\n%s", w, strings.Join(idx.Missing, "\n"))
		}
	}
	for _, m := range idx.Missing {
		resource, _, _ := strings.Cut(m, " ")
		if strings.Contains(m, "forbidden") && !strings.HasSuffix(m, "(grant get "+resource+")") {
			t.Errorf("no rule to grant: %q", m)
		}
	}
	files, _ := readBundle(t, buf.Bytes(), idx.Root)
	for name := range files {
		if strings.HasPrefix(name, "logs/") || strings.HasPrefix(name, "leases/") {
			t.Errorf("bundle holds %s", name)
		}
	}
	for _, p := range []string{"nodes/gpu-1.yaml", "events/nodes/gpu-1.yaml", "pods/kube-system/" + leaderName + ".yaml", "pods/kube-system/" + followerName + ".yaml"} {
		if _, ok := files[p]; !ok {
			t.Errorf("no %s", p)
		}
	}
	if _, ok := files["pods/default/train.yaml"]; ok {
		t.Error("a node bundle holds a pod that is not HAMi's")
	}
	for _, m := range idx.Missing {
		if !strings.Contains(files["index.txt"], "  "+m+"\n") {
			t.Errorf("index.txt lacks %q", m)
		}
	}
}

type failingWriter struct{}

var errDiskFull = errors.New("disk full")

func (failingWriter) Write([]byte) (int, error) { return 0, errDiskFull }

// WriteBundle fails only when the target cannot be read, the input is invalid or w fails.
func TestWriteBundleErrors(t *testing.T) {
	t.Parallel()
	forbidden := fakeClient(true, bundleObjects()...)
	forbid(forbidden, "pods", "")
	tests := map[string]struct {
		client *fake.Clientset
		target diagnose.BundleTarget
		files  []diagnose.BundleFile
		w      io.Writer
		want   error
	}{
		"node not found":   {target: diagnose.BundleTarget{Node: "gpu-9"}, want: diagnose.ErrNodeNotFound},
		"pod not found":    {target: diagnose.BundleTarget{Namespace: "default", Pod: "gone"}, want: diagnose.ErrPodNotFound},
		"pod forbidden":    {client: forbidden, target: diagnose.BundleTarget{Namespace: "default", Pod: bundleTestPod}, want: diagnose.ErrAPI},
		"no target":        {want: diagnose.ErrInvalidOptions},
		"pod without ns":   {target: diagnose.BundleTarget{Pod: bundleTestPod}, want: diagnose.ErrInvalidOptions},
		"file outside":     {target: diagnose.BundleTarget{Node: bundleTestNode}, files: []diagnose.BundleFile{{Name: "../x"}}, want: diagnose.ErrInvalidOptions},
		"file absolute":    {target: diagnose.BundleTarget{Node: bundleTestNode}, files: []diagnose.BundleFile{{Name: "/etc/x"}}, want: diagnose.ErrInvalidOptions},
		"file twice":       {target: diagnose.BundleTarget{Node: bundleTestNode}, files: []diagnose.BundleFile{{Name: "a"}, {Name: "a"}}, want: diagnose.ErrInvalidOptions},
		"writer fails":     {target: diagnose.BundleTarget{Node: bundleTestNode}, w: failingWriter{}, want: errDiskFull},
		"invalid selector": {target: diagnose.BundleTarget{Node: bundleTestNode}, want: diagnose.ErrInvalidOptions},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			client := tc.client
			if client == nil {
				client = fakeClient(true, bundleObjects()...)
			}
			w := tc.w
			var buf bytes.Buffer
			if w == nil {
				w = &buf
			}
			o := diagnose.BundleOptions{Options: opts(), Files: tc.files}
			if name == "invalid selector" {
				o.PluginSelector = "a=b=c"
			}
			_, err := diagnose.WriteBundle(t.Context(), client, tc.target, w, o)
			if !errors.Is(err, tc.want) {
				t.Fatalf("error %v, want %v", err, tc.want)
			}
			if buf.Len() != 0 {
				t.Errorf("%d bytes written on error", buf.Len())
			}
		})
	}
}

// The same cluster at the same time gives the same bytes.
func TestWriteBundleDeterministic(t *testing.T) {
	t.Parallel()
	var a, b bytes.Buffer
	for _, buf := range []*bytes.Buffer{&a, &b} {
		if _, err := diagnose.WriteBundle(t.Context(), fakeClient(true, bundleObjects()...), diagnose.BundleTarget{Namespace: "default", Pod: bundleTestPod}, buf, bundleOptions()); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Error("two bundles of the same cluster differ")
	}
}

// A pod that names no node gives a bundle without node, with the reason in the index; a
// negative LogLines collects no log.
func TestWriteBundleUnboundPodNoLogs(t *testing.T) {
	t.Parallel()
	p := gpuPod()
	p.Annotations = nil
	o := bundleOptions()
	o.LogLines = -1
	var buf bytes.Buffer
	idx, err := diagnose.WriteBundle(t.Context(), fakeClient(true, replace(bundleObjects(), p)...), diagnose.BundleTarget{Namespace: "default", Pod: bundleTestPod}, &buf, o)
	if err != nil {
		t.Fatal(err)
	}
	if idx.Target.Node != "" {
		t.Errorf("node %q", idx.Target.Node)
	}
	files, _ := readBundle(t, buf.Bytes(), idx.Root)
	for name := range files {
		if strings.HasPrefix(name, "nodes/") || strings.HasPrefix(name, "logs/") {
			t.Errorf("bundle holds %s", name)
		}
	}
	for _, w := range []string{"nodes: pod default/train names no node", "pods/log kube-system/" + leaderName + ": log collection disabled"} {
		if !slices.ContainsFunc(idx.Missing, func(m string) bool { return strings.HasPrefix(m, w) }) {
			t.Errorf("missing lacks %q: %q", w, idx.Missing)
		}
	}
}

// The bundle's rules only read, and never Secrets.
func TestBundleClusterRoleRules(t *testing.T) {
	t.Parallel()
	for _, r := range diagnose.BundleClusterRoleRules() {
		for _, res := range r.Resources {
			if res == "secrets" || res == "*" {
				t.Errorf("rule on %s", res)
			}
		}
		for _, v := range r.Verbs {
			if v != "get" && v != "list" {
				t.Errorf("verb %s on %v", v, r.Resources)
			}
		}
	}
}

func TestBundleTargetRoot(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 30, 13, 4, 5, 0, time.FixedZone("CET", 3600))
	for target, want := range map[diagnose.BundleTarget]string{
		{Node: "gpu-1"}:                            "hami-doctor-node-gpu-1-20261130-120405",
		{Namespace: "ml", Pod: "train-0"}:          "hami-doctor-pod-ml-train-0-20261130-120405",
		{Namespace: "ml", Pod: "a/b c"}:            "hami-doctor-pod-ml-a_b_c-20261130-120405",
		{Node: "gpu-1", Namespace: "ml", Pod: "p"}: "hami-doctor-pod-ml-p-20261130-120405",
	} {
		if got := target.Root(at); got != want {
			t.Errorf("%v: %q, want %q", target, got, want)
		}
	}
}

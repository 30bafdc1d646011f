package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/yaml"

	"github.com/hamireg/hamireg/diagnose"
	"github.com/hamireg/hamireg/nodelock"
)

// kubeconfig writes a kubeconfig with contexts ctx-a (namespace team-a, current) and ctx-b
// (namespace team-b); the fake clientset never dials its server.
func kubeconfig(t *testing.T) string {
	t.Helper()
	const cfg = `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:1"}
users:
- name: u
  user: {token: x}
contexts:
- name: ctx-a
  context: {cluster: c, user: u, namespace: team-a}
- name: ctx-b
  context: {cluster: c, user: u, namespace: team-b}
current-context: ctx-a
`
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func gpuPod(ns, name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + name)},
		Spec: corev1.PodSpec{SchedulerName: "default-scheduler", Containers: []corev1.Container{{
			Name:      "cuda",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}},
		}}},
		Status: corev1.PodStatus{Phase: corev1.PodPending},
	}
}

// harness runs the CLI against a fake clientset; seen records the kubectl flags connect got.
type harness struct {
	client kubernetes.Interface
	api    diagnoseAPI
	seen   *genericclioptions.ConfigFlags
	argv0  string
}

func newHarness(objs ...runtime.Object) *harness {
	return &harness{client: fake.NewClientset(objs...), api: defaultAPI(), argv0: "doctor"}
}

func (h *harness) run(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errb bytes.Buffer
	c := newCLI(t.Context(), h.argv0, strings.NewReader(""), &out, &errb)
	c.connect = func(f *genericclioptions.ConfigFlags) (kubernetes.Interface, error) {
		h.seen = f
		return h.client, nil
	}
	c.api = h.api
	code = c.run(args)
	return out.String(), errb.String(), code
}

func TestCommandName(t *testing.T) {
	t.Parallel()
	for argv0, want := range map[string]string{
		"/home/u/bin/kubectl-hami_doctor": "kubectl hami-doctor",
		"kubectl-hami_doctor.exe":         "kubectl hami-doctor",
		"./doctor":                        "doctor",
		"/tmp/go-build1/exe/doctor":       "doctor",
	} {
		if got := commandName(argv0); got != want {
			t.Errorf("commandName(%q) = %q, want %q", argv0, got, want)
		}
	}
}

func TestUsageAsKubectlPlugin(t *testing.T) {
	t.Parallel()
	h := newHarness()
	h.argv0 = "/usr/local/bin/kubectl-hami_doctor"
	out, _, code := h.run(t, "help")
	if code != 0 || !strings.Contains(out, "kubectl hami-doctor pod [NAMESPACE/]NAME") || strings.Contains(out, "\n  doctor ") {
		t.Errorf("exit %d, usage:\n%s", code, out)
	}
	_, errOut, code := h.run(t, "pod")
	if code != exitError || !strings.Contains(errOut, "kubectl hami-doctor pod: no pod name given") {
		t.Errorf("exit %d, stderr %q", code, errOut)
	}
	out, errOut, code = h.run(t, "pod", "-h")
	if code != exitHealthy || errOut != "" {
		t.Errorf("pod -h: exit %d, stderr %q; want help on stdout and exit 0", code, errOut)
	}
	for _, want := range []string{"kubectl hami-doctor pod NAMESPACE/NAME", "--kubeconfig", "--context", "-n, --namespace", "--as ", "--as-group", "--request-timeout", "--hami-namespace", "-o, --output"} {
		if !strings.Contains(out, want) {
			t.Errorf("pod -h lacks %q:\n%s", want, out)
		}
	}
}

func TestPodFlags(t *testing.T) {
	t.Parallel()
	kc := kubeconfig(t)
	tests := map[string]struct {
		args []string
		code int // -1: a diagnosis (0 or 1)
		want string
	}{
		"NS/NAME":                {args: []string{"pod", "team-b/train"}, code: -1, want: "Pod team-b/train:"},
		"-n":                     {args: []string{"pod", "train", "-n", "team-b"}, code: -1, want: "Pod team-b/train:"},
		"--namespace after name": {args: []string{"pod", "--namespace=team-b", "train"}, code: -1, want: "Pod team-b/train:"},
		"--context":              {args: []string{"pod", "train", "--context", "ctx-b"}, code: -1, want: "Pod team-b/train:"},
		"current context":        {args: []string{"pod", "train"}, code: exitError, want: "get pod team-a/train: pod not found"},
		"-n disagrees":           {args: []string{"pod", "team-b/train", "-n", "team-a"}, code: exitError, want: "but -n says team-a"},
		"bad target":             {args: []string{"pod", "team-b/"}, code: exitError, want: "give NAME or NAMESPACE/NAME"},
		"two names":              {args: []string{"pod", "a", "b"}, code: exitError, want: "unexpected arguments"},
		"bad output":             {args: []string{"pod", "team-b/train", "-o", "wide"}, code: exitError, want: `unknown output format "wide"`},
		"unknown flag":           {args: []string{"pod", "team-b/train", "--bogus"}, code: exitError, want: "unknown flag: --bogus"},
		"pods -n and -A":         {args: []string{"pods", "-A", "-n", "x"}, code: exitError, want: "not both"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(gpuPod("team-b", "train"))
			out, errOut, code := h.run(t, append(tc.args, "--kubeconfig", kc)...)
			if (tc.code == -1 && code == exitError) || (tc.code != -1 && code != tc.code) {
				t.Errorf("exit %d, want %d\n%s%s", code, tc.code, out, errOut)
			}
			if !strings.Contains(out+errOut, tc.want) {
				t.Errorf("output lacks %q:\n%s%s", tc.want, out, errOut)
			}
		})
	}
}

func TestKubectlFlagsReachConnect(t *testing.T) {
	t.Parallel()
	h := newHarness(gpuPod("team-b", "train"))
	_, errOut, code := h.run(t, "pod", "team-b/train", "--kubeconfig", kubeconfig(t), "--context", "ctx-b", "--as", "alice", "--as-group", "ops", "--request-timeout", "5s", "--hami-namespace", "hami-system")
	if code == exitError {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if *h.seen.Context != "ctx-b" || *h.seen.Impersonate != "alice" || len(*h.seen.ImpersonateGroup) != 1 || *h.seen.Timeout != "5s" {
		t.Errorf("connect got context %q, as %q, groups %v, timeout %q", *h.seen.Context, *h.seen.Impersonate, *h.seen.ImpersonateGroup, *h.seen.Timeout)
	}
}

func TestPodOutputs(t *testing.T) {
	t.Parallel()
	kc := kubeconfig(t)
	h := newHarness(gpuPod("team-b", "train"))
	out, errOut, code := h.run(t, "pod", "team-b/train", "--kubeconfig", kc)
	if code == exitError {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"Pod team-b/train: ", "phase", "Pending", "stage", "case"} {
		if !strings.Contains(out, want) {
			t.Errorf("text lacks %q:\n%s", want, out)
		}
	}
	for _, format := range []string{"json", "yaml"} {
		out, errOut, _ := h.run(t, "pod", "team-b/train", "--kubeconfig", kc, "-o", format)
		var r diagnose.PodReport
		if err := yaml.Unmarshal([]byte(out), &r); err != nil || r.Namespace != "team-b" || r.Name != "train" || r.Phase != "Pending" {
			t.Errorf("-o %s: %v, report %+v\n%s%s", format, err, r, out, errOut)
		}
	}
}

func TestPods(t *testing.T) {
	t.Parallel()
	kc := kubeconfig(t)
	running := gpuPod("team-a", "done")
	running.Status.Phase = corev1.PodRunning
	h := newHarness(gpuPod("team-b", "train"), gpuPod("team-a", "eval"), running)

	out, errOut, code := h.run(t, "pods", "-A", "--kubeconfig", kc)
	if code == exitError || !strings.Contains(out, "NAMESPACE  NAME") || !strings.Contains(out, "team-b     train  Pending") || !strings.Contains(out, "team-a     eval") || strings.Contains(out, "done") {
		t.Errorf("pods -A: exit %d\n%s%s", code, out, errOut)
	}
	out, _, _ = h.run(t, "pods", "--kubeconfig", kc, "-o", "json")
	var reports struct {
		typeMeta
		Items []diagnose.PodReport `json:"items"`
	}
	if err := json.Unmarshal([]byte(out), &reports); err != nil || reports.Kind != kindPodReportList || len(reports.Items) != 1 || reports.Items[0].Name != "eval" {
		t.Errorf("pods in the context's namespace team-a: %v %+v", err, reports)
	}
	out, _, code = h.run(t, "pods", "-n", "empty", "--kubeconfig", kc)
	if code != exitHealthy || !strings.Contains(out, "No GPU pod in namespace empty") {
		t.Errorf("empty namespace: exit %d\n%s", code, out)
	}
	out, _, _ = h.run(t, "pods", "-n", "empty", "--kubeconfig", kc, "-o", "yaml")
	if strings.TrimSpace(out) != "apiVersion: "+apiVersion+"\nitems: []\nkind: PodReportList" {
		t.Errorf("empty yaml %q", out)
	}
}

// fakeLocks is a diagnoseAPI with one lock per node and a record of removals.
func fakeLocks(locks map[string]diagnose.LockState, removed *[]string) diagnoseAPI {
	api := defaultAPI()
	api.lockOf = func(_ context.Context, _ kubernetes.Interface, node string, _ diagnose.Options) (*diagnose.LockState, error) {
		l, ok := locks[node]
		if !ok {
			return nil, diagnose.ErrNoLock
		}
		return &l, nil
	}
	api.removeStaleLock = func(_ context.Context, _ kubernetes.Interface, shown diagnose.LockState, _ diagnose.Options) error {
		if locks[shown.Node].Value != shown.Value {
			return diagnose.ErrNotStale
		}
		*removed = append(*removed, shown.Node+"="+shown.Value)
		return nil
	}
	return api
}

func TestUnlock(t *testing.T) {
	t.Parallel()
	kc := kubeconfig(t)
	locks := map[string]diagnose.LockState{
		"gpu-1": {Node: "gpu-1", Value: "2026-12-02T06:00:00Z,team-a,gone", Holder: "team-a/gone", Stale: "its holder team-a/gone does not exist", AgeSeconds: 90},
		"gpu-2": {Node: "gpu-2", Value: "2026-12-02T06:00:00Z,team-a,busy", Holder: "team-a/busy", HolderExists: true, HolderNode: "gpu-2", HolderBindPhase: "allocating"},
	}
	tests := map[string]struct {
		args    []string
		code    int
		want    []string
		removed int
	}{
		"dry run":   {args: []string{"unlock", "gpu-1"}, code: 0, want: []string{`hami.io/mutex.lock = "2026-12-02T06:00:00Z,team-a,gone"`, "Holder   team-a/gone", "Stale    its holder team-a/gone does not exist", "Nothing written", "doctor unlock gpu-1 --yes"}},
		"yes":       {args: []string{"unlock", "gpu-1", "--yes"}, code: 0, want: []string{`Removed hami.io/mutex.lock "2026-12-02T06:00:00Z,team-a,gone" from node gpu-1.`}, removed: 1},
		"live lock": {args: []string{"unlock", "gpu-2", "--yes"}, code: 1, want: []string{"Refused: node lock is not stale", "holder team-a/busy (on node gpu-2, bind-phase allocating)"}},
		"no lock":   {args: []string{"unlock", "gpu-3"}, code: 1, want: []string{"Refused: node has no lock"}},
		"json":      {args: []string{"unlock", "gpu-1", "-o", "json"}, code: 0, want: []string{`"dryRun": true`, `"removed": false`, `"holder": "team-a/gone"`}},
		"yaml yes":  {args: []string{"unlock", "gpu-1", "--yes", "-o", "yaml"}, code: 0, want: []string{"removed: true", "dryRun: false"}, removed: 1},
		"no node":   {args: []string{"unlock"}, code: 2, want: []string{"no node name given"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var removed []string
			h := newHarness()
			h.api = fakeLocks(locks, &removed)
			out, errOut, code := h.run(t, append(tc.args, "--kubeconfig", kc)...)
			if code != tc.code {
				t.Errorf("exit %d, want %d\n%s%s", code, tc.code, out, errOut)
			}
			for _, w := range tc.want {
				if !strings.Contains(out+errOut, w) {
					t.Errorf("output lacks %q:\n%s%s", w, out, errOut)
				}
			}
			if len(removed) != tc.removed {
				t.Errorf("removed %v, want %d removal(s)", removed, tc.removed)
			}
		})
	}
}

// TestUnlockOnTheClientset runs unlock with package diagnose's LockOf and RemoveStaleLock
// on a node whose lock names a pod that is gone.
func TestUnlockOnTheClientset(t *testing.T) {
	t.Parallel()
	kc := kubeconfig(t)
	value := nodelock.NewLock(time.Now().Add(-time.Minute), types.NamespacedName{Namespace: "team-a", Name: "gone"}).String()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1", Annotations: map[string]string{nodelock.Key: value}}}
	h := newHarness(node, gpuPod("team-a", "live"))

	out, errOut, code := h.run(t, "unlock", "gpu-1", "--kubeconfig", kc)
	if code != 0 || !strings.Contains(out, "Holder   team-a/gone") || !strings.Contains(out, "Stale    its holder pod team-a/gone no longer exists") || !strings.Contains(out, "Nothing written") {
		t.Errorf("dry run: exit %d\n%s%s", code, out, errOut)
	}
	if n, _ := h.client.CoreV1().Nodes().Get(t.Context(), "gpu-1", metav1.GetOptions{}); n.Annotations[nodelock.Key] != value {
		t.Fatalf("the dry run changed the lock: %v", n.Annotations)
	}
	out, errOut, code = h.run(t, "unlock", "gpu-1", "--yes", "--kubeconfig", kc)
	if code != 0 || !strings.Contains(out, "Removed hami.io/mutex.lock "+strconv.Quote(value)+" from node gpu-1.") {
		t.Errorf("--yes: exit %d\n%s%s", code, out, errOut)
	}
	if n, _ := h.client.CoreV1().Nodes().Get(t.Context(), "gpu-1", metav1.GetOptions{}); n.Annotations[nodelock.Key] != "" {
		t.Errorf("the lock stayed: %v", n.Annotations)
	}
	out, _, code = h.run(t, "unlock", "gpu-1", "--yes", "--kubeconfig", kc)
	if code != exitCase || !strings.Contains(out, "Refused: ") || !strings.Contains(out, "has no lock") {
		t.Errorf("no lock: exit %d\n%s", code, out)
	}
	_, errOut, code = h.run(t, "unlock", "gpu-9", "--kubeconfig", kc)
	if code != exitError || !strings.Contains(errOut, "gpu-9") {
		t.Errorf("unknown node: exit %d %q", code, errOut)
	}
}

// TestBundleOnTheClientset writes a real bundle of a pod with package diagnose's WriteBundle.
func TestBundleOnTheClientset(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "pod.tar.gz")
	h := newHarness(gpuPod("team-b", "train"))
	out, errOut, code := h.run(t, "bundle", "team-b/train", "-f", file, "--kubeconfig", kubeconfig(t), "-o", "yaml")
	var res bundleResult
	if err := yaml.Unmarshal([]byte(out), &res); err != nil || code != 0 || res.File != file {
		t.Fatalf("exit %d %v %+v\n%s%s", code, err, res, out, errOut)
	}
	var diagnosis bool
	for _, f := range res.Files {
		diagnosis = diagnosis || strings.HasSuffix(f, "diagnosis.json")
	}
	if !diagnosis {
		t.Errorf("files %v lack diagnosis.json", res.Files)
	}
	if st, err := os.Stat(file); err != nil || st.Size() == 0 {
		t.Errorf("bundle file: %v", err)
	}
}

func TestBundle(t *testing.T) {
	t.Parallel()
	kc := kubeconfig(t)
	dir := t.TempDir()
	var got bundleTarget
	var files []bundleFile
	h := newHarness(gpuPod("team-b", "train"), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-7", Labels: map[string]string{"gpu": "on"}}})
	h.api.writeBundle = func(_ context.Context, _ kubernetes.Interface, target bundleTarget, w io.Writer, opts bundleOptions) (*bundleIndex, error) {
		got, files = target, opts.Files
		if _, err := w.Write([]byte("tar")); err != nil {
			return nil, err
		}
		return &bundleIndex{Files: []string{"index.txt", "pod.yaml", "diagnosis.txt", "diagnosis.json"}, Missing: []string{"pods/log kube-system/hami-scheduler-0: forbidden"}}, nil
	}

	file := filepath.Join(dir, "b.tar.gz")
	out, errOut, code := h.run(t, "bundle", "team-b/train", "-f", file, "--kubeconfig", kc)
	if code != 0 || !strings.Contains(out, "Wrote "+file+": 4 file(s)") || !strings.Contains(out, "missing: pods/log kube-system/hami-scheduler-0: forbidden") {
		t.Errorf("exit %d\n%s%s", code, out, errOut)
	}
	if got != (bundleTarget{Namespace: "team-b", Pod: "train"}) || len(files) != 2 || !strings.Contains(string(files[0].Data), "Pod team-b/train:") || !json.Valid(files[1].Data) {
		t.Errorf("target %+v, files %d", got, len(files))
	}
	if b, err := os.ReadFile(file); err != nil || string(b) != "tar" {
		t.Errorf("bundle file: %q %v", b, err)
	}
	_, errOut, code = h.run(t, "bundle", "team-b/train", "-f", file, "--kubeconfig", kc)
	if code != exitError || !strings.Contains(errOut, "give another -f FILE") {
		t.Errorf("existing file: exit %d %q", code, errOut)
	}

	out, errOut, code = h.run(t, "bundle", "gpu-7", "-f", filepath.Join(dir, "n.tar.gz"), "--kubeconfig", kc, "-o", "json")
	var res bundleResult
	if err := json.Unmarshal([]byte(out), &res); err != nil || code != 0 || len(res.Files) != 4 || len(res.Missing) != 1 || got.Node != "gpu-7" {
		t.Errorf("node bundle: exit %d %v %+v %s", code, err, res, errOut)
	}
	if !strings.Contains(string(files[0].Data), "Node gpu-7:") {
		t.Errorf("node diagnosis text:\n%s", files[0].Data)
	}
	_, errOut, code = h.run(t, "bundle", "team-b/missing", "-f", filepath.Join(dir, "m.tar.gz"), "--kubeconfig", kc)
	if code != exitError || !strings.Contains(errOut, "pod not found") {
		t.Errorf("missing pod: exit %d %q", code, errOut)
	}
	if _, err := os.Stat(filepath.Join(dir, "m.tar.gz")); err == nil {
		t.Error("a bundle was written for a missing pod")
	}
}

func TestBundleFileName(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 2, 7, 8, 9, 0, time.UTC)
	if got := bundleFileName(bundleTarget{Namespace: "ns", Pod: "p"}, now); got != "hami-doctor-pod-ns-p-20261202-070809.tar.gz" {
		t.Errorf("pod: %s", got)
	}
	if got := bundleFileName(bundleTarget{Node: "gpu-1"}, now); got != "hami-doctor-node-gpu-1-20261202-070809.tar.gz" {
		t.Errorf("node: %s", got)
	}
}

func TestNodeOutputs(t *testing.T) {
	t.Parallel()
	kc := kubeconfig(t)
	h := newHarness(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-7", Labels: map[string]string{"gpu": "on"},
		Annotations: map[string]string{"hami.io/node-nvidia-register": `[{"id":"GPU-a","count":10,"health":true}]`}}})
	for _, format := range []string{"json", "yaml"} {
		out, errOut, code := h.run(t, "node", "gpu-7", "--kubeconfig", kc, "-o", format)
		var r diagnose.Report
		if err := yaml.Unmarshal([]byte(out), &r); err != nil || code != exitCase || r.Node != "gpu-7" || r.Case != diagnose.CasePluginNotScheduled {
			t.Errorf("node -o %s: exit %d %v %+v %s", format, code, err, r.Case, errOut)
		}
		out, _, _ = h.run(t, "nodes", "--kubeconfig", kc, "-o", format)
		var rs struct {
			Items []diagnose.Report `json:"items"`
		}
		if err := yaml.Unmarshal([]byte(out), &rs); err != nil || len(rs.Items) != 1 {
			t.Errorf("nodes -o %s: %v %d", format, err, len(rs.Items))
		}
	}
	out, _, code := h.run(t, "nodes", "--kubeconfig", kc)
	if code != exitCase || !strings.Contains(out, "Details and fixes: doctor node NAME") {
		t.Errorf("nodes: exit %d\n%s", code, out)
	}
}

package schedplugin_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hamireg/hamireg/envtest"
	"github.com/hamireg/hamireg/envtest/proc"
	"github.com/hamireg/hamireg/extender"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// The webhook mode of examples/scheduler (`scheduler webhook`, as deploy/deployment.yaml's
// second container runs it) serves the extender package's admission webhook against the API
// server: once its caches synced (/readyz), a GPU pod's AdmissionReview is answered with a
// patch that sends it to hami-scheduler, a pod without GPUs is allowed unchanged, and the
// extender's scheduling routes are not served. It exits 0 on SIGTERM.
func TestWebhookMode(t *testing.T) {
	t.Parallel()
	bin := cp.HAMiSchedulerBinary(t)
	addr := fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t))
	sp := proc.NewSpawner()
	p, err := sp.Start(proc.Options{Name: "scheduler-webhook", Path: bin, LogPath: filepath.Join(t.TempDir(), "webhook.log"),
		Args: []string{"webhook", "--bind=" + addr, "--kubeconfig=" + cp.Kubeconfig(), "--scheduler-name=hami-scheduler", "-v=2"}})
	if err != nil {
		sp.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		defer sp.Close()
		if err := p.Stop(20 * time.Second); err != nil {
			t.Errorf("stop the webhook: %v", err)
		} else if ee := (*exec.ExitError)(nil); errors.As(p.ExitError(), &ee) {
			t.Errorf("the webhook exited with %v after SIGTERM, want 0", ee)
		}
		if t.Failed() {
			t.Logf("webhook log:\n%s", p.LogTail(60))
		}
	})
	url := "http://" + addr
	hc := &http.Client{Timeout: 5 * time.Second}
	defer hc.CloseIdleConnections()
	if err := p.WaitUntil(t.Context(), 50*time.Millisecond, envtest.Readyz(hc, url+extender.PathReadyz, "")); err != nil {
		t.Fatalf("webhook not ready: %v", err)
	}

	review := func(pod *corev1.Pod) *admissionv1.AdmissionResponse {
		t.Helper()
		raw, err := json.Marshal(pod)
		if err != nil {
			t.Fatal(err)
		}
		body, err := json.Marshal(&admissionv1.AdmissionReview{
			TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
			Request: &admissionv1.AdmissionRequest{UID: types.UID("uid-" + pod.Name), Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
				Operation: admissionv1.Create, Namespace: pod.Namespace, Object: runtime.RawExtension{Raw: raw}},
		})
		if err != nil {
			t.Fatal(err)
		}
		resp, err := hc.Post(url+extender.PathWebhook, "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		var out admissionv1.AdmissionReview
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK || out.Response == nil {
			t.Fatalf("webhook answered %d, %+v (%v)", resp.StatusCode, out.Response, err)
		}
		return out.Response
	}
	gpu := gpuPod("default", "gpu", "", "any", map[string]int64{resGPU: 1, resMem: 2000})
	r := review(gpu)
	if !r.Allowed || !strings.Contains(string(r.Patch), `"hami-scheduler"`) || !strings.Contains(string(r.Patch), "/spec/schedulerName") {
		t.Errorf("GPU pod: allowed %v, patch %s; want a patch of spec.schedulerName to hami-scheduler", r.Allowed, r.Patch)
	}
	plain := gpuPod("default", "plain", "", "any", nil)
	if r := review(plain); !r.Allowed || len(r.Patch) != 0 {
		t.Errorf("pod without GPUs: allowed %v, patch %s; want allowed unchanged", r.Allowed, r.Patch)
	}
	for _, path := range []string{extender.PathFilter, extender.PathBind} {
		resp, err := hc.Post(url+path, "application/json", strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("%s answered %d, want 404: the plugin schedules, not the extender", path, resp.StatusCode)
		}
	}
}

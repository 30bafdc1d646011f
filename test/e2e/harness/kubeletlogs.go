package harness

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// KubeletLogs is a stand-in of one node's kubelet that serves only the container log
// endpoint, GET /containerLogs/{namespace}/{pod}/{container}, which kube-apiserver's pods/log
// proxies to. Start it with [ControlPlane.ServeContainerLogs].
type KubeletLogs struct {
	// URL is the server's base address, https://127.0.0.1:<port>.
	URL string

	logs     map[string]string
	mu       sync.Mutex
	requests []string
}

// ServeContainerLogs starts an HTTPS server on 127.0.0.1 (a self-signed certificate: the
// envtest API server sets no --kubelet-certificate-authority, so it does not verify the
// kubelet's) that answers /containerLogs/{ns}/{pod}/{container} with logs["ns/pod/container"],
// honouring tailLines and limitBytes as the kubelet does, and 404 for any other path, an
// unknown container or previous=true. It then points the Node's status at it (addresses:
// InternalIP 127.0.0.1 only, daemonEndpoints.kubeletEndpoint.Port: the server's port), so
// that pods/log of the node's Pods reaches it. The server is closed when tb ends; it fails
// tb when the Node cannot be patched.
func (cp *ControlPlane) ServeContainerLogs(tb testing.TB, node string, logs map[string]string) *KubeletLogs {
	tb.Helper()
	k := &KubeletLogs{logs: logs}
	srv := httptest.NewTLSServer(http.HandlerFunc(k.serve))
	tb.Cleanup(srv.Close)
	k.URL = srv.URL
	u, err := url.Parse(srv.URL)
	if err != nil {
		tb.Fatalf("kubelet log server address %q: %v", srv.URL, err)
	}
	_, portText, err := net.SplitHostPort(u.Host)
	if err != nil {
		tb.Fatalf("kubelet log server address %q: %v", srv.URL, err)
	}
	port, err := strconv.Atoi(portText)
	if err != nil {
		tb.Fatalf("kubelet log server port %q: %v", portText, err)
	}
	// A JSON merge patch replaces the address list: no Hostname or DNS address, which the API
	// server prefers over InternalIP, is left.
	patch := fmt.Appendf(nil, `{"status":{"addresses":[{"type":"InternalIP","address":"127.0.0.1"}],"daemonEndpoints":{"kubeletEndpoint":{"Port":%d}}}}`, port)
	if _, err := cp.AdminClient().CoreV1().Nodes().Patch(tb.Context(), node, types.MergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		tb.Fatalf("point node %s at the kubelet log server: %v", node, err)
	}
	return k
}

// Requests returns the request URIs (path and query) the server received, in order.
func (k *KubeletLogs) Requests() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.requests...)
}

// serve answers one request of the API server.
func (k *KubeletLogs) serve(w http.ResponseWriter, r *http.Request) {
	k.mu.Lock()
	k.requests = append(k.requests, r.URL.RequestURI())
	k.mu.Unlock()
	key, ok := strings.CutPrefix(r.URL.Path, "/containerLogs/")
	text, found := k.logs[key]
	if !ok || r.Method != http.MethodGet || strings.Count(key, "/") != 2 || !found {
		http.Error(w, "no container log at "+r.URL.Path, http.StatusNotFound)
		return
	}
	q := r.URL.Query()
	if q.Get("previous") == "true" {
		http.Error(w, "previous terminated container not found: "+key, http.StatusNotFound)
		return
	}
	out, err := selectLog(text, q.Get("tailLines"), q.Get("limitBytes"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "text/plain")
	_, _ = w.Write([]byte(out))
}

// selectLog is what the kubelet sends of text: the last tailLines lines (all when empty or
// negative), then at most limitBytes bytes of them from the start (all when empty).
func selectLog(text, tailLines, limitBytes string) (string, error) {
	if tailLines != "" {
		n, err := strconv.Atoi(tailLines)
		if err != nil {
			return "", fmt.Errorf("tailLines %q: %w", tailLines, err)
		}
		if n >= 0 {
			lines := strings.SplitAfter(text, "\n")
			if lines[len(lines)-1] == "" {
				lines = lines[:len(lines)-1]
			}
			text = strings.Join(lines[max(0, len(lines)-n):], "")
		}
	}
	if limitBytes != "" {
		n, err := strconv.Atoi(limitBytes)
		if err != nil || n < 0 {
			return "", fmt.Errorf("limitBytes %q: want a number >= 0", limitBytes)
		}
		text = text[:min(n, len(text))]
	}
	return text, nil
}

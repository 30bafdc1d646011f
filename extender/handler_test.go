package extender

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
)

// serve sends one request to the handler and returns the status and body.
func serve(ctx context.Context, h http.Handler, method, path, body string) (int, string) {
	r := httptest.NewRequestWithContext(ctx, method, path, strings.NewReader(body))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	data, _ := io.ReadAll(w.Result().Body)
	return w.Code, string(data)
}

func TestHandler(t *testing.T) {
	t.Parallel()
	pod := `{"metadata":{"namespace":"default","name":"p","uid":"uid-p"},"spec":{"containers":[{"name":"c","resources":{"limits":{"nvidia.com/gpu":"1"}}}]}}`
	tests := map[string]struct {
		method, path, body string
		wantStatus         int
		wantBody           string // exact, or a prefix ending in "…"
	}{
		"filter": {method: "POST", path: PathFilter, body: `{"Pod":` + pod + `,"NodeNames":["n","x"]}`, wantStatus: 200,
			wantBody: `{"Nodes":null,"NodeNames":["n"],"FailedNodes":null,"FailedAndUnresolvableNodes":null,"Error":""}`},
		"filter, lower-case keys": {method: "POST", path: PathFilter, body: `{"pod":` + pod + `,"nodenames":["n"]}`, wantStatus: 200,
			wantBody: `{"Nodes":null,"NodeNames":["n"],"FailedNodes":null,"FailedAndUnresolvableNodes":null,"Error":""}`},
		"filter, not JSON": {method: "POST", path: PathFilter, body: `{"Pod":`, wantStatus: 400,
			wantBody: `{"Nodes":null,"NodeNames":null,"FailedNodes":null,"FailedAndUnresolvableNodes":null,"Error":"/filter: bad request: decode request: unexpected EOF"}`},
		"filter, no pod":     {method: "POST", path: PathFilter, body: `{"NodeNames":["n"]}`, wantStatus: 400, wantBody: `{"Nodes":null,…`},
		"filter, two values": {method: "POST", path: PathFilter, body: `{"Pod":` + pod + `} {}`, wantStatus: 400, wantBody: `{"Nodes":null,…`},
		"filter, too large": {method: "POST", path: PathFilter, body: `{"Pod":` + pod + `,"NodeNames":["` + strings.Repeat("n", 5000) + `"]}`, wantStatus: 413,
			wantBody: `{"Nodes":null,"NodeNames":null,"FailedNodes":null,"FailedAndUnresolvableNodes":null,"Error":"/filter: bad request: decode request: http: request body too large"}`},
		"filter, GET": {method: "GET", path: PathFilter, wantStatus: 405, wantBody: `{"Nodes":null,…`},
		"bind, no node": {method: "POST", path: PathBind, body: `{"PodName":"p","PodNamespace":"default"}`, wantStatus: 400,
			wantBody: `{"Error":"/bind: bad request: binding arguments need PodName, PodNamespace and Node"}`},
		"bind, unknown pod": {method: "POST", path: PathBind, body: `{"PodName":"q","PodNamespace":"default","Node":"n"}`, wantStatus: 200,
			wantBody: `{"Error":"bind default/q: pod not found"}`},
		"bind, GET":      {method: "GET", path: PathBind, wantStatus: 405, wantBody: `{"Error":"bind: method GET not allowed, use POST"}`},
		"webhook, empty": {method: "POST", path: PathWebhook, body: `{}`, wantStatus: 400, wantBody: `{"kind":"AdmissionReview",…`},
		"healthz":        {method: "GET", path: PathHealthz, wantStatus: 200, wantBody: "ok"},
		"readyz":         {method: "GET", path: PathReadyz, wantStatus: 200, wantBody: "ok"},
		"unknown route":  {method: "GET", path: "/prioritize", wantStatus: 404, wantBody: "404 page not found\n"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				e := start(t, Options{MaxBodyBytes: 4096}, registered("n", 1, 23028), gpuNode("x", "", 1), gpuPod("p", map[string]string{"nvidia.com/gpu": "1"}))
				status, body := serve(e.ctx, e.ext.Handler(), tc.method, tc.path, tc.body)
				if status != tc.wantStatus {
					t.Errorf("status = %d, want %d (body %s)", status, tc.wantStatus, body)
				}
				if prefix, ok := strings.CutSuffix(tc.wantBody, "…"); ok {
					if !strings.HasPrefix(body, prefix) {
						t.Errorf("body = %s, want it to start with %s", body, prefix)
					}
				} else if diff := cmp.Diff(tc.wantBody, body); diff != "" {
					t.Errorf("body (-want +got):\n%s", diff)
				}
				if strings.HasPrefix(tc.wantBody, "{") && !json.Valid([]byte(body)) {
					t.Errorf("body is not JSON: %s", body)
				}
			})
		})
	}
}

// TestHandlerNotReady: before the caches synced /filter waits with the request's context, then
// answers 503; /readyz answers 503 and /healthz (liveness) 200.
func TestHandlerNotReady(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := setup(t, Options{}, registered("n", 1, 23028)) // never run
		h := e.ext.Handler()
		ctx, cancel := context.WithTimeout(e.ctx, time.Second)
		defer cancel()
		status, body := serve(ctx, h, "POST", PathFilter, `{"Pod":{"metadata":{"name":"p"}},"NodeNames":["n"]}`)
		if status != http.StatusServiceUnavailable || !strings.Contains(body, ErrNotReady.Error()) {
			t.Errorf("filter before ready = %d %s", status, body)
		}
		if status, body := serve(e.ctx, h, "GET", PathReadyz, ""); status != http.StatusServiceUnavailable || !strings.Contains(body, "not synced") {
			t.Errorf("readyz before ready = %d %q, want 503", status, body)
		}
		if status, body := serve(e.ctx, h, "GET", PathHealthz, ""); status != http.StatusOK || body != "ok" {
			t.Errorf("healthz before ready = %d %q, want 200 ok: liveness does not wait for the sync", status, body)
		}
	})
}

package extender

import (
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/hamireg/hamireg/annotation"
)

func TestAllocationAnnotationKeys(t *testing.T) {
	t.Parallel()
	keys := AllocationAnnotationKeys(annotation.NewVendor("acme", "acme.com/gpu"))
	for _, want := range []string{"hami.io/vgpu-devices-to-allocate", "hami.io/vgpu-devices-allocated", "hami.io/bind-phase",
		"hami.io/bind-time", "hami.io/vgpu-node", "hami.io/vgpu-mig-allocations", "hami.io/acme-devices-to-allocate",
		"hami.io/acme-devices-allocated", "hami.io/dcu-devices-allocated"} {
		found := false
		for _, k := range keys {
			found = found || k == want
		}
		if !found {
			t.Errorf("AllocationAnnotationKeys lacks %s: %v", want, keys)
		}
	}
	for _, v := range annotation.Vendors() {
		for _, k := range []string{v.ToAllocateKey, v.AllocatedKey} {
			found := k == ""
			for _, got := range keys {
				found = found || got == k
			}
			if !found {
				t.Errorf("vendor %s: key %s not guarded", v.Name, k)
			}
		}
	}
	for _, k := range keys {
		if k == annotation.KeyNodeLock || k == "" {
			t.Errorf("guarded key %q is not a pod allocation key", k)
		}
	}
}

// TestAdmitGuardsAllocationAnnotations: a pod created with a scheduler-owned annotation is
// denied whatever its scheduler or labels, naming the annotation; an update that adds,
// changes or removes one is denied unless its user is trusted.
func TestAdmitGuardsAllocationAnnotations(t *testing.T) {
	t.Parallel()
	const (
		plain  = `{"metadata":{"name":"p","labels":{"hami.io/webhook":"ignore"}},"spec":{"containers":[{"name":"c","resources":{"limits":{"nvidia.com/gpu":"1"}}}]}}`
		forged = `{"metadata":{"name":"p","labels":{"hami.io/webhook":"ignore"},"annotations":{"hami.io/vgpu-devices-to-allocate":"GPU-1,NVIDIA,24000,100:;"}},"spec":{"schedulerName":"volcano","containers":[{"name":"c"}]}}`
		placed = `{"metadata":{"name":"p","annotations":{"hami.io/vgpu-node":"n1","hami.io/bind-phase":"allocating"}},"spec":{"containers":[{"name":"c"}]}}`
		moved  = `{"metadata":{"name":"p","annotations":{"hami.io/vgpu-node":"n2","hami.io/bind-phase":"allocating"}},"spec":{"containers":[{"name":"c"}]}}`
		freed  = `{"metadata":{"name":"p","annotations":{"hami.io/bind-phase":"allocating"}},"spec":{"containers":[{"name":"c"}]}}`
		other  = `{"metadata":{"name":"p","annotations":{"hami.io/vgpu-node":"n1","hami.io/bind-phase":"allocating","team":"a"}},"spec":{"containers":[{"name":"c"}]}}`
	)
	scheduler := authenticationv1.UserInfo{Username: "system:serviceaccount:kube-system:hami-scheduler"}
	agent := authenticationv1.UserInfo{Username: "system:serviceaccount:kube-system:hami-device-plugin"}
	admin := authenticationv1.UserInfo{Username: "kubernetes-admin", Groups: []string{"system:masters", "system:authenticated"}}
	user := authenticationv1.UserInfo{Username: "alice", Groups: []string{"system:authenticated"}}
	custom := authenticationv1.UserInfo{Username: "system:serviceaccount:gpu:my-scheduler"}
	tests := map[string]struct {
		op          admissionv1.Operation
		obj, old    string
		user        authenticationv1.UserInfo
		opts        Options
		wantAllowed bool
		wantIn      string
	}{
		"create forged, other scheduler, opt-out label": {op: admissionv1.Create, obj: forged, user: admin, wantIn: "hami.io/vgpu-devices-to-allocate"},
		"create forged by the scheduler itself":         {op: admissionv1.Create, obj: placed, user: scheduler, wantIn: "hami.io/bind-phase"},
		"create without: opt-out label not mutated":     {op: admissionv1.Create, obj: plain, user: user, wantAllowed: true},
		"update adds by a user":                         {op: admissionv1.Update, obj: placed, old: `{"metadata":{"name":"p"}}`, user: user, wantIn: `user "alice" may not change`},
		"update changes by a user":                      {op: admissionv1.Update, obj: moved, old: placed, user: user, wantIn: "hami.io/vgpu-node"},
		"update removes by a user":                      {op: admissionv1.Update, obj: freed, old: placed, user: user, wantIn: "hami.io/vgpu-node"},
		"update of another annotation by a user":        {op: admissionv1.Update, obj: other, old: placed, user: user, wantAllowed: true},
		"update by the scheduler":                       {op: admissionv1.Update, obj: moved, old: placed, user: scheduler, wantAllowed: true},
		"update by the node agent":                      {op: admissionv1.Update, obj: freed, old: placed, user: agent, wantAllowed: true},
		"update by system:masters":                      {op: admissionv1.Update, obj: moved, old: placed, user: admin, wantAllowed: true},
		"configured identity":                           {op: admissionv1.Update, obj: moved, old: placed, user: custom, opts: Options{TrustedUsers: []string{custom.Username}}, wantAllowed: true},
		"configured list replaces the defaults":         {op: admissionv1.Update, obj: moved, old: placed, user: scheduler, opts: Options{TrustedUsers: []string{custom.Username}}, wantIn: "may not change"},
		"no trusted group":                              {op: admissionv1.Update, obj: moved, old: placed, user: admin, opts: Options{TrustedGroups: []string{}}, wantIn: "may not change"},
		"delete is not looked at":                       {op: admissionv1.Delete, old: placed, user: user, wantAllowed: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newWebhookExtender(t, tc.opts)
			req := &admissionv1.AdmissionRequest{UID: "u1", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}, Operation: tc.op,
				UserInfo: tc.user, Object: runtime.RawExtension{Raw: []byte(tc.obj)}, OldObject: runtime.RawExtension{Raw: []byte(tc.old)}}
			resp := e.Admit(t.Context(), req)
			if resp.UID != "u1" || resp.Allowed != tc.wantAllowed {
				t.Fatalf("allowed = %v, want %v (%+v)", resp.Allowed, tc.wantAllowed, resp.Result)
			}
			if tc.wantAllowed {
				if resp.Patch != nil {
					t.Errorf("patched %s", resp.Patch)
				}
				return
			}
			if resp.Result == nil || resp.Result.Code != 403 || !strings.Contains(resp.Result.Message, tc.wantIn) {
				t.Errorf("result = %+v, want 403 containing %q", resp.Result, tc.wantIn)
			}
		})
	}
}

func TestTrustedOptionsRefused(t *testing.T) {
	t.Parallel()
	for _, o := range []Options{{TrustedUsers: []string{""}}, {TrustedGroups: []string{"x", ""}}} {
		if _, err := o.withDefaults(); err == nil || !strings.Contains(err.Error(), "anonymous") {
			t.Errorf("%+v: err = %v", o, err)
		}
	}
}

package diagnose_test

import (
	"bytes"
	"encoding/pem"
	"strings"
	"testing"

	"github.com/hamireg/hamireg/diagnose"
)

func TestRedact(t *testing.T) {
	t.Parallel()
	tests := map[string]struct{ in, want string }{
		"kubeconfig token": {"users:\n- name: u\n  user:\n    token: abc.def-123\n    username: admin\n",
			"users:\n- name: u\n  user:\n    token: [REDACTED]\n    username: admin\n"},
		"kubeconfig data": {"    certificate-authority-data: LS0tLS1CRUd=\n    client-certificate-data: \"LS0x\"\n    client-key-data: 'LS0y'\n    server: https://x\n",
			"    certificate-authority-data: [REDACTED]\n    client-certificate-data: [REDACTED]\n    client-key-data: [REDACTED]\n    server: https://x\n"},
		"webhook caBundle":  {"  clientConfig:\n    caBundle: LS0tLS1CRUdJTg==\n    service:\n", "  clientConfig:\n    caBundle: [REDACTED]\n    service:\n"},
		"json":              {`{"token":"abc","caBundle": "LS0t","name":"x"}`, `{"token":[REDACTED],"caBundle": [REDACTED],"name":"x"}`},
		"escaped json":      {`"{\"token\":\"abc\",\"user\":\"u\"}"`, `"{\"token\":[REDACTED],\"user\":\"u\"}"`},
		"escaped newline":   {`kubeconfig: "users:\n- user:\n    token: abc123\n"`, `kubeconfig: "users:\n- user:\n    token: [REDACTED]\n"`},
		"flag":              {"args: [--token=abc123, --v=4]", "args: [--token=[REDACTED], --v=4]"},
		"env":               {"HF_TOKEN=hf_abc123 PASSWORD=hunter2 OTHER=1", "HF_TOKEN=[REDACTED] PASSWORD=[REDACTED] OTHER=1"},
		"bearer header":     {"Authorization: Bearer abcdefgh12345678\nnext", "Authorization: Bearer [REDACTED]\nnext"},
		"basic header":      {`"Authorization": "Basic dXNlcjpwYXNz"`, `"Authorization": "Basic [REDACTED]"`},
		"bearer word":       {"using bearer token auth", "using bearer token auth"},
		"jwt in a log":      {"E1130 got eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln here", "E1130 got [REDACTED] here"},
		"pem block":         {"ca.crt: |\n  -----BEGIN CERTIFICATE-----\n  MIIB\n  -----END CERTIFICATE-----\nnext: 1\n", "ca.crt: |\n  [REDACTED PEM BLOCK]\nnext: 1\n"},
		"pem one line":      {`"-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----\n"`, `"[REDACTED PEM BLOCK]\n"`},
		"pem without end":   {"-----BEGIN PRIVATE KEY-----\nMIIEvQ==\nAAAA\nI1130 next line\n", "[REDACTED PEM BLOCK]I1130 next line\n"},
		"block scalar":      {"token: |\n  abc\n  def\nname: x\n", "token: [REDACTED]\nname: x\n"},
		"block scalar last": {"token: |\n  abc\n", "token: [REDACTED]"},
		"keys alike":        {"automountServiceAccountToken: true\ntokens: 5\ntokenFile: /x\nserviceAccountToken:\n  path: t\n", "automountServiceAccountToken: true\ntokens: 5\ntokenFile: /x\nserviceAccountToken:\n  path: t\n"},
		"nothing":           {"I1130 Updating node annotations with 1 device(s)\n", "I1130 Updating node annotations with 1 device(s)\n"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			in := []byte(tc.in)
			if got := string(diagnose.Redact(in)); got != tc.want {
				t.Errorf("Redact(%q)\n got %q\nwant %q", tc.in, got, tc.want)
			}
			if string(in) != tc.in {
				t.Error("input modified")
			}
		})
	}
}

// secretForms are the ways a credential appears in a kubeconfig, a ConfigMap, a webhook
// configuration or a log.
var secretForms = []string{
	"    token: %s", `    "token": "%s",`, "    client-key-data: %s", "    client-certificate-data: '%s'",
	"    certificate-authority-data: %s", "    caBundle: %s", "Authorization: Bearer %s", "  - --token=%s",
	"    id-token: %s", "    refresh-token: \"%s\"", `{\"token\":\"%s\"}`, "password=%s",
}

// FuzzRedact: Redact never panics, its output holds no PEM block and no "-----BEGIN", and
// a credential in any of secretForms, on a line of its own between any two texts, is gone.
func FuzzRedact(f *testing.F) {
	f.Add("apiVersion: v1\nusers:\n- user:\n", "abcdefgh12345678", uint8(0), "clusters: []\n")
	f.Add("-----BEGIN CERTIFICATE-----\nMIIB\n", "sha256~Zm9vYmFy", uint8(1), "-----END CERTIFICATE-----")
	f.Add("token: |\n", "eyJhbGciOiJub25lIn0.eyJzdWIiOiJ4In0.", uint8(6), "\n")
	f.Add(`{"a":"`, "LS0tLS1CRUdJTg==", uint8(10), `"}`)
	f.Add("-----BEGIN-----BEGIN X-----", "aaaaaaaa", uint8(3), "-----END")
	f.Fuzz(func(t *testing.T, before, secret string, form uint8, after string) {
		out := diagnose.Redact([]byte(before + after))
		checkNoPEM(t, out)
		if len(secret) < 8 || strings.Trim(secret, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=._~-") != "" {
			return
		}
		line := strings.Replace(secretForms[int(form)%len(secretForms)], "%s", secret, 1)
		in := before + "\n" + line + "\n" + after
		if strings.Count(in, secret) != 1 {
			return
		}
		out = diagnose.Redact([]byte(in))
		checkNoPEM(t, out)
		if bytes.Contains(out, []byte(secret)) {
			t.Fatalf("Redact(%q) = %q holds %q", in, out, secret)
		}
	})
}

func checkNoPEM(t *testing.T, out []byte) {
	t.Helper()
	if bytes.Contains(out, []byte("-----BEGIN")) {
		t.Fatalf("output holds -----BEGIN: %q", out)
	}
	if b, _ := pem.Decode(out); b != nil {
		t.Fatalf("output holds a PEM block: %q", out)
	}
}

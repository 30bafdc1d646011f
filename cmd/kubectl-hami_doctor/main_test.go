package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestExplain(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		args  []string
		stdin string
		code  int
		want  []string
	}{
		"registers": {
			args: []string{"explain", `[{"id":"GPU-b","index":1,"count":10,"devmem":23028,"devcore":100,"type":"NVIDIA A10","mode":"hami-core","health":true},{"id":"GPU-a","count":10}]`},
			code: 0,
			want: []string{"Devices (2):", "GPU-b", "NVIDIA A10", "23028", "UNHEALTHY", "registers for NVIDIA", "1 device(s) are unhealthy"},
		},
		"malformed": {
			args: []string{"explain", `[{"id":"GPU-a","devmem":1.5}]`},
			code: 1,
			want: []string{"does NOT register", "offset 24", `field "devmem"`, "HAMi logs (error): failed to decode node devices"},
		},
		"empty list": {
			args: []string{"explain", `[]`},
			code: 1,
			want: []string{"HAMi logs (info): no nvidia gpu device found", "found no GPU"},
		},
		"null element crashes HAMi": {
			args: []string{"explain", `[null]`},
			code: 1,
			want: []string{"panics", "kubectl annotate node <node> hami.io/node-nvidia-register-"},
		},
		"stdin": {
			args:  []string{"explain", "-"},
			stdin: `[{"id":"GPU-a","count":10,"health":true}]` + "\n",
			code:  0,
			want:  []string{"Devices (1):", "GPU-a"},
		},
		"legacy value for NVIDIA": {
			args: []string{"explain", "GPU-1,10,1024,100,NVIDIA T4,0,true,0,hami-core:"},
			code: 1,
			want: []string{"legacy colon format"},
		},
		"legacy value for DCU": {
			args: []string{"explain", "--vendor", "DCU", "GPU-1,10,1024,100,DCU Z100,0,true,0,hami-core:"},
			code: 0,
			want: []string{"hami.io/node-dcu-register", "DCU Z100"},
		},
		"handshake expired, allocatable present": {
			args: []string{"explain", "--handshake", "Requesting_2020-01-01 00:00:00", "--allocatable", "80", `[{"id":"GPU-a","count":10,"health":true}]`},
			code: 0,
			want: []string{"Handshake hami.io/node-handshake", "Allocatable still present", "An old Requesting_ timestamp is normal"},
		},
		"handshake expired, allocatable zero": {
			args: []string{"explain", "--handshake", "Requesting_2020-01-01 00:00:00", "--allocatable", "0", `[{"id":"GPU-a","count":10,"health":true}]`},
			code: 1,
			want: []string{"healthy: false"},
		},
		"no value":       {args: []string{"explain"}, code: 2, want: []string{"no annotation value given"}},
		"two values":     {args: []string{"explain", "[", "]"}, code: 2, want: []string{"quote the JSON"}},
		"unknown vendor": {args: []string{"explain", "--vendor", "ACME", "[]"}, code: 2, want: []string{`unknown vendor "ACME"`}},
		"unknown cmd":    {args: []string{"frobnicate"}, code: 2, want: []string{`unknown command "frobnicate"`}},
		"no args":        {args: nil, code: 2, want: []string{"Usage:"}},
		"json": {
			args: []string{"explain", "-o", "json", "--handshake", "Requesting_2020-01-01 00:00:00", "--allocatable", "80", `[{"id":"GPU-a","count":10,"health":true}]`},
			code: 0,
			want: []string{`"registers": true`, `"key": "hami.io/node-nvidia-register"`, `"id": "GPU-a"`, `"handshake": {`, `"healthy": true`},
		},
		"yaml not registering": {
			args: []string{"explain", "-o", "yaml", `[]`},
			code: 1,
			want: []string{"registers: false", "hamiLog: no nvidia gpu device found", "hamiLogLevel: info"},
		},
		"bad output": {args: []string{"explain", "-o", "xml", "[]"}, code: 2, want: []string{`unknown output format "xml"`}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var out, errOut bytes.Buffer
			code := run(tc.args, strings.NewReader(tc.stdin), &out, &errOut)
			all := out.String() + errOut.String()
			if code != tc.code {
				t.Errorf("exit %d, want %d\n%s", code, tc.code, all)
			}
			for _, w := range tc.want {
				if !strings.Contains(all, w) {
					t.Errorf("output lacks %q:\n%s", w, all)
				}
			}
		})
	}
}

func TestExplainFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "value.json")
	if err := os.WriteFile(path, []byte(`[{"id":"GPU-f","count":4,"health":true}]`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if code := run([]string{"explain", "-f", path}, strings.NewReader(""), &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s%s", code, out.String(), errOut.String())
	}
	if !strings.Contains(out.String(), "GPU-f") {
		t.Errorf("output lacks the device:\n%s", out.String())
	}
	if code := run([]string{"explain", "-f", filepath.Join(t.TempDir(), "missing")}, strings.NewReader(""), &out, &errOut); code != 2 {
		t.Errorf("missing file: exit %d, want 2", code)
	}
}

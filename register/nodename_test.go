package register_test

import (
	"errors"
	"testing"

	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/hamireg/hamireg/register"
)

func TestNodeNameFromEnv(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		env      map[string]string
		want     string
		wantErr  error
		wantWarn bool
	}{
		"NODE_NAME":                 {env: map[string]string{"NODE_NAME": "gpu-1"}, want: "gpu-1"},
		"NODE_NAME wins":            {env: map[string]string{"NODE_NAME": "gpu-1", "NodeName": "old"}, want: "gpu-1"},
		"legacy NodeName":           {env: map[string]string{"NodeName": "gpu-2"}, want: "gpu-2", wantWarn: true},
		"empty NODE_NAME, legacy":   {env: map[string]string{"NODE_NAME": " ", "NodeName": "gpu-2"}, want: "gpu-2", wantWarn: true},
		"neither":                   {wantErr: register.ErrNoNodeName},
		"both empty":                {env: map[string]string{"NODE_NAME": "", "NodeName": ""}, wantErr: register.ErrNoNodeName},
		"invalid":                   {env: map[string]string{"NODE_NAME": "Node_1"}, want: "Node_1", wantErr: register.ErrInvalidNodeName},
		"surrounding space trimmed": {env: map[string]string{"NODE_NAME": " gpu-1\n"}, want: "gpu-1"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
			ctx := klog.NewContext(t.Context(), logger)
			got, err := register.NodeNameFromEnv(ctx, func(k string) string { return tc.env[k] })
			if got != tc.want || !errors.Is(err, tc.wantErr) {
				t.Errorf("NodeNameFromEnv = %q, %v; want %q, %v", got, err, tc.want, tc.wantErr)
			}
			warned := false
			for _, e := range logger.GetSink().(ktesting.Underlier).GetBuffer().Data() {
				if e.Verbosity == 0 && len(e.Message) > 8 && e.Message[:8] == "Warning:" {
					warned = true
				}
			}
			if warned != tc.wantWarn {
				t.Errorf("warning logged = %v, want %v", warned, tc.wantWarn)
			}
		})
	}
}

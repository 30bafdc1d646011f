package main

import (
	"errors"
	"io"
	"maps"
	"strings"
	"testing"
)

func TestNodeLabelSelectorFlag(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		args    []string
		want    map[string]string
		wantErr string
	}{
		"absent":   {args: nil, want: nil},
		"one term": {args: []string{"--node-label-selector", "gpu=on"}, want: map[string]string{"gpu": "on"}},
		"two terms": {args: []string{"--node-label-selector=gpu=on,e2e.hamireg.io/node=n1"},
			want: map[string]string{"gpu": "on", "e2e.hamireg.io/node": "n1"}},
		"not equality": {args: []string{"--node-label-selector", "gpu in (on)"}, wantErr: "--node-label-selector"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := newCLI(t.Context(), "doctor", strings.NewReader(""), io.Discard, io.Discard)
			fs, f := c.newClusterFlags("pod", podUsage)
			if err := parse(fs, tc.args); err != nil {
				t.Fatal(err)
			}
			err := f.complete()
			if tc.wantErr != "" {
				if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("complete: %v, want a usage error naming %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(f.opts.NodeLabelSelector, tc.want) {
				t.Errorf("NodeLabelSelector %v, want %v", f.opts.NodeLabelSelector, tc.want)
			}
		})
	}
}

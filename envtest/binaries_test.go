package envtest_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/hamireg/hamireg/envtest"
)

// Without the binaries Start fails (the suite must not skip) and says how to get them.
func TestStartWithoutBinariesFailsNamingMakeE2E(t *testing.T) {
	t.Parallel()
	tests := map[string]string{
		"empty folder":       t.TempDir(),
		"folder not present": "/nonexistent/hamireg-k8s-bin",
	}
	for name, dir := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cp, err := envtest.Start(t.Context(), envtest.Options{BinDir: dir})
			if err == nil {
				_ = cp.Stop()
				t.Fatal("Start succeeded without binaries")
			}
			if !errors.Is(err, envtest.ErrBinariesMissing) {
				t.Errorf("err = %v, want ErrBinariesMissing", err)
			}
			if !strings.Contains(err.Error(), "make e2e") {
				t.Errorf("err = %q, want it to name `make e2e`", err)
			}
		})
	}
}

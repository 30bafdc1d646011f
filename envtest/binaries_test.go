package envtest_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/hamireg/hamireg/envtest"
)

// Without the binaries Start fails (the suite must not skip) and says which binaries it
// needs, where it looked and how to get them. (Not parallel: it sets the variables.)
func TestStartWithoutBinaries(t *testing.T) {
	t.Setenv(envtest.EnvBinDir, "")
	t.Setenv(envtest.EnvKubebuilderAssets, "")
	tests := map[string]string{
		"empty folder":       t.TempDir(),
		"folder not present": "/nonexistent/hamireg-k8s-bin",
	}
	for name, dir := range tests {
		t.Run(name, func(t *testing.T) {
			cp, err := envtest.Start(t.Context(), envtest.Options{BinDir: dir})
			if err == nil {
				_ = cp.Stop()
				t.Fatal("Start succeeded without binaries")
			}
			if !errors.Is(err, envtest.ErrBinariesMissing) {
				t.Errorf("err = %v, want ErrBinariesMissing", err)
			}
			for _, want := range []string{"etcd and kube-apiserver", dir, "setup-envtest use 1.37.x -p path", "hack/k8sbins/build.sh"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("err = %q, want it to name %q", err, want)
				}
			}
		})
	}
}

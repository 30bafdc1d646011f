//go:build e2e

package envtest_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hamireg/hamireg/envtest"
)

// A folder laid out as setup-envtest's (etcd and kube-apiserver, no kube-scheduler), named by
// $KUBEBUILDER_ASSETS alone, serves Start; StartScheduler then fails naming kube-scheduler
// and where to get it, and SchedulerOptions.Binary runs a kube-scheduler-compatible program
// from elsewhere (here a script that records its run and execs $HAMIREG_K8S_BIN's
// kube-scheduler). The folder links to the binaries of $HAMIREG_K8S_BIN. (Not parallel: it
// sets the variables.)
func TestStartFromSetupEnvtestFolder(t *testing.T) {
	bin := os.Getenv(envtest.EnvBinDir)
	if bin == "" {
		t.Fatalf("$%s is not set: %v", envtest.EnvBinDir, envtest.ErrBinariesMissing)
	}
	assets := t.TempDir()
	for _, n := range []string{"etcd", "kube-apiserver"} {
		if err := os.Symlink(filepath.Join(bin, n), filepath.Join(assets, n)); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv(envtest.EnvBinDir, "")
	t.Setenv(envtest.EnvKubebuilderAssets, assets)

	cp, err := envtest.Start(t.Context(), envtest.Options{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cp.Stop(); err != nil {
			t.Error(err)
		}
	})
	if _, err := cp.AdminClient().Discovery().ServerVersion(); err != nil {
		t.Fatalf("the control plane from setup-envtest's folder does not answer: %v", err)
	}

	s, err := cp.StartScheduler(t.Context(), envtest.SchedulerOptions{})
	if err == nil {
		_ = s.Stop()
		t.Fatal("StartScheduler succeeded without kube-scheduler")
	}
	var nf *envtest.BinaryNotFoundError
	if !errors.As(err, &nf) || !errors.Is(err, envtest.ErrBinariesMissing) {
		t.Fatalf("err = %v, want a *BinaryNotFoundError wrapping ErrBinariesMissing", err)
	}
	for _, want := range []string{"StartScheduler needs kube-scheduler", "$KUBEBUILDER_ASSETS (" + assets + ")", "hack/k8sbins/build.sh", "bin/linux/amd64/kube-scheduler"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("err = %q, want it to name %q", err, want)
		}
	}
	t.Log(err)

	// A scheduler binary of one's own (e.g. built with a plugin) needs no kube-scheduler in
	// the folders.
	dir := t.TempDir()
	marker := filepath.Join(dir, "ran")
	wrapper := filepath.Join(dir, "my-scheduler")
	script := "#!/bin/sh\necho \"$@\" > " + marker + "\nexec " + filepath.Join(bin, "kube-scheduler") + " \"$@\"\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	s, err = cp.StartScheduler(t.Context(), envtest.SchedulerOptions{Binary: wrapper})
	if err != nil {
		t.Fatalf("StartScheduler with Binary: %v", err)
	}
	defer func() { _ = s.Stop() }()
	args, err := os.ReadFile(marker)
	if err != nil {
		t.Fatalf("the Binary did not run: %v", err)
	}
	if !strings.Contains(string(args), "--config="+s.ConfigPath()) {
		t.Errorf("the Binary ran with %q, want kube-scheduler's flags with --config=%s", args, s.ConfigPath())
	}
}

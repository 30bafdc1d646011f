package envtest

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// stubs makes a folder holding an executable stub file for each name, as setup-envtest's or
// build.sh's folder holds the binaries.
func stubs(t *testing.T, names ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func env(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

// Each binary comes from the first folder holding it as an executable: Options.BinDir,
// then $HAMIREG_K8S_BIN, then $KUBEBUILDER_ASSETS.
func TestFindBinariesOrder(t *testing.T) {
	t.Parallel()
	setupEnvtest := stubs(t, "etcd", "kube-apiserver", "kubectl")
	built := stubs(t, "etcd", "kube-apiserver", "kube-scheduler")
	onlyScheduler := stubs(t, "kube-scheduler")
	onlyEtcd := stubs(t, "etcd")
	notExecutable := stubs(t)
	if err := os.WriteFile(filepath.Join(notExecutable, "kube-apiserver"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		binDir string
		env    map[string]string
		names  []string
		want   map[string]string
	}{
		"setup-envtest's folder serves Start": {
			env:   map[string]string{EnvKubebuilderAssets: setupEnvtest},
			names: []string{binEtcd, binAPIServer},
			want:  map[string]string{binEtcd: filepath.Join(setupEnvtest, "etcd"), binAPIServer: filepath.Join(setupEnvtest, "kube-apiserver")},
		},
		"HAMIREG_K8S_BIN before KUBEBUILDER_ASSETS": {
			env:   map[string]string{EnvBinDir: built, EnvKubebuilderAssets: setupEnvtest},
			names: []string{binEtcd, binAPIServer, binScheduler},
			want: map[string]string{binEtcd: filepath.Join(built, "etcd"), binAPIServer: filepath.Join(built, "kube-apiserver"),
				binScheduler: filepath.Join(built, "kube-scheduler")},
		},
		"kube-scheduler alone in HAMIREG_K8S_BIN beside setup-envtest's folder": {
			env:   map[string]string{EnvBinDir: onlyScheduler, EnvKubebuilderAssets: setupEnvtest},
			names: []string{binEtcd, binAPIServer, binScheduler},
			want: map[string]string{binEtcd: filepath.Join(setupEnvtest, "etcd"), binAPIServer: filepath.Join(setupEnvtest, "kube-apiserver"),
				binScheduler: filepath.Join(onlyScheduler, "kube-scheduler")},
		},
		"Options.BinDir first, per binary": {
			binDir: onlyEtcd,
			env:    map[string]string{EnvBinDir: built},
			names:  []string{binEtcd, binAPIServer},
			want:   map[string]string{binEtcd: filepath.Join(onlyEtcd, "etcd"), binAPIServer: filepath.Join(built, "kube-apiserver")},
		},
		"a file that is not executable is skipped": {
			binDir: notExecutable,
			env:    map[string]string{EnvKubebuilderAssets: setupEnvtest},
			names:  []string{binAPIServer},
			want:   map[string]string{binAPIServer: filepath.Join(setupEnvtest, "kube-apiserver")},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got, err := findBinaries(binFolders(tc.binDir, env(tc.env)), "Start", tc.names...)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for n, p := range tc.want {
				if got[n] != p {
					t.Errorf("%s = %q, want %q", n, got[n], p)
				}
			}
		})
	}
}

// A missing binary's error names it, the start that needs it, every place searched and how
// to get it.
func TestFindBinariesMissing(t *testing.T) {
	t.Parallel()
	setupEnvtest := stubs(t, "etcd", "kube-apiserver", "kubectl")
	empty := stubs(t)
	tests := map[string]struct {
		binDir string
		env    map[string]string
		start  string
		names  []string
		want   string
	}{
		"nothing set": {
			start: "Start", names: []string{binEtcd, binAPIServer},
			want: "peer binaries missing: Start needs etcd and kube-apiserver, not found in $HAMIREG_K8S_BIN (not set), " +
				"$KUBEBUILDER_ASSETS (not set); get etcd and kube-apiserver with setup-envtest " +
				"(export KUBEBUILDER_ASSETS=$(setup-envtest use 1.37.x -p path)) or build them with the hamireg repository's " +
				"hack/k8sbins/build.sh (export HAMIREG_K8S_BIN=$(hack/k8sbins/build.sh))",
		},
		"kube-apiserver missing from Options.BinDir": {
			binDir: empty, env: map[string]string{EnvBinDir: "/nonexistent"},
			start: "Start", names: []string{binEtcd, binAPIServer},
			want: "peer binaries missing: Start needs etcd and kube-apiserver, not found in Options.BinDir (" + empty + "), " +
				"$HAMIREG_K8S_BIN (/nonexistent), $KUBEBUILDER_ASSETS (not set); get etcd and kube-apiserver with setup-envtest " +
				"(export KUBEBUILDER_ASSETS=$(setup-envtest use 1.37.x -p path)) or build them with the hamireg repository's " +
				"hack/k8sbins/build.sh (export HAMIREG_K8S_BIN=$(hack/k8sbins/build.sh))",
		},
		"kube-scheduler with setup-envtest's folder only": {
			env:   map[string]string{EnvKubebuilderAssets: setupEnvtest},
			start: "StartScheduler", names: []string{binScheduler},
			want: "peer binaries missing: StartScheduler needs kube-scheduler, not found in $HAMIREG_K8S_BIN (not set), " +
				"$KUBEBUILDER_ASSETS (" + setupEnvtest + "); setup-envtest's folder has no kube-scheduler: build it with the " +
				"hamireg repository's hack/k8sbins/build.sh (export HAMIREG_K8S_BIN=$(hack/k8sbins/build.sh)), or put " +
				"kube-scheduler 1.37.x of the Kubernetes release (https://dl.k8s.io/release/v1.37.2/bin/linux/amd64/kube-scheduler) " +
				"in a folder and set HAMIREG_K8S_BIN to it",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := findBinaries(binFolders(tc.binDir, env(tc.env)), tc.start, tc.names...)
			if !errors.Is(err, ErrBinariesMissing) {
				t.Fatalf("err = %v, want ErrBinariesMissing", err)
			}
			if err.Error() != tc.want {
				t.Errorf("err =\n%s\nwant\n%s", err, tc.want)
			}
		})
	}
}

// A control plane started from setup-envtest's folder has no kube-scheduler:
// StartScheduler says so before it starts anything.
func TestStartSchedulerWithoutKubeScheduler(t *testing.T) {
	t.Parallel()
	setupEnvtest := stubs(t, "etcd", "kube-apiserver", "kubectl")
	cp := &ControlPlane{folders: binFolders("", env(map[string]string{EnvKubebuilderAssets: setupEnvtest}))}
	_, err := cp.StartScheduler(t.Context(), SchedulerOptions{})
	var nf *BinaryNotFoundError
	if !errors.As(err, &nf) || !errors.Is(err, ErrBinariesMissing) {
		t.Fatalf("err = %v, want a *BinaryNotFoundError wrapping ErrBinariesMissing", err)
	}
	if nf.Start != "StartScheduler" || len(nf.Missing) != 1 || nf.Missing[0] != binScheduler {
		t.Errorf("err = %+v, want StartScheduler missing kube-scheduler", nf)
	}
}

// SchedulerOptions.Binary, when set, is run instead of the folders' kube-scheduler (which need
// not exist); it must be an executable file.
func TestSchedulerBinary(t *testing.T) {
	t.Parallel()
	own := filepath.Join(stubs(t, "my-scheduler"), "my-scheduler")
	plain := filepath.Join(t.TempDir(), "not-executable")
	if err := os.WriteFile(plain, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	found := stubs(t, binScheduler)
	tests := map[string]struct {
		binary, folder string
		want           string
		wantErr        string
	}{
		"default: the folders' kube-scheduler": {folder: found, want: filepath.Join(found, binScheduler)},
		"default without kube-scheduler":       {folder: t.TempDir(), wantErr: "peer binaries missing"},
		"binary of one's own, no folder":       {binary: own, folder: t.TempDir(), want: own},
		"binary over the folders'":             {binary: own, folder: found, want: own},
		"binary missing":                       {binary: filepath.Join(t.TempDir(), "nope"), wantErr: "no such file"},
		"binary not executable":                {binary: plain, wantErr: "not an executable file"},
		"binary is a folder":                   {binary: t.TempDir(), wantErr: "not an executable file"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cp := &ControlPlane{folders: binFolders(tc.folder, env(nil))}
			got, err := cp.schedulerBinary(tc.binary)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("schedulerBinary(%q) = %q, %v; want %q", tc.binary, got, err, tc.want)
			}
		})
	}
}

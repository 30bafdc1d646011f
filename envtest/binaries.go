package envtest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// EnvBinDir names the environment variable that holds a folder with the peer binaries
// (kube-apiserver, etcd, kube-scheduler), searched after [Options.BinDir]. In the hamireg
// repository hack/e2e.sh (run by `make e2e`) builds them with hack/k8sbins/build.sh and sets
// it; see the package documentation for how a consumer gets them.
const EnvBinDir = "HAMIREG_K8S_BIN"

// EnvKubebuilderAssets names the environment variable of controller-runtime's envtest: the
// folder of release binaries that `setup-envtest use 1.37.x -p path` prints (etcd,
// kube-apiserver and kubectl; no kube-scheduler). It is searched after $HAMIREG_K8S_BIN.
const EnvKubebuilderAssets = "KUBEBUILDER_ASSETS"

// ErrBinariesMissing is returned (wrapped in a [*BinaryNotFoundError]) by [Start] and
// [ControlPlane.StartScheduler] when a peer binary they need is in none of the folders
// searched. Tests should fail on it, not skip.
var ErrBinariesMissing = errors.New("peer binaries missing")

// Binaries the control plane runs, as named in the bin folder.
const (
	binAPIServer = "kube-apiserver"
	binEtcd      = "etcd"
	binScheduler = "kube-scheduler"
)

// kubernetesMinor is the Kubernetes release whose binaries this module is tested with (the
// version hack/k8sbins/go.mod pins), for the hints of [BinaryNotFoundError].
const (
	kubernetesMinor   = "1.37"
	kubernetesRelease = "v1.37.2"
)

// BinaryNotFoundError says which peer binaries a start needs and could not find, where it
// looked and how to get them. It unwraps to [ErrBinariesMissing].
type BinaryNotFoundError struct {
	// Start is the function that needs the binaries: "Start" or "StartScheduler".
	Start string
	// Missing are the binaries not found, e.g. ["kube-scheduler"].
	Missing []string
	// Searched are the places looked in, in order, e.g. `$KUBEBUILDER_ASSETS
	// (/home/me/.local/share/kubebuilder-envtest/k8s/1.37.2-linux-amd64)` or
	// "$HAMIREG_K8S_BIN (not set)".
	Searched []string
}

// Error names the binaries, the places searched and how to get the binaries.
func (e *BinaryNotFoundError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s needs %s, not found in %s",
		ErrBinariesMissing, e.Start, strings.Join(e.Missing, " and "), strings.Join(e.Searched, ", "))
	if e.Start == "StartScheduler" {
		fmt.Fprintf(&b, "; setup-envtest's folder has no kube-scheduler: build it with the hamireg repository's "+
			"hack/k8sbins/build.sh (export %s=$(hack/k8sbins/build.sh)), or put kube-scheduler %s.x of the Kubernetes "+
			"release (https://dl.k8s.io/release/%s/bin/linux/amd64/kube-scheduler) in a folder and set %s to it",
			EnvBinDir, kubernetesMinor, kubernetesRelease, EnvBinDir)
	} else {
		fmt.Fprintf(&b, "; get etcd and kube-apiserver with setup-envtest (export %s=$(setup-envtest use %s.x -p path)) "+
			"or build them with the hamireg repository's hack/k8sbins/build.sh (export %s=$(hack/k8sbins/build.sh))",
			EnvKubebuilderAssets, kubernetesMinor, EnvBinDir)
	}
	return b.String()
}

// Unwrap returns [ErrBinariesMissing].
func (e *BinaryNotFoundError) Unwrap() error { return ErrBinariesMissing }

// binFolder is one place searched for the peer binaries.
type binFolder struct {
	name string // "Options.BinDir", "$HAMIREG_K8S_BIN", "$KUBEBUILDER_ASSETS"
	dir  string // "" when not set
}

// binFolders lists the places searched, in order: Options.BinDir, $HAMIREG_K8S_BIN,
// $KUBEBUILDER_ASSETS.
func binFolders(binDir string, getenv func(string) string) []binFolder {
	return []binFolder{
		{name: "Options.BinDir", dir: binDir},
		{name: "$" + EnvBinDir, dir: getenv(EnvBinDir)},
		{name: "$" + EnvKubebuilderAssets, dir: getenv(EnvKubebuilderAssets)},
	}
}

// findBinaries returns the path of each binary in names, each taken from the first folder
// that holds it as an executable file, or a *BinaryNotFoundError for start naming every
// binary not found.
func findBinaries(folders []binFolder, start string, names ...string) (map[string]string, error) {
	paths := make(map[string]string, len(names))
	var missing []string
	for _, n := range names {
		for _, f := range folders {
			if f.dir == "" {
				continue
			}
			p := filepath.Join(f.dir, n)
			if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
				paths[n] = p
				break
			}
		}
		if paths[n] == "" {
			missing = append(missing, n)
		}
	}
	if len(missing) == 0 {
		return paths, nil
	}
	var searched []string
	for _, f := range folders {
		if f.dir == "" {
			if f.name != "Options.BinDir" { // the field is optional; say only which variables are unset
				searched = append(searched, f.name+" (not set)")
			}
			continue
		}
		searched = append(searched, fmt.Sprintf("%s (%s)", f.name, f.dir))
	}
	return nil, &BinaryNotFoundError{Start: start, Missing: missing, Searched: searched}
}

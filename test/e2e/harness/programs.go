package harness

import (
	"path/filepath"

	"github.com/hamireg/hamireg/envtest"
)

// BuildProgram builds the program pkg of the SDK's root module (e.g. "./examples/extender")
// into out with envtest.BuildProgram and returns out; a pkg that is a nested module
// ("./cmd/kubectl-hami_doctor") is built from its own folder. race builds it with the race detector.
// It must be called from a package folder of the test module (test/e2e/<pkg>, as go test
// runs it).
func BuildProgram(out, pkg string, race bool) (string, error) {
	return envtest.BuildProgram(out, filepath.Join("..", "..", ".."), pkg, race)
}

package harness

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/hamireg/hamireg/envtest"
	"github.com/hamireg/hamireg/envtest/kubeletpeer"
)

// Programs are examples/deviceplugin and examples/extender, built once per test binary into
// the control plane's folder (removed with it); the errors say why one is missing, for the
// tests that need it to report.
type Programs struct {
	DevicePlugin, Extender       string
	DevicePluginErr, ExtenderErr error
}

// MainWithPrograms is Main for the packages that run the GPU node's programs against the
// kubelet's device manager: the device manager's child process ends here first
// (kubeletpeer.RunIfChild); the control plane's kube-apiserver runs with
// --request-timeout=5s, which bounds its graceful shutdown (it waits for the programs' open
// watches); both programs are built, with the race detector when race is set (the package's
// race build tag), and use gets the control plane and the programs.
func MainWithPrograms(m *testing.M, race bool, use func(*ControlPlane, Programs)) {
	MainWithProgramsOptions(m, race, envtest.Options{}, use)
}

// MainWithProgramsOptions is MainWithPrograms with the control plane's options, e.g. more
// kube-apiserver flags (an admission configuration), which come after --request-timeout=5s.
func MainWithProgramsOptions(m *testing.M, race bool, opts envtest.Options, use func(*ControlPlane, Programs)) {
	if code, child := kubeletpeer.RunIfChild(context.Background()); child {
		os.Exit(code)
	}
	opts.APIServerFlags = append([]string{"--request-timeout=5s"}, opts.APIServerFlags...)
	Main(m, opts, func(c *ControlPlane) {
		var p Programs
		p.DevicePlugin, p.DevicePluginErr = BuildProgram(filepath.Join(c.Dir(), "deviceplugin"), "./examples/deviceplugin", race)
		p.Extender, p.ExtenderErr = BuildProgram(filepath.Join(c.Dir(), "extender"), "./examples/extender", race)
		use(c, p)
	})
}

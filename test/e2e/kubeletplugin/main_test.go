// Package kubeletplugin_test runs package kubeletplugin against the kubelet's own code: the
// registration server (plugin/v1beta1) and the complete device manager (ManagerImpl), with
// kubelet restarts, plugin restarts (in process, and a process killed with SIGKILL), health changes, relocated folders and the
// duplicate-Register trap; BenchmarkKubeletRestart measures re-registration latency.
package kubeletplugin_test

import (
	"context"
	"os"
	"testing"

	"github.com/hamireg/hamireg/envtest/kubeletpeer"
)

func TestMain(m *testing.M) {
	if code, child := kubeletpeer.RunIfChild(context.Background()); child {
		os.Exit(code) // the kubelet device manager's child ends here
	}
	runPluginChildIfAsked() // so does a plugin process of TestKubeletPluginProcessKilled
	os.Exit(m.Run())
}

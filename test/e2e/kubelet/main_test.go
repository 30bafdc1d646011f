// Package kubelet_test proves that the kubelet peers in kubeletpeer are the kubelet's own
// code: Register validation, the dial-back and ListAndWatch, capacity and allocatable from
// ManagerImpl, and what a kubelet restart does to plugins.
package kubelet_test

import (
	"os"
	"testing"

	"github.com/hamireg/hamireg/envtest/kubeletpeer"
)

func TestMain(m *testing.M) {
	kubeletpeer.ReexecIfChild() // the device-manager child runs here and exits
	os.Exit(m.Run())
}

// Package kubelet_test proves that the kubelet peers in kubeletpeer are the kubelet's own
// code: Register validation, the dial-back and ListAndWatch, capacity and allocatable from
// ManagerImpl, and what a kubelet restart does to plugins.
package kubelet_test

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
	os.Exit(m.Run())
}

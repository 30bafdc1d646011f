// Package diagnose_test runs package diagnose against a real kube-apiserver and etcd. Each
// scenario installs HAMi as its Helm chart does (device plugin DaemonSet, its ServiceAccount
// and node RBAC, scheduler Deployment, Pod and Lease) in a namespace of its own, creates a GPU
// Node and the plugin's Pod with the statuses a kubelet would write, and checks the case, the
// channels, the findings with their evidence and fixes; where a fix is a DaemonSet patch or
// RBAC, it is applied to the API server and must take:
//
//   - healthy: chart defaults, an old Requesting_ handshake, the legacy
//     hami.io/node-handshake-nvidia key, allocatable below the annotation's count, one
//     unhealthy device;
//   - case 1: the node lacks gpu=on or has gpu=off, an untolerated taint, no Pod although
//     selected and tolerated, no DaemonSet;
//   - case 2: NVML cannot load (no runtimeClassName, an nvidia RuntimeClass, beside a native
//     sidecar), an init container waiting for toolkit-ready, the legacy NodeName variable, a
//     crash with no known message, an image pull back-off;
//   - case 3: allocatable absent, and 0 with a non-default device-plugins hostPath;
//   - case 4: annotation missing (the plugin may and may not patch nodes), malformed,
//     truncated, empty, with a null element, devices without a health key;
//   - case 5: --node-label-selector excludes the node, the Lease expired, missing or held by
//     no scheduler Pod, no scheduler installed, the extender without leader election, the
//     handshake missing or a pre-2.8 value;
//   - Nodes over the whole cluster (non-GPU nodes left out, each report as Node's),
//     ErrNodeNotFound, ErrInvalidOptions, and a caller with exactly the documented read
//     permissions (and one without Leases and SubjectAccessReviews).
package diagnose_test

import (
	"testing"

	"github.com/hamireg/hamireg/envtest"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// cp is the control plane shared by every test of this binary.
var cp *harness.ControlPlane

func TestMain(m *testing.M) {
	harness.Main(m, envtest.Options{}, func(c *harness.ControlPlane) { cp = c })
}

package nvmlscantest

import (
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/hamireg/hamireg/nvmlscan/nvmlsim"
)

// Node is the simulated GPU node of package nvmlsim, named here so that tests need one import.
type Node = nvmlsim.Node

// NewNode is [nvmlsim.Wire] for tests: it fails the test when srv has more than 8 GPUs.
func NewNode(tb testing.TB, srv *server.Server) *Node {
	tb.Helper()
	n, err := nvmlsim.Wire(srv)
	if err != nil {
		tb.Fatal(err)
	}
	return n
}

// NewMIGNode is [NewNode] with MIG mode on for every GPU ([nvmlsim.Node.EnableMIG]): the
// GPUs answer MIG calls as the hardware does (placement conflicts refused, MIG devices
// enumerated). At the end of the test it fails the test if two live MIG instances overlap
// ([nvmlsim.Node.MIGOverlaps]).
func NewMIGNode(tb testing.TB, srv *server.Server) *Node {
	tb.Helper()
	n := NewNode(tb, srv)
	n.EnableMIG()
	tb.Cleanup(func() {
		if err := n.MIGOverlaps(); err != nil {
			tb.Error(err)
		}
	})
	return n
}

// SetReturn is [nvmlsim.Node.SetReturn] for tests: it makes query q of GPU i answer ret (until
// set back to nvml.SUCCESS) and fails the test for a query nvmlsim does not know.
func SetReturn(tb testing.TB, n *Node, i int, q nvmlsim.Query, ret nvml.Return) {
	tb.Helper()
	if err := n.SetReturn(i, q, ret); err != nil {
		tb.Fatal(err)
	}
}

// Package nvmlscantest gives tests of [github.com/hamireg/hamireg/nvmlscan] and of the
// programs on it a simulated GPU node in one call: [NewNode] wires one of go-nvml's simulated
// servers (mock/dgxa100, dgxh100, dgxh200, dgxb200, mock/server) with
// [github.com/hamireg/hamireg/nvmlscan/nvmlsim], which fills in what the servers do not wire
// (PCI bus ids, event registration, an event set), builds the matching sysfs tree, and lets a
// test inject XID events, event-wait failures and GPUs that stop answering, and set what the
// GPUs answer to a node monitor's usage queries (memory, utilisation, processes; nvmlsim's
// "Usage queries"), with [SetReturn] to make a query fail. Programs use
// nvmlsim directly: it does not import package testing.
//
// [NewMIGNode] is the same node with MIG mode on: its GPUs create and enumerate MIG
// instances as the hardware does (see nvmlsim's "MIG"), and the test fails at cleanup if two
// live instances overlap.
//
// Like the mocks it builds on, it needs cgo.
//
// The node does not fake the clock: give the scanner a fake one (k8s.io/utils/clock/testing)
// to step through the health recovery rule.
//
// Usage (the snippet is [Example]):
//
//	node := nvmlscantest.NewNode(t, dgxh100.New())
//	s, err := nvmlscan.New(node.Server, nvmlscan.Options{Sysfs: node.Sysfs})
//	...
//	node.XID(2, 79) // GPU 2 reports XID 79 to a running Scanner.Run
package nvmlscantest

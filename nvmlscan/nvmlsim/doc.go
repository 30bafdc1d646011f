// Package nvmlsim turns one of go-nvml's simulated servers (mock/dgxa100, dgxh100, dgxh200,
// dgxb200, mock/server) into a GPU node that [github.com/hamireg/hamireg/nvmlscan] can scan
// and watch without a GPU: it fills in what the simulated servers do not wire (PCI bus ids,
// event registration, an event set), builds the matching sysfs tree, and lets its caller
// inject XID events, event-wait failures and GPUs that stop answering. It also answers the
// topology queries the simulated servers leave unwired (common PCIe ancestor, NVLink state,
// remote PCI bus and device type) from a [Topology]: the NVSwitch interconnect of the DGX
// servers by default, or a DGX-1V's hybrid cube mesh of direct NVLinks, or PCIe alone
// ([Node.SetTopology]).
//
// It is for programs (a device plugin's --simulate mode, a demo) as much as for tests: it does
// not import package testing, so it may be linked into a production binary. Tests use it
// through [github.com/hamireg/hamireg/nvmlscan/nvmlscantest], which adds the testing.TB
// helpers. With nvmlscan and nvmlscantest it is one of the packages under nvmlscan/, the only
// ones of this SDK that import go-nvml; like go-nvml's mocks it needs cgo.
//
// # Lifecycle and concurrency
//
// [New] or [Wire] sets the server's functions once, before anything uses it. Afterwards the
// [Node]'s methods are safe for concurrent use with a running scanner: [Node.XID],
// [Node.Event] and [Node.WaitError] queue up to 64 events for the scanner's next waits (and
// block when the queue is full); [Node.SetLost] takes effect at the next query. The node does
// not fake the clock: give the scanner a fake one to step through the health recovery rule.
//
// # Usage
//
// A program's --simulate flag, as examples/deviceplugin has it (see [Example]):
//
//	node, err := nvmlsim.New("dgxh100") // nvmlsim.Servers() lists the names
//	if err != nil {
//		return err // errors.Is(err, nvmlsim.ErrUnknownServer)
//	}
//	scanner, err := nvmlscan.New(node.Server, nvmlscan.Options{Sysfs: node.Sysfs})
//	if err != nil {
//		return err
//	}
//	node.XID(0, 79) // GPU 0 reports XID 79 to a running Scanner.Run
package nvmlsim

package nvmlscan

import (
	"io/fs"
	"strconv"
	"strings"
)

// NUMANodes returns the NUMA node of the GPUs of the last scan, by UUID, as the kernel
// reports it in sysfs (bus/pci/devices/<bus id>/numa_node under Options.Sysfs). A GPU has
// no entry when its PCI bus ID is unknown ([Scanner.PCIBusIDs]), its numa_node cannot be
// read or parsed, or it is negative (-1: no NUMA affinity), unlike the register
// annotation's numa, which HAMi writes as 0 then. It implements nodeagent's NUMASource,
// which the DRA world publishes as the standard attribute resource.kubernetes.io/numaNode.
// The map is the caller's.
func (s *Scanner) NUMANodes() map[string]int {
	out := map[string]int{}
	for uuid, bus := range s.PCIBusIDs() {
		raw, err := fs.ReadFile(s.cfg.sysfs, "bus/pci/devices/"+bus+"/numa_node")
		if err != nil {
			continue
		}
		n, err := strconv.Atoi(strings.TrimSpace(string(raw)))
		if err != nil || n < 0 {
			continue
		}
		out[uuid] = n
	}
	return out
}

package nvmlscan

import "maps"

// NUMANodes returns the NUMA node of the GPUs of the last scan, by UUID, as the kernel
// reports it in sysfs (bus/pci/devices/<bus id>/numa_node under Options.Sysfs, read by the
// scan). A GPU has no entry when its PCI bus ID is unknown ([Scanner.PCIBusIDs]), its
// numa_node cannot be read or parsed, or it is negative (-1: no NUMA affinity), unlike the
// register annotation's numa, which HAMi writes as 0 then. It implements nodeagent's
// NUMASource, which the DRA world publishes as the standard attribute
// resource.kubernetes.io/numaNode. The map is the caller's.
func (s *Scanner) NUMANodes() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.numaNodes)
}

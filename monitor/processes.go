package monitor

import "strconv"

// processes sends the SDK's per-process families (Options.ProcessMetrics): each live slot of
// a region joined by host PID with the driver's processes of the host GPU its device maps to
// (by UUID), the driver processes on a shared GPU that no live slot names, and the slots the
// driver no longer lists.
func (s *scrape) processes(cs []Container, gpus []HostGPU) {
	d := &s.c.d
	byUUID := make(map[string]*HostGPU, len(gpus))
	for i := range gpus {
		byUUID[gpus[i].UUID] = &gpus[i]
	}
	named := map[uint32]bool{}               // host PIDs a live slot of some region names
	shared := map[string]bool{}              // host GPU UUIDs some region lists
	driver := map[string]map[uint32]uint64{} // per host GPU: PID -> the driver's used memory
	for ci := range cs {
		r := cs[ci].Region
		if r == nil {
			continue
		}
		for k := range r.Slots {
			if sl := &r.Slots[k]; sl.Live() && sl.HostPID > 0 {
				named[uint32(sl.HostPID)] = true
			}
		}
		for i := range r.Devices {
			if r.Devices[i].ValidUUID() {
				shared[r.Devices[i].UUID()] = true
			}
		}
	}
	for i := range gpus {
		g := &gpus[i]
		if g.ProcessesErr != nil {
			continue
		}
		pids := make(map[uint32]uint64, len(g.Processes))
		for _, p := range g.Processes {
			pids[p.PID] = p.UsedMemory
		}
		driver[g.UUID] = pids
	}
	for ci := range cs {
		c := &cs[ci]
		r := c.Region
		if r == nil {
			continue
		}
		for i := range r.Devices {
			dev := &r.Devices[i]
			uuid, ok := uuidLabel(dev)
			if !ok || byUUID[dev.UUID()] == nil {
				continue
			}
			pids, listedOK := driver[dev.UUID()] // false: the driver's list failed for this GPU
			idx := strconv.Itoa(i)
			for k := range r.Slots {
				sl := &r.Slots[k]
				if !sl.Live() || sl.HostPID <= 0 {
					continue
				}
				hc := sl.Used[i].Total
				nv, listed := pids[uint32(sl.HostPID)]
				if hc == 0 && !listed {
					continue // the process does not use this device
				}
				l := []string{c.Pod.Namespace, c.Pod.Name, c.Name, idx, uuid, strconv.FormatInt(int64(sl.HostPID), 10)}
				s.sendOnce(d.processMem, float64(hc), append(l[:6:6], SourceHAMiCore)...)
				if listed {
					s.sendOnce(d.processMem, float64(nv), append(l[:6:6], SourceNVML)...)
					if nv > 0 {
						s.sendOnce(d.processDrift, (float64(hc)-float64(nv))/float64(nv), l...)
					}
				} else if listedOK {
					s.sendOnce(d.staleSlotBytes, float64(hc), l...)
				}
			}
		}
	}
	for i := range gpus {
		g := &gpus[i]
		if _, ok := driver[g.UUID]; !ok || !shared[g.UUID] {
			continue
		}
		idx := strconv.Itoa(g.Index)
		for _, p := range g.Processes {
			if !named[p.PID] {
				s.sendOnce(d.unaccounted, float64(p.UsedMemory), idx, g.UUID, strconv.FormatUint(uint64(p.PID), 10), "", "", "")
			}
		}
	}
}

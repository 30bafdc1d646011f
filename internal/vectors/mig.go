package vectors

import "strings"

// ContainerOfEntry maps entry, the index of an entry of the pod device list value as HAMi
// wrote it (the containerIndex of HAMi master's hami.io/vgpu-mig-allocations), to the index
// of the container that entry belongs to by [OneEntryPerContainer]'s rule (gpu[i] says
// whether container i asks for devices). It reports false when entry is not a non-empty
// entry of value or no container takes it.
func ContainerOfEntry(value string, entry int, gpu []bool) (int, bool) {
	entries := strings.Split(value, ";")
	if entry < 0 || entry >= len(entries) || entries[entry] == "" {
		return 0, false
	}
	k := 0 // non-empty entries before it
	for _, e := range entries[:entry] {
		if e != "" {
			k++
		}
	}
	for i, asks := range gpu {
		if !asks {
			continue
		}
		if k == 0 {
			return i, true
		}
		k--
	}
	return 0, false
}

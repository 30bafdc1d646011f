package schedplugin

import (
	"fmt"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
)

// configFor is a stand-in for allocation.ConfigFor until it lands on main: NVIDIA only.
func configFor(v annotation.Vendor, base allocation.Config) (allocation.Config, error) {
	if v.Name != annotation.VendorNVIDIA {
		return allocation.Config{}, fmt.Errorf("vendor %q: only NVIDIA is fitted by this SDK version", v.Name)
	}
	return base, nil
}

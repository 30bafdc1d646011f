package monitor

import (
	"errors"
	"fmt"
	"os"

	"github.com/hamireg/hamireg/hamicore/region"
)

// ErrRegionChanged means a region was replaced or re-initialised between the read a write
// was decided on and the write: nothing was written.
var ErrRegionChanged = errors.New("region changed since it was read")

// write stores v into field f of c's region file, a 4-byte write at the layout's offset,
// after checking that the file still holds a region of the layout c was read as (a region
// replaced by another layout, or truncated, is not written).
func (m *Monitor) write(c *Container, f region.Field, v int32) error {
	if c.Region == nil {
		return fmt.Errorf("write %v of %s: %w", f, c.Key, ErrRegionChanged)
	}
	file, err := os.OpenFile(c.Path, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("write %v of %s: %w", f, c.Key, err)
	}
	defer func() { _ = file.Close() }()
	st, err := file.Stat()
	if err != nil {
		return fmt.Errorf("write %v of %s: %w", f, c.Key, err)
	}
	head := make([]byte, region.HeaderSize)
	if _, err := file.ReadAt(head, 0); err != nil {
		return fmt.Errorf("write %v of %s: %w: %w", f, c.Key, ErrRegionChanged, err)
	}
	layout, _, _, err := region.Detect(st.Size(), head)
	if err != nil {
		return fmt.Errorf("write %v of %s: %w: %w", f, c.Key, ErrRegionChanged, err)
	}
	if layout != c.Region.Layout {
		return fmt.Errorf("write %v of %s: %w (read as %v, now %v)", f, c.Key, ErrRegionChanged, c.Region.Layout, layout)
	}
	if err := region.WriteField(file, layout, f, v); err != nil {
		return fmt.Errorf("write %v of %s: %w", f, c.Key, err)
	}
	return nil
}

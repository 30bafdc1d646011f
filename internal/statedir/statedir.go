// Package statedir prepares HAMi-core's state folders on the host: the per-container folder
// of the device plugin's Allocate (nodeagent.HAMiCore) and the per-claim folder of the DRA
// plugin's Prepare (draplugin), which HAMi-core's processes of one container or claim share.
package statedir

import (
	"fmt"
	"os"
)

// Recreate makes dir an empty folder with mode 0777 (HAMi-core runs as any user in the
// container), removing what it held.
func Recreate(dir string) error {
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	if err := os.Chmod(dir, 0o777); err != nil { // MkdirAll's mode is masked by the umask
		return fmt.Errorf("chmod %s: %w", dir, err)
	}
	return nil
}

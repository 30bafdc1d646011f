package draplugin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

// checkpointVersion is the version of the checkpoint's format this package writes and reads.
const checkpointVersion = 1

// checkpoint is the file in PluginDir that lists the prepared claims: Unprepare gets only a
// claim's UID, and a restarted plugin must still find what to remove.
type checkpoint struct {
	Version int                         `json:"version"`
	Driver  string                      `json:"driver"`
	Claims  map[types.UID]preparedClaim `json:"claims"`
}

// preparedClaim is what Prepare did for one claim.
type preparedClaim struct {
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name,omitempty"`
	// CDISpec is the transient CDI spec file; StateDir the HAMi-core state folder Prepare
	// created (empty without Options.PrepareStateDir).
	CDISpec  string           `json:"cdiSpec"`
	StateDir string           `json:"stateDir,omitempty"`
	Devices  []preparedDevice `json:"devices"`
}

// preparedDevice is one allocation result of a prepared claim and the answer given for it.
type preparedDevice struct {
	Request     string     `json:"request"`
	Pool        string     `json:"pool"`
	Device      string     `json:"device"`
	ShareID     *types.UID `json:"shareID,omitempty"`
	CDIDeviceID string     `json:"cdiDeviceID"`
	UUID        string     `json:"uuid"`
	MemoryMiB   int64      `json:"memoryMiB"`
	Cores       int64      `json:"cores"`
	// MIG is the MIG device created for a result naming a MIG placement (UUID is then the
	// parent GPU's); nil for a share of a GPU.
	MIG *preparedMIG `json:"mig,omitempty"`
}

// checkpointFix is the advice every checkpoint decoding error ends with.
const checkpointFix = "inspect the file; remove it only when no claim of this driver is prepared on the node (the kubelet would not unprepare the claims it lists, and their CDI specs would stay)"

// readCheckpoint reads the checkpoint at path; a missing file is no claims.
func readCheckpoint(path, driver string) (map[types.UID]preparedClaim, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return map[types.UID]preparedClaim{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w %s: %w", ErrCheckpoint, path, err)
	}
	c, err := decodeCheckpoint(data)
	if err != nil {
		return nil, fmt.Errorf("%w %s: %w: %s", ErrCheckpoint, path, err, checkpointFix)
	}
	if c.Driver != driver {
		return nil, fmt.Errorf("%w %s: written by driver %q, this plugin is %q: give each driver its own Options.PluginDir", ErrCheckpoint, path, c.Driver, driver)
	}
	return c.Claims, nil
}

// decodeCheckpoint parses and checks a checkpoint. It fails for JSON that is not a
// checkpoint, another version, and claims whose paths or names could not have been written
// by Prepare (Unprepare removes those paths, so they must be the plugin's own).
func decodeCheckpoint(data []byte) (checkpoint, error) {
	var c checkpoint
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return checkpoint{}, fmt.Errorf("decode: %w", err)
	}
	if dec.More() {
		return checkpoint{}, errors.New("decode: data after the checkpoint")
	}
	if c.Version != checkpointVersion {
		return checkpoint{}, fmt.Errorf("version %d, this plugin reads version %d", c.Version, checkpointVersion)
	}
	if c.Driver == "" {
		return checkpoint{}, errors.New("no driver")
	}
	if c.Claims == nil {
		c.Claims = map[types.UID]preparedClaim{}
	}
	for uid, claim := range c.Claims {
		if err := checkClaim(uid, claim); err != nil {
			return checkpoint{}, fmt.Errorf("claim %q: %w", uid, err)
		}
	}
	return c, nil
}

func checkClaim(uid types.UID, c preparedClaim) error {
	if !safeName(string(uid)) {
		return errors.New("the UID is not a file name")
	}
	if !filepath.IsAbs(c.CDISpec) || filepath.Base(c.CDISpec) != cdiSpecFile(uid) || filepath.Clean(c.CDISpec) != c.CDISpec {
		return fmt.Errorf("CDI spec %q is not an absolute, clean path to %s", c.CDISpec, cdiSpecFile(uid))
	}
	if c.StateDir != "" && (!filepath.IsAbs(c.StateDir) || filepath.Clean(c.StateDir) != c.StateDir ||
		filepath.Base(c.StateDir) != string(uid) || filepath.Base(filepath.Dir(c.StateDir)) != "claims") {
		return fmt.Errorf("state folder %q is not an absolute, clean path to claims/%s", c.StateDir, uid)
	}
	if len(c.Devices) == 0 {
		return errors.New("no devices")
	}
	for i, d := range c.Devices {
		switch {
		case d.Pool == "" || d.Device == "" || d.UUID == "":
			return fmt.Errorf("device %d: pool, device and uuid are required", i)
		case d.CDIDeviceID != cdiDeviceID(uid, d.Device):
			return fmt.Errorf("device %d: CDI device ID %q, want %q", i, d.CDIDeviceID, cdiDeviceID(uid, d.Device))
		case d.MemoryMiB < 0 || d.Cores < 0:
			return fmt.Errorf("device %d: negative memory or cores", i)
		case d.MIG != nil && (d.MIG.MigUUID == "" || d.MIG.Profile == "" || d.MIG.Size == 0):
			return fmt.Errorf("device %d: MIG device without MIG UUID, profile or placement size", i)
		}
	}
	return nil
}

// safeName reports whether s can be one element of a path.
func safeName(s string) bool {
	return s != "" && s != "." && s != ".." && !strings.ContainsAny(s, "/\\\x00")
}

// encodeCheckpoint is the checkpoint of claims, indented so that an operator can read it.
func encodeCheckpoint(driver string, claims map[types.UID]preparedClaim) ([]byte, error) {
	if claims == nil {
		claims = map[types.UID]preparedClaim{}
	}
	data, err := json.MarshalIndent(checkpoint{Version: checkpointVersion, Driver: driver, Claims: claims}, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(data, '\n'), nil
}

// writeCheckpoint writes the checkpoint atomically (temporary file, fsync, rename).
func (p *Plugin) writeCheckpoint(claims map[types.UID]preparedClaim) error {
	data, err := encodeCheckpoint(p.opts.Profile.Driver, claims)
	if err != nil {
		return fmt.Errorf("%w %s: encode: %w", ErrCheckpoint, p.ckptPath, err)
	}
	if err := os.MkdirAll(p.opts.PluginDir, 0o750); err != nil {
		return fmt.Errorf("%w %s: %w", ErrCheckpoint, p.ckptPath, err)
	}
	if err := writeFileAtomic(p.ckptPath, data, 0o600); err != nil {
		return fmt.Errorf("%w %s: %w", ErrCheckpoint, p.ckptPath, err)
	}
	return nil
}

// writeFileAtomic replaces path with data: readers see the old or the new file, never a part.
func writeFileAtomic(path string, data []byte, mode os.FileMode) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("create temporary file: %w", err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			_ = os.Remove(tmp)
		}
	}()
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := f.Chmod(mode); err != nil {
		_ = f.Close()
		return fmt.Errorf("chmod %s: %w", tmp, err)
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return fmt.Errorf("sync %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename %s: %w", tmp, err)
	}
	return nil
}

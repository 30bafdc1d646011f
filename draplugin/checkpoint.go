package draplugin

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

// Versions of the checkpoint's format: version 1 has no checksum; version 2, which this
// package writes, carries the SHA-256 of its content. Both are read.
const (
	checkpointVersion1 = 1
	checkpointVersion  = 2
)

// checksumPrefix starts a version 2 checkpoint's checksum.
const checksumPrefix = "sha256:"

// checkpoint is the file in PluginDir that lists the prepared claims: Unprepare gets only a
// claim's UID, and a restarted plugin must still find what to remove.
type checkpoint struct {
	Version int `json:"version"`
	// Checksum (version 2) is checksumPrefix and the hex SHA-256 of the compact JSON of
	// checkpointContent{Version, Driver, Claims} (map keys sorted): a flipped bit in any value
	// changes it.
	Checksum string                      `json:"checksum,omitempty"`
	Driver   string                      `json:"driver"`
	Claims   map[types.UID]preparedClaim `json:"claims"`
}

// checkpointContent is what a checkpoint's checksum covers.
type checkpointContent struct {
	Version int                         `json:"version"`
	Driver  string                      `json:"driver"`
	Claims  map[types.UID]preparedClaim `json:"claims"`
}

// checksum is the checksum of a checkpoint of version, driver and claims.
func checksum(version int, driver string, claims map[types.UID]preparedClaim) (string, error) {
	data, err := json.Marshal(checkpointContent{Version: version, Driver: driver, Claims: claims})
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(data)
	return checksumPrefix + hex.EncodeToString(sum[:]), nil
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

// readCheckpoint reads the checkpoint at path; a missing file is no claims. It also returns
// the SHA-256 of the file's bytes (zero for a missing file), so that the plugin can tell
// whether another process rewrote it. A file that is not a checkpoint (not JSON, truncated, a
// bad checksum, claims Prepare could not have written) is an error wrapping
// [ErrCheckpointCorrupt]; one of another driver or of a newer format wraps [ErrCheckpoint].
func readCheckpoint(path, driver string) (map[types.UID]preparedClaim, [sha256.Size]byte, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return map[types.UID]preparedClaim{}, [sha256.Size]byte{}, nil
	}
	if err != nil {
		return nil, [sha256.Size]byte{}, fmt.Errorf("%w %s: %w", ErrCheckpoint, path, err)
	}
	sum := sha256.Sum256(data)
	c, err := decodeCheckpoint(data)
	if err != nil {
		return nil, sum, fmt.Errorf("read %s: %w", path, err)
	}
	if c.Driver != driver {
		return nil, sum, fmt.Errorf("%w %s: written by driver %q, this plugin is %q: give each driver its own Options.PluginDir", ErrCheckpoint, path, c.Driver, driver)
	}
	return c.Claims, sum, nil
}

// errNewerCheckpoint: the checkpoint has a version this plugin does not know (a newer
// plugin wrote it): not corrupted, but not readable either.
var errNewerCheckpoint = errors.New("a newer format")

// decodeCheckpoint parses and checks a checkpoint. It fails, wrapping [ErrCheckpointCorrupt],
// for bytes that are not a checkpoint, a version 2 checkpoint whose checksum does not match
// its content, and claims whose paths or names could not have been written by Prepare
// (Unprepare removes those paths, so they must be the plugin's own); a version it does not
// know wraps [ErrCheckpoint] only.
func decodeCheckpoint(data []byte) (checkpoint, error) {
	var c checkpoint
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return checkpoint{}, fmt.Errorf("%w: decode: %w", ErrCheckpointCorrupt, err)
	}
	if dec.More() {
		return checkpoint{}, fmt.Errorf("%w: decode: data after the checkpoint", ErrCheckpointCorrupt)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return checkpoint{}, fmt.Errorf("%w: decode: data after the checkpoint", ErrCheckpointCorrupt)
	}
	switch {
	case c.Version > checkpointVersion:
		return checkpoint{}, fmt.Errorf("%w: version %d is %w, this plugin reads versions %d and %d: run the newer plugin, or move the file aside (the plugin then rebuilds it from the CDI specs)",
			ErrCheckpoint, c.Version, errNewerCheckpoint, checkpointVersion1, checkpointVersion)
	case c.Version < checkpointVersion1:
		return checkpoint{}, fmt.Errorf("%w: version %d", ErrCheckpointCorrupt, c.Version)
	case c.Version == checkpointVersion1 && c.Checksum != "":
		return checkpoint{}, fmt.Errorf("%w: version 1 has no checksum", ErrCheckpointCorrupt)
	case c.Version == checkpointVersion:
		want, err := checksum(c.Version, c.Driver, c.Claims)
		if err != nil {
			return checkpoint{}, fmt.Errorf("%w: checksum: %w", ErrCheckpointCorrupt, err)
		}
		if c.Checksum != want {
			return checkpoint{}, fmt.Errorf("%w: checksum %q does not match the content (%s)", ErrCheckpointCorrupt, c.Checksum, want)
		}
	}
	if c.Driver == "" {
		return checkpoint{}, fmt.Errorf("%w: no driver", ErrCheckpointCorrupt)
	}
	if c.Claims == nil {
		c.Claims = map[types.UID]preparedClaim{}
	}
	for uid, claim := range c.Claims {
		if err := checkClaim(uid, claim); err != nil {
			return checkpoint{}, fmt.Errorf("%w: claim %q: %w", ErrCheckpointCorrupt, uid, err)
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
	sum, err := checksum(checkpointVersion, driver, claims)
	if err != nil {
		return nil, err
	}
	data, err := json.MarshalIndent(checkpoint{Version: checkpointVersion, Checksum: sum, Driver: driver, Claims: claims}, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(data, '\n'), nil
}

// writeCheckpoint writes the checkpoint atomically (temporary file, fsync, rename); the
// caller holds the plugin's lock ([Plugin.lock]).
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
	p.ckptSum = sha256.Sum256(data)
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
	// The folder is not synced (it would double Prepare's time): a rename lost to a power
	// cut leaves the previous checkpoint, whose missing or extra claims the stale-claim
	// cleanup settles (an orphan CDI spec is adopted or removed, a stale entry unprepared).
	return nil
}

package draplugin

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
)

// recoverCheckpoint replaces a corrupted checkpoint (cause wraps [ErrCheckpointCorrupt]):
// it moves the file aside to <checkpoint>.corrupt-<UTC time> for inspection, rebuilds the
// prepared claims from the records in the CDI specs of this driver ([CDIRecordAnnotation])
// and writes them as the new checkpoint. The stale-claim cleanup then checks every rebuilt
// claim against the API server. report wraps cause and says what was done; err is set (and
// wraps [ErrCheckpointCorrupt]) when the recovery itself failed. The flock is held.
func (p *Plugin) recoverCheckpoint(cause error) (report, err error) {
	aside, err := p.moveAside()
	if err != nil {
		return nil, fmt.Errorf("%w; moving it aside failed: %w: move it away by hand, the plugin rebuilds it from the CDI specs in %s", cause, err, p.opts.CDIDir)
	}
	claims, skipped, err := specRecords(p.opts.CDIDir, p.opts.Profile.Driver)
	if err != nil {
		return nil, fmt.Errorf("%w; moved it to %s, but rebuilding it failed: %w", cause, aside, err)
	}
	if err := p.writeCheckpoint(claims); err != nil {
		return nil, fmt.Errorf("%w; moved it to %s, but writing the rebuilt one failed: %w", cause, aside, err)
	}
	p.mu.Lock()
	p.claims = claims
	p.mu.Unlock()
	p.recoveries.Add(1)
	var notes string
	if len(skipped) > 0 {
		var s []string
		for _, path := range slices.Sorted(maps.Keys(skipped)) {
			s = append(s, path+": "+skipped[path])
		}
		notes = fmt.Sprintf(" (%d CDI spec(s) of this vendor without a usable record were left alone: %s)", len(skipped), strings.Join(s, "; "))
	}
	return fmt.Errorf("%w; moved it to %s and rebuilt it from the CDI specs in %s with %d prepared claim(s)%s; the stale-claim cleanup checks them against the API server",
		cause, aside, p.opts.CDIDir, len(claims), notes), nil
}

// moveAside renames the checkpoint to <checkpoint>.corrupt-<UTC time>[-<n>], a name not
// taken yet, and returns it.
func (p *Plugin) moveAside() (string, error) {
	base := p.ckptPath + ".corrupt-" + p.clock.Now().UTC().Format("20060102T150405Z")
	for i := 0; ; i++ {
		aside := base
		if i > 0 {
			aside += "-" + strconv.Itoa(i)
		}
		if _, err := os.Lstat(aside); err == nil {
			continue
		} else if !errors.Is(err, fs.ErrNotExist) {
			return "", err
		}
		if err := os.Rename(p.ckptPath, aside); err != nil {
			return "", err
		}
		return aside, nil
	}
}

// recoverAtNew is New's way with a corrupted checkpoint: under the flock (waited for
// without end: New has no context) it reads the checkpoint again, since another process may
// have recovered it meanwhile, and recovers it if it is still corrupted. The report is kept
// for Run, which logs it and hands it to Options.OnError.
func (p *Plugin) recoverAtNew() error {
	f, err := p.flockWithoutContext()
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	claims, sum, err := readCheckpoint(p.ckptPath, p.opts.Profile.Driver)
	if err == nil {
		p.claims, p.ckptSum = claims, sum
		return nil
	}
	if !errors.Is(err, ErrCheckpointCorrupt) {
		return err
	}
	report, err := p.recoverCheckpoint(err)
	if err != nil {
		return err
	}
	p.recovery = report
	return nil
}

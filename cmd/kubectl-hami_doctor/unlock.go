package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/hamireg/hamireg/diagnose"
)

const unlockUsage = `Usage:
  {cmd} unlock NODE [--yes] [flags]   remove a stale node lock (hami.io/mutex.lock)

Without --yes it prints the lock, its holder and why it is stale, and writes nothing. With
--yes it removes the lock shown, only if it is still the same and still stale. It refuses a
live lock. Besides cordon and uncordon, this is the only verb that writes.
Exit status: 0 when removed (or, without --yes, removable), 1 when the lock is live or there
is none, 2 on errors.
`

// unlockResult is unlock's -o json and yaml form.
type unlockResult struct {
	Lock    *diagnose.LockState `json:"lock,omitempty"`
	Removed bool                `json:"removed"`
	DryRun  bool                `json:"dryRun"`
	Refused string              `json:"refused,omitempty"`
}

func (c *cli) unlockCmd(args []string) int {
	fs, f := c.newClusterFlags("unlock", unlockUsage)
	yes := fs.Bool("yes", false, "remove the lock (without it: show what would be removed)")
	if err := parse(fs, args); err != nil {
		return c.fail("unlock", fs, err)
	}
	node, err := oneName(fs, "node name")
	if err != nil {
		return c.fail("unlock", fs, err)
	}
	client, err := c.client(f)
	if err != nil {
		return c.fail("unlock", fs, err)
	}
	ctx, cancel := f.context(c.ctx)
	defer cancel()
	res := unlockResult{DryRun: !*yes}
	lock, err := c.api.lockOf(ctx, client, node, f.opts)
	switch {
	case errors.Is(err, diagnose.ErrNoLock):
		res.Refused = err.Error()
		return c.unlockDone(f.output, res, node)
	case err != nil:
		return c.fail("unlock", nil, err)
	}
	res.Lock = lock
	if lock.Stale == "" {
		res.Refused = fmt.Sprintf("%v: node %s: its holder %s is on the node and still allocating, within the lock timeout", diagnose.ErrNotStale, node, orDash(lock.Holder))
		return c.unlockDone(f.output, res, node)
	}
	if *yes {
		err := c.api.removeStaleLock(ctx, client, *lock, f.opts)
		switch {
		case errors.Is(err, diagnose.ErrNotStale), errors.Is(err, diagnose.ErrNoLock):
			res.Refused = err.Error()
		case err != nil:
			return c.fail("unlock", nil, err)
		default:
			res.Removed = true
		}
	}
	return c.unlockDone(f.output, res, node)
}

// unlockDone prints the result and returns the exit status.
func (c *cli) unlockDone(output string, res unlockResult, node string) int {
	return c.show("unlock", output, document{kindUnlockResult, res}, func() { c.printUnlock(c.stdout, res, node) }, res.Refused != "")
}

func (c *cli) printUnlock(w io.Writer, res unlockResult, node string) {
	if res.Lock != nil {
		fmt.Fprintf(w, "Lock     %s\n", lockLine(res.Lock))
		if res.Lock.Holder != "" {
			fmt.Fprintf(w, "Holder   %s\n", res.Lock.Holder)
		}
		if res.Lock.Stale != "" {
			fmt.Fprintf(w, "Stale    %s\n", res.Lock.Stale)
		}
	}
	switch {
	case res.Refused != "":
		fmt.Fprintf(w, "Refused: %s\n", res.Refused)
	case res.Removed:
		fmt.Fprintf(w, "Removed hami.io/mutex.lock %q from node %s.\n", res.Lock.Value, node)
	default:
		fmt.Fprintf(w, "Nothing written. To remove this lock, rerun with --yes:\n  %s unlock %s --yes\n", c.name, node)
	}
}

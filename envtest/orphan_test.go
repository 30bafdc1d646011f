//go:build e2e

package envtest_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hamireg/hamireg/envtest"
)

// A test binary killed with SIGKILL (as a test timeout or an OOM kill would) takes its
// etcd, kube-apiserver and kube-scheduler with it (Pdeathsig), and the next Start removes
// the temporary folder it could not remove itself.
func TestChildrenDieWithTestBinary(t *testing.T) {
	t.Parallel()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), self, "-test.run=^$")
	cmd.Env = append(os.Environ(), envOrphanChild+"=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var s started
	line, err := bufio.NewReader(out).ReadBytes('\n')
	if err == nil {
		err = json.Unmarshal(line, &s)
	}
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("doomed test binary did not report its control plane (output %q): %v", line, err)
	}
	for _, pid := range s.Pids {
		if !alive(pid) {
			t.Fatalf("pid %d not running before the kill", pid)
		}
	}

	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range s.Pids {
		for alive(pid) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if alive(pid) {
			t.Errorf("pid %d still running after its test binary was killed", pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}

	if _, err := os.Stat(s.Dir); err != nil {
		t.Fatalf("the killed binary's folder %s: %v (expected it left behind)", s.Dir, err)
	}
	envtest.RemoveStaleDirs("hamireg-e2e-")
	if _, err := os.Stat(s.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("RemoveStaleDirs left %s behind (stat: %v)", s.Dir, err)
		_ = os.RemoveAll(s.Dir)
	}
}

// alive reports whether pid exists and is not a zombie (PID 1 of a container may not reap
// orphans promptly).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z'
}

//go:build e2e

package envtest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/hamireg/hamireg/envtest"
)

// envOrphanChild makes the test binary act as a doomed test binary: it starts a control
// plane, prints what it started and waits to be killed (see TestChildrenDieWithTestBinary).
const envOrphanChild = "HAMIREG_HARNESS_TEST_ORPHAN"

// started is what the doomed child reports.
type started struct {
	Pids []int  `json:"pids"`
	Dir  string `json:"dir"`
}

// The tests of this file's build tag (e2e, run by hack/e2e.sh), TestExample included, need
// the peer binaries: they fail, never skip, without them.
func TestMain(m *testing.M) {
	if os.Getenv(envOrphanChild) == "1" {
		os.Exit(runDoomedChild())
	}
	os.Exit(m.Run())
}

func runDoomedChild() int {
	cp, err := envtest.Start(context.Background(), envtest.Options{Logf: func(string, ...any) {}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	s, err := cp.StartScheduler(context.Background(), envtest.SchedulerOptions{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	_ = json.NewEncoder(os.Stdout).Encode(started{Pids: []int{cp.APIServerPid(), cp.EtcdPid(), s.Pid()}, Dir: cp.Dir()})
	time.Sleep(time.Hour) // killed by the parent test
	return 0
}

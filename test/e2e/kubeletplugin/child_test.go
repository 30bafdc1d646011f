package kubeletplugin_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/hamireg/hamireg/kubeletplugin"
)

// Environment of a plugin child: the plugin folder and the health of its GPUs ("1,0": two
// GPUs, the second unhealthy).
const (
	envPluginDir    = "HAMIREG_E2E_PLUGIN_CHILD_DIR"
	envPluginHealth = "HAMIREG_E2E_PLUGIN_CHILD_HEALTH"
)

// runPluginChildIfAsked runs a device plugin process and exits, when this test binary was
// started as one by startPluginProcess.
func runPluginChildIfAsked() {
	dir := os.Getenv(envPluginDir)
	if dir == "" {
		return
	}
	var health []bool
	for _, h := range strings.Split(os.Getenv(envPluginHealth), ",") {
		health = append(health, h == "1")
	}
	p, err := kubeletplugin.New(kubeletplugin.Options{PluginDir: dir})
	if err != nil {
		fmt.Fprintln(os.Stderr, "plugin child:", err)
		os.Exit(2)
	}
	p.SetDevices(gpus(health...))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	err = p.Run(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "plugin child:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// startPluginProcess starts a device plugin in a process of its own (this test binary,
// re-executed); it is killed when the test ends or the test binary dies.
func startPluginProcess(t *testing.T, dir string, health ...bool) *exec.Cmd {
	t.Helper()
	var hs []string
	for _, h := range health {
		hs = append(hs, strconv.Itoa(map[bool]int{false: 0, true: 1}[h]))
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envPluginDir+"="+dir, envPluginHealth+"="+strings.Join(hs, ","))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start plugin process: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
		if t.Failed() {
			t.Logf("plugin process %d output:\n%s", cmd.Process.Pid, out.String())
		}
	})
	return cmd
}

// A plugin process killed with SIGKILL (no cleanup: the stream just breaks, the socket file
// stays) takes its devices out of allocatable; a new process removes the stale socket,
// serves, registers, and the kubelet publishes its devices again.
func TestKubeletPluginProcessKilled(t *testing.T) {
	t.Parallel()
	dm := startDeviceManager(t)
	first := startPluginProcess(t, dm.Dir(), true, true)
	waitForResources(t, dm, 2*split, 2*split)

	killed := time.Now()
	if err := first.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitForResources(t, dm, 2*split, 0)
	t.Logf("allocatable 0 %v after SIGKILL", time.Since(killed).Round(time.Millisecond))

	started := time.Now()
	startPluginProcess(t, dm.Dir(), true, false)
	waitForResources(t, dm, 2*split, split)
	t.Logf("new process registered and published %v after it started", time.Since(started).Round(time.Millisecond))

	// The survivor keeps serving: a kubelet restart finds it again.
	if err := dm.Restart(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		r, err := dm.Capacity(ctx)
		return err == nil && r.Allocatable[resource] == split, nil
	}); err != nil {
		t.Errorf("allocatable after a kubelet restart: %v", err)
	}
}

package drarobust_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/dra"
	"github.com/hamireg/hamireg/draplugin"
	"github.com/hamireg/hamireg/envtest/proc"
	"github.com/hamireg/hamireg/hamicore"
)

// pluginChildEnv carries a childConfig (JSON): the test binary then runs the DRA plugin of
// one node as a process of its own, which a test can SIGKILL.
const pluginChildEnv = "HAMIREG_DRAROBUST_PLUGIN"

// childConfig is what the child plugin needs.
type childConfig struct {
	Kubeconfig, Node, RegistrarDir, PluginDir, CDIDir, Hook string
	// Block, when set, makes the plugin write this file (the claim's UID) and hang after the
	// first claim's CDI spec is written, before the checkpoint records it
	// (draplugin.Options.AfterCDISpec): the test kills it there.
	Block string
}

// childGPUs are the child's two GPUs of 40 GiB.
func childGPUs() []annotation.Device {
	return []annotation.Device{
		{ID: "GPU-0b0b0b0b-0000-4000-8000-000000000000", Index: 0, Count: 10, Devmem: 40960, Devcore: 100, Type: "NVIDIA-A100-SXM4-40GB", Mode: "hami-core", Health: true},
		{ID: "GPU-0b0b0b0b-1111-4000-8000-000000000001", Index: 1, Count: 10, Devmem: 40960, Devcore: 100, Type: "NVIDIA-A100-SXM4-40GB", Mode: "hami-core", Health: true},
	}
}

// runPluginChild is the child's main: the DRA plugin until SIGTERM (or SIGKILL).
func runPluginChild() int {
	var c childConfig
	if err := json.Unmarshal([]byte(os.Getenv(pluginChildEnv)), &c); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ctx = klog.NewContext(ctx, textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(4))))
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	profile := dra.SDKProfile()
	opts := draplugin.Options{
		Profile: profile, Client: client, NodeName: c.Node,
		RegistrarDir: c.RegistrarDir, PluginDir: c.PluginDir, CDIDir: c.CDIDir,
		Env: hamicore.EnvOptions{HookPath: c.Hook}, PrepareStateDir: true, SliceSyncDelay: -1,
	}
	if c.Block != "" {
		opts.AfterCDISpec = func(ctx context.Context, uid types.UID) {
			_ = os.WriteFile(c.Block, []byte(uid), 0o600)
			<-ctx.Done() // the test SIGKILLs the process here
		}
	}
	p, err := draplugin.New(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	devs, err := dra.Devices(childGPUs(), dra.Options{Profile: profile})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	p.SetDevices(childGPUs(), devs)
	if err := p.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// childPlugin is a running child plugin.
type childPlugin struct {
	cmd *exec.Cmd
	log string
}

// startChild starts the node's DRA plugin as a child process (blocking mid-prepare when block
// is set) and waits until it registered with the DRA manager.
func (n *robustNode) startChild(tb testing.TB, block string) *childPlugin {
	tb.Helper()
	cfg, err := json.Marshal(childConfig{
		Kubeconfig: cp.Kubeconfig(), Node: n.name, RegistrarDir: n.dra.RegistryDir(),
		PluginDir: n.plugin, CDIDir: n.cdiDir, Hook: n.hook, Block: block,
	})
	if err != nil {
		tb.Fatal(err)
	}
	regs := n.dra.Registrations(n.profile.Driver)
	c := &childPlugin{log: filepath.Join(n.root, fmt.Sprintf("plugin-%d.log", time.Now().UnixNano()))}
	logFile, err := os.Create(c.log)
	if err != nil {
		tb.Fatal(err)
	}
	defer func() { _ = logFile.Close() }()
	c.cmd = exec.Command(os.Args[0], "-test.run=^$")
	c.cmd.Env = append(os.Environ(), pluginChildEnv+"="+string(cfg))
	c.cmd.Stdout, c.cmd.Stderr = logFile, logFile
	if err := c.cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if c.cmd.ProcessState == nil {
			_ = c.cmd.Process.Signal(syscall.SIGTERM)
			_ = c.cmd.Wait()
		}
		if tb.Failed() {
			tb.Logf("child plugin log %s:\n%s", c.log, proc.Tail(c.log, 60))
		}
	})
	n.waitForRegistration(tb, regs)
	return c
}

// kill SIGKILLs the child and reaps it.
func (c *childPlugin) kill(tb testing.TB) {
	tb.Helper()
	if err := c.cmd.Process.Kill(); err != nil {
		tb.Fatal(err)
	}
	_ = c.cmd.Wait()
}

// stop ends the child with SIGTERM and reaps it.
func (c *childPlugin) stop(tb testing.TB) {
	tb.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		tb.Fatal(err)
	}
	if err := c.cmd.Wait(); err != nil {
		tb.Errorf("child plugin: %v (log %s)", err, c.log)
	}
}

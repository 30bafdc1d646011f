package kubeletplugin_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/envtest/kubeletpeer"
	"github.com/hamireg/hamireg/kubeletplugin"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// The kubelet's registration server accepts the plugin: it dials back at <dir>/<Endpoint>,
// reads the options and streams GPUs x split virtual devices with HAMi's ids and, with
// NUMATopology, their GPU's NUMA node.
func TestKubeletRegistration(t *testing.T) {
	t.Parallel()
	srv, err := kubeletpeer.StartRegistrationServer(t.Context(), harness.ShortTempDir(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	p := startPlugin(t, kubeletplugin.Options{PluginDir: srv.Dir(), SocketName: "hami.sock", NUMATopology: true}, gpus(true, false))

	ev := harness.WaitForEvent(t, srv, "connect", func(e kubeletpeer.Event) bool { return e.Kind == kubeletpeer.EventConnected })
	if ev.Resource != resource || ev.SocketPath != filepath.Join(srv.Dir(), "hami.sock") || ev.Options.GetPreStartRequired() || ev.Options.GetGetPreferredAllocationAvailable() {
		t.Errorf("connected %+v", ev)
	}
	ev = harness.WaitForEvent(t, srv, "device list", func(e kubeletpeer.Event) bool { return e.Kind == kubeletpeer.EventListAndWatch })
	if len(ev.Devices) != 2*split || ev.Healthy() != split {
		t.Fatalf("devices %d healthy %d, want %d and %d", len(ev.Devices), ev.Healthy(), 2*split, split)
	}
	d := ev.Devices[split]
	if want := kubeletplugin.VirtualDeviceID(gpus(true, true)[1].ID, 0); d.GetID() != want || d.GetHealth() != pluginapi.Unhealthy || d.GetTopology().GetNodes()[0].GetID() != 1 {
		t.Errorf("device %d = %v, want %s unhealthy on NUMA 1", split, d, want)
	}
	if err := wait.PollUntilContextTimeout(t.Context(), 5*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return p.Stats().Registrations == 1, nil
	}); err != nil {
		t.Errorf("Registrations = %d, want 1", p.Stats().Registrations)
	}
	if err := p.stop(); err != nil {
		t.Fatal(err)
	}
	harness.WaitForEvent(t, srv, "disconnect", func(e kubeletpeer.Event) bool { return e.Kind == kubeletpeer.EventDisconnected })
}

// A resource name without a domain is refused by New, before anything reaches the kubelet,
// with the form it needs (annotation.Vendor.Validate); the kubelet's own verdict on a name
// that has the form but not its syntax (a name part starting with '-') reaches the caller with
// the kubelet's words.
func TestKubeletInvalidResourceName(t *testing.T) {
	t.Parallel()
	srv, err := kubeletpeer.StartRegistrationServer(t.Context(), harness.ShortTempDir(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	_, err = kubeletplugin.New(kubeletplugin.Options{PluginDir: srv.Dir(), Vendor: annotation.Vendor{Name: "NVIDIA", ResourceName: "gpu"}})
	if !errors.Is(err, annotation.ErrIncompleteVendor) || !strings.Contains(err.Error(), "<domain>/<name>") {
		t.Errorf("New with resource gpu: %v, want annotation.ErrIncompleteVendor naming the form", err)
	}

	const bad = "example.com/-gpu"
	p := startPlugin(t, kubeletplugin.Options{PluginDir: srv.Dir(), Vendor: annotation.Vendor{Name: "NVIDIA", ResourceName: bad}}, gpus(true))
	err = p.wait(t, 30*time.Second)
	var rerr *kubeletplugin.RegistrationError
	if !errors.Is(err, kubeletplugin.ErrRegistrationRejected) || !errors.As(err, &rerr) {
		t.Fatalf("Run: %v, want a RegistrationError", err)
	}
	if !strings.Contains(err.Error(), `the ResourceName "`+bad+`" is invalid`) {
		t.Errorf("error %q lacks the kubelet's message", err)
	}
	if _, err := os.Stat(p.SocketPath()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left after rejection: %v", err)
	}
}

// A kubelet with --root-dir elsewhere: the plugin finds it through PluginDirFromRootDir, and
// a plugin looking at the default folder gets an error naming where it looked.
func TestKubeletRelocatedPluginDir(t *testing.T) {
	t.Parallel()
	root := filepath.Join(harness.ShortTempDir(t), "k0s", "kubelet")
	srv, err := kubeletpeer.StartRegistrationServer(t.Context(), kubeletplugin.PluginDirFromRootDir(root))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	startPlugin(t, kubeletplugin.Options{PluginDir: kubeletplugin.PluginDirFromRootDir(root)}, gpus(true))
	ev := harness.WaitForEvent(t, srv, "device list", func(e kubeletpeer.Event) bool { return e.Kind == kubeletpeer.EventListAndWatch })
	if len(ev.Devices) != split {
		t.Errorf("devices = %d, want %d", len(ev.Devices), split)
	}

	wrong := filepath.Join(filepath.Dir(root), "var-lib-kubelet", "device-plugins")
	if err := os.MkdirAll(wrong, 0o750); err != nil {
		t.Fatal(err)
	}
	p := startPlugin(t, kubeletplugin.Options{PluginDir: wrong}, gpus(true))
	err = p.wait(t, 10*time.Second)
	if !errors.Is(err, kubeletplugin.ErrKubeletSocketMissing) || !strings.Contains(err.Error(), wrong) || !strings.Contains(err.Error(), "--root-dir") {
		t.Fatalf("Run in the wrong folder: %v, want ErrKubeletSocketMissing naming %s", err, wrong)
	}
}

// ManagerImpl: capacity = GPUs x split, allocatable = healthy virtual devices; a GPU turning
// unhealthy lowers allocatable and recovery raises it; stopping the plugin zeroes it.
func TestKubeletDeviceManagerHealth(t *testing.T) {
	t.Parallel()
	dm := startDeviceManager(t)
	p := startPlugin(t, kubeletplugin.Options{PluginDir: dm.Dir()}, gpus(true, true, true))
	waitForResources(t, dm, 3*split, 3*split)

	p.SetDevices(gpus(true, false, true))
	waitForResources(t, dm, 3*split, 2*split)
	p.SetDevices(gpus(true, true, true))
	waitForResources(t, dm, 3*split, 3*split)
	p.SetDevices(gpus(true, true, true, false)) // a GPU added, unhealthy
	waitForResources(t, dm, 4*split, 3*split)

	if err := p.stop(); err != nil {
		t.Fatal(err)
	}
	waitForResources(t, dm, 4*split, 0)
}

// A kubelet restart deletes the plugin's socket and re-creates kubelet.sock; the plugin
// re-registers by itself and allocatable comes back.
func TestKubeletRestart(t *testing.T) {
	t.Parallel()
	dm := startDeviceManager(t)
	p := startPlugin(t, kubeletplugin.Options{PluginDir: dm.Dir()}, gpus(true, false))
	waitForResources(t, dm, 2*split, split)
	for i := range 3 {
		if err := dm.Restart(t.Context()); err != nil {
			t.Fatalf("kubelet restart %d: %v", i, err)
		}
		waitForResources(t, dm, 2*split, split)
	}
	// The kubelet streams before Register returns to the plugin: poll the counter.
	if err := wait.PollUntilContextTimeout(t.Context(), 5*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return p.Stats().Registrations >= 4, nil
	}); err != nil {
		t.Errorf("Registrations = %d, want >= 4 (1 + 3 restarts); stats %+v", p.Stats().Registrations, p.Stats())
	}
	p.SetDevices(gpus(true, true))
	waitForResources(t, dm, 2*split, 2*split)
}

// The plugin process restarts: the old one is gone (here its socket file is left behind as
// after a crash), a new one removes the stale socket, serves and registers.
func TestKubeletPluginProcessRestart(t *testing.T) {
	t.Parallel()
	dm := startDeviceManager(t)
	opts := kubeletplugin.Options{PluginDir: dm.Dir()}
	p := startPlugin(t, opts, gpus(true, true))
	waitForResources(t, dm, 2*split, 2*split)
	if err := p.stop(); err != nil {
		t.Fatal(err)
	}
	waitForResources(t, dm, 2*split, 0)

	// What a crashed process leaves: a socket file nobody listens on.
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: p.SocketPath(), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	_ = ln.Close()

	p2 := startPlugin(t, opts, gpus(true, false))
	waitForResources(t, dm, 2*split, split)
	if err := wait.PollUntilContextTimeout(t.Context(), 5*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return p2.Stats().Registrations == 1, nil
	}); err != nil {
		t.Errorf("new plugin Registrations = %d, want 1", p2.Stats().Registrations)
	}
}

// The duplicate-Register trap (a second Register of an endpoint whose stream is open makes
// the kubelet forget the stream, and the devices stay allocatable after the plugin dies)
// cannot be reached through the package: a second Plugin on the socket is refused, and
// forced re-registrations with the same kubelet never hit "already connected"; at the end,
// stopping the plugin still drops allocatable to 0.
func TestKubeletDuplicateRegisterTrap(t *testing.T) {
	t.Parallel()
	dm := startDeviceManager(t)
	opts := kubeletplugin.Options{PluginDir: dm.Dir()}
	p := startPlugin(t, opts, gpus(true, true))
	waitForResources(t, dm, 2*split, 2*split)

	second := startPlugin(t, opts, gpus(true))
	if err := second.wait(t, 10*time.Second); !errors.Is(err, kubeletplugin.ErrSocketInUse) {
		t.Fatalf("second plugin on the same socket: %v, want ErrSocketInUse", err)
	}

	// The kubelet sees the devices before Register returns to the plugin: wait for the count.
	if err := wait.PollUntilContextTimeout(t.Context(), 5*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return p.Stats().Registrations == 1, nil
	}); err != nil {
		t.Fatalf("Registrations = %d, want 1", p.Stats().Registrations)
	}
	for i := range 5 { // the plugin re-registers with the same kubelet instance
		before := p.Stats().Registrations
		if err := os.Remove(p.SocketPath()); err != nil {
			t.Fatal(err)
		}
		harness.Eventually(t, fmt.Sprintf("re-registration %d", i), 20*time.Second, func() bool { return p.Stats().Registrations != before })
		waitForResources(t, dm, 2*split, 2*split)
	}
	if st := p.Stats(); st.RegistrationFailures != 0 {
		t.Errorf("RegistrationFailures = %d, want 0; stats %+v", st.RegistrationFailures, st)
	}
	if err := p.stop(); err != nil {
		t.Fatal(err)
	}
	waitForResources(t, dm, 2*split, 0) // stays 2*split/2*split if the kubelet orphaned the stream
	if log := dm.LogTail(400); strings.Contains(log, "already connected") {
		t.Errorf("the kubelet saw a duplicate Register:\n%s", log)
	}
}

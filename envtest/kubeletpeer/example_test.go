package kubeletpeer_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/hamireg/hamireg/envtest/kubeletpeer"
)

// The package doc's snippets, compiled (the root module's TestSnippetsAreCompiled compares
// them with these regions). They need the kubelet's device manager in a mount namespace and
// a device plugin, so they only compile here; Example (run by TestExample, tag e2e) runs them.

// snippet: doc
func TestMain(m *testing.M) {
	if code, child := kubeletpeer.RunIfChild(context.Background()); child {
		os.Exit(code) // the kubelet device manager's child ends here
	}
	os.Exit(m.Run())
}

// end snippet

func Example_registrationServer() {
	run := func(ctx context.Context, dir string) error {
		// snippet: doc
		srv, err := kubeletpeer.StartRegistrationServer(ctx, dir)
		if err != nil {
			return err
		}
		defer srv.Stop() //nolint:errcheck // the doc's snippet
		// the plugin serves on srv.Dir()/vendor.sock and registers at srv.SocketPath()
		ev, err := srv.WaitFor(ctx, func(e kubeletpeer.Event) bool { return e.Kind == kubeletpeer.EventListAndWatch })
		// end snippet
		fmt.Println(ev.Kind)
		return err
	}
	_ = run
}

func Example_deviceManager() {
	run := func(ctx context.Context, pod *corev1.Pod) error {
		// snippet: doc
		dm, err := kubeletpeer.StartDeviceManager(ctx, kubeletpeer.DeviceManagerOptions{})
		if err != nil {
			return err
		}
		defer dm.Stop() //nolint:errcheck // the doc's snippet
		// the plugin serves on dm.Dir()/vendor.sock and registers at dm.SocketPath()
		res, err := dm.Capacity(ctx) // res.Capacity["vendor.com/gpu"], res.Allocatable[…]
		if err != nil {
			return err
		}
		if err := dm.Restart(ctx); err != nil { // kubelet restart: plugin sockets deleted, kubelet.sock re-created
			return err
		}
		a, err := dm.Allocate(ctx, pod, "cuda") // the kubelet admitting one container: a.DeviceIDs, a.Envs, a.Mounts, a.Devices
		// end snippet
		fmt.Println(res.Capacity, a.DeviceIDs)
		return err
	}
	_ = run
}

func Example_draManager() {
	run := func(ctx context.Context, client kubernetes.Interface, pod *corev1.Pod) error {
		// snippet: doc
		m, err := kubeletpeer.StartDRAManager(ctx, kubeletpeer.DRAManagerOptions{Client: client, NodeName: "node-1"})
		if err != nil {
			return err
		}
		defer m.Stop() //nolint:errcheck // the doc's snippet
		// the driver registers in m.RegistryDir()
		if err := m.WaitForDriver(ctx, "gpu.example.com"); err != nil {
			return err
		}
		if err := m.Prepare(ctx, pod); err != nil { // NodePrepareResources of the pod's claims
			return err
		}
		ids, err := m.GetResources(pod, "cuda") // CDI device IDs for the container runtime
		fmt.Println(ids, err)
		err = m.Unprepare(ctx, pod) // NodeUnprepareResources
		// end snippet
		return err
	}
	_ = run
}

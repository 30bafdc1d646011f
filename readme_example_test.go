package hamireg_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/dra"
	"github.com/hamireg/hamireg/draplugin"
	"github.com/hamireg/hamireg/extender"
	"github.com/hamireg/hamireg/hamicore"
	"github.com/hamireg/hamireg/kubeletplugin"
	"github.com/hamireg/hamireg/nodeagent"
	"github.com/hamireg/hamireg/nodeagent/nodedra"
	"github.com/hamireg/hamireg/nodelock"
	"github.com/hamireg/hamireg/nvmlscan"
	"github.com/hamireg/hamireg/register"
	"github.com/hamireg/hamireg/schedcache"
)

// The Go blocks of README.md and docs/*.md, compiled (TestSnippetsAreCompiled checks that each block is the
// text of one region here). Each Example only compiles its snippet: the snippets need a
// cluster or a GPU. What a snippet uses without declaring it is a parameter of the function
// around it; what it declares for later is used after the region.

func Example_readmeNodeAgent() {
	run := func(ctx context.Context, client kubernetes.Interface, nodeName, hookPath string) error {
		// snippet: README
		scanner, err := nvmlscan.New(nvml.New(), nvmlscan.Options{SplitCount: 10}) // or your own nodeagent.Source
		if err != nil {
			return err
		}
		defer scanner.Close() //nolint:errcheck // the README's snippet
		agent, err := nodeagent.New(client, nodeName, scanner, nodeagent.Options{
			Allocator: nodeagent.HAMiCore{Env: hamicore.EnvOptions{HookPath: hookPath}, PrepareStateDir: true},
		})
		if err != nil {
			return err
		}
		return agent.Run(ctx) // the register annotation, the kubelet's device count, HAMi's Allocate
		// end snippet
	}
	_ = run
}

func Example_readmeDRA() {
	run := func(client kubernetes.Interface, nodeName string, scanner nodeagent.Source, env hamicore.EnvOptions) (*nodeagent.Agent, error) {
		// snippet: README
		world, err := nodedra.New(client, nodeName, nodedra.Options{
			Plugin: draplugin.Options{Profile: dra.SDKProfile(), Env: env},
			GPUs:   []string{"6", "7"}, // UUIDs or NVML indexes DRA owns; empty: all
		})
		if err != nil {
			return nil, err
		}
		agent, err := nodeagent.New(client, nodeName, scanner, nodeagent.Options{
			Allocator: nodeagent.HAMiCore{Env: env},
			DRA:       world, // only a program that imports nodedra links the DRA libraries
		})
		// end snippet
		return agent, err
	}
	_ = run
}

func Example_readmeExtender() {
	run := func(ctx context.Context, client kubernetes.Interface, factory informers.SharedInformerFactory, selector labels.Selector, hostname string, ln net.Listener) error {
		var wg sync.WaitGroup
		defer wg.Wait()
		// snippet: README
		cache, err := schedcache.New(factory.Core().V1().Nodes(), schedcache.Options{NodeSelector: selector})
		if err != nil {
			return err
		}
		var leader schedcache.Runnable // leader-only handshake writes, under kube-scheduler's Lease (HAMi's shape)
		if leader, err = schedcache.NewHandshaker(client, cache, schedcache.HandshakerOptions{}); err == nil {
			leader, err = schedcache.NewLeaseFollower(client, leader, schedcache.FollowerOptions{Namespace: "kube-system", Name: "hami-scheduler", Identity: hostname})
		}
		if err != nil {
			return err
		}
		ext, err := extender.New(client, cache, extender.Options{Pods: factory.Core().V1().Pods(), Nodes: factory.Core().V1().Nodes().Lister()})
		if err != nil {
			return err
		}
		factory.Start(ctx.Done())
		ctx, cancel := context.WithCancelCause(ctx) // a part that fails stops the others
		defer cancel(nil)
		for _, r := range []schedcache.Runnable{cache, leader, ext} {
			wg.Go(func() { cancel(r.Run(ctx)) })
		}
		return http.Serve(ln, ext.Handler()) // /filter, /bind, /webhook, /healthz, /readyz
		// end snippet
	}
	_ = run
}

func Example_readmeCodec() {
	use := func(scanned []annotation.Device, node *corev1.Node) {
		// snippet: README
		// Device plugin side: publish in canonical order so an unchanged node encodes the same.
		devs := annotation.Canonical(scanned)
		value := annotation.Encode(devs) // merge-patch under annotation.KeyNVIDIARegister

		// Scheduler side: decode without ever crashing, and branch on the failure class.
		devs, err := annotation.Decode(node.Annotations[annotation.KeyNVIDIARegister])
		switch {
		case errors.Is(err, annotation.ErrMalformed): // bad JSON or a field out of range
		case errors.Is(err, annotation.ErrInvalidElement): // [null]: HAMi's scheduler would crash
		}

		// What HAMi's scheduler concludes, with the message it logs.
		v := annotation.Check(annotation.NVIDIA(), node.Annotations)
		fmt.Println(v.Registers, v.Err, v.HAMiLog)
		// end snippet
		_, _ = value, devs
	}
	_ = use
}

func Example_readmeScan() {
	run := func(ctx context.Context, cancel context.CancelCauseFunc) error {
		var wg sync.WaitGroup
		defer wg.Wait()
		// snippet: README
		s, err := nvmlscan.New(nvml.New(), nvmlscan.Options{}) // chart defaults: split 10, scaling 1
		if err != nil {
			return err // errors.Is(err, nvml.ERROR_LIBRARY_NOT_FOUND): the container has no driver
		}
		defer s.Close()                      //nolint:errcheck // the README's snippet
		wg.Go(func() { cancel(s.Run(ctx)) }) // XID health watch; Close stops it
		res, err := s.Scan(ctx)              // res.Failed: GPUs skipped, with HAMi's error wording
		if err != nil {
			return err
		}
		value := annotation.Encode(res.Devices)
		// end snippet
		_ = value
		return nil
	}
	_ = run
}

func Example_readmeAgent() {
	run := func(ctx context.Context, client kubernetes.Interface, name string, scanner *nvmlscan.Scanner) error {
		// snippet: README
		agent, err := nodeagent.New(client, name, scanner, nodeagent.Options{})
		if err != nil {
			return err
		}
		return agent.Run(ctx) // annotation first, then the kubelet; health changes reach both at once
		// end snippet
	}
	_ = run
}

func Example_readmeParts() {
	run := func(ctx context.Context, cancel context.CancelCauseFunc, client kubernetes.Interface, res nvmlscan.Result) error {
		var wg sync.WaitGroup
		defer wg.Wait()
		// snippet: README
		name, err := register.NodeNameFromEnv(ctx, nil) // NODE_NAME, or the legacy NodeName
		if err != nil {
			return err
		}
		w, err := register.New(client, name, register.Options{})
		if err != nil {
			return err
		}
		w.SetDevices(res.Devices)            // after every scan; writes only on a difference
		wg.Go(func() { cancel(w.Run(ctx)) }) // heals drift, returns when ctx ends

		p, err := kubeletplugin.New(kubeletplugin.Options{PluginDir: kubeletplugin.PluginDirFromRootDir("/var/lib/kubelet")})
		if err != nil {
			return err
		}
		p.SetDevices(res.Devices)            // Count is the split count; ListAndWatch resends on every change
		wg.Go(func() { cancel(p.Run(ctx)) }) // re-registers after kubelet restarts
		// end snippet
		return nil
	}
	_ = run
}

func Example_readmeSchedulerSide() {
	run := func(ctx context.Context, cancel context.CancelCauseFunc, client kubernetes.Interface, factory informers.SharedInformerFactory, ns, pod string) error {
		var wg sync.WaitGroup
		defer wg.Wait()
		// snippet: README
		c, err := schedcache.New(factory.Core().V1().Nodes(), schedcache.Options{}) // warm on every replica
		if err != nil {
			return err
		}
		h, err := schedcache.NewHandshaker(client, c, schedcache.HandshakerOptions{}) // leader-only writes
		if err != nil {
			return err
		}
		e, err := schedcache.NewElector(client, h, schedcache.ElectorOptions{Namespace: ns, Name: "hamireg", Identity: pod})
		if err != nil {
			return err
		}
		factory.Start(ctx.Done())
		wg.Go(func() { cancel(c.Run(ctx)) })
		wg.Go(func() { cancel(e.Run(ctx)) }) // runs h.Run while this replica leads; or schedcache.NewLeaseFollower, HAMi's shape
		if err := c.WaitForSync(ctx); err != nil {
			return err
		}
		snap := c.Snapshot() // every node: registered ones in snap.All(), the others with state and reason
		// end snippet
		_ = snap
		return nil
	}
	_ = run
}

func Example_readmePlacing() {
	run := func(ctx context.Context, pod *corev1.Pod, nodes []allocation.Node, locker *nodelock.Locker, gpus []annotation.Device, cacheID string) error {
		// snippet: README
		req := allocation.Requests(pod, allocation.Config{}) // chart resource names and defaults
		d := allocation.Schedule(nodes, req, pod.Annotations, allocation.Config{})
		value := allocation.EncodePodDevices(d.Devices) // hami.io/vgpu-devices-to-allocate and -allocated
		if err := locker.Acquire(ctx, d.Node, types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}); err != nil {
			return err // nodelock, at bind; errors.Is(err, nodelock.ErrLocked): kube-scheduler retries
		}

		pd, err := allocation.DecodePodDevices(value, allocation.VersionMaster) // in Allocate
		if err != nil {
			return err
		}
		i, ok := pd.Next()                           // the container served now
		ctr, found := allocation.ContainerAt(pod, i) // init containers first
		if !ok || !found {
			return fmt.Errorf("no container %d to allocate", i)
		}
		c := hamicore.Container{PodUID: string(pod.UID), Name: ctr.Name, Env: ctr.Env, CacheID: cacheID}
		resp, err := hamicore.ContainerResponse(pd[i], c, gpus, hamicore.EnvOptions{}) // HAMi-core env and mounts
		if err != nil {
			return err
		}
		next := allocation.EncodePodDevices(pd.Consume(i))
		// end snippet
		_, _ = resp, next
		return nil
	}
	_ = run
}

func Example_readmeDevicePlugin() {
	run := func(ctx context.Context) error {
		// snippet: README
		name, err := register.NodeNameFromEnv(ctx, nil) // NODE_NAME from spec.nodeName (legacy NodeName)
		if err != nil {
			return err
		}
		scanner, err := nvmlscan.New(nvml.New(), nvmlscan.Options{SplitCount: 10}) // chart defaults otherwise
		if err != nil {
			return err // the classified NVML error says what to fix
		}
		defer scanner.Close() //nolint:errcheck // the README's snippet
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return err
		}
		client, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return err
		}
		agent, err := nodeagent.New(client, name, scanner, nodeagent.Options{
			Allocator: nodeagent.HAMiCore{
				Env:             hamicore.EnvOptions{HookPath: os.Getenv("HOOK_PATH")}, // /usr/local by default
				PrepareStateDir: true,                                                  // the DaemonSet mounts <HOOK_PATH>/vgpu at the same path
			},
		})
		if err != nil {
			return err
		}
		return agent.Run(ctx) // until SIGTERM (signal.NotifyContext)
		// end snippet
	}
	_ = run
}

package schedplugin_test

import (
	"context"
	"fmt"
	"io"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/hamireg/hamireg/schedplugin"
)

// handle stands in for kube-scheduler's framework handle: the plugin's factory reads the
// client and the shared informer factory from it.
type handle struct {
	fwk.Handle
	client  kubernetes.Interface
	factory informers.SharedInformerFactory
}

func (h handle) ClientSet() kubernetes.Interface                        { return h.client }
func (h handle) SharedInformerFactory() informers.SharedInformerFactory { return h.factory }

// Example calls the factory as kube-scheduler does for a profile that enables HAMiGPU; a
// scheduler binary passes it to app.WithPlugin instead:
//
//	app.NewSchedulerCommand(app.WithPlugin(schedplugin.Name, schedplugin.NewFactory()))
func Example() {
	ctx, cancel := context.WithCancel(context.Background())
	client := fake.NewClientset()
	factory := informers.NewSharedInformerFactory(client, 0)

	// snippet: doc
	newPlugin := schedplugin.NewFactory() // one factory: every profile shares its state
	args := &runtime.Unknown{Raw: []byte("nodeSchedulerPolicy: spread\nhamiVersion: master\nnodeLockWait: 10s\n")}
	p, err := newPlugin(ctx, args, handle{client: client, factory: factory})
	// end snippet
	if err != nil {
		cancel()
		fmt.Println(err)
		return
	}
	factory.Start(ctx.Done()) // kube-scheduler starts the informers the plugin asked for
	defer func() {
		_ = p.(io.Closer).Close() // kube-scheduler closes plugins at shutdown
		cancel()
		factory.Shutdown()
	}()
	fmt.Println(p.Name())

	_, err = newPlugin(ctx, &runtime.Unknown{Raw: []byte("nodeLockWaits: 10s\n")}, handle{client: client, factory: factory})
	fmt.Println(err != nil)
	// Output:
	// HAMiGPU
	// true
}

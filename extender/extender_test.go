package extender

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/schedcache"
)

// TestOwnPodInformer: without Options.Pods the extender runs its own pod informer in Run, counts
// usage from it, and joins it when Run returns; Run twice is refused.
func TestOwnPodInformer(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		_, ctx := ktesting.NewTestContext(t)
		client := fake.NewClientset(registered("n", 1, 23028), placedPod("a", "n", "GPU-n-0,NVIDIA,1000,10:;"))
		factory := informers.NewSharedInformerFactory(client, 0)
		c, err := schedcache.New(factory.Core().V1().Nodes(), schedcache.Options{})
		if err != nil {
			t.Fatal(err)
		}
		e, err := New(client, c, Options{})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(ctx)
		factory.Start(ctx.Done())
		done := make(chan error, 2)
		go func() { done <- c.Run(ctx) }()
		go func() { done <- e.Run(ctx) }()
		<-e.Ready()
		if got := e.usage.usage("n")["GPU-n-0"].Usedmem; got != 1000 {
			t.Errorf("usage from the own informer = %d MiB", got)
		}
		if err := e.Run(ctx); !errors.Is(err, ErrAlreadyRunning) {
			t.Errorf("second Run = %v", err)
		}
		cancel()
		for range 2 {
			if err := <-done; err != nil {
				t.Errorf("Run = %v", err)
			}
		}
		factory.Shutdown()
	})
}

func TestNewValidation(t *testing.T) {
	t.Parallel()
	client := fake.NewClientset()
	c, err := schedcache.New(newNodeInformer(client), schedcache.Options{})
	if err != nil {
		t.Fatal(err)
	}
	dcu, _ := annotation.VendorByName("DCU")
	tests := map[string]Options{
		"other vendor":       {Vendor: dcu},
		"negative timeout":   {NodeLockTimeout: -1},
		"negative body size": {MaxBodyBytes: -1},
		"negative cores":     {Config: allocation.Config{DefaultCores: -1}},
	}
	for name, opts := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if _, err := New(client, c, opts); !errors.Is(err, ErrInvalidOptions) {
				t.Errorf("New = %v, want ErrInvalidOptions", err)
			}
		})
	}
	if _, err := New(nil, c, Options{}); !errors.Is(err, ErrInvalidOptions) {
		t.Errorf("New(nil client) = %v", err)
	}
}

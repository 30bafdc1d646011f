package nodelock_test

import (
	"context"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/hamireg/hamireg/nodelock"
)

// Example_usage compiles the package documentation's snippet; ExampleLocker_Acquire runs it.
func Example_usage() {
	bindWithLock := func(ctx context.Context, clientset kubernetes.Interface, bind func(context.Context) error) error {
		// snippet: doc
		locker, err := nodelock.New(clientset.CoreV1(), nodelock.Options{})
		if err != nil {
			return err
		}
		pod := types.NamespacedName{Namespace: "default", Name: "train-0"}
		if err := locker.Acquire(ctx, "gpu-1", pod); err != nil {
			return err // ErrLocked: kube-scheduler retries the bind later
		}
		if err := bind(ctx); err != nil {
			_ = locker.Release(ctx, "gpu-1", pod) // the bind failed: give the node back
			return err
		}
		// The lock stays until the device plugin has allocated the pod's devices and
		// calls locker.Release(ctx, node, pod).
		// end snippet
		return nil
	}
	_ = bindWithLock
}

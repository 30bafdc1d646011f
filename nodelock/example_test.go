package nodelock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/hamireg/hamireg/nodelock"
)

func ExampleLocker_Acquire() {
	ctx := context.Background()
	clientset := fake.NewClientset(
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1"}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "train-0"}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "train-1"}},
	)
	clk := testingclock.NewFakeClock(time.Date(2026, 5, 19, 9, 14, 52, 0, time.UTC))
	locker, err := nodelock.New(clientset.CoreV1(), nodelock.Options{Clock: clk})
	if err != nil {
		fmt.Println(err)
		return
	}

	// The scheduler binds train-0: it takes the lock before it creates the Binding.
	bind := func(context.Context) error { return errors.New("binding refused") }
	pod := types.NamespacedName{Namespace: "default", Name: "train-0"}
	if err := locker.Acquire(ctx, "gpu-1", pod); err != nil {
		fmt.Println(err) // ErrLocked: kube-scheduler retries the bind later
		return
	}
	node, _ := clientset.CoreV1().Nodes().Get(ctx, "gpu-1", metav1.GetOptions{})
	fmt.Println(node.Annotations[nodelock.Key])

	// Half a minute later train-1 is bound to the same node and has to wait.
	clk.Step(30 * time.Second)
	train1 := types.NamespacedName{Namespace: "default", Name: "train-1"}
	err = locker.Acquire(ctx, "gpu-1", train1)
	fmt.Println(errors.Is(err, nodelock.ErrLocked), err)

	// train-0's Binding fails: the scheduler gives the node back, and train-1 gets it.
	if err := bind(ctx); err != nil {
		fmt.Println(err, locker.Release(ctx, "gpu-1", pod))
	}
	fmt.Println(locker.Acquire(ctx, "gpu-1", train1))
	// Output:
	// 2026-05-19T09:14:52Z,default,train-0
	// true node gpu-1 has been locked within 5m0s by pod default/train-0 since 2026-05-19T09:14:52Z (30s ago)
	// binding refused <nil>
	// <nil>
}

func ExampleParse() {
	for _, v := range []string{"2026-05-19T17:14:52+08:00,kube-system,p", "2026-05-19T09:14:52Z", "2026-05-19T09:14:52Z,default"} {
		l, err := nodelock.Parse(v)
		if err != nil {
			fmt.Println(err)
			continue
		}
		pod, named := l.Owner()
		fmt.Println(l.Time, pod, named)
	}
	// Output:
	// 2026-05-19 09:14:52 +0000 UTC kube-system/p true
	// 2026-05-19 09:14:52 +0000 UTC / false
	// parse node lock "2026-05-19T09:14:52Z,default": expected 3 parts, got 2 (want <RFC 3339 time>,<namespace>,<pod>): malformed node lock
}

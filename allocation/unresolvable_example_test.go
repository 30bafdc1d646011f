package allocation_test

import (
	"fmt"

	"github.com/hamireg/hamireg/allocation"
)

// A scheduler answers the nodes whose reason is unresolvable as "unschedulable and
// unresolvable": removing pods there cannot help, so kube-scheduler does not preempt.
func ExampleUnresolvable() {
	for _, reason := range []string{
		"2/2 CardTypeMismatch",
		allocation.ReasonNodeInsufficientDevice,
		"1/2 CardInsufficientMemory, 1/2 CardTypeMismatch",
		allocation.ReasonNodeUnregistered + ": NVIDIA absent",
	} {
		fmt.Printf("%s: %v\n", reason, allocation.Unresolvable(reason))
	}
	// Output:
	// 2/2 CardTypeMismatch: true
	// NodeInsufficientDevice: true
	// 1/2 CardInsufficientMemory, 1/2 CardTypeMismatch: false
	// node unregistered: NVIDIA absent: true
}

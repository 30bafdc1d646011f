package allocation_test

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
)

// Example_usage compiles the package documentation's snippets; Example runs the same steps.
func Example_usage() {
	filter := func(pod *corev1.Pod, nodes []allocation.Node) {
		// snippet: doc
		req := allocation.Requests(pod, allocation.Config{}) // chart resource names and defaults
		if !req.Any() {
			return // not a HAMi pod: every candidate node passes
		}
		d := allocation.Schedule(nodes, req, pod.Annotations, allocation.Config{})
		// d.Node, and EncodePodDevices(d.Devices) for both device annotations; d.Failed[node] says
		// why the others do not fit ("1/2 CardInsufficientMemory, 1/2 CardNotHealth").
		// end snippet
		_ = d
	}
	allocate := func(pod *corev1.Pod, vendor annotation.Vendor, edits func(allocation.ContainerDevices, *corev1.Container) (allocation.Response, error)) error {
		// snippet: doc
		pd, err := allocation.DecodePodDevices(pod.Annotations[vendor.ToAllocateKey], allocation.VersionMaster)
		if err != nil {
			return err
		}
		i, ok := pd.Next()                           // the container served now
		ctr, found := allocation.ContainerAt(pod, i) // init containers first
		if !ok || !found {
			return fmt.Errorf("no container %d to allocate", i)
		}
		resp, err := edits(pd[i], ctr) // the vendor's answer, an allocation.Response
		if err != nil {
			return err
		}
		next := allocation.EncodePodDevices(pd.Consume(i)) // merge-patch it back
		// end snippet
		_, _ = resp, next
		return nil
	}
	_, _ = filter, allocate
}

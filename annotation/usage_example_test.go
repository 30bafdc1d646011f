package annotation_test

import (
	"log"

	corev1 "k8s.io/api/core/v1"

	"github.com/hamireg/hamireg/annotation"
)

// Example_usage compiles the package documentation's snippet.
func Example_usage() {
	use := func(scanned []annotation.Device, node *corev1.Node) {
		// snippet: doc
		devs := annotation.Canonical(scanned)
		value := annotation.Encode(devs) // merge-patch it under annotation.KeyNVIDIARegister

		v := annotation.Check(annotation.NVIDIA(), node.Annotations)
		if !v.Registers {
			log.Printf("%s: %v (HAMi logs %q)", node.Name, v.Err, v.HAMiLog)
		}
		// end snippet
		_ = value
	}
	_ = use
}

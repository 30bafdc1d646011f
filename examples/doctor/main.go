// Command doctor explains why a GPU node does or does not register with HAMi's scheduler.
//
// Offline, from an annotation value alone:
//
//	doctor explain '[{"id":"GPU-a","count":10,"devmem":23028,"health":true}]'
//	doctor explain -f annotation.json
//	kubectl get node gpu-1 -o jsonpath='{.metadata.annotations.hami\.io/node-nvidia-register}' | doctor explain -
//
// It prints the devices as a table and what HAMi's scheduler concludes, with the exact message
// HAMi logs. With --handshake (and --allocatable) it also interprets the liveness handshake.
// Exit status: 0 when the node would register, 1 when it would not, 2 on usage errors.
package main

import (
	"os"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

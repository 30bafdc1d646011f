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
//
// From a live cluster (package diagnose), for one node or every GPU node:
//
//	doctor node gpu-7 [--kubeconfig FILE] [--namespace kube-system] [-o json]
//	doctor nodes
//
// node prints the three channels as observed, the case of HAMi's troubleshooting guide (1-5)
// and every finding with its evidence, the kubectl commands that fix it and, for what the API
// server cannot show, the commands to run on the node. nodes prints one line per node: the
// channel states, the case and the reason. Exit status: 0 when healthy, 1 when a case applies,
// 2 on errors (node not found, no cluster). Without --kubeconfig it reads $KUBECONFIG,
// ~/.kube/config, then the in-cluster configuration.
package main

import (
	"os"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

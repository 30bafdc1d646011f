// Command replaces writes the block of replace lines that a module depending on
// github.com/hamireg/hamireg/envtest/kubeletpeer needs into that module's go.mod.
//
// kubeletpeer requires k8s.io/kubernetes, which requires its staging modules (k8s.io/api,
// k8s.io/client-go, …) at the placeholder v0.0.0; replace directives apply only in the main
// module, so the consumer's go.mod must map each of them to its published version, exactly
// as kubeletpeer's own go.mod does. A module that uses only envtest (the control plane and
// kube-scheduler) does not require k8s.io/kubernetes and needs no block. From the consumer
// module's folder:
//
//	go run github.com/hamireg/hamireg/envtest/cmd/replaces@v0.1.0 -w
//	go get github.com/hamireg/hamireg/envtest/kubeletpeer@v0.1.0
//
// Without -w it prints the block on standard output. With -w it rewrites ./go.mod (or the
// file named by -modfile): it drops the go.mod's replace directives of the modules the block
// names, whatever their versions, appends the block and keeps everything else; running it
// again changes nothing. The block is embedded (block.txt, written by
// hack/k8sbins/regen.sh together with kubeletpeer's go.mod), so the command needs neither the
// network nor a working module graph — it runs before `go get` can. Use the same version of
// this command and of kubeletpeer.
package main

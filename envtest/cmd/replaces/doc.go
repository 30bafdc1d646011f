// Command replaces writes the block of replace lines that a module depending on
// github.com/hamireg/hamireg/envtest needs into that module's go.mod.
//
// envtest requires k8s.io/kubernetes, which requires its staging modules (k8s.io/api,
// k8s.io/client-go, …) at the placeholder v0.0.0; replace directives apply only in the main
// module, so the consumer's go.mod must map each of them to its published version, exactly
// as envtest's own go.mod does. From the consumer module's folder:
//
//	go run github.com/hamireg/hamireg/envtest/cmd/replaces@latest -w
//	go get github.com/hamireg/hamireg/envtest@latest
//
// Without -w it prints the block on standard output. With -w it rewrites ./go.mod (or the
// file named by -modfile): it drops the go.mod's replace directives of the modules the block
// names, whatever their versions, appends the block and keeps everything else; running it
// again changes nothing. The block is embedded (block.txt, written by
// hack/k8sbins/regen.sh together with envtest's go.mod), so the command needs neither the
// network nor a working module graph — it runs before `go get` can. Use the same version of
// this command and of envtest.
package main

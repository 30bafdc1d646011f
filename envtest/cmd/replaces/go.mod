// Module replaces is the command that writes kubeletpeer's block of k8s.io replace lines into a
// consumer's go.mod. It is a module of its own, without replace directives and without
// k8s.io/kubernetes, so that `go run github.com/hamireg/hamireg/envtest/cmd/replaces@VERSION`
// works from any module; block.txt is written by hack/k8sbins/regen.sh.
module github.com/hamireg/hamireg/envtest/cmd/replaces

go 1.26.0

require (
	github.com/google/go-cmp v0.7.0
	golang.org/x/mod v0.42.0
)

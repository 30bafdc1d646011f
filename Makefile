# The Makefile is the interface everyone uses; CI runs `make test` through .ci/run.
SHELL := /bin/bash
GO ?= go
# golangci-lint v2 and staticcheck are pinned in hack/tools/go.mod (tool directives).
LINT_PATH := $(GO) tool -modfile=$(CURDIR)/hack/tools/go.mod -n golangci-lint
# Nested modules that are linted and unit-tested on their own. hack/k8sbins and hack/krew are
# left out: they have no Go packages (only tool directives for the binaries hack/e2e.sh builds
# and for krew's manifest validator).
# The tests of envtest and envtest/kubeletpeer that need the peer binaries carry the build
# tag e2e: `make unit` leaves them out, hack/e2e.sh (`make e2e`) runs them; lint and vet see them.
MODULES := . envtest envtest/kubeletpeer envtest/cmd/replaces $(wildcard test/e2e) examples/quickstart examples/scheduler schedplugin cmd/kubectl-hami_doctor hack/release
# The doctor (cmd/kubectl-hami_doctor) requires the SDK's release and has no replace (so that
# go install …@v0.1.0 works); its go.work puts the tree's SDK in its place, named explicitly so
# that GOWORK=off in the environment does not turn it off.
DOCTOR_WORK := $(CURDIR)/cmd/kubectl-hami_doctor/go.work
# Flags for the quickstart, e.g. QUICKSTART_FLAGS=--keep.
QUICKSTART_FLAGS ?=
E2E_FLAGS ?=
# go-nvml's header trips deprecation warnings on every uncached cgo build.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations
BENCH ?= .
FUZZTIME ?= 30s

.PHONY: test unit lint krew bench e2e fuzz cgo0 quickstart rehearsal

## quickstart: a local HAMi-compatible GPU cluster (real peers, 8 simulated GPUs) and the
## whole loop, step by step; QUICKSTART_FLAGS=--keep leaves it running until Ctrl-C.
quickstart:
	@hack/quickstart.sh $(QUICKSTART_FLAGS)

## test: everything CI runs: lint, unit tests (race), the release rehearsal, e2e against real
## peers.
test: lint unit rehearsal e2e

## rehearsal: every module released at a rehearsal version into a GOPROXY=file:// folder, then
## fetched, built and installed from it in scratch modules outside the repository, and the
## README's "Testing your component" run there (hack/release, docs/release.md).
rehearsal:
	cd hack/release && $(GO) test -count=1 -timeout 40m -v -run TestRehearsal ./...

## unit: unit, conformance and example tests of the root module, envtest's and kubeletpeer's
## (those without peers), the replaces command's, the quickstart's, the scheduler's (examples/scheduler), schedplugin's and the doctor's, with the
## race detector.
unit: cgo0
	$(GO) test -race -count=1 ./...
	cd envtest && $(GO) test -race -count=1 ./...
	cd envtest/kubeletpeer && $(GO) test -race -count=1 ./...
	cd envtest/cmd/replaces && $(GO) test -race -count=1 ./...
	cd examples/quickstart && $(GO) test -race -count=1 ./...
	cd examples/scheduler && $(GO) test -race -count=1 ./...
	cd schedplugin && $(GO) test -race -count=1 ./...
	cd cmd/kubectl-hami_doctor && GOWORK=$(DOCTOR_WORK) $(GO) test -race -count=1 ./...
	cd hack/release && $(GO) test -race -short -count=1 ./...

## cgo0: everything but nvmlscan (the only cgo package) and the device plugin on it must build
## without cgo, and so must the doctor (its own module).
cgo0:
	CGO_ENABLED=0 $(GO) build $$($(GO) list ./... | grep -v -e /nvmlscan -e /examples/deviceplugin)
	cd cmd/kubectl-hami_doctor && GOWORK=$(DOCTOR_WORK) CGO_ENABLED=0 $(GO) build -o /dev/null .

## lint: gofmt, go vet and golangci-lint (config .golangci.yml) over every module, files
## with the build tag e2e included, and the doctor's krew manifest through krew's own
## validator (pinned in hack/krew/go.mod; -skip-install: it does not download the archives).
lint: krew
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	@# go tool -modfile refuses workspace mode (the doctor's go.work): -n builds golangci-lint
	@# outside any workspace and prints its path, which then runs inside each module.
	@lint=$$(GOWORK=off $(LINT_PATH)) && for m in $(MODULES); do echo "== lint $$m"; (cd $$m && if [ -f go.work ]; then export GOWORK=$$PWD/go.work; fi && $(GO) vet -tags e2e ./... && $$lint run --allow-parallel-runners --config $(CURDIR)/.golangci.yml ./...) || exit 1; done

## krew: krew's validate-krew-manifest on the doctor's plugin manifest.
krew:
	$(GO) tool -modfile=$(CURDIR)/hack/krew/go.mod validate-krew-manifest -manifest cmd/kubectl-hami_doctor/krew/hami-doctor.yaml -skip-install

## bench: benchmarks with their baselines in the same run (ratios readable from one output).
bench:
	$(GO) test -run '^$$' -bench '$(BENCH)' -benchmem ./...

## fuzz: run every fuzz target for FUZZTIME each.
fuzz:
	@hack/fuzz.sh $(FUZZTIME)

## e2e: tests against real peers (kube-apiserver, etcd, kube-scheduler, kubelet device manager).
e2e:
	@if [ -x hack/e2e.sh ]; then hack/e2e.sh $(E2E_FLAGS); else echo "e2e: no real-peer suite yet"; fi

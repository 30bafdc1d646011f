#!/usr/bin/env bash
# e2e.sh runs the tests against real peers (modules envtest, envtest/kubeletpeer and
# test/e2e); `make e2e` calls
# it, and `make test` (CI) includes it. Arguments are passed to `go test`, e.g.
#
#   make e2e E2E_FLAGS="-run TestScheduler -v"     or     hack/e2e.sh -run TestScheduler
#
# Steps, each with its wall time:
#  1. build kube-apiserver, etcd and kube-scheduler with hack/k8sbins/build.sh into
#     ~/.cache/hamireg/k8sbins/<version>-<hash> (reused when present) and export the folder
#     as HAMIREG_K8S_BIN;
#  2. go test -race -count=1 -tags e2e -v ./... in envtest, then in envtest/kubeletpeer: the
#     libraries' own tests and their Examples (TestExample) that need the peers (build tag
#     e2e; they fail, never skip, without them);
#  3. go test -race -count=1 -v ./... in test/e2e; every test binary starts its own
#     control plane (-v so that the log shows the versions the peers reported);
#  4. check that no peer process and no temporary folder was left behind.
# E2E_RACE=0 turns off the race detector (default on).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
now() { date +%s; }

t0=$(now)
bin=$("$root/hack/k8sbins/build.sh")
t1=$(now)
export HAMIREG_K8S_BIN=$bin
echo "e2e: peers: $("$bin/kube-apiserver" --version), $("$bin/kube-scheduler" --version), etcd $("$bin/etcd" --version | sed -n 's/^etcd Version: //p')"
echo "e2e: peer binaries ready in $((t1 - t0))s ($bin)"

race=(-race)
[[ ${E2E_RACE:-1} == 0 ]] && race=()
# Each test binary may run this long (go test's default of 10 minutes is too short for the
# quickstart package on a loaded 2-core machine); a -timeout in the arguments overrides it.
race+=(-timeout "${E2E_TIMEOUT:-25m}")

status=0
(cd "$root/envtest" && go test "${race[@]}" -count=1 -tags e2e -v ./... "$@") || status=$?
tk=$(now)
echo "e2e: go test in envtest (compile and run) took $((tk - t1))s (exit $status)"
(cd "$root/envtest/kubeletpeer" && go test "${race[@]}" -count=1 -tags e2e -v ./... "$@") || status=$?
te=$(now)
echo "e2e: go test in envtest/kubeletpeer (compile and run) took $((te - tk))s (exit $status)"
cd "$root/test/e2e"
go test "${race[@]}" -count=1 -v ./... "$@" || status=$?
t2=$(now)
echo "e2e: go test in test/e2e (compile and run) took $((t2 - te))s (exit $status)"

# Nothing may outlive the run: peers orphaned by a dead test binary (re-parented to init or
# a subreaper, so not children of a live test binary), or temporary folders whose owner is
# gone. Peers of a concurrent run elsewhere still have their live test binary as parent.
leftover=0
for pid in $(pgrep -f "^$bin/" || true); do
	ppid=$(ps -o ppid= -p "$pid" | tr -d ' ' || true)
	parent=$(ps -o args= -p "${ppid:-0}" 2>/dev/null | cut -d" " -f1 || true)
	if [[ -n $ppid && $parent != *.test ]]; then
		echo "e2e: left running: $(ps -o pid=,args= -p "$pid" | cut -c1-160)"
		leftover=1
	fi
done
for dir in "${TMPDIR:-/tmp}"/hamireg-e2e-* "${TMPDIR:-/tmp}"/hamireg-kl-*; do
	[[ -e $dir ]] || continue
	owner=$(cat "$dir/owner.pid" 2>/dev/null || true)
	if [[ ! $owner =~ ^[1-9][0-9]*$ ]] || ! kill -0 "$owner" 2>/dev/null; then
		echo "e2e: left behind: $dir"
		leftover=1
	fi
done
if [[ $leftover == 1 && $status == 0 ]]; then
	status=1
fi
echo "e2e: total $((t2 - t0))s: peer binaries $((t1 - t0))s, go test $((t2 - t1))s"
exit $status

#!/usr/bin/env bash
# quickstart.sh builds examples/quickstart (its own module: it links the kubelet's device
# manager from k8s.io/kubernetes, a few minutes the first time) into the user's cache, saying
# every 20 s that it is still building, then replaces itself with it; `make quickstart` runs it.
#
#   hack/quickstart.sh [--keep] [quickstart flags...]
#
# QUICKSTART_BIN overrides where the binary goes.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
bin=${QUICKSTART_BIN:-${XDG_CACHE_HOME:-$HOME/.cache}/hamireg/quickstart/quickstart}
mkdir -p "$(dirname "$bin")"

start=$(date +%s)
(cd "$root/examples/quickstart" && exec go build -o "$bin" .) &
build=$!
trap 'kill "$build" 2>/dev/null || true' INT TERM
announced=0
while kill -0 "$build" 2>/dev/null; do
	sleep 1
	elapsed=$(( $(date +%s) - start ))
	if (( elapsed == 3 && announced == 0 )); then
		echo "quickstart: building examples/quickstart into $bin (the first time: a few minutes on 2 cores)"
		announced=1
	elif (( elapsed > 3 && elapsed % 20 == 0 )); then
		echo "quickstart: still building examples/quickstart: $((elapsed / 60))m$((elapsed % 60))s so far"
	fi
done
status=0
wait "$build" || status=$?
trap - INT TERM
if (( status != 0 )); then
	echo "quickstart: go build in examples/quickstart failed (exit $status)" >&2
	exit "$status"
fi
(( announced == 0 )) || echo "quickstart: built in $(( $(date +%s) - start ))s"
cd "$root"
exec "$bin" "$@"

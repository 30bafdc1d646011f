#!/usr/bin/env bash
# Runs every fuzz target of the root module for a given time each (default 30s) and then
# copies up to 300 of the generated inputs per target into the committed corpus
# (<pkg>/testdata/fuzz/<Target>/), so `go test` replays them on every run.
# Usage: hack/fuzz.sh [fuzztime] [parallel]
set -euo pipefail
cd "$(dirname "$0")/.."
time=${1:-30s}
par=${2:-1}
cache=$(go env GOCACHE)/fuzz
for pkg in $(go list ./...); do
  dir=$(go list -f '{{.Dir}}' "$pkg")
  for target in $(grep -ho '^func \(Fuzz[A-Za-z0-9_]*\)' "$dir"/*_test.go 2>/dev/null | sed 's/^func //'); do
    echo "== $pkg $target for $time"
    start=$(date +%s)
    go test -run '^$' -fuzz "^${target}\$" -fuzztime "$time" -parallel "$par" "$pkg" 2>&1 | tail -3
    echo "== $pkg $target ran $(( $(date +%s) - start ))s"
    src="$cache/$pkg/$target"
    dst="$dir/testdata/fuzz/$target"
    if [ -d "$src" ]; then
      mkdir -p "$dst"
      # Keep the smallest inputs: they cover the same paths and keep the repository small.
      ls -S -r "$src" | head -n 300 | while read -r f; do cp -n "$src/$f" "$dst/$f"; done
    fi
  done
done

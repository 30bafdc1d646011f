#!/usr/bin/env bash
# regen.sh rewrites the go.mod of a module that links k8s.io/kubernetes for another
# Kubernetes version and refreshes its go.sum.
#
#   hack/k8sbins/regen.sh v1.37.2 [MODULE_DIR...]
#
# MODULE_DIR defaults to hack/k8sbins; pass test/e2e and examples/quickstart too to move the
# modules that link k8s.io/kubernetes along.
# k8s.io/kubernetes requires its staging modules (k8s.io/api, k8s.io/client-go, ...) at the
# placeholder v0.0.0 and replaces them with ./staging/... in its own go.mod; replace
# directives do not propagate, so every module that requires k8s.io/kubernetes has to map
# each of them to the matching published v0.X.Y. The list is read from the go.mod that the
# module proxy serves for that version (31 modules for v1.37.2), so it follows the version
# rather than a copy here.
# The script edits only the require of k8s.io/kubernetes and the k8s.io/* replace lines,
# then runs `go mod tidy`; commit the resulting go.mod and go.sum (CI never tidies).
set -euo pipefail

version=${1:?usage: regen.sh vMAJOR.MINOR.PATCH [MODULE_DIR...]}
shift
[[ $version =~ ^v1\.([0-9]+)\.([0-9]+)(-.+)?$ ]] || { echo "regen.sh: $version is not a v1.X.Y Kubernetes version" >&2; exit 2; }
staging="v0.${BASH_REMATCH[1]}.${BASH_REMATCH[2]}${BASH_REMATCH[3]}"

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
dirs=("$@")
[[ ${#dirs[@]} -gt 0 ]] || dirs=("$here")

# `go list -m` fetches only the .info and .mod files, not the module zip.
gomod=$(cd "$here" && GOFLAGS=-mod=mod go list -m -json "k8s.io/kubernetes@$version" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')
[[ -f $gomod ]] || { echo "regen.sh: cannot download the go.mod of k8s.io/kubernetes@$version" >&2; exit 1; }

# The staging modules: required at v0.0.0 by k8s.io/kubernetes.
mapfile -t mods < <(awk '$1 ~ /^k8s\.io\// && $2 == "v0.0.0" { print $1 }' "$gomod" | sort -u)
[[ ${#mods[@]} -gt 0 ]] || { echo "regen.sh: no v0.0.0 staging requirements found in $gomod" >&2; exit 1; }
goversion=$(awk '$1 == "go" { print $2; exit }' "$gomod")
echo "regen.sh: k8s.io/kubernetes $version (go $goversion): ${#mods[@]} staging modules -> $staging" >&2

for d in "${dirs[@]}"; do
	d=$(cd "$d" && pwd)
	echo "regen.sh: updating ${d#"$root"/}/go.mod" >&2
	(
		cd "$d"
		# Drop the old k8s.io/* replaces, then write the new ones.
		for r in $(go mod edit -json | awk '/"Replace"/ { inrep = 1 } inrep && /"Path": "k8s\.io\// { gsub(/[",]/, "", $2); print $2 }' | sort -u); do
			go mod edit -dropreplace="$r"
		done
		go mod edit -go="$goversion" -require="k8s.io/kubernetes@$version"
		# One replace block, so that the diff of a version bump is easy to read.
		{
			printf '\n// Staging modules that k8s.io/kubernetes@%s requires at v0.0.0 (written by regen.sh).\nreplace (\n' "$version"
			for m in "${mods[@]}"; do
				printf '\t%s => %s %s\n' "$m" "$m" "$staging"
			done
			printf ')\n'
		} >>go.mod
		go mod edit -fmt
		GOFLAGS=-mod=mod go mod tidy
	)
done

#!/usr/bin/env bash
# regen.sh rewrites the go.mod of the modules that link k8s.io/kubernetes for another
# Kubernetes version and refreshes their go.sum; it also prints or writes the block of
# replace lines for a module outside this repository that depends on envtest/kubeletpeer
# (envtest itself does not require k8s.io/kubernetes and needs no block).
#
#   hack/k8sbins/regen.sh v1.37.2 [MODULE_DIR...]   # regenerate
#   hack/k8sbins/regen.sh --print                    # print kubeletpeer's block (for a consumer)
#   hack/k8sbins/regen.sh --consumer path/to/go.mod  # write it into that go.mod
#
# MODULE_DIR defaults to every module here that links k8s.io/kubernetes: hack/k8sbins,
# envtest/kubeletpeer, test/e2e and examples/quickstart (any module with a require of
# k8s.io/kubernetes is found and listed). Regenerating also writes the block into
# envtest/cmd/replaces/block.txt, which that command embeds: a consumer runs
# `go run github.com/hamireg/hamireg/envtest/cmd/replaces@VERSION -w`, and --consumer runs
# the same command from this checkout (both drop the file's replace lines for those modules,
# append the block and keep everything else; no `go mod tidy`).
# k8s.io/kubernetes requires its staging modules (k8s.io/api, k8s.io/client-go, ...) at the
# placeholder v0.0.0 and replaces them with ./staging/... in its own go.mod; replace
# directives do not propagate, so every module that requires k8s.io/kubernetes has to map
# each of them to the matching published v0.X.Y. The list is read from the go.mod that the
# module proxy serves for that version (31 modules for v1.37.2), so it follows the version
# rather than a copy here.
# The script edits only the require of k8s.io/kubernetes and the k8s.io/* replace lines,
# then runs `go mod tidy`; commit the resulting go.mod and go.sum (CI never tidies).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
blockfile=$root/envtest/cmd/replaces/block.txt

case ${1:-} in
--print)
	cat "$blockfile"
	exit 0
	;;
--consumer)
	gomod=${2:?usage: regen.sh --consumer path/to/go.mod}
	gomod=$(cd "$(dirname "$gomod")" && pwd)/$(basename "$gomod")
	cd "$root/envtest/cmd/replaces"
	exec go run . -w -modfile "$gomod"
	;;
esac

version=${1:?usage: regen.sh vMAJOR.MINOR.PATCH [MODULE_DIR...] | --print | --consumer GO_MOD}
shift
[[ $version =~ ^v1\.([0-9]+)\.([0-9]+)(-.+)?$ ]] || { echo "regen.sh: $version is not a v1.X.Y Kubernetes version" >&2; exit 2; }
staging="v0.${BASH_REMATCH[1]}.${BASH_REMATCH[2]}${BASH_REMATCH[3]}"

dirs=("$@")
if [[ ${#dirs[@]} -eq 0 ]]; then
	# Every module of the checkout that requires k8s.io/kubernetes, directly or indirectly.
	mapfile -t dirs < <(cd "$root" && git ls-files --cached --others --exclude-standard -- '*go.mod' | xargs grep -l '^[[:space:]]*k8s.io/kubernetes v' | xargs -n1 dirname | sort)
	dirs=("${dirs[@]/#/$root/}")
fi
[[ ${#dirs[@]} -gt 0 ]] || { echo "regen.sh: no module requires k8s.io/kubernetes" >&2; exit 1; }

# `go list -m` fetches only the .info and .mod files, not the module zip.
gomod=$(cd "$here" && GOFLAGS=-mod=mod go list -m -json "k8s.io/kubernetes@$version" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')
[[ -f $gomod ]] || { echo "regen.sh: cannot download the go.mod of k8s.io/kubernetes@$version" >&2; exit 1; }

# The staging modules: required at v0.0.0 by k8s.io/kubernetes.
mapfile -t mods < <(awk '$1 ~ /^k8s\.io\// && $2 == "v0.0.0" { print $1 }' "$gomod" | sort -u)
[[ ${#mods[@]} -gt 0 ]] || { echo "regen.sh: no v0.0.0 staging requirements found in $gomod" >&2; exit 1; }
goversion=$(awk '$1 == "go" { print $2; exit }' "$gomod")
echo "regen.sh: k8s.io/kubernetes $version (go $goversion): ${#mods[@]} staging modules -> $staging" >&2

# One replace block, so that the diff of a version bump is easy to read; the same text goes
# into every module's go.mod and into the consumer command's block.txt.
block=$(
	printf '// Staging modules that k8s.io/kubernetes@%s requires at v0.0.0 (written by regen.sh).\nreplace (\n' "$version"
	for m in "${mods[@]}"; do
		printf '\t%s => %s %s\n' "$m" "$m" "$staging"
	done
	printf ')'
)
printf '%s\n' "$block" >"$blockfile"
echo "regen.sh: wrote ${blockfile#"$root"/}" >&2

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
		printf '\n%s\n' "$block" >>go.mod
		go mod edit -fmt
		GOFLAGS=-mod=mod go mod tidy
	)
done

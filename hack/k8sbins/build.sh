#!/usr/bin/env bash
# build.sh builds kube-apiserver, kube-scheduler and etcd at the versions pinned in this
# module's go.mod, in one `go build`, into a cache folder outside the repository, and prints
# that folder on stdout. A folder that is already complete is reused without building.
#
#   bin=$(hack/k8sbins/build.sh)      # e.g. ~/.cache/hamireg/k8sbins/v1.37.2-0123abcd4567
#
# The folder is ${XDG_CACHE_HOME:-$HOME/.cache}/hamireg/k8sbins/<kubernetes version>-<hash>,
# where the hash covers go.mod, go.sum and this script, so a version bump or a change of
# build flags builds afresh and CI in a fresh clone still finds binaries built earlier on
# the same machine. HAMIREG_K8SBINS_CACHE overrides the parent folder.
# Progress and timings go to stderr.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cd "$here"

version=$(awk '$1 == "k8s.io/kubernetes" { print $2; exit }' go.mod)
[[ $version =~ ^v1\.([0-9]+)\.[0-9]+ ]] || { echo "build.sh: no k8s.io/kubernetes version in $here/go.mod" >&2; exit 1; }
minor=${BASH_REMATCH[1]}
hash=$(cat go.mod go.sum build.sh | sha256sum | cut -c1-12)
parent=${HAMIREG_K8SBINS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hamireg/k8sbins}
dir=$parent/$version-$hash
bins=(kube-apiserver kube-scheduler etcd)

complete() {
	local b
	for b in "${bins[@]}"; do [[ -x $1/$b ]] || return 1; done
	[[ -f $1/.complete ]]
}

if complete "$dir"; then
	echo "build.sh: reusing $dir" >&2
	echo "$dir"
	exit 0
fi

mkdir -p "$parent"
# One build at a time per cache folder; a second caller waits and then reuses the result.
exec 9>"$parent/.lock"
flock 9
if complete "$dir"; then
	echo "build.sh: reusing $dir (built by a concurrent caller)" >&2
	echo "$dir"
	exit 0
fi

tmp=$(mktemp -d "$parent/.build-XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# The version variables that /version and the binaries' --version report; without them
# they report a v0.0.0-master placeholder.
ldflags="-s -w"
for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
	ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
	ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

echo "build.sh: building kube-apiserver, kube-scheduler and etcd for $version into $dir (cold: several minutes)" >&2
start=$(date +%s)
# -mod=readonly: CI builds from the committed go.sum and never tidies.
CGO_ENABLED=0 go build -mod=readonly -trimpath -ldflags "$ldflags" -o "$tmp/" \
	k8s.io/kubernetes/cmd/kube-apiserver \
	k8s.io/kubernetes/cmd/kube-scheduler \
	go.etcd.io/etcd/server/v3
# go.etcd.io/etcd/server/v3 is a main package whose binary is named after "server".
mv "$tmp/server" "$tmp/etcd"
touch "$tmp/.complete"
chmod 0755 "$tmp"
rm -rf "$dir"
mv "$tmp" "$dir"
trap - EXIT
echo "build.sh: built in $(( $(date +%s) - start ))s: $dir" >&2
echo "$dir"

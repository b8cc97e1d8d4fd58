#!/usr/bin/env bash
# Builds the Prometheus Operator (cmd/operator) at a pinned version into
# $1/prometheus-operator-$VERSION/operator. Skipped when it is already there. Its CRDs, which it
# needs installed to run, come from tools/build-operator-crds.sh (the same module and version);
# tools/kube/README.md says how to run it against the API server tools/build-kube.sh builds.
#
# The operator's go.mod replaces its two nested modules (pkg/apis/monitoring, pkg/client) with
# folders that its module zip leaves out, so the module cannot be built as downloaded. The build
# runs in the downloaded module with `-modfile tools/prometheus-operator/go.mod`: the module's own
# go.mod less those two replace lines, so the published pkg/apis/monitoring and pkg/client of the
# same version (the same commit) are used, and go.sum beside it (the module's go.sum plus their
# two hashes).
#
# Pinned: the h1 hashes of the operator module and its two nested modules are in
# tools/go-modules.sum and checked before the build; tools/prometheus-operator/go.sum pins every
# other module, and GOFLAGS=-mod=readonly refuses anything outside it.
#
# Usage: tools/build-prometheus-operator.sh TOOLS_DIR
#        tools/build-prometheus-operator.sh --refresh   regenerate tools/prometheus-operator/go.mod
#                                                       and go.sum from the module (after a
#                                                       version change; review the diff)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tools/go-verify.sh
. "$here/go-verify.sh"
VERSION=v0.85.0   # keep in step with tools/build-operator-crds.sh
MODULE=github.com/prometheus-operator/prometheus-operator
NESTED="$MODULE/pkg/apis/monitoring $MODULE/pkg/client"
refresh=false
if [ "${1:-}" = "--refresh" ]; then
  refresh=true
else
  TOOLS=${1:?usage: build-prometheus-operator.sh TOOLS_DIR | --refresh}
  dest="$TOOLS/prometheus-operator-$VERSION"
  if [ -x "$dest/operator" ]; then exit 0; fi
fi
command -v go >/dev/null || { echo "bootstrap: Go >= 1.26 is needed to build the Prometheus Operator $VERSION (https://go.dev/dl)" >&2; exit 1; }
src=$(verified_module_dir "$MODULE" "$VERSION")
for m in $NESTED; do verified_module_dir "$m" "$VERSION" >/dev/null; done

if $refresh; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  cp "$src/go.mod" "$src/go.sum" "$work/"
  chmod u+w "$work/go.mod" "$work/go.sum"
  args=()
  for m in $NESTED; do args+=("-dropreplace=$m"); done
  # the required versions stay the module's own; only the two hashes are added to go.sum
  (cd "$work" && GOWORK=off GOFLAGS= go mod edit "${args[@]}" go.mod &&
    GOWORK=off GOFLAGS= go mod download $(for m in $NESTED; do echo "$m@$VERSION"; done))
  cp "$work/go.mod" "$work/go.sum" "$here/prometheus-operator/"
  echo "bootstrap: refreshed tools/prometheus-operator/go.mod and go.sum; review and commit them"
  exit 0
fi

grep -q "^	$MODULE/pkg/client $VERSION\$" "$here/prometheus-operator/go.mod" ||
  { echo "bootstrap: tools/prometheus-operator/go.mod is not $MODULE $VERSION's; run tools/build-prometheus-operator.sh --refresh" >&2; exit 1; }

echo "bootstrap: building the Prometheus Operator $VERSION (first run only, about 4.5 CPU-minutes)"
# the version stamp of the operator's Makefile (it also names the config-reloader image's tag)
ldflags="-s -X github.com/prometheus/common/version.Version=${VERSION#v}"
rm -rf "$dest.tmp"; mkdir -p "$dest.tmp"
(cd "$src" && GOWORK=off GOFLAGS=-mod=readonly CGO_ENABLED=0 go build -trimpath -buildvcs=false -modfile="$here/prometheus-operator/go.mod" -o "$dest.tmp/operator" -ldflags "$ldflags" ./cmd/operator)
rm -rf "$dest"
mv "$dest.tmp" "$dest"
echo "bootstrap: built $dest/operator"

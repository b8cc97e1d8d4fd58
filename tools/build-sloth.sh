#!/usr/bin/env bash
# Builds Sloth (github.com/slok/sloth, `sloth generate`: SLO rules from its prometheus/v1 spec) from
# the Go module proxy at a pinned version into $1/sloth-$VERSION/. Skipped when it is already
# there. fusebox's tests hold its burn-rate alerts against Sloth's on the same series (docs/slo.md).
#
# Pinned: the module's h1 hash is in tools/go-modules.sum and checked before the build; its own
# go.sum, part of that hashed module, pins every dependency, and GOFLAGS=-mod=readonly refuses
# anything outside it. The module is its own main module (no replace directives), so it builds
# from its own directory with no wrapper module (`go install ...@v0.16.0` works as well). Cold
# (empty Go module and build caches): about 10 minutes on 2 shared cores.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tools/go-verify.sh
. "$here/go-verify.sh"
TOOLS=${1:?usage: build-sloth.sh TOOLS_DIR}
VERSION=v0.16.0
dest="$TOOLS/sloth-$VERSION"
if [ -x "$dest/sloth" ]; then exit 0; fi
command -v go >/dev/null || { echo "bootstrap: Go >= 1.26 is needed to build Sloth $VERSION (https://go.dev/dl)" >&2; exit 1; }
echo "bootstrap: building Sloth $VERSION (first run only, several minutes)"
src=$(verified_module_dir github.com/slok/sloth "$VERSION")
rm -rf "$dest.tmp"; mkdir -p "$dest.tmp"
(cd "$src" && GOWORK=off GOFLAGS=-mod=readonly CGO_ENABLED=0 go build -trimpath -o "$dest.tmp/sloth" ./cmd/sloth)
mv "$dest.tmp" "$dest"

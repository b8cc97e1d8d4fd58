#!/usr/bin/env bash
# Builds VictoriaMetrics (single node), vmalert and vmalert-tool from the Go module proxy at a
# pinned version, in ONE `go build` invocation so the three binaries share their compiled
# packages, into $1/victoriametrics-$VERSION/. Skipped when all three are already there.
#
# Pinned: the VictoriaMetrics module's h1 hash is in tools/go-modules.sum and checked before the
# build; its own go.sum, part of that hashed module, pins every dependency, and
# GOFLAGS=-mod=readonly refuses anything outside it.
#
# The cluster binaries (vminsert, vmselect, vmstorage) live on VictoriaMetrics' `cluster` branch,
# tagged vX.Y.Z-cluster; the Go module proxy does not serve those tags, so they are not built here
# (docs/rule-engines.md says what fusebox tests in their place).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tools/go-verify.sh
. "$here/go-verify.sh"
TOOLS=${1:?usage: build-victoriametrics.sh TOOLS_DIR}
VERSION=v1.151.0
dest="$TOOLS/victoriametrics-$VERSION"
if [ -x "$dest/victoria-metrics" ] && [ -x "$dest/vmalert" ] && [ -x "$dest/vmalert-tool" ]; then exit 0; fi
command -v go >/dev/null || { echo "bootstrap: Go >= 1.26 is needed to build VictoriaMetrics $VERSION (https://go.dev/dl)" >&2; exit 1; }
echo "bootstrap: building VictoriaMetrics, vmalert and vmalert-tool $VERSION (first run only, several minutes)"
src=$(verified_module_dir github.com/VictoriaMetrics/VictoriaMetrics "$VERSION")
rm -rf "$dest.tmp"; mkdir -p "$dest.tmp"
# -o DIR with several main packages writes one executable per package, named after its folder.
(cd "$src" && GOWORK=off GOFLAGS=-mod=readonly CGO_ENABLED=0 go build -trimpath -o "$dest.tmp/" \
  -ldflags "-X github.com/VictoriaMetrics/VictoriaMetrics/lib/buildinfo.Version=victoria-metrics-$VERSION" \
  ./app/victoria-metrics ./app/vmalert ./app/vmalert-tool)
mv "$dest.tmp" "$dest"

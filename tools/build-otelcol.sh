#!/usr/bin/env bash
# Builds the pinned OpenTelemetry Collector that fusebox's generated config targets, with the
# collector builder (ocb), into $1/otelcol-$VERSION/otelcol-fusebox (VERSION: the core version and
# a digest of the manifest). Skipped when the binary is already there, so `make test` stays quick
# once cached.
#
# Pinned by files in this repository: tools/otelcol/manifest.yaml (the components and their
# versions), tools/otelcol/go.mod and go.sum (every module below them, built with
# GOFLAGS=-mod=readonly, so nothing outside go.sum is fetched) and the builder's own h1 hash
# in tools/go-modules.sum.
#
# Usage: tools/build-otelcol.sh TOOLS_DIR
#        tools/build-otelcol.sh --refresh   regenerate tools/otelcol/go.mod and go.sum from the
#                                           manifest (after changing a version; review the diff)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tools/go-verify.sh
. "$here/go-verify.sh"
CORE=v0.165.0        # the builder and the go.opentelemetry.io/collector/* 0.x modules in the manifest
# The output folder's name: CORE and the first 12 hex digits of otelcol/manifest.yaml's sha256, so
# a manifest change (a component added) gives a new folder and a cached build of another manifest
# is never taken for this one. Keep in step with OTELCOL_VERSION in fusebox/tooling.py.
VERSION=$CORE-fad73c3a4fa3
refresh=false
if [ "${1:-}" = "--refresh" ]; then
  refresh=true
  TOOLS=$(mktemp -d)
else
  TOOLS=${1:?usage: build-otelcol.sh TOOLS_DIR | --refresh}
  manifest_sum=$(sha256sum "$here/otelcol/manifest.yaml" | cut -c1-12)
  if [ "$VERSION" != "$CORE-$manifest_sum" ]; then
    echo "bootstrap: tools/otelcol/manifest.yaml has changed: set VERSION=$CORE-$manifest_sum in tools/build-otelcol.sh and OTELCOL_VERSION in fusebox/tooling.py (after tools/build-otelcol.sh --refresh)" >&2
    exit 1
  fi
fi
dest="$TOOLS/otelcol-$VERSION"
if ! $refresh && [ -x "$dest/otelcol-fusebox" ]; then exit 0; fi
command -v go >/dev/null || { echo "bootstrap: Go >= 1.26 is needed to build the OpenTelemetry Collector $VERSION (https://go.dev/dl)" >&2; exit 1; }
echo "bootstrap: building OpenTelemetry Collector $VERSION (first run only, several minutes)"
mkdir -p "$TOOLS"
work=$(mktemp -d "$TOOLS/otelcol-build.XXXXXX")
if $refresh; then trap 'rm -rf "$TOOLS"' EXIT; else trap 'rm -rf "$work"' EXIT; fi
builder_src=$(verified_module_dir go.opentelemetry.io/collector/cmd/builder "$CORE")
(cd "$builder_src" && GOFLAGS=-mod=readonly GOBIN="$work/bin" go install .)
cp "$here/otelcol/manifest.yaml" "$work/manifest.yaml"  # output_path ./dist, relative to $work
mkdir -p "$work/dist"
if $refresh; then
  (cd "$work" && "$work/bin/builder" --config manifest.yaml --skip-compilation)
  cp "$work/dist/go.mod" "$work/dist/go.sum" "$here/otelcol/"
  echo "bootstrap: refreshed tools/otelcol/go.mod and go.sum; review and commit them"
  exit 0
fi
# the committed module graph; the builder then only generates the sources and compiles
cp "$here/otelcol/go.mod" "$here/otelcol/go.sum" "$work/dist/"
(cd "$work" && GOFLAGS=-mod=readonly "$work/bin/builder" --config manifest.yaml --skip-get-modules)
mkdir -p "$dest.tmp"
mv "$work/dist/otelcol-fusebox" "$dest.tmp/"
cp "$here/otelcol/manifest.yaml" "$here/otelcol/go.sum" "$dest.tmp/"
rm -rf "$dest"
mv "$dest.tmp" "$dest"
echo "bootstrap: built $dest/otelcol-fusebox"

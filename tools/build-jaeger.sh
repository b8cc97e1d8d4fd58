#!/usr/bin/env bash
# Builds Jaeger v2, the `jaeger` command of github.com/jaegertracing/jaeger (cmd/jaeger: an
# OpenTelemetry Collector distribution with Jaeger's storage, query and sampling extensions), at a
# pinned version into $1/jaeger-$VERSION/jaeger. Skipped when it is already there.
# With no --config it runs all-in-one with in-memory storage; tools/README.md says how a test
# starts it on chosen loopback ports.
#
# Jaeger's go.mod has a replace directive, so `go install MODULE/cmd/jaeger@VERSION` refuses it;
# a replace holds where the downloaded module is the main module, so the build runs inside it,
# with its own go.mod and go.sum, as Jaeger's Makefile builds it (less the UI: the web UI's
# assets are built with npm and are not in the module, so the binary serves Jaeger's placeholder
# page at / and the full query API under /api/).
#
# Pinned: the h1 hash of github.com/jaegertracing/jaeger in tools/go-modules.sum, checked before
# the build; the module's own go.sum (inside the hashed module) pins every module below it, and
# GOFLAGS=-mod=readonly refuses anything outside it. The module's v1.x tag is the release Jaeger
# also tags v2.x (the same commit); the Go module proxy knows it by the v1.x tag.
#
# Usage: tools/build-jaeger.sh TOOLS_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tools/go-verify.sh
. "$here/go-verify.sh"
VERSION=v1.75.0   # keep in step with JAEGER_VERSION in fusebox/tooling.py
MODULE=github.com/jaegertracing/jaeger
TOOLS=${1:?usage: build-jaeger.sh TOOLS_DIR}
dest="$TOOLS/jaeger-$VERSION"
[ -x "$dest/jaeger" ] && exit 0
command -v go >/dev/null || { echo "bootstrap: Go >= 1.26 is needed to build Jaeger $VERSION (https://go.dev/dl)" >&2; exit 1; }
src=$(verified_module_dir "$MODULE" "$VERSION")

echo "bootstrap: building Jaeger $VERSION's jaeger command (first run only, about 7 CPU-minutes)"
# the version stamp of Jaeger's Makefile (BuildInfo.mk); `jaeger version` prints it
ldflags="-s -w -X=$MODULE/internal/version.latestVersion=$VERSION -X=$MODULE/internal/version.commitSHA=$VERSION"
rm -rf "$dest.tmp"; mkdir -p "$dest.tmp"
(cd "$src" && GOWORK=off GOFLAGS=-mod=readonly CGO_ENABLED=0 go build -trimpath -buildvcs=false -o "$dest.tmp/jaeger" -ldflags "$ldflags" ./cmd/jaeger)
chmod -R u+w "$dest.tmp"
rm -rf "$dest"
mv "$dest.tmp" "$dest"
echo "bootstrap: built $dest/jaeger"

#!/usr/bin/env bash
# Builds Thanos (one binary; fusebox runs its `thanos tools rules-check`, the check Thanos Ruler
# applies to rule files, `partial_response_strategy` included) from the Go module proxy at a pinned
# version into $1/thanos-$VERSION/. Skipped when it is already there.
#
# Pinned: the Thanos module's h1 hash is in tools/go-modules.sum and checked before the build; its
# own go.sum, part of that hashed module, pins every dependency, and GOFLAGS=-mod=readonly refuses
# anything outside it. v0.42.4 is the newest release whose go.mod asks for no newer Go than 1.26.0
# (v0.42.5 needs 1.26.10). It shares many packages with the Prometheus 3 promtool build, which
# bootstrap.sh runs first, so most of them come from the Go build cache.
# bootstrap: after build-promtool3.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tools/go-verify.sh
. "$here/go-verify.sh"
TOOLS=${1:?usage: build-thanos.sh TOOLS_DIR}
VERSION=v0.42.4
dest="$TOOLS/thanos-$VERSION"
if [ -x "$dest/thanos" ]; then exit 0; fi
command -v go >/dev/null || { echo "bootstrap: Go >= 1.26 is needed to build Thanos $VERSION (https://go.dev/dl)" >&2; exit 1; }
echo "bootstrap: building Thanos $VERSION (first run only, several minutes)"
src=$(verified_module_dir github.com/thanos-io/thanos "$VERSION")
rm -rf "$dest.tmp"; mkdir -p "$dest.tmp"
(cd "$src" && GOWORK=off GOFLAGS=-mod=readonly CGO_ENABLED=0 go build -trimpath -o "$dest.tmp/thanos" \
  -ldflags "-X github.com/prometheus/common/version.Version=${VERSION#v}" ./cmd/thanos)
mv "$dest.tmp" "$dest"

#!/usr/bin/env bash
# Builds a current Prometheus 3.x promtool from the Go module proxy (pinned), so the generated
# rule tests run under both Debian's promtool 2.42 and Prometheus 3.
#
# Pinned: the prometheus module's h1 hash is in tools/go-modules.sum and checked before the
# build; its own go.sum, part of that hashed module, pins every dependency, and
# GOFLAGS=-mod=readonly refuses anything outside it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tools/go-verify.sh
. "$here/go-verify.sh"
TOOLS=${1:?usage: build-promtool3.sh TOOLS_DIR}
VERSION=v0.316.0   # Go module version of Prometheus v3.16.0 (module v0.3XY.Z = release 3.XY.Z)
dest="$TOOLS/promtool-$VERSION"
[ -x "$dest/promtool" ] && exit 0
command -v go >/dev/null || { echo "bootstrap: Go >= 1.26 is needed to build promtool $VERSION (https://go.dev/dl)" >&2; exit 1; }
echo "bootstrap: building promtool $VERSION (first run only, a few minutes)"
src=$(verified_module_dir github.com/prometheus/prometheus "$VERSION")
mkdir -p "$dest.tmp"
# GOWORK=off: the module ships a go.work naming folders that its module zip leaves out.
(cd "$src" && GOWORK=off GOFLAGS=-mod=readonly go build -trimpath -o "$dest.tmp/promtool" \
  -ldflags "-X github.com/prometheus/common/version.Version=3.${VERSION#v0.3}" ./cmd/promtool)
mv "$dest.tmp" "$dest"

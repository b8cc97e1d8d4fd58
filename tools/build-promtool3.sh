#!/usr/bin/env bash
# Builds a current Prometheus 3.x promtool from the Go module proxy (pinned), so the generated
# rule tests run under both Debian's promtool 2.42 and Prometheus 3.
set -euo pipefail
TOOLS=$1
VERSION=v0.316.0   # Go module version of Prometheus v3.16.0 (module v0.3XY.Z = release 3.XY.Z)
dest="$TOOLS/promtool-$VERSION"
[ -x "$dest/promtool" ] && exit 0
command -v go >/dev/null || { echo "bootstrap: Go is needed to build promtool $VERSION (https://go.dev/dl)" >&2; exit 1; }
echo "bootstrap: building promtool $VERSION (first run only, a few minutes)"
mkdir -p "$dest.tmp"
GOBIN="$dest.tmp" GOFLAGS=-mod=mod go install \
  -ldflags "-X github.com/prometheus/common/version.Version=3.${VERSION#v0.3}" \
  "github.com/prometheus/prometheus/cmd/promtool@$VERSION"
mv "$dest.tmp" "$dest"

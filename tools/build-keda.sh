#!/usr/bin/env bash
# Builds KEDA's operator (cmd/operator: the ScaledObject controller, which makes and keeps the HPA,
# and the gRPC metrics service that runs the scalers) and its metrics API server (cmd/adapter: the
# external.metrics.k8s.io API the HPA controller reads through the API server's aggregator) at a
# pinned version into $1/keda-$VERSION/{operator,adapter}, with KEDA's CRDs (config/crd/bases/*.yaml
# of the same module) in $1/keda-$VERSION/crds/. Skipped when all of it is already there.
# tests/_scaling_support.py says how the tests run them on loopback.
#
# KEDA's go.mod has a replace directive (and an exclude), so `go install MODULE/cmd/...@VERSION`
# refuses it; both hold when the downloaded module is the main module, so the build runs inside
# it, with its own go.mod and go.sum, as KEDA's Makefile builds it.
#
# Pinned: the h1 hash of github.com/kedacore/keda/v2 in tools/go-modules.sum, checked before the
# build; the module's own go.sum (inside the hashed module) pins every module below it, and
# GOFLAGS=-mod=readonly refuses anything outside it. VERSION is the newest release the machines'
# Go builds (v2.21.1 needs Go 1.27.4).
#
# Usage: tools/build-keda.sh TOOLS_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tools/go-verify.sh
. "$here/go-verify.sh"
VERSION=v2.21.0   # keep in step with KEDA_VERSION in tests/_scaling_support.py
MODULE=github.com/kedacore/keda/v2
CRDS="keda.sh_scaledobjects keda.sh_scaledjobs keda.sh_triggerauthentications keda.sh_clustertriggerauthentications
  eventing.keda.sh_cloudeventsources eventing.keda.sh_clustercloudeventsources"
TOOLS=${1:?usage: build-keda.sh TOOLS_DIR}
dest="$TOOLS/keda-$VERSION"
have=true
[ -x "$dest/operator" ] && [ -x "$dest/adapter" ] || have=false
for c in $CRDS; do [ -f "$dest/crds/$c.yaml" ] || have=false; done
$have && exit 0
command -v go >/dev/null || { echo "bootstrap: Go >= 1.26 is needed to build KEDA $VERSION (https://go.dev/dl)" >&2; exit 1; }
src=$(verified_module_dir "$MODULE" "$VERSION")

echo "bootstrap: building KEDA $VERSION's operator and metrics API server (first run only, about 12 CPU-minutes)"
# the version stamp of KEDA's Makefile (GO_LDFLAGS); the operator logs it at start
ldflags="-s -w -X=$MODULE/version.Version=${VERSION#v} -X=$MODULE/version.GitCommit=$VERSION"
rm -rf "$dest.tmp"; mkdir -p "$dest.tmp/crds"
# -o DIR with several main packages writes one executable per package, named after its folder.
(cd "$src" && GOWORK=off GOFLAGS=-mod=readonly CGO_ENABLED=0 go build -trimpath -buildvcs=false -o "$dest.tmp/" -ldflags "$ldflags" ./cmd/operator ./cmd/adapter)
for c in $CRDS; do
  [ -f "$src/config/crd/bases/$c.yaml" ] || { echo "bootstrap: KEDA $VERSION has no config/crd/bases/$c.yaml; update CRDS in tools/build-keda.sh" >&2; exit 1; }
  cp "$src/config/crd/bases/$c.yaml" "$dest.tmp/crds/"
done
chmod -R u+w "$dest.tmp"   # the module cache is read-only
rm -rf "$dest"
mv "$dest.tmp" "$dest"
echo "bootstrap: built $dest/operator, $dest/adapter and $dest/crds/"

#!/usr/bin/env bash
# Copies the Prometheus Operator's CRD schemas (PrometheusRule, ServiceMonitor, PodMonitor,
# AlertmanagerConfig) from the Go module proxy (pinned) into $TOOLS, for the tests that validate
# the generated k8s/ manifests offline (tests/test_k8s_manifests.py). Nothing is built.
#
# Pinned: the prometheus-operator module's h1 hash is in tools/go-modules.sum and checked after
# the download (go mod download checks it against sum.golang.org too); the CRDs are the
# module's own example/prometheus-operator-crd/ files, as the operator's release ships them.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tools/go-verify.sh
. "$here/go-verify.sh"
TOOLS=${1:?usage: build-operator-crds.sh TOOLS_DIR}
VERSION=v0.85.0   # keep in step with OPERATOR_VERSION in tests/test_k8s_manifests.py
dest="$TOOLS/prometheus-operator-crds-$VERSION"
kinds="prometheusrules servicemonitors podmonitors alertmanagerconfigs"
[ -f "$dest/monitoring.coreos.com_alertmanagerconfigs.yaml" ] && exit 0
command -v go >/dev/null || { echo "bootstrap: Go is needed to fetch the Prometheus Operator $VERSION CRDs (https://go.dev/dl)" >&2; exit 1; }
echo "bootstrap: fetching the Prometheus Operator $VERSION CRDs"
src=$(verified_module_dir github.com/prometheus-operator/prometheus-operator "$VERSION")
rm -rf "$dest.tmp"
mkdir -p "$dest.tmp"
for k in $kinds; do
  cp "$src/example/prometheus-operator-crd/monitoring.coreos.com_$k.yaml" "$dest.tmp/"
done
chmod -R u+w "$dest.tmp"   # the module cache is read-only
mv "$dest.tmp" "$dest"

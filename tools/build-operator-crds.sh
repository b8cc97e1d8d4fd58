#!/usr/bin/env bash
# Copies the Prometheus Operator's CRDs, all ten of them (every file of the module's
# example/prometheus-operator-crd/), from the Go module proxy (pinned) into
# $TOOLS/prometheus-operator-crds-$VERSION/: the tests that validate the generated k8s/ manifests
# offline read four of them (PrometheusRule, ServiceMonitor, PodMonitor, AlertmanagerConfig:
# tests/k8s/test_k8s_manifests.py), and the operator tools/build-prometheus-operator.sh builds needs
# all of them installed in the API server to run (tools/kube/README.md). Nothing is built.
#
# Pinned: the prometheus-operator module's h1 hash is in tools/go-modules.sum and checked after
# the download (go mod download checks it against sum.golang.org too); the CRDs are the
# module's own example/prometheus-operator-crd/ files, as the operator's release ships them.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tools/go-verify.sh
. "$here/go-verify.sh"
TOOLS=${1:?usage: build-operator-crds.sh TOOLS_DIR}
VERSION=v0.85.0   # keep in step with OPERATOR_VERSION in tests/k8s/test_k8s_manifests.py
dest="$TOOLS/prometheus-operator-crds-$VERSION"
# every file of example/prometheus-operator-crd/ at $VERSION (checked against the module below)
kinds="alertmanagerconfigs alertmanagers podmonitors probes prometheusagents prometheuses
  prometheusrules scrapeconfigs servicemonitors thanosrulers"
have=true
for k in $kinds; do [ -f "$dest/monitoring.coreos.com_$k.yaml" ] || have=false; done
$have && exit 0
command -v go >/dev/null || { echo "bootstrap: Go is needed to fetch the Prometheus Operator $VERSION CRDs (https://go.dev/dl)" >&2; exit 1; }
echo "bootstrap: fetching the Prometheus Operator $VERSION CRDs"
src=$(verified_module_dir github.com/prometheus-operator/prometheus-operator "$VERSION")
rm -rf "$dest.tmp"
mkdir -p "$dest.tmp"
cp "$src"/example/prometheus-operator-crd/*.yaml "$dest.tmp/"
chmod -R u+w "$dest.tmp"   # the module cache is read-only
for k in $kinds; do
  [ -f "$dest.tmp/monitoring.coreos.com_$k.yaml" ] || { echo "bootstrap: the operator $VERSION has no $k CRD; update kinds in tools/build-operator-crds.sh" >&2; exit 1; }
done
# an older cache may hold the first four CRDs only: replace it whole
rm -rf "$dest"
mv "$dest.tmp" "$dest"

#!/usr/bin/env bash
# Builds the pinned OpenTelemetry Collector that fusebox's generated config targets, with the
# collector builder (ocb) from the Go module proxy, into $1/otelcol-$VERSION/otelcol-fusebox.
# Skipped when the binary is already there, so `make test` stays quick once cached.
# Usage: tools/build-otelcol.sh TOOLS_DIR
set -euo pipefail
TOOLS=${1:?usage: build-otelcol.sh TOOLS_DIR}
CORE=v0.165.0        # go.opentelemetry.io/collector/* 0.x modules (and the builder)
CORE_STABLE=v1.71.0  # go.opentelemetry.io/collector/* 1.x modules (confmap providers)
CONTRIB=v0.165.1     # github.com/open-telemetry/opentelemetry-collector-contrib/*
VERSION=$CORE
dest="$TOOLS/otelcol-$VERSION"
[ -x "$dest/otelcol-fusebox" ] && exit 0
command -v go >/dev/null || { echo "bootstrap: Go >= 1.24 is needed to build the OpenTelemetry Collector $VERSION (https://go.dev/dl)" >&2; exit 1; }
echo "bootstrap: building OpenTelemetry Collector $VERSION (first run only, several minutes)"
mkdir -p "$TOOLS"
work=$(mktemp -d "$TOOLS/otelcol-build.XXXXXX")
trap 'rm -rf "$work"' EXIT
GOBIN="$work/bin" go install "go.opentelemetry.io/collector/cmd/builder@$CORE"
c=github.com/open-telemetry/opentelemetry-collector-contrib
o=go.opentelemetry.io/collector
cat > "$work/manifest.yaml" <<MANIFEST
dist:
  name: otelcol-fusebox
  description: OpenTelemetry Collector with the components fusebox's generated config uses
  version: ${VERSION#v}
  output_path: $work/dist
receivers:
  - gomod: $o/receiver/otlpreceiver $CORE
  - gomod: $c/receiver/prometheusreceiver $CONTRIB
processors:
  - gomod: $o/processor/memorylimiterprocessor $CORE
  - gomod: $o/processor/batchprocessor $CORE
  - gomod: $c/processor/resourceprocessor $CONTRIB
exporters:
  - gomod: $o/exporter/debugexporter $CORE
  - gomod: $c/exporter/prometheusexporter $CONTRIB
  - gomod: $c/exporter/prometheusremotewriteexporter $CONTRIB
extensions:
  - gomod: $c/extension/healthcheckextension $CONTRIB
providers:
  - gomod: $o/confmap/provider/envprovider $CORE_STABLE
  - gomod: $o/confmap/provider/fileprovider $CORE_STABLE
  - gomod: $o/confmap/provider/yamlprovider $CORE_STABLE
MANIFEST
"$work/bin/builder" --config "$work/manifest.yaml"
mkdir -p "$dest.tmp"
mv "$work/dist/otelcol-fusebox" "$dest.tmp/"
cp "$work/manifest.yaml" "$dest.tmp/manifest.yaml"
rm -rf "$dest"
mv "$dest.tmp" "$dest"
echo "bootstrap: built $dest/otelcol-fusebox"

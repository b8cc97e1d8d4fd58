#!/usr/bin/env bash
# Installs what the tests need and the project does not vendor:
#  - promtool, amtool, prometheus, alertmanager, the PostgreSQL server from the system package
#    manager when missing;
#  - pinned Go tools (Prometheus 3 promtool, the OpenTelemetry Collector, VictoriaMetrics with
#    vmalert and vmalert-tool, Thanos for its rules-check) built once into
#    $FUSEBOX_TOOLS and reused.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
TOOLS=${FUSEBOX_TOOLS:-$HOME/.cache/fusebox/tools}
mkdir -p "$TOOLS"

need_apt=()
command -v promtool >/dev/null || need_apt+=(prometheus)
command -v prometheus >/dev/null || need_apt+=(prometheus)
command -v amtool >/dev/null || need_apt+=(prometheus-alertmanager)
command -v prometheus-alertmanager >/dev/null || command -v alertmanager >/dev/null || need_apt+=(prometheus-alertmanager)
command -v haproxy >/dev/null || need_apt+=(haproxy)  # the fuse's haproxy adapter tests (runtime API)
# Headless Chromium renders the fuse service's status page in tests/test_fuse_status_page.py.
command -v chromium >/dev/null || command -v chromium-browser >/dev/null || command -v google-chrome >/dev/null || need_apt+=(chromium)
# The PostgreSQL server (initdb, pg_ctl) the fuse's HA tests start: tests/test_fuse_ha.py.
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null || need_apt+=(postgresql)
if [ ${#need_apt[@]} -gt 0 ]; then
  if ! command -v apt-get >/dev/null; then
    echo "bootstrap: ${need_apt[*]} missing and no apt-get: install Prometheus >= 2.42, Alertmanager >= 0.25, Chromium and PostgreSQL >= 13 and put them on PATH" >&2
    exit 1
  fi
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  echo "bootstrap: installing ${need_apt[*]} with apt-get"
  $SUDO apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends $(printf '%s\n' "${need_apt[@]}" | sort -u) >/dev/null
fi

# Pinned Go tools, each built by its own script into $TOOLS (skipped when already there).
for script in "$here"/build-*.sh; do
  [ -e "$script" ] || continue
  bash "$script" "$TOOLS"
done

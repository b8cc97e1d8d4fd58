#!/usr/bin/env bash
# Installs what the tests need and the project does not vendor:
#  - promtool, amtool, prometheus, alertmanager, the PostgreSQL server from the system package
#    manager when missing;
#  - pinned Go tools (Prometheus 3 promtool, the OpenTelemetry Collector, VictoriaMetrics with
#    vmalert and vmalert-tool, Thanos for its rules-check, kube-apiserver, kube-controller-manager
#    and etcd, the Prometheus Operator and its CRDs, KEDA's operator and metrics API server and its
#    CRDs, Jaeger v2 as the trace backend) built once into $FUSEBOX_TOOLS and reused.
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
# Headless Chromium renders the fuse service's status page in tests/fuse/test_fuse_status_page.py.
command -v chromium >/dev/null || command -v chromium-browser >/dev/null || command -v google-chrome >/dev/null || need_apt+=(chromium)
# The PostgreSQL server (initdb, pg_ctl) the fuse's HA tests start: tests/fuse/test_fuse_ha.py.
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

# Pinned Go tools, each built by its own script, tools/build-*.sh, into $TOOLS (each skips itself
# when its output is already there). The scripts are independent, so they run in parallel,
# FUSEBOX_TOOLS_JOBS (default 3) at a time: a cold bootstrap is mostly Go compiling, and one
# `go build` leaves cores idle while it links or waits on a package everything else needs. A
# script with a line `# bootstrap: after build-X.sh` starts once build-X.sh has finished (Thanos
# after promtool 3: they share most packages, which the second then takes from the Go build
# cache). Each line a script prints is prefixed with its name, and kept in
# $TOOLS/logs/<script>.log; a failed script's log tail is printed again at the end.
jobs_max=${FUSEBOX_TOOLS_JOBS:-3}
logs="$TOOLS/logs"
mkdir -p "$logs"
# Each job writes its exit status to a file here: the shell's own bookkeeping of finished
# background jobs (wait PID) proved unreliable once `jobs` had listed them.
rcs=$(mktemp -d)
trap 'rm -rf "$rcs"' EXIT
declare -A pid after
first=() later=()
for script in "$here"/build-*.sh; do
  [ -e "$script" ] || continue
  name=$(basename "$script")
  after[$name]=$(sed -n 's/^# bootstrap: after \(build-[a-z0-9-]*\.sh\)$/\1/p' "$script")
  if [ -n "${after[$name]}" ]; then later+=("$script"); else first+=("$script"); fi
done
finished() {  # finished NAME: true once its job has ended (a job killed before writing its status: 137)
  [ -e "$rcs/$1" ] && return 0
  kill -0 "${pid[$1]}" 2>/dev/null && return 1
  sleep 1; [ -e "$rcs/$1" ] || echo 137 > "$rcs/$1"
}
running() {
  local n=0 name
  for name in "${!pid[@]}"; do finished "$name" || n=$((n + 1)); done
  echo "$n"
}
for script in "${first[@]}" "${later[@]}"; do
  name=$(basename "$script")
  while [ "$(running)" -ge "$jobs_max" ]; do sleep 1; done
  dep=${after[$name]}
  if [ -n "$dep" ] && [ -n "${pid[$dep]:-}" ]; then
    until finished "$dep"; do sleep 1; done
  fi
  (
    set -o pipefail
    start=$SECONDS
    rc=0
    bash "$script" "$TOOLS" 2>&1 | tee "$logs/$name.log" | sed -u "s/^/[$name] /" || rc=$?
    if [ $rc -ne 0 ]; then echo "[$name] bootstrap: failed (exit $rc) after $((SECONDS - start)) s"
    elif [ -s "$logs/$name.log" ]; then echo "[$name] bootstrap: done in $((SECONDS - start)) s"; fi
    echo "$rc" > "$rcs/$name.tmp" && mv "$rcs/$name.tmp" "$rcs/$name"
  ) &
  pid[$name]=$!
done
failed=()
for name in "${!pid[@]}"; do
  until finished "$name"; do sleep 1; done
  [ "$(cat "$rcs/$name")" -eq 0 ] || failed+=("$name")
done
wait  # reap the subshells
if [ ${#failed[@]} -gt 0 ]; then
  for name in "${failed[@]}"; do
    echo "bootstrap: tools/$name failed (exit $(cat "$rcs/$name")); the end of $logs/$name.log:" >&2
    tail -n 25 "$logs/$name.log" | sed "s/^/  /" >&2
  done
  exit 1
fi

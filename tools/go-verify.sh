#!/usr/bin/env bash
# Sourced by tools/build-*.sh. verified_module_dir MODULE VERSION downloads MODULE@VERSION into
# the Go module cache, checks its h1 hash against tools/go-modules.sum and prints its
# directory; it fails (non-zero, a message on stderr) on a missing line or another hash.
verified_module_dir() {
  local sums want json got
  sums="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/go-modules.sum"
  want=$(awk -v m="$1" -v v="$2" '$1 == m && $2 == v {print $3}' "$sums")
  if [ -z "$want" ]; then
    echo "bootstrap: $1 $2 has no line in tools/go-modules.sum" >&2
    return 1
  fi
  # outside any module, so no go.mod around us decides what is downloaded
  json=$(cd / && go mod download -json "$1@$2") || return 1
  got=$(printf '%s\n' "$json" | sed -n 's/^[[:space:]]*"Sum": "\(.*\)",\{0,1\}$/\1/p')
  if [ "$got" != "$want" ]; then
    echo "bootstrap: $1 $2 has hash ${got:-none}, tools/go-modules.sum says $want" >&2
    return 1
  fi
  printf '%s\n' "$json" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p'
}

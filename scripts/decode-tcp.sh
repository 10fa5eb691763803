#!/usr/bin/env bash
# scripts/decode-tcp.sh [N] [extra kvmesh decode args...]
#
# Runs `kvmesh decode` as N local processes (default 4), one rank each, whose
# decode steps go over the TCP step transport (no mpirun). Rank 0 binds a
# free port on 127.0.0.1 and publishes it in a rendezvous file; the others
# read it. Rank 0's report goes to stdout; progress to stderr. Waits for every
# rank; exits with the first non-zero rank status. On exit or Ctrl-C the ranks
# still running are killed.
#
#   scripts/decode-tcp.sh 4 --sweep '' --repeat 3
#   KVMESH_BIN=build-decode/bin/kvmesh scripts/decode-tcp.sh 2 --json
set -uo pipefail

n=4
if [[ $# -gt 0 && "$1" =~ ^[0-9]+$ ]]; then n="$1"; shift; fi
if (( n < 1 || n > 64 )); then echo "decode-tcp: N must be in [1, 64]" >&2; exit 2; fi
here="$(cd "$(dirname "$0")/.." && pwd)"
bin="${KVMESH_BIN:-$here/build/bin/kvmesh}"
[[ -x "$bin" ]] || { echo "decode-tcp: no kvmesh binary at $bin (set KVMESH_BIN)" >&2; exit 2; }

dir="$(mktemp -d "${TMPDIR:-/tmp}/kvmesh-decode-tcp.XXXXXX")"
file="$dir/rendezvous"
pids=()
# shellcheck disable=SC2317  # reached through the traps below, which shellcheck does not follow
cleanup() {
  trap - EXIT INT TERM
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  sleep 0.2
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'echo "decode-tcp: interrupted, stopping the ranks" >&2; cleanup; exit 130' INT TERM

echo "decode-tcp: starting $n ranks of $bin (rendezvous file $file)" >&2
for ((r = 0; r < n; r++)); do
  args=(decode --tcp-rank "$r" --tcp-world "$n" --tcp-rendezvous 127.0.0.1:0 --tcp-rendezvous-file "$file" "$@")
  if (( r == 0 )); then
    "$bin" "${args[@]}" &
  else
    "$bin" "${args[@]}" > "$dir/rank$r.out" &  # only rank 0 reports
  fi
  pids+=($!)
done

status=0
for ((r = 0; r < n; r++)); do
  wait "${pids[$r]}"
  rc=$?
  if (( rc != 0 )); then
    echo "decode-tcp: rank $r exited with status $rc" >&2
    (( status == 0 )) && status=$rc
  else
    echo "decode-tcp: rank $r done" >&2
  fi
done
pids=()
exit "$status"

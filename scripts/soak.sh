#!/usr/bin/env bash
# The long soak / chaos run (docs/soak.md), kept out of CI: builds kvmesh and
# kvmesh_soak, then runs a real cluster (coordinator + N node daemons on
# 127.0.0.1) under load and faults for --seconds (default 300), checking that
# no wrong byte is ever returned, every error is a miss or a documented
# refusal, no call overruns its timeout, killed nodes come back, daemons never
# crash and the client leaks no fds or threads. The progress line goes to
# stderr, the JSON report to stdout (and to --json-out FILE if given).
# Exit status 1 on any invariant violation.
#
#   scripts/soak.sh                        # 5 minutes, 3 nodes
#   scripts/soak.sh --seconds 1800 --nodes 4 --json-out /tmp/soak.json
#   KVMESH_SOAK_BUILD=build-soak scripts/soak.sh --seconds 60
#
# Options other than --seconds pass through to kvmesh_soak (--help lists them).
# The CI variant is the ctest test soak:ci-15s (label "chaos").
set -euo pipefail
cd "$(dirname "$0")/.."
build="${KVMESH_SOAK_BUILD:-build}"
seconds=300
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --seconds=*) seconds="${1#*=}"; shift ;;
    *) args+=("$1"); shift ;;
  esac
done
if [ ! -f "$build/CMakeCache.txt" ]; then
  if [ "$build" = build ]; then
    scripts/install-deps.sh >&2
    cmake --preset default >&2
  else
    cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >&2
  fi
fi
cmake --build "$build" -j2 --target kvmesh kvmesh_soak >&2   # stdout carries only the JSON report
exec "$build/bin/kvmesh_soak" --kvmesh "$build/bin/kvmesh" --seconds "$seconds" ${args[@]+"${args[@]}"}

#!/usr/bin/env bash
# Every test from nothing: install, build (warnings are errors under CI), run
# ctest (GPU-labelled tests are skipped without a GPU; soak tests are left out),
# then the fuzz stage: every libFuzzer target for a bounded time from its seed
# corpus, each printing its execution count (scripts/fuzz.sh; KVMESH_FUZZ=0
# skips it).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
(cd build && ctest --output-on-failure -j2 --timeout 300 -LE 'soak' "$@")
if [ "${KVMESH_FUZZ:-1}" != 0 ]; then
  scripts/fuzz.sh
fi

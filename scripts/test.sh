#!/usr/bin/env bash
# Every test from nothing: install, build (warnings are errors under CI), run
# ctest (GPU-labelled tests are skipped without a GPU; soak tests are left out).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
cd build
ctest --output-on-failure -j2 --timeout 300 -LE 'soak' "$@"

#!/usr/bin/env bash
# Installs what is missing, then configures and builds kvmesh into build/.
# Usage: scripts/build.sh [cmake preset, default "default"; CI=true uses "ci"]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
preset="${1:-}"
if [ -z "$preset" ]; then
  if [ "${CI:-}" = "true" ]; then preset=ci; else preset=default; fi
fi
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset"

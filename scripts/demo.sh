#!/usr/bin/env bash
# The main job from nothing: install, build, run `kvmesh demo` on the embedded
# default cluster (cluster_configs/local.json). Extra arguments go to the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
exec build/bin/kvmesh demo --config cluster_configs/local.json "$@"

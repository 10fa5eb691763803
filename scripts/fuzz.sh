#!/usr/bin/env bash
# The fuzz stage of CI (.ci/run -> scripts/test.sh; docs/security.md,
# "Fuzzing"): builds the libFuzzer targets in build-fuzz/ (clang, ASan and
# UBSan; fuzz/build.sh), runs each for KVMESH_FUZZ_SECONDS seconds (default
# 20) from its committed seed corpus under ctest (label "fuzz", two at a
# time), then prints every target's execution count. A crash fails the stage
# and leaves its input in build-fuzz/fuzz/work/<target>/.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${KVMESH_FUZZ_SECONDS:-20}"
fuzz/build.sh -DKVMESH_FUZZ_SECONDS="$seconds"
status=0
ctest --test-dir build-fuzz -L fuzz -j2 --output-on-failure --timeout $((seconds + 120)) || status=$?
echo "fuzz stage (${seconds} s per target):"
cat build-fuzz/fuzz/work/*/summary 2> /dev/null || true
exit "$status"

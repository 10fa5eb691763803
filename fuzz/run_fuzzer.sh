#!/usr/bin/env bash
# Runs one libFuzzer target for a bounded time from its committed seed corpus
# (a ctest test of label "fuzz", fuzz/CMakeLists.txt) and prints one line:
#   fuzz NAME: N executions in S s, E coverage edges, C corpus inputs, exit 0
# New inputs go to WORK/corpus in the build tree, never into the seeds. A
# crash, leak or timeout leaves its input in WORK/ (crash-*, leak-*, ...),
# prints the tail of the log and fails the test: fix the parser and turn the
# input into a regression test (tests/test_fuzz_regressions.cc).
# Usage: run_fuzzer.sh BINARY SECONDS SEED_DIR WORK_DIR [DICT]
set -uo pipefail
bin=$1 secs=$2 seeds=$3 work=$4 dict=${5:-}
name=$(basename "$bin")
mkdir -p "$work/corpus"
rm -f "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-* "$work/summary"
args=(-max_total_time="$secs" -print_final_stats=1 -artifact_prefix="$work/" -timeout=10 -rss_limit_mb=2048
      -max_len=65536)
[ -n "$dict" ] && args+=(-dict="$dict")
"$bin" "${args[@]}" "$work/corpus" "$seeds" > "$work/log" 2>&1
rc=$?
runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log" | tail -1)
cov=$(grep -oE ' cov: [0-9]+' "$work/log" | tail -1 | grep -oE '[0-9]+')
corpus=$(find "$work/corpus" -type f | wc -l)
line="fuzz $name: ${runs:-0} executions in $secs s, ${cov:-?} coverage edges, $corpus corpus inputs, exit $rc"
echo "$line" | tee "$work/summary"
if [ "$rc" -ne 0 ] || [ -z "$runs" ]; then
  tail -n 60 "$work/log"
  ls -l "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-* 2> /dev/null
  exit 1
fi

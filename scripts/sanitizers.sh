#!/usr/bin/env bash
# Configures, builds and tests the sanitizer presets (CMakePresets.json), one
# after the other, and prints one summary line per preset at the end.
#
# Usage: scripts/sanitizers.sh [asan|tsan|all] [ctest arguments...]
#   asan  AddressSanitizer + UndefinedBehaviorSanitizer + LeakSanitizer, build-asan/
#   tsan  ThreadSanitizer, build-tsan/
#   all   both (the default)
# Extra arguments go to ctest after the preset's own (for example -R decode).
#
# The test presets exclude the gpu and soak labels, scale every test's time
# bound (KVMESH_TEST_TIMEOUT_SCALE) and set the sanitizer options and
# suppressions (scripts/lsan.supp, scripts/tsan.supp). Each preset's full
# output goes to build-<preset>/sanitizers-{configure,build,test}.log.
#
# Exit status: 0 when every preset built and passed every test it ran.
# Not run by .ci/run: on 2 cores each sanitizer build costs as much as the main one.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

which="${1:-all}"
[ $# -gt 0 ] && shift
case "$which" in
  asan | tsan) presets=("$which") ;;
  all) presets=(asan tsan) ;;
  *)
    echo "usage: $0 [asan|tsan|all] [ctest arguments...]" >&2
    exit 2
    ;;
esac

scripts/install-deps.sh || exit 1

summaries=()
status=0
for p in "${presets[@]}"; do
  dir="build-$p"
  mkdir -p "$dir"
  t0=$(date +%s)
  echo "== $p: configure and build ($dir/sanitizers-build.log)"
  if ! cmake --preset "$p" >"$dir/sanitizers-configure.log" 2>&1; then
    tail -20 "$dir/sanitizers-configure.log"
    summaries+=("$p: CONFIGURE FAILED after $(($(date +%s) - t0)) s (see $dir/sanitizers-configure.log)")
    status=1
    continue
  fi
  if ! nice -n 10 cmake --build --preset "$p" >"$dir/sanitizers-build.log" 2>&1; then
    grep -E -m 20 "error|FAILED" "$dir/sanitizers-build.log"
    summaries+=("$p: BUILD FAILED after $(($(date +%s) - t0)) s (see $dir/sanitizers-build.log)")
    status=1
    continue
  fi
  t1=$(date +%s)
  echo "== $p: ctest --preset $p $* ($dir/sanitizers-test.log)"
  ctest --preset "$p" "$@" 2>&1 | tee "$dir/sanitizers-test.log"
  rc=${PIPESTATUS[0]}
  t2=$(date +%s)
  log="$dir/sanitizers-test.log"
  # ctest's own count line: "100% tests passed, 0 tests failed out of 226".
  line=$(grep -E '^[0-9]+% tests passed, [0-9]+ tests failed out of [0-9]+' "$log" | tail -1)
  if [ -z "$line" ]; then
    summaries+=("$p: NO TEST RESULT (ctest exit $rc; see $log), build $((t1 - t0)) s")
    status=1
    continue
  fi
  failed=$(sed -E 's/.* ([0-9]+) tests failed out of ([0-9]+).*/\1/' <<<"$line")
  total=$(sed -E 's/.* tests failed out of ([0-9]+).*/\1/' <<<"$line")
  # Skipped tests count as not failed in ctest's line; ctest lists them as "(Skipped)".
  skipped=$(grep -cE '^[[:space:]]*[0-9]+ - .* \(Skipped\)$' "$log")
  passed=$((total - failed - skipped))
  verdict=PASS
  if [ "$failed" -ne 0 ] || [ "$rc" -ne 0 ]; then
    verdict=FAIL
    status=1
  fi
  summaries+=("$p: $verdict: $passed passed, $failed failed, $skipped skipped of $total tests; build $((t1 - t0)) s, tests $((t2 - t1)) s")
done

echo
for s in "${summaries[@]}"; do echo "$s"; done
exit $status

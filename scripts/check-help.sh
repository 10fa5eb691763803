#!/usr/bin/env bash
# scripts/check-help.sh BIN_DIR — every program in BIN_DIR answers --help with
# its usage on stdout and exit status 0, within 5 s, and runs nothing (no
# daemon, no benchmark: a program that starts work takes longer than that or
# prints no usage). ctest `help` runs it on build/bin.
set -u
dir=${1:?usage: check-help.sh BIN_DIR}
fail=0
n=0
for bin in "$dir"/*; do
  [[ -f $bin && -x $bin ]] || continue
  n=$((n + 1))
  out=$(timeout 5 "$bin" --help 2>/dev/null)
  rc=$?
  if [[ $rc -ne 0 ]]; then
    echo "FAIL: $(basename "$bin") --help exited $rc"
    fail=1
  elif ! grep -qi 'usage' <<<"$out"; then
    echo "FAIL: $(basename "$bin") --help printed no usage on stdout"
    fail=1
  fi
done
if [[ $n -eq 0 ]]; then
  echo "FAIL: no programs in $dir"
  exit 1
fi
[[ $fail -eq 0 ]] && echo "OK: $n programs answer --help"
exit "$fail"

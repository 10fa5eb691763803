#!/usr/bin/env bash
# expect.sh <want-exit-status|nonzero> <regex> -- cmd args...
# Runs cmd, requires its exit status and that stdout+stderr match the regex.
set -u
want="$1"; regex="$2"; shift 3
out=$("$@" 2>&1); rc=$?
echo "$out"
if [ "$want" = nonzero ]; then
  [ "$rc" -ne 0 ] || { echo "expect.sh: wanted a non-zero exit status, got 0"; exit 1; }
else
  [ "$rc" -eq "$want" ] || { echo "expect.sh: wanted exit status $want, got $rc"; exit 1; }
fi
grep -Eq -- "$regex" <<<"$out" || { echo "expect.sh: output does not match /$regex/"; exit 1; }
exit 0

#!/usr/bin/env bash
# The shell scripts' lint (ctest `shellcheck`, label lint; CI runs it through
# scripts/test.sh): shellcheck on every *.sh of the tree and on .ci/run. A
# finding fails; a check that must not apply to one line is disabled there
# with a comment that says why. Exit 77 (ctest: Skipped) when shellcheck is
# not installed (scripts/install-deps.sh installs it).
#
#   scripts/shellcheck.sh [SOURCE_DIR]      (default: this checkout)
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"
if ! command -v shellcheck >/dev/null; then
  echo "SKIP: shellcheck is not installed (apt-get install shellcheck)"
  exit 77
fi
files=()
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  # Tracked files and new ones git does not ignore.
  while IFS= read -r f; do [ -f "$f" ] && files+=("$f"); done \
    < <(git ls-files --cached --others --exclude-standard -- '*.sh' .ci/run)
else
  while IFS= read -r f; do files+=("$f"); done \
    < <(find . -path './build*' -prune -o -name '*.sh' -type f -print; echo .ci/run)
fi
shellcheck --version | sed -n 2p
shellcheck -f gcc "${files[@]}"
echo "shellcheck: ${#files[@]} scripts clean"

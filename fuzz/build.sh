#!/usr/bin/env bash
# Builds the protocol fuzz target with clang + libFuzzer + ASan/UBSan into
# ${OUT:-/tmp/kvmesh-fuzz}. Not part of CI. Run:
#   fuzz/build.sh && /tmp/kvmesh-fuzz/fuzz_protocol -max_total_time=60 /tmp/kvmesh-fuzz/corpus
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/kvmesh-fuzz}"
mkdir -p "$out/corpus"
clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -I include -I . \
  fuzz/fuzz_protocol.cc transport/protocol.cc common/status.cc -lxxhash -o "$out/fuzz_protocol"
echo "built $out/fuzz_protocol"

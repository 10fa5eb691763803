#!/usr/bin/env bash
# Builds the libFuzzer targets (clang + libFuzzer + ASan/UBSan) in build-fuzz/
# through the KVMESH_BUILD_FUZZ option: only the fuzz targets, each compiled
# from the sources of the parsers it fuzzes. Run one, e.g.:
#   fuzz/build.sh && build-fuzz/bin/fuzz_protocol -max_total_time=60 /tmp/kvmesh-fuzz-corpus fuzz/corpus/protocol
# or all of them as CI does (bounded, from the seed corpora): scripts/fuzz.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang \
  -DKVMESH_BUILD_FUZZ=ON -DKVMESH_BUILD_TESTS=OFF -DKVMESH_BUILD_BENCH=OFF -DKVMESH_WITH_CUDA=OFF \
  -DKVMESH_WITH_UCX=OFF -DKVMESH_WITH_MPI=OFF "$@" >/dev/null
cmake --build build-fuzz -j2 --target fuzz_all
echo "built build-fuzz/bin/fuzz_{protocol,resp,coordinator,config,block}"

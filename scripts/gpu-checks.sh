#!/usr/bin/env bash
# scripts/gpu-checks.sh — every GPU check of kvmesh in one run, for a machine
# with an NVIDIA GPU and only the CUDA toolkit, CMake and a C++20 compiler (no
# Debian libraries needed): builds kernels/cuda (the codecs) and
# coordinator/decode/cuda (the reference model) as top-level projects, then
#   gpu_codec_test   CUDA codecs vs the CPU, byte for byte
#   gpu_model_test   the reference model on the GPU vs the CPU reference
#   gpu_codec_bench  codec GB/s vs cudaMemcpy device-to-device (--json)
#   gpu_model_bench  reference model tokens/s, GPU vs CPU (--json)
# Results (logs and JSON) go to $OUT (default build-cuda/out). Exit status: the
# first failing test's, after every step has run.
#
#   scripts/gpu-checks.sh [--arch 90]
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
arch=90
while [[ $# -gt 0 ]]; do
  case "$1" in
    --arch) arch="$2"; shift 2 ;;
    *) echo "gpu-checks: unknown argument $1" >&2; exit 2 ;;
  esac
done
out="${OUT:-build-cuda/out}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$out/gpu.txt"
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
set -x
for part in kernels/cuda:kernels coordinator/decode/cuda:decode; do
  src="${part%%:*}" bin="build-cuda/${part##*:}"
  cmake -S "$src" -B "$bin" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$nvcc" \
    -DCMAKE_CUDA_ARCHITECTURES="$arch" >"$out/configure-${part##*:}.log" 2>&1 || { tail -30 "$out/configure-${part##*:}.log"; exit 1; }
  cmake --build "$bin" -j"$(nproc)" >"$out/build-${part##*:}.log" 2>&1 || { tail -40 "$out/build-${part##*:}.log"; exit 1; }
done
set +x
rc=0
step() {  # step NAME CMD...: runs, logs to $out/NAME.log, keeps the first failure
  local name="$1"; shift
  echo "== $name: $*"
  "$@" 2>&1 | tee "$out/$name.log"
  local r=${PIPESTATUS[0]}
  echo "== $name: exit $r"
  [[ $r -ne 0 && $rc -eq 0 ]] && rc=$r
  return 0
}
step codec_test build-cuda/kernels/gpu_codec_test
step model_test build-cuda/decode/gpu_model_test
step codec_bench build-cuda/kernels/gpu_codec_bench --json
step model_bench build-cuda/decode/gpu_model_bench --json
echo "gpu-checks: done, exit $rc (logs in $out)"
exit "$rc"

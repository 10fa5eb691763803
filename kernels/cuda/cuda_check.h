// kernels/cuda/cuda_check.h — CUDA_OK(expr) for the GPU check programs
// (gpu_*_test, gpu_*_bench): a failing CUDA runtime call prints file:line,
// the expression and CUDA's message, and exits 2 (a broken device, not a
// mismatch). Library code returns Status instead (cuda_status.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CUDA_OK(x)                                                                              \
  do {                                                                                          \
    cudaError_t e_ = (x);                                                                       \
    if (e_ != cudaSuccess) {                                                                    \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(2);                                                                             \
    }                                                                                           \
  } while (0)

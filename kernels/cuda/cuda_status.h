// kernels/cuda/cuda_status.h — a CUDA runtime error as a kvmesh Status, with
// file:line and the failing expression. Needs only the CUDA runtime, so the
// code built on a bare GPU machine uses it too (transport/nccl_status.h adds
// the NCCL twin).
//
//   KVMESH_CUDA_RETURN(cudaMalloc(&p, n));   // returns Unavailable("file:line: cudaMalloc(&p, n): ...")
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "kvmesh/status.h"

#define KVMESH_CUDA_RETURN(expr)                                                                       \
  do {                                                                                                 \
    cudaError_t e_ = (expr);                                                                           \
    if (e_ != cudaSuccess)                                                                             \
      return ::kvmesh::Unavailable(std::string(__FILE__) + ":" + std::to_string(__LINE__) + ": " #expr \
                                   ": " + cudaGetErrorString(e_));                                     \
  } while (0)

// transport/nccl_status.h — CUDA and NCCL error codes as kvmesh Status, with
// file:line and the failing expression, for the files built with CUDA + NCCL
// (transport/nccl_mover.cc, coordinator/decode/comm_nccl.cc).
//
//   KVMESH_CUDA_RETURN(cudaMalloc(&p, n));   // returns Unavailable("file:line: cudaMalloc(&p, n): ...")
//   KVMESH_NCCL_RETURN(ncclGroupEnd());
#pragma once

#include <nccl.h>

#include <string>

#include "kernels/cuda/cuda_status.h"  // KVMESH_CUDA_RETURN
#include "kvmesh/status.h"

#define KVMESH_NCCL_RETURN(expr)                                                                       \
  do {                                                                                                 \
    ncclResult_t r_ = (expr);                                                                          \
    if (r_ != ncclSuccess)                                                                             \
      return ::kvmesh::Unavailable(std::string(__FILE__) + ":" + std::to_string(__LINE__) + ": " #expr \
                                   ": " + ncclGetErrorString(r_));                                     \
  } while (0)

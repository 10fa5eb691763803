// shard_node/cuda_memory.h — GPU memory for the tiers: a device pool
// (cudaMalloc once at start-up) for the primary tier and pinned host memory
// (cudaHostAlloc) for the host tier, so device <-> host copies can use DMA.
//
// Built with CUDA (KVMESH_HAVE_CUDA); without it, or without a usable GPU,
// both return Unavailable and the node falls back to plain host memory.
// Only the CUDA runtime is linked (never libcuda), so a binary built with
// CUDA still starts on a machine without a driver.
#pragma once

#include <memory>

#include "kvmesh/status.h"
#include "shard_node/memory_backend.h"

namespace kvmesh {

// A device pool of `bytes` on CUDA device `gpu`. Not host-accessible: the
// store copies with cudaMemcpy and skips CPU checksum verification of reads.
Result<std::unique_ptr<MemoryBackend>> MakeCudaDeviceMemory(size_t bytes, int gpu);
// Pinned (page-locked) host memory of `bytes`; host-accessible.
Result<std::unique_ptr<MemoryBackend>> MakePinnedHostMemory(size_t bytes);

}  // namespace kvmesh

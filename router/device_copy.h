// router/device_copy.h — copies between CUDA device memory and host memory
// for the router's device-memory bounce path (Router::RegisterMemory with
// MemoryKind::kDevice). Built from device_copy_cuda.cc with CUDA, else from
// device_copy_none.cc, whose calls answer Unimplemented.
//
// Thread-safety: safe from any thread (synchronous copies on the default stream).
#pragma once

#include <cstddef>

#include "kvmesh/status.h"

namespace kvmesh {

// True when this build can copy device memory (it has CUDA).
bool DeviceCopyAvailable();
// Synchronous cudaMemcpy; errors carry CUDA's message.
Status CopyToDevice(void* device_dst, const void* host_src, size_t n);
Status CopyFromDevice(void* host_dst, const void* device_src, size_t n);

}  // namespace kvmesh

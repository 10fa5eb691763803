// Built without CUDA: no GPU memory; callers fall back to host memory.
#include "shard_node/cuda_memory.h"

namespace kvmesh {

Result<std::unique_ptr<MemoryBackend>> MakeCudaDeviceMemory(size_t, int) {
  return Unavailable("kvmesh was built without CUDA");
}
Result<std::unique_ptr<MemoryBackend>> MakePinnedHostMemory(size_t) {
  return Unavailable("kvmesh was built without CUDA");
}

}  // namespace kvmesh

// CUDA runtime backends (compiled only with KVMESH_HAVE_CUDA).
#include "shard_node/cuda_memory.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <string>

namespace kvmesh {
namespace {

Status CudaStatus(const char* what, cudaError_t e, const char* file, int line) {
  return Unavailable(std::string(what) + ": " + cudaGetErrorString(e) + " (" + file + ":" + std::to_string(line) + ")");
}
#define KVMESH_CUDA_RETURN(what, expr)                                             \
  do {                                                                             \
    cudaError_t kvmesh_cuda_e_ = (expr);                                           \
    if (kvmesh_cuda_e_ != cudaSuccess) return CudaStatus(what, kvmesh_cuda_e_, __FILE__, __LINE__); \
  } while (0)

class CudaDeviceMemory final : public MemoryBackend {
 public:
  CudaDeviceMemory(std::byte* base, size_t size, int gpu) : base_(base), size_(size), gpu_(gpu) {}
  ~CudaDeviceMemory() override {
    cudaSetDevice(gpu_);
    cudaFree(base_);
  }
  std::string_view name() const override { return "cuda-device"; }
  bool host_accessible() const override { return false; }
  std::byte* base() const override { return base_; }
  size_t size() const override { return size_; }
  // Synchronous copies: the store calls them outside its locks, one block at a time.
  void CopyIn(std::byte* dst, const std::byte* src, size_t n) override {
    cudaSetDevice(gpu_);
    cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice);
  }
  void CopyOut(std::byte* dst, const std::byte* src, size_t n) override {
    cudaSetDevice(gpu_);
    cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost);
  }

 private:
  std::byte* base_;
  size_t size_;
  int gpu_;
};

class PinnedHostMemory final : public MemoryBackend {
 public:
  PinnedHostMemory(std::byte* base, size_t size) : base_(base), size_(size) {}
  ~PinnedHostMemory() override { cudaFreeHost(base_); }
  std::string_view name() const override { return "cuda-pinned-host"; }
  bool host_accessible() const override { return true; }
  std::byte* base() const override { return base_; }
  size_t size() const override { return size_; }
  void CopyIn(std::byte* dst, const std::byte* src, size_t n) override { std::memcpy(dst, src, n); }
  void CopyOut(std::byte* dst, const std::byte* src, size_t n) override { std::memcpy(dst, src, n); }

 private:
  std::byte* base_;
  size_t size_;
};

Status RequireGpu(int gpu) {
  int n = 0;  // cudaGetDeviceCount leaves it unwritten when there is no driver
  if (cudaGetDeviceCount(&n) != cudaSuccess || n <= 0) return Unavailable("no CUDA device");
  if (gpu < 0 || gpu >= n) return InvalidArgument("CUDA device " + std::to_string(gpu) + " does not exist (" +
                                                  std::to_string(n) + " present)");
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<MemoryBackend>> MakeCudaDeviceMemory(size_t bytes, int gpu) {
  if (bytes == 0) return InvalidArgument("device memory budget must be > 0");
  KVMESH_RETURN_IF_ERROR(RequireGpu(gpu));
  KVMESH_CUDA_RETURN("cudaSetDevice", cudaSetDevice(gpu));
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess)
    return ResourceExhausted("cannot allocate " + std::to_string(bytes) + " bytes on CUDA device " +
                             std::to_string(gpu) + ": " + cudaGetErrorString(e));
  return std::unique_ptr<MemoryBackend>(new CudaDeviceMemory(static_cast<std::byte*>(p), bytes, gpu));
}

Result<std::unique_ptr<MemoryBackend>> MakePinnedHostMemory(size_t bytes) {
  if (bytes == 0) return InvalidArgument("host memory budget must be > 0");
  KVMESH_RETURN_IF_ERROR(RequireGpu(0));
  void* p = nullptr;
  cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
  if (e != cudaSuccess)
    return ResourceExhausted("cannot pin " + std::to_string(bytes) + " bytes of host memory: " + cudaGetErrorString(e));
  return std::unique_ptr<MemoryBackend>(new PinnedHostMemory(static_cast<std::byte*>(p), bytes));
}

}  // namespace kvmesh

// router/device_copy.h with CUDA: synchronous cudaMemcpy (cudart only).
#include "router/device_copy.h"

#include <cuda_runtime.h>

#include <string>

namespace kvmesh {
namespace {
Status Cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  return Internal(std::string(what) + ": " + cudaGetErrorString(e));
}
}  // namespace

bool DeviceCopyAvailable() {
  int n = 0;  // cudaGetDeviceCount leaves it unwritten when there is no driver
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}
Status CopyToDevice(void* dst, const void* src, size_t n) {
  return Cuda(cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice), "cudaMemcpy host to device");
}
Status CopyFromDevice(void* dst, const void* src, size_t n) {
  return Cuda(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost), "cudaMemcpy device to host");
}

}  // namespace kvmesh

// coordinator/decode/cuda/model_cuda_none.cc — CudaReferenceModel in a build
// without CUDA: nothing can be created, so the members are never reached.
#include "coordinator/decode/cuda/model_cuda.h"

namespace kvmesh::decode {

struct CudaReferenceModel::Impl {};

Status CudaDeviceStatus() { return Unavailable("kvmesh was built without CUDA"); }

Result<std::unique_ptr<CudaReferenceModel>> CudaReferenceModel::Create(std::shared_ptr<const Weights>, uint32_t) {
  return CudaDeviceStatus();
}

CudaReferenceModel::CudaReferenceModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaReferenceModel::~CudaReferenceModel() = default;
Result<int> CudaReferenceModel::NewSequence() { return CudaDeviceStatus(); }
Result<int> CudaReferenceModel::Fork(int) { return CudaDeviceStatus(); }
Status CudaReferenceModel::Truncate(int, uint32_t) { return CudaDeviceStatus(); }
Status CudaReferenceModel::Release(int) { return CudaDeviceStatus(); }
uint32_t CudaReferenceModel::Length(int) const { return 0; }
Result<std::vector<float>> CudaReferenceModel::Feed(int, std::span<const TokenId>) { return CudaDeviceStatus(); }

}  // namespace kvmesh::decode

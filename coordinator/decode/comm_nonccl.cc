// Stand-ins when kvmesh is built without CUDA + NCCL.
#include "coordinator/decode/comm_tcp.h"

namespace kvmesh::decode {

bool HaveNccl() { return false; }

Result<std::unique_ptr<StepComm>> MakeNcclComm(const TcpCommOptions&, int) {
  return Unimplemented("this kvmesh was built without CUDA + NCCL (KVMESH_WITH_CUDA)");
}

int CudaDeviceCount() { return 0; }

}  // namespace kvmesh::decode

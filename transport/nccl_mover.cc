#include "transport/nccl_mover.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <string>

#include "transport/nccl_status.h"

namespace kvmesh {
namespace {

static_assert(sizeof(ncclUniqueId) == sizeof(NcclId), "NCCL unique id size");

struct CommDeleter {
  void operator()(ncclComm* c) const { ncclCommDestroy(c); }
};
struct StreamDeleter {
  void operator()(CUstream_st* s) const { cudaStreamDestroy(s); }
};

class Mover final : public NcclBlockMover {
 public:
  Mover(int rank, int nranks) : rank_(rank), nranks_(nranks) {}

  Status Init(const NcclId& id, int device) {
    KVMESH_CUDA_RETURN(cudaSetDevice(device));
    cudaStream_t s = nullptr;
    KVMESH_CUDA_RETURN(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    stream_.reset(s);
    ncclUniqueId uid;
    std::memcpy(&uid, id.data(), sizeof(uid));
    ncclComm_t c = nullptr;
    KVMESH_NCCL_RETURN(ncclCommInitRank(&c, nranks_, uid, rank_));
    comm_.reset(c);
    return Status::Ok();
  }

  int rank() const override { return rank_; }
  int nranks() const override { return nranks_; }

  Status Exchange(std::span<const BlockTransfer> sends, std::span<const BlockTransfer> recvs) override {
    for (const auto& t : sends)
      if (t.peer < 0 || t.peer >= nranks_) return InvalidArgument("send to a rank outside the communicator");
    for (const auto& t : recvs)
      if (t.peer < 0 || t.peer >= nranks_) return InvalidArgument("receive from a rank outside the communicator");
    KVMESH_NCCL_RETURN(ncclGroupStart());
    for (const auto& t : sends) {
      ncclResult_t r = ncclSend(t.data, t.bytes, ncclUint8, t.peer, comm_.get(), stream_.get());
      if (r != ncclSuccess) {
        ncclGroupEnd();
        return Unavailable(std::string("ncclSend: ") + ncclGetErrorString(r));
      }
    }
    for (const auto& t : recvs) {
      ncclResult_t r = ncclRecv(t.data, t.bytes, ncclUint8, t.peer, comm_.get(), stream_.get());
      if (r != ncclSuccess) {
        ncclGroupEnd();
        return Unavailable(std::string("ncclRecv: ") + ncclGetErrorString(r));
      }
    }
    KVMESH_NCCL_RETURN(ncclGroupEnd());
    KVMESH_CUDA_RETURN(cudaStreamSynchronize(stream_.get()));
    return Status::Ok();
  }

 private:
  int rank_, nranks_;
  std::unique_ptr<CUstream_st, StreamDeleter> stream_;
  std::unique_ptr<ncclComm, CommDeleter> comm_;  // destroyed before the stream
};

}  // namespace

bool CudaDeviceAvailable() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

Result<NcclId> NcclBlockMover::NewUniqueId() {
  ncclUniqueId uid;
  KVMESH_NCCL_RETURN(ncclGetUniqueId(&uid));
  NcclId id;
  std::memcpy(id.data(), &uid, sizeof(uid));
  return id;
}

Result<std::unique_ptr<NcclBlockMover>> NcclBlockMover::Create(const NcclId& id, int rank, int nranks, int device) {
  if (nranks <= 0 || rank < 0 || rank >= nranks) return InvalidArgument("bad NCCL rank/size");
  if (!CudaDeviceAvailable()) return Unavailable("no CUDA device: the NCCL block mover needs GPUs");
  auto m = std::make_unique<Mover>(rank, nranks);
  KVMESH_RETURN_IF_ERROR(m->Init(id, device));
  return std::unique_ptr<NcclBlockMover>(std::move(m));
}

}  // namespace kvmesh

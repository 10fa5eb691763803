// transport/nccl_mover.h — moves GPU-resident blocks between GPU nodes with
// NCCL (rebalancing after a membership change, replication) (docs/architecture.md, "Transports").
//
// One communicator per mover, created at bootstrap from the NCCL unique id
// that `kvmesh serve` broadcasts over MPI (rank 0 calls NewUniqueId()). A
// transfer batch is one ncclGroupStart/End holding every ncclSend/ncclRecv of
// the batch, on the mover's stream; Exchange() returns when the stream is done.
// Built only with CUDA + NCCL (KVMESH_HAVE_NCCL); it runs only where GPUs are.
//
// Thread-safety: not thread-safe; one mover per node thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "kvmesh/status.h"

namespace kvmesh {

using NcclId = std::array<std::byte, 128>;  // ncclUniqueId bytes (NCCL_UNIQUE_ID_BYTES)

// One block to send to or receive from a peer rank. `data` is device memory.
struct BlockTransfer {
  int peer = 0;
  std::byte* data = nullptr;
  size_t bytes = 0;
};

class NcclBlockMover {
 public:
  // Rank 0 makes the id; every rank receives it (MPI_Bcast in `kvmesh serve`).
  static Result<NcclId> NewUniqueId();
  // Joins the communicator of `nranks` ranks on CUDA device `device`.
  static Result<std::unique_ptr<NcclBlockMover>> Create(const NcclId& id, int rank, int nranks, int device);
  virtual ~NcclBlockMover() = default;
  virtual int rank() const = 0;
  virtual int nranks() const = 0;
  // Sends and receives every listed block in one NCCL group; waits for completion.
  virtual Status Exchange(std::span<const BlockTransfer> sends, std::span<const BlockTransfer> recvs) = 0;
};

// True when a CUDA device is usable here.
bool CudaDeviceAvailable();

}  // namespace kvmesh

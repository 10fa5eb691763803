// coordinator/decode/step_comm.h — the collectives a model-parallel decode
// step needs between its ranks: reduce the ranks' partial outputs,
// broadcast the driver's sampled tokens, agree on a prefix length.
//
// Backends: threads in one process (tests, the embedded demo), MPI
// collectives under mpirun, and, for ranks that are separate processes
// started without mpirun, TCP or NCCL (comm_tcp.h). Every rank calls the
// same collectives in the same order (SPMD). An all-reduce returns when every
// rank's data is in, so it also synchronises; Broadcast may return at the root
// before the others have joined (as MPI_Bcast may); Barrier synchronises.
//
// Thread-safety: one StepComm per rank, used by that rank's thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvmesh/status.h"

namespace kvmesh::decode {

class StepComm {
 public:
  virtual ~StepComm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string_view backend() const = 0;

  // data := elementwise sum over ranks, on every rank. The sum runs in rank
  // order on the thread and TCP backends (bitwise equal results); MPI and
  // NCCL choose their own order (fp32 tolerance).
  virtual Status AllReduceSum(std::span<float> data) = 0;
  // data := elementwise min (sum) over ranks, on every rank.
  virtual Status AllReduceMin(std::span<uint64_t> data) = 0;
  virtual Status AllReduceSumU64(std::span<uint64_t> data) = 0;
  // data := root's data, on every rank (same size everywhere).
  virtual Status Broadcast(std::span<std::byte> data, int root) = 0;
  virtual Status Barrier() = 0;
};

// n communicators joined to each other, for n threads of one process.
std::vector<std::unique_ptr<StepComm>> MakeThreadComms(int n);

// Whether this build has the MPI backend.
bool HaveMpi();
// MPI_COMM_WORLD (MPI_Init_thread must have run: see MpiSession).
// Unimplemented without MPI.
Result<std::unique_ptr<StepComm>> MakeMpiComm();

// RAII MPI_Init_thread / MPI_Finalize for a process run under mpirun.
class MpiSession {
 public:
  static Result<std::unique_ptr<MpiSession>> Init(int* argc, char*** argv);
  ~MpiSession();
  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  MpiSession() = default;
  int rank_ = 0, size_ = 1;
};

}  // namespace kvmesh::decode

// StepComm over MPI collectives (mpirun). Built only with KVMESH_HAVE_MPI;
// comm_nompi.cc stands in otherwise.
#include <mpi.h>

#include "coordinator/decode/step_comm.h"

namespace kvmesh::decode {
namespace {

// Converts an MPI return code into a Status, with the call site.
#define KVMESH_MPI_CHECK(call)                                                               \
  do {                                                                                       \
    int kvmesh_mpi_rc_ = (call);                                                             \
    if (kvmesh_mpi_rc_ != MPI_SUCCESS) {                                                     \
      char kvmesh_mpi_msg_[MPI_MAX_ERROR_STRING];                                            \
      int kvmesh_mpi_len_ = 0;                                                               \
      MPI_Error_string(kvmesh_mpi_rc_, kvmesh_mpi_msg_, &kvmesh_mpi_len_);                   \
      return Internal(std::string(#call " failed at " __FILE__ ":") + std::to_string(__LINE__) + \
                      ": " + std::string(kvmesh_mpi_msg_, kvmesh_mpi_len_));                 \
    }                                                                                        \
  } while (0)

class MpiComm final : public StepComm {
 public:
  MpiComm() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "mpi"; }

  Status AllReduceSum(std::span<float> data) override {
    KVMESH_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data.data(), static_cast<int>(data.size()), MPI_FLOAT, MPI_SUM,
                                   MPI_COMM_WORLD));
    return Status::Ok();
  }
  Status AllReduceMin(std::span<uint64_t> data) override {
    KVMESH_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data.data(), static_cast<int>(data.size()), MPI_UINT64_T, MPI_MIN,
                                   MPI_COMM_WORLD));
    return Status::Ok();
  }
  Status AllReduceSumU64(std::span<uint64_t> data) override {
    KVMESH_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data.data(), static_cast<int>(data.size()), MPI_UINT64_T, MPI_SUM,
                                   MPI_COMM_WORLD));
    return Status::Ok();
  }
  Status Broadcast(std::span<std::byte> data, int root) override {
    KVMESH_MPI_CHECK(MPI_Bcast(data.data(), static_cast<int>(data.size()), MPI_BYTE, root, MPI_COMM_WORLD));
    return Status::Ok();
  }
  Status Barrier() override {
    KVMESH_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    return Status::Ok();
  }

 private:
  int rank_ = 0, size_ = 1;
};

}  // namespace

bool HaveMpi() { return true; }

Result<std::unique_ptr<StepComm>> MakeMpiComm() {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) return FailedPrecondition("MPI is not initialised (create an MpiSession first)");
  return std::unique_ptr<StepComm>(new MpiComm());
}

Result<std::unique_ptr<MpiSession>> MpiSession::Init(int* argc, char*** argv) {
  int provided = 0;
  KVMESH_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
  std::unique_ptr<MpiSession> s(new MpiSession());
  MPI_Comm_rank(MPI_COMM_WORLD, &s->rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &s->size_);
  return s;
}

MpiSession::~MpiSession() { MPI_Finalize(); }

}  // namespace kvmesh::decode

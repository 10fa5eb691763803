// StepComm over NCCL, one CUDA device per rank (built only with CUDA + NCCL;
// comm_nonccl.cc stands in otherwise). The decode engine keeps its tensors in
// host memory, so each collective stages the host span into a device buffer,
// runs ncclAllReduce / ncclBroadcast on the comm's stream and copies back.
// The NCCL unique id travels over a TCP step comm (same rendezvous), which
// also stays as the control channel for Barrier.
//
// No collective hangs: completion is polled with cudaStreamQuery against the
// step timeout while ncclCommGetAsyncError is checked; on error or timeout
// the communicator is aborted (ncclCommAbort) and the error sticks.
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "coordinator/decode/comm_tcp.h"
#include "transport/nccl_status.h"

namespace kvmesh::decode {
namespace {

using Clock = std::chrono::steady_clock;

struct StreamDeleter {
  void operator()(CUstream_st* s) const { cudaStreamDestroy(s); }
};
struct DeviceFree {
  void operator()(void* p) const { cudaFree(p); }
};

class NcclComm final : public StepComm {
 public:
  NcclComm(std::unique_ptr<StepComm> tcp, int device, std::chrono::milliseconds step_timeout)
      : tcp_(std::move(tcp)), device_(device), step_timeout_(step_timeout) {}
  ~NcclComm() override {
    if (comm_ != nullptr) {
      cudaSetDevice(device_);
      if (aborted_) ncclCommAbort(comm_);
      else ncclCommDestroy(comm_);
    }
  }

  Status Init() {
    KVMESH_CUDA_RETURN(cudaSetDevice(device_));
    cudaStream_t s = nullptr;
    KVMESH_CUDA_RETURN(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    stream_.reset(s);
    ncclUniqueId id;
    if (tcp_->rank() == 0) KVMESH_NCCL_RETURN(ncclGetUniqueId(&id));
    KVMESH_RETURN_IF_ERROR(tcp_->Broadcast(std::as_writable_bytes(std::span(&id, 1)), 0));
    KVMESH_NCCL_RETURN(ncclCommInitRank(&comm_, tcp_->size(), id, tcp_->rank()));
    return Status::Ok();
  }

  int rank() const override { return tcp_->rank(); }
  int size() const override { return tcp_->size(); }
  std::string_view backend() const override { return "nccl"; }

  Status AllReduceSum(std::span<float> data) override {
    return Reduce(std::as_writable_bytes(data), data.size(), ncclFloat32, ncclSum);
  }
  Status AllReduceMin(std::span<uint64_t> data) override {
    return Reduce(std::as_writable_bytes(data), data.size(), ncclUint64, ncclMin);
  }
  Status AllReduceSumU64(std::span<uint64_t> data) override {
    return Reduce(std::as_writable_bytes(data), data.size(), ncclUint64, ncclSum);
  }
  Status Broadcast(std::span<std::byte> data, int root) override {
    if (root < 0 || root >= size()) return InvalidArgument("Broadcast root out of range");
    KVMESH_RETURN_IF_ERROR(broken_);
    if (data.empty() || size() == 1) return Status::Ok();
    KVMESH_RETURN_IF_ERROR(Stage(data));
    KVMESH_RETURN_IF_ERROR(Check(Nccl(ncclBroadcast(dev_.get(), dev_.get(), data.size(), ncclUint8, root, comm_,
                                                    stream_.get()))));
    return Unstage(data);
  }
  Status Barrier() override {
    KVMESH_RETURN_IF_ERROR(broken_);
    return Check(tcp_->Barrier());
  }

 private:
  Status Reduce(std::span<std::byte> bytes, size_t count, ncclDataType_t type, ncclRedOp_t op) {
    KVMESH_RETURN_IF_ERROR(broken_);
    if (bytes.empty() || size() == 1) return Status::Ok();
    KVMESH_RETURN_IF_ERROR(Stage(bytes));
    KVMESH_RETURN_IF_ERROR(
        Check(Nccl(ncclAllReduce(dev_.get(), dev_.get(), count, type, op, comm_, stream_.get()))));
    return Unstage(bytes);
  }

  static Status Nccl(ncclResult_t r) {
    return r == ncclSuccess ? Status::Ok() : Unavailable(std::string("NCCL: ") + ncclGetErrorString(r));
  }

  // Host -> device buffer (grown as needed), on the stream.
  Status Stage(std::span<const std::byte> host) {
    KVMESH_CUDA_RETURN(cudaSetDevice(device_));
    if (host.size() > dev_bytes_) {
      void* p = nullptr;
      dev_.reset();
      dev_bytes_ = 0;
      KVMESH_CUDA_RETURN(cudaMalloc(&p, host.size()));
      dev_.reset(static_cast<std::byte*>(p));
      dev_bytes_ = host.size();
    }
    KVMESH_CUDA_RETURN(
        cudaMemcpyAsync(dev_.get(), host.data(), host.size(), cudaMemcpyHostToDevice, stream_.get()));
    return Status::Ok();
  }

  // Device -> host, then wait for the stream within the step timeout.
  Status Unstage(std::span<std::byte> host) {
    KVMESH_CUDA_RETURN(
        cudaMemcpyAsync(host.data(), dev_.get(), host.size(), cudaMemcpyDeviceToHost, stream_.get()));
    return Check(Wait());
  }

  Status Wait() {
    const auto deadline = Clock::now() + step_timeout_;
    for (;;) {
      cudaError_t e = cudaStreamQuery(stream_.get());
      if (e == cudaSuccess) return Status::Ok();
      if (e != cudaErrorNotReady) return Unavailable(std::string("CUDA stream: ") + cudaGetErrorString(e));
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess) return Unavailable(std::string("NCCL (async): ") + ncclGetErrorString(async));
      if (Clock::now() >= deadline) return DeadlineExceeded("NCCL collective did not finish within the step timeout");
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  Status Check(Status s) {
    if (s.ok()) return s;
    broken_ = s.WithContext("nccl step comm, rank " + std::to_string(rank()));
    aborted_ = true;  // the destructor aborts the communicator instead of waiting on peers
    return broken_;
  }

  std::unique_ptr<StepComm> tcp_;
  int device_;
  std::chrono::milliseconds step_timeout_;
  ncclComm_t comm_ = nullptr;
  std::unique_ptr<CUstream_st, StreamDeleter> stream_;
  std::unique_ptr<std::byte, DeviceFree> dev_;
  size_t dev_bytes_ = 0;
  bool aborted_ = false;
  Status broken_;
};

}  // namespace

bool HaveNccl() { return true; }

int CudaDeviceCount() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

Result<std::unique_ptr<StepComm>> MakeNcclComm(const TcpCommOptions& o, int device) {
  const int devices = CudaDeviceCount();
  if (devices == 0) return Unavailable("no CUDA device: the NCCL step comm needs one GPU per rank");
  if (device < 0 || device >= devices)
    return InvalidArgument("CUDA device " + std::to_string(device) + " out of [0, " + std::to_string(devices) + ")");
  KVMESH_ASSIGN_OR_RETURN(auto tcp, MakeTcpComm(o));
  auto c = std::make_unique<NcclComm>(std::move(tcp), device, o.step_timeout);
  KVMESH_RETURN_IF_ERROR(c->Init());
  return std::unique_ptr<StepComm>(std::move(c));
}

}  // namespace kvmesh::decode

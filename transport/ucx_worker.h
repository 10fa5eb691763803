// transport/ucx_worker.h — a UCP context + worker with RAII, for the UCX
// backend (docs/protocol.md: the kvmesh frames ride in UCX active messages:
// AM header = the 40-byte frame header, AM data = the frame body, so a
// receiver knows the request id and every length before accepting a
// rendezvous payload). UCX_TLS and the other UCX_* variables pass through
// (tcp and shared memory on one machine, RDMA where a cluster has it).
//
// UCX status codes become Status here (the edge), with file:line.
#pragma once

#include <ucp/api/ucp.h>

#include <memory>
#include <string>
#include <string_view>

#include "kvmesh/status.h"

namespace kvmesh {

inline constexpr unsigned kUcxAmRequest = 17;  // client -> node
inline constexpr unsigned kUcxAmReply = 18;    // node -> client

Status UcxStatus(ucs_status_t s, const char* what, const char* file, int line);
#define KVMESH_UCX_RETURN(expr)                                               \
  do {                                                                        \
    ucs_status_t s_ = (expr);                                                 \
    if (s_ != UCS_OK) return ::kvmesh::UcxStatus(s_, #expr, __FILE__, __LINE__); \
  } while (0)

class UcxWorker {
 public:
  // multi_thread: callers on several threads may post operations (UCS_THREAD_MODE_MULTI).
  static Result<std::unique_ptr<UcxWorker>> Create(bool multi_thread);
  ~UcxWorker();
  UcxWorker(const UcxWorker&) = delete;
  UcxWorker& operator=(const UcxWorker&) = delete;

  ucp_worker_h get() const { return worker_; }
  // The worker address (to give to peers), as bytes.
  const std::string& address() const { return address_; }
  // The wakeup fd: readable when there may be progress to make (after Arm()).
  int efd() const { return efd_; }
  // True when it is safe to sleep on efd(); false: progress again first.
  bool Arm();
  // Progresses until no more immediate work.
  void ProgressAll();

 private:
  UcxWorker() = default;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::string address_;
  int efd_ = -1;
};

std::string HexEncode(std::string_view bytes);
Result<std::string> HexDecode(std::string_view hex);

}  // namespace kvmesh

// shard_node/server/ucx_server.h — serves one ShardNode over UCX active
// messages with the kvmesh protocol (docs/protocol.md, "UCX"). The worker's
// wakeup fd is driven by an Asio loop, which spins briefly after activity
// (UcxServerOptions::progress) and otherwise sleeps on it; registered client
// memory is served one-sided (ucx_rma.h); requests arrive as
// AM (header = frame header, data = body; large bodies by rendezvous straight
// into a buffer sized from the checked header), answers go back with an iov
// gathered from pool memory on an endpoint the server creates to the client's
// worker (whose address the client's HELLO carries): one session per client
// nonce, closed when the client's endpoint fails or the client is gone, so a
// client vanishing with requests queued never leaves a dangling endpoint.
// Peers reach it by its worker address (address(), published through the
// coordinator and exchanged over MPI in `kvmesh serve`). With several workers
// (UcxServerOptions::workers) each is such a server of its own over the same
// node, and clients spread over them; they are workers of one UCP context,
// on which the node's pool is mapped once.
//
// Thread-safety: Start/Stop from one thread.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "kvmesh/status.h"
#include "transport/protocol.h"
#include "transport/ucx_worker.h"

namespace kvmesh {

class ShardNode;

struct UcxServerOptions {
  proto::ProtocolLimits limits;
  std::string token;  // the cluster secret a HELLO without a tenant name must carry (empty: none)
  // How the loop waits for work ($.transport.ucx): kAdaptive spins up to
  // spin_us (SpinBudget) while idle before sleeping on the worker's wakeup fd.
  UcxProgress progress = UcxProgress::kAdaptive;
  int64_t spin_us = 100;
  // Worker threads ($.transport.ucx.workers, resolved: >= 1). Each has its
  // own UCX worker, loop thread and client sessions; a client channel talks
  // to one of them (address() packs all their addresses).
  int workers = 1;
  // The longest a reply may hold pins on the pool blocks it sends from (a
  // GET answer goes straight from its slots): past it the client is taken to
  // have stopped reading and its session is closed, which ends the send.
  int64_t max_pinned_send_ms = 5000;
};

class UcxServer {
 public:
  static Result<std::unique_ptr<UcxServer>> Start(ShardNode* node, UcxServerOptions options,
                                                  const std::atomic<uint64_t>* epoch);
  virtual ~UcxServer() = default;
  // The worker address bytes (several workers: PackWorkerAddresses).
  virtual const std::string& address() const = 0;
  virtual uint64_t requests() const = 0;
  // Requests served by each worker.
  virtual std::vector<uint64_t> worker_requests() const = 0;
  // Payload bytes moved with one-sided puts and gets (GET_INTO, PUT_FROM).
  virtual uint64_t one_sided_bytes() const = 0;
  // Bytes of registered client regions of this host still to be warmed
  // (PageWarmer, ucx_rma.h): until 0, a GET into them may pay page-table fills.
  virtual uint64_t warm_pending_bytes() const = 0;
  virtual uint64_t warmed_bytes() const = 0;  // read so far
  // Data frames of `op` its FrameHandler admitted (FrameHandler::Admit), and
  // frames it refused as StaleEpoch, summed over the workers.
  virtual uint64_t admitted(proto::Opcode op) const = 0;
  virtual uint64_t stale_refused() const = 0;
  // Distinct mappings of the node's pool memory (ucp_mem_map) the server
  // holds: one per pool region, shared by every worker.
  virtual size_t pool_mappings() const = 0;
  virtual void Stop() = 0;
};

}  // namespace kvmesh

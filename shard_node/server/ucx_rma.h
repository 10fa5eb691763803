// shard_node/server/ucx_rma.h — the one-sided half of the node's UCX server
// (docs/protocol.md "Registered memory"): a client registers its memory once
// per session (MEM_REGISTER: the region and its packed remote key); then for
// GET_INTO the node writes each block straight from its pool into the
// client's memory (ucp_put_nbx), flushes, and answers with the records only;
// for PUT_FROM it reserves a chunk per block, reads the bytes straight from
// the client's memory into it (ucp_get_nbx), verifies each checksum once
// where the bytes landed and commits. The pool is mapped once per node
// (ucp_mem_map, MapPools), for all its workers, so UCX moves it without
// registering per request or per worker. No payload byte passes
// through an intermediate buffer, except for blocks stored encoded (decoded
// into a scratch buffer on GET_INTO) and for nodes that encode on put
// (staged, then ShardNode::Put). The frames reach it through the server's
// FrameHandler (admission, tenant scope, epoch): each session's
// UcxSessionMemory is its RemoteMemory capability.
//
// A client region on this host is written through this process's own
// mapping of the client's shared memory (UCX attaches it when the remote key
// unpacks). The first write to each of its 4 KiB pages through that mapping
// costs a page-table fill, on this VM 10-30 us a page (a hypervisor that
// shadows guest page tables), so the first GET_INTO into fresh pages ran
// 8-20x slower than the next (docs/serving.md "The slow first get").
// PageWarmer reads one byte of every page of such a region after
// MEM_REGISTER, off the loop thread, so that GETs no longer pay it.
//
// Thread-safety: everything runs on the UCX server's loop thread (UCX
// callbacks run inside its progress calls); not thread-safe. PageWarmer:
// its own thread; Warm and Cancel from any thread.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "shard_node/server/frame_handler.h"
#include "transport/protocol.h"
#include "transport/ucx_worker.h"

namespace kvmesh {

class ShardNode;

// Reads one byte of every 4 KiB page of the regions it is given, one region
// after another, on its own thread: the page-table fill of this process's
// mapping is paid there instead of by the first write into each page.
// Contents are not changed (relaxed atomic loads). A region's owner calls
// Cancel before unmapping it; Cancel waits for the chunk being read (64
// pages) and no byte of it is read after.
class PageWarmer {
 public:
  struct Job;
  PageWarmer();
  ~PageWarmer();
  PageWarmer(const PageWarmer&) = delete;
  PageWarmer& operator=(const PageWarmer&) = delete;
  std::shared_ptr<Job> Warm(const std::byte* base, size_t length);
  static void Cancel(const std::shared_ptr<Job>& job);
  // Bytes read so far, over all regions, and bytes given to it not yet read
  // nor cancelled (stats: kvmesh_ucx_warm_pending_bytes).
  uint64_t bytes_warmed() const { return warmed_.load(std::memory_order_relaxed); }
  uint64_t bytes_pending() const {
    return queued_.load(std::memory_order_relaxed) - warmed_.load(std::memory_order_relaxed) -
           dropped_.load(std::memory_order_relaxed);
  }

 private:
  void Run();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> jobs_;  // guarded by mu_
  bool stop_ = false;                      // guarded by mu_
  std::atomic<uint64_t> queued_{0}, warmed_{0}, dropped_{0};  // dropped: cancelled before read
  std::thread thread_;
};

// One session's registered client regions, by the client's region id. The
// remote keys were unpacked on the session's endpoint; they are destroyed
// with the table, which transfers in flight keep alive (shared_ptr). A
// region this process maps (a client on this host: ucp_rkey_ptr answers) is
// given to `warmer` (may be null: not warmed).
class UcxRegionTable {
 public:
  explicit UcxRegionTable(std::shared_ptr<PageWarmer> warmer = nullptr) : warmer_(std::move(warmer)) {}
  ~UcxRegionTable();
  UcxRegionTable(const UcxRegionTable&) = delete;
  UcxRegionTable& operator=(const UcxRegionTable&) = delete;

  // InvalidArgument when the key does not unpack; a known id is replaced.
  Status Add(ucp_ep_h ep, const proto::MemRegister& r);
  void Remove(uint64_t id);
  // The remote key of region `id` when [addr, addr + n) lies inside it, else null.
  ucp_rkey_h Find(uint64_t id, uint64_t addr, uint64_t n) const;
  size_t size() const { return regions_.size(); }
  // The client runs on this host (its MEM_REGISTER carried this HostBootId):
  // its GET_INTO deadlines are in this process's steady_clock.
  bool same_host() const { return same_host_; }

 private:
  bool same_host_ = false;
  struct Region {
    uint64_t base = 0, length = 0;
    ucp_rkey_h rkey = nullptr;
    std::shared_ptr<PageWarmer::Job> warm;  // cancelled before the key is destroyed
  };
  std::map<uint64_t, Region> regions_;
  std::shared_ptr<PageWarmer> warmer_;
};

// Runs GET_INTO and PUT_FROM for the server's sessions.
class UcxRma {
 public:
  // The node's pool regions mapped for one-sided operations, shared by the
  // workers of the context they were mapped on.
  using Pools = std::vector<std::shared_ptr<const UcxMemory>>;
  // Maps every pool region of `node` that the CPU can address
  // (ShardNode::PoolMemory) on `context`. On RDMA a mapping pins and
  // registers the memory with the NIC: done once per node, whatever the
  // number of workers (each a worker of this one context).
  static Result<Pools> MapPools(ShardNode* node, UcxContext& context);
  // Answers are built by `handler` (FrameHandler::OkReply).
  // REQUIRES: node, worker and handler outlive this object; `pools` were
  // mapped on worker->context().
  static Result<std::unique_ptr<UcxRma>> Create(ShardNode* node, UcxWorker* worker, FrameHandler* handler,
                                                Pools pools);

  // Called with the finished reply, on the loop thread, once the transfer's
  // bytes have moved (or failed). The reply pins what it still needs.
  using Done = std::function<void(std::unique_ptr<FrameReply>)>;
  // Starts the frame's transfers on `ep`. A body that does not parse returns
  // InvalidArgument and starts nothing (the caller closes the session).
  // `v` is the node as the session's tenant sees it (keys in its namespace).
  Status GetInto(ucp_ep_h ep, std::shared_ptr<UcxRegionTable> regions, TenantView v, const proto::FrameHeader& h,
                 std::span<const std::byte> body, const Done& done);
  Status PutFrom(ucp_ep_h ep, std::shared_ptr<UcxRegionTable> regions, TenantView v, const proto::FrameHeader& h,
                 std::span<const std::byte> body, const Done& done);

  // The pool mappings it moves from and into (shared with the node's other workers).
  const Pools& pools() const { return pools_; }
  // Warms the client regions of this host that its sessions register.
  const std::shared_ptr<PageWarmer>& warmer() const { return warmer_; }
  uint64_t in_flight() const { return in_flight_; }
  // Payload bytes moved by completed puts and gets (any thread may read it).
  uint64_t bytes_moved() const { return bytes_moved_.load(std::memory_order_relaxed); }

  // For the UCX completion callbacks: one transfer in flight, and the end of
  // one of its operations (the transfer finishes when none is left).
  struct Transfer;
  void Settle(Transfer* t);

 private:
  UcxRma() = default;
  // The pool mapping holding [p, p + n), for the local side of a put/get.
  ucp_mem_h MemhOf(const std::byte* p, size_t n) const;

  ShardNode* node_ = nullptr;
  UcxWorker* worker_ = nullptr;
  FrameHandler* handler_ = nullptr;
  Pools pools_;
  std::shared_ptr<PageWarmer> warmer_;
  uint64_t in_flight_ = 0;
  std::atomic<uint64_t> bytes_moved_{0};
};

// One UCX session's remote-memory capability (RemoteMemory): the client
// regions it registered and the endpoint its transfers go on, served by the
// worker's UcxRma. `done` sends a finished transfer's answer.
// REQUIRES: rma outlives it. Not thread-safe (the loop thread's).
class UcxSessionMemory final : public RemoteMemory {
 public:
  UcxSessionMemory(UcxRma* rma, ucp_ep_h ep, UcxRma::Done done)
      : rma_(rma), ep_(ep), done_(std::move(done)), regions_(std::make_shared<UcxRegionTable>(rma->warmer())) {}

  Status Register(const proto::MemRegister& r) override { return regions_->Add(ep_, r); }
  void Unregister(uint64_t id) override { regions_->Remove(id); }
  Status GetInto(const proto::FrameHeader& h, std::span<const std::byte> body, TenantView v) override {
    return rma_->GetInto(ep_, regions_, v, h, body, done_);
  }
  Status PutFrom(const proto::FrameHeader& h, std::span<const std::byte> body, TenantView v) override {
    return rma_->PutFrom(ep_, regions_, v, h, body, done_);
  }
  // Transfers in flight and a closing endpoint keep the table alive.
  const std::shared_ptr<UcxRegionTable>& regions() const { return regions_; }

 private:
  UcxRma* rma_;
  ucp_ep_h ep_;
  UcxRma::Done done_;
  std::shared_ptr<UcxRegionTable> regions_;
};

}  // namespace kvmesh

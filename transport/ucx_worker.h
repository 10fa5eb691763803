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

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

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

class UcxContext;

// Caller memory mapped for one-sided operations (ucp_mem_map), with its packed
// remote key for peers. Unmapped on destruction; keeps its context alive.
class UcxMemory {
 public:
  ~UcxMemory();
  UcxMemory(const UcxMemory&) = delete;
  UcxMemory& operator=(const UcxMemory&) = delete;
  ucp_mem_h memh() const { return memh_; }
  // The packed remote key (ucp_rkey_pack), for a peer's ucp_ep_rkey_unpack.
  const std::string& rkey() const { return rkey_; }
  std::byte* base() const { return base_; }
  size_t length() const { return length_; }
  // The context it was mapped on (a memh is valid only with that context's workers).
  const UcxContext* context() const { return owner_.get(); }

 private:
  friend class UcxContext;
  UcxMemory() = default;
  std::shared_ptr<const UcxContext> owner_;
  ucp_mem_h memh_ = nullptr;
  std::string rkey_;
  std::byte* base_ = nullptr;
  size_t length_ = 0;
};

// A UCP context (active messages, RMA, wakeup), shared by the workers made
// from it: memory mapped once serves every worker and endpoint of the context.
// Thread-safety: Map is thread-safe (UCX's context is); the object is immutable.
class UcxContext : public std::enable_shared_from_this<UcxContext> {
 public:
  // mt_workers: workers of this context are used from several threads.
  static Result<std::shared_ptr<UcxContext>> Create(bool mt_workers);
  ~UcxContext();
  UcxContext(const UcxContext&) = delete;
  UcxContext& operator=(const UcxContext&) = delete;
  ucp_context_h get() const { return context_; }
  // UCX_TLS names only tcp (and self): UCX then runs gets and puts between
  // processes as active messages (software RMA), and UCX 1.13 aborts the
  // process when such a get's answer arrives after its endpoint failed (a
  // link cut and restored: ucp_get_rep_handler, `worker->flush_ops_count >
  // 0`). Channels of such a context move registered memory two-sided.
  bool software_rma_only() const { return software_rma_only_; }
  // Maps (registers) [base, base + length) for one-sided operations.
  Result<std::unique_ptr<UcxMemory>> Map(void* base, size_t length) const;
  // A caller region (Router::RegisterMemory) mapped once for every worker of
  // this context: while any user holds the mapping of [base, base + length),
  // later calls for that range share it; it is unmapped when the last user
  // drops it. A region inside memory that Allocate returned shares that
  // allocation's mapping. Keyed by the range, not by the caller's region id:
  // region ids are per router, and routers (or engines) of one process that
  // share a context each number their regions from 1.
  Result<std::shared_ptr<UcxMemory>> MapRegion(void* base, size_t length);
  // Memory allocated by UCX for one-sided operations (ucp_mem_map with
  // UCP_MEM_MAP_ALLOCATE: a shared-memory segment on one host). A peer on the
  // same host then reads and writes it through its own mapping of the
  // segment, with no copy by this process and no round trip per fragment;
  // memory allocated elsewhere (malloc) is reached through CMA or emulated
  // over active messages, which needs this process to take part. Freed when
  // the last holder drops it.
  Result<std::shared_ptr<UcxMemory>> Allocate(size_t length);

 private:
  UcxContext() = default;
  ucp_context_h context_ = nullptr;
  bool software_rma_only_ = false;
  std::mutex regions_mu_;
  // Mapped caller ranges (base, length); guarded by regions_mu_.
  std::map<std::pair<const std::byte*, size_t>, std::weak_ptr<UcxMemory>> regions_;
  std::vector<std::weak_ptr<UcxMemory>> allocations_;  // guarded by regions_mu_
};

// How a thread waiting on a worker makes progress ($.transport.ucx.progress).
enum class UcxProgress : uint8_t {
  kPoll,    // spin on ucp_worker_progress: lowest latency, a core per waiting thread
  kEvent,   // sleep on the wakeup fd whenever there is nothing to do
  kHybrid,  // spin up to spin_us after the last event, then sleep on the fd
  // Spin for a budget that follows the waits this thread sees (SpinBudget),
  // then sleep on the fd.
  kAdaptive,
};
// "poll" | "event" | "hybrid" | "adaptive" (kUcxProgressModes, in the enum's
// order); InvalidArgument otherwise.
Result<UcxProgress> ParseUcxProgress(std::string_view name);
// How long a thread of a fixed mode spins after the last event before it
// sleeps: forever (kPoll), never (kEvent), spin_us (kHybrid). kAdaptive's
// spin is its SpinBudget's.
inline std::chrono::nanoseconds FixedSpin(UcxProgress mode, int64_t spin_us) {
  switch (mode) {
    case UcxProgress::kPoll:
      return std::chrono::nanoseconds::max();
    case UcxProgress::kEvent:
      return std::chrono::nanoseconds::zero();
    default:
      return std::chrono::microseconds(spin_us);
  }
}

// The spin budget of UcxProgress::kAdaptive. A thread waiting for a UCX event
// spins for budget(), then sleeps on the worker's wakeup fd; after each wait
// it reports how long the wait lasted and whether it slept.
//
// * Caught while spinning: the budget doubles (from 1 us, up to max_us).
//   Spinning past the event costs nothing, it stops when the event comes.
//   (With a budget of 0, an event that was there at once changes nothing.)
// * Slept, and the wait was longer than max_us: no spin could have caught
//   it; the budget halves (below 1 us it is 0: the thread sleeps at once, as
//   kEvent). Answers that queue behind other callers' (more waiting threads
//   than cores) end here, and the cores go to the threads they wait for.
// * Slept, the wait shorter than max_us: a spin of about the wait might have
//   caught it, so the next wait is a probe with twice this wait as budget.
//   A probe that sleeps again means the event came only after the spin
//   stopped: the peer that produces it needs this core (it shares it, or the
//   cores are oversubscribed), and spinning only delays it. Then the budget
//   is 0 and the next probe waits for `gap` waits, a gap that doubles with
//   every failed probe (8 up to 1024) and resets when a spin catches one.
//
// So a lone client and its node on two cores spin (as kHybrid, no wake-up),
// while on one shared core they hand over at once, as kEvent (with kHybrid's
// fixed spin every hand-over there costs the whole spin).
// Thread-safety: any thread (relaxed atomics: the budget is a hint, and a
// lost update between two reporting threads costs at most one wait's choice).
class SpinBudget {
 public:
  explicit SpinBudget(int64_t max_us) : max_ns_(std::max<int64_t>(0, max_us) * 1000), budget_ns_(max_ns_) {}
  std::chrono::nanoseconds budget() const { return std::chrono::nanoseconds(budget_ns_.load(std::memory_order_relaxed)); }
  void Waited(std::chrono::nanoseconds waited, bool slept) {
    const int64_t b = budget_ns_.load(std::memory_order_relaxed);
    if (!slept) {
      if (b == 0) return;  // the event was there before any spin: says nothing about spinning
      budget_ns_.store(std::min<int64_t>(max_ns_, std::max<int64_t>(2 * b, kFloorNs)), std::memory_order_relaxed);
      probing_.store(false, std::memory_order_relaxed);
      gap_.store(kMinGap, std::memory_order_relaxed);
      skip_.store(0, std::memory_order_relaxed);
      return;
    }
    if (probing_.exchange(false, std::memory_order_relaxed)) {
      const uint32_t gap = std::min<uint32_t>(kMaxGap, 2 * gap_.load(std::memory_order_relaxed));
      gap_.store(gap, std::memory_order_relaxed);
      skip_.store(gap, std::memory_order_relaxed);
      budget_ns_.store(0, std::memory_order_relaxed);
      return;
    }
    const int64_t half = b / 2 < kFloorNs ? 0 : b / 2;
    if (waited.count() > max_ns_ || max_ns_ == 0) {
      budget_ns_.store(half, std::memory_order_relaxed);
      return;
    }
    if (const uint32_t skip = skip_.load(std::memory_order_relaxed); skip > 0) {
      skip_.store(skip - 1, std::memory_order_relaxed);
      budget_ns_.store(half, std::memory_order_relaxed);
      return;
    }
    budget_ns_.store(std::min<int64_t>(max_ns_, std::max<int64_t>(kFloorNs, 2 * waited.count())),
                     std::memory_order_relaxed);
    probing_.store(true, std::memory_order_relaxed);
  }

 private:
  static constexpr int64_t kFloorNs = 1000;
  static constexpr uint32_t kMinGap = 8, kMaxGap = 1024;
  const int64_t max_ns_;
  std::atomic<int64_t> budget_ns_;
  std::atomic<bool> probing_{false};    // the current budget is a probe
  std::atomic<uint32_t> gap_{kMinGap};  // waits between probes after the last failed one
  std::atomic<uint32_t> skip_{0};       // waits left before the next probe
};

// The spin -> arm -> sleep pacing of a thread that progresses a UCX worker
// while it waits: a channel's caller waiting for its answer (UcxChannel), a
// node's loop waiting for the next request (UcxServer). After the last event
// the thread spins for its mode's spin (FixedSpin; kAdaptive: its
// SpinBudget's budget from the start of the wait), then arms the worker and
// sleeps on its wakeup fd; each finished wait is reported to the budget. The
// caller owns the loop and the sleep itself (a bounded poll, an Asio wait on
// the fd); the pacer decides when.
//
//   UcxPacer pace(mode, spin_us, &budget);
//   pace.Begin(Clock::now());                 // a wait begins
//   for (;;) {
//     if (ucp_worker_progress(w) != 0) { pace.Event(); continue; }
//     if (done) { pace.End(Clock::now()); break; }
//     if (pace.Spinning(Clock::now()) || !worker.Arm()) continue;
//     sleep on worker.efd(); pace.Slept();
//   }
//
// Thread-safety: one waiting thread per pacer (the budget may be shared).
class UcxPacer {
 public:
  using Clock = std::chrono::steady_clock;
  // REQUIRES: budget (kAdaptive's; unused by the fixed modes) outlives the pacer.
  UcxPacer(UcxProgress mode, int64_t spin_us, SpinBudget* budget)
      : adaptive_(mode == UcxProgress::kAdaptive),
        fixed_(std::chrono::duration_cast<Clock::duration>(FixedSpin(mode, spin_us))),
        budget_(budget) {}

  // A wait begins: the spin counts from `now`.
  void Begin(Clock::time_point now) {
    start_ = last_ = now;
    slept_ = asleep_ = false;
    spin_ = adaptive_ ? std::chrono::duration_cast<Clock::duration>(budget_->budget()) : fixed_;
  }
  // Progress found events within the wait: the fixed modes spin again from
  // now; kAdaptive's spin stays counted from the wait's start (no clock read).
  void Event() {
    if (!adaptive_) last_ = Clock::now();
  }
  // True while the thread should progress again rather than sleep.
  bool Spinning(Clock::time_point now) const {
    if (adaptive_ && asleep_) return false;  // it slept in this wait: no more spinning
    return spin_ == Clock::duration::max() || (spin_ > Clock::duration::zero() && now - last_ < spin_);
  }
  // The thread slept on the wakeup fd: the fixed modes spin again from now;
  // kAdaptive spins no more in this wait, and reports it slept.
  void Slept() {
    slept_ = asleep_ = true;
    if (!adaptive_) last_ = Clock::now();
  }
  // The thread gave the core away briefly (another thread progresses the
  // worker): kAdaptive reports the wait as slept; the spin goes on.
  void Yielded() { slept_ = true; }
  // The wait ended (what it waited for came): kAdaptive reports it to the budget.
  void End(Clock::time_point now) {
    if (adaptive_) budget_->Waited(now - start_, slept_);
  }

 private:
  const bool adaptive_;
  const Clock::duration fixed_;
  SpinBudget* const budget_;
  Clock::duration spin_{};
  Clock::time_point start_, last_;
  bool slept_ = false;   // the wait gave the core away (reported to the budget)
  bool asleep_ = false;  // the wait slept on the wakeup fd
};

class UcxWorker {
 public:
  // multi_thread: callers on several threads may post operations (UCS_THREAD_MODE_MULTI).
  // A worker of its own context.
  static Result<std::unique_ptr<UcxWorker>> Create(bool multi_thread);
  // A worker of `context` (kept alive by the worker).
  static Result<std::unique_ptr<UcxWorker>> Create(std::shared_ptr<UcxContext> context, bool multi_thread);
  const std::shared_ptr<UcxContext>& context() const { return context_; }
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
  // The longest active-message header this worker sends (UCX's
  // max_am_header worker attribute).
  size_t max_am_header() const { return max_am_header_; }

 private:
  UcxWorker() = default;
  std::shared_ptr<UcxContext> context_;
  ucp_worker_h worker_ = nullptr;
  std::string address_;
  int efd_ = -1;
  size_t max_am_header_ = 0;
};

// A node with several UCX workers publishes one address for all of them:
// "KVMW", a count byte, then per worker a 4-byte little-endian length and its
// worker address. One worker publishes its plain worker address.
std::string PackWorkerAddresses(const std::vector<std::string>& addresses);
// The worker addresses inside `address`: the packed ones, or `address` itself
// when it is not a well-formed pack (a plain worker address).
std::vector<std::string> UnpackWorkerAddresses(std::string_view address);
// One UCX peer whose watch endpoint (peer-failure handling, TCP in UCX 1.13)
// lives on a worker of its own, so that its data worker polls no TCP socket:
// "KVMP", the byte 2, then the data and the watch worker's addresses, each
// after a 4-byte little-endian length. A node's worker publishes its pair (in
// a node's pack, one entry per worker); a client's HELLO carries its own.
std::string PackEndpointPair(const std::string& data, const std::string& watch);
// {data, watch} of a pair; a plain address (anything else) is both.
std::pair<std::string, std::string> UnpackEndpointPair(std::string_view address);

std::string HexEncode(std::string_view bytes);
Result<std::string> HexDecode(std::string_view hex);

}  // namespace kvmesh

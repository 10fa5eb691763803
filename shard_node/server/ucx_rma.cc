#include "shard_node/server/ucx_rma.h"

#include <algorithm>
#include <chrono>

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/checksum.h"
#include "kernels/codec.h"
#include "kvmesh/clock.h"
#include "shard_node/shard_node.h"

namespace kvmesh {

using namespace proto;

struct PageWarmer::Job {
  const std::byte* base = nullptr;
  size_t length = 0;
  std::mutex mu;           // held while a chunk is read
  bool cancelled = false;  // guarded by mu
};

PageWarmer::PageWarmer() : thread_([this] { Run(); }) {}

PageWarmer::~PageWarmer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

std::shared_ptr<PageWarmer::Job> PageWarmer::Warm(const std::byte* base, size_t length) {
  auto job = std::make_shared<Job>();
  job->base = base;
  job->length = length;
  queued_.fetch_add(length, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(job);
  }
  cv_.notify_one();
  return job;
}

void PageWarmer::Cancel(const std::shared_ptr<Job>& job) {
  if (!job) return;
  std::lock_guard<std::mutex> lock(job->mu);
  job->cancelled = true;
}

void PageWarmer::Run() {
  // Below the loop thread that serves requests (Linux: a thread's nice value is its own).
  ::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), 5);
  constexpr size_t kPage = 4096, kChunk = 64 * kPage;
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (stop_) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    for (size_t at = 0; at < job->length; at += kChunk) {
      std::lock_guard<std::mutex> lock(job->mu);
      if (job->cancelled) {
        dropped_.fetch_add(job->length - at, std::memory_order_relaxed);
        break;
      }
      const size_t end = std::min(job->length, at + kChunk);
      for (size_t p = at; p < end; p += kPage)
        (void)__atomic_load_n(reinterpret_cast<const unsigned char*>(job->base + p), __ATOMIC_RELAXED);
      warmed_.fetch_add(end - at, std::memory_order_relaxed);
    }
  }
}

UcxRegionTable::~UcxRegionTable() {
  for (auto& [id, r] : regions_) {
    PageWarmer::Cancel(r.warm);
    ucp_rkey_destroy(r.rkey);
  }
}

Status UcxRegionTable::Add(ucp_ep_h ep, const MemRegister& m) {
  ucp_rkey_h rkey = nullptr;
  if (ucp_ep_rkey_unpack(ep, m.rkey.data(), &rkey) != UCS_OK) return InvalidArgument("remote key does not unpack");
  Remove(m.region);
  Region& r = regions_[m.region] = Region{m.base, m.length, rkey, nullptr};
  same_host_ = m.host != 0 && m.host == HostBootId();
  // A region this process maps (shared memory of a client on this host):
  // its pages are warmed before GETs write into them.
  void* local = nullptr;
  if (warmer_ && m.length > 0 && ucp_rkey_ptr(rkey, m.base, &local) == UCS_OK && local != nullptr)
    r.warm = warmer_->Warm(static_cast<const std::byte*>(local), m.length);
  return Status::Ok();
}

void UcxRegionTable::Remove(uint64_t id) {
  auto it = regions_.find(id);
  if (it == regions_.end()) return;
  PageWarmer::Cancel(it->second.warm);
  ucp_rkey_destroy(it->second.rkey);
  regions_.erase(it);
}

ucp_rkey_h UcxRegionTable::Find(uint64_t id, uint64_t addr, uint64_t n) const {
  auto it = regions_.find(id);
  if (it == regions_.end()) return nullptr;
  const Region& r = it->second;
  if (addr < r.base || n > r.length || addr - r.base > r.length - n) return nullptr;
  return r.rkey;
}

// One GET_INTO or PUT_FROM: its items, what pins or holds their bytes, and
// how many UCX operations are still in flight.
struct UcxRma::Transfer {
  UcxRma* rma = nullptr;
  FrameHeader h;
  std::shared_ptr<UcxRegionTable> regions;
  uint32_t tenant = 0;  // the session's identity: the keys' namespace
  Done done;
  int pending = 1;      // operations in flight, plus one while posting
  uint64_t moved = 0;   // payload bytes of the posted puts / gets
  bool failed = false;  // an operation failed: the endpoint is broken, every moved item is lost
  // GET_INTO
  std::vector<GetRecord> out;
  std::vector<BlockRef> refs;                     // pin the blocks until the client has them
  std::vector<std::vector<std::byte>> decoded;    // blocks stored encoded, decoded for the client
  // PUT_FROM
  std::vector<PutFromRecord> put;
  std::vector<TenantView::PutLanding> landing;    // the PUT ladder of each block
  std::vector<std::vector<std::byte>> staged;     // nodes that encode on put: the raw bytes
  std::vector<uint8_t> codes;
};

Result<UcxRma::Pools> UcxRma::MapPools(ShardNode* node, UcxContext& context) {
  Pools pools;
  for (std::span<std::byte> pool : node->PoolMemory()) {
    KVMESH_ASSIGN_OR_RETURN(std::unique_ptr<UcxMemory> m, context.Map(pool.data(), pool.size()));
    pools.push_back(std::move(m));
  }
  return pools;
}

Result<std::unique_ptr<UcxRma>> UcxRma::Create(ShardNode* node, UcxWorker* worker, FrameHandler* handler,
                                               Pools pools) {
  for (const auto& m : pools)
    if (m->context() != worker->context().get())
      return InvalidArgument("a pool mapping of another UCX context than the worker's");
  std::unique_ptr<UcxRma> r(new UcxRma());
  r->node_ = node;
  r->worker_ = worker;
  r->handler_ = handler;
  r->pools_ = std::move(pools);
  r->warmer_ = std::make_shared<PageWarmer>();
  return r;
}

ucp_mem_h UcxRma::MemhOf(const std::byte* p, size_t n) const {
  for (const auto& m : pools_)
    if (p >= m->base() && n <= m->length() && size_t(p - m->base()) <= m->length() - n) return m->memh();
  return nullptr;
}

namespace {

// Posts one put or get whose completion settles `t`; `start` issues it.
template <typename Start>
void PostOp(void* t, ucp_mem_h memh, bool* failed, int* pending, Start start,
            void (*settle)(void* req, ucs_status_t st, void* user)) {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  if (memh != nullptr) {
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    p.memh = memh;
  }
  p.cb.send = settle;
  p.user_data = t;
  void* r = start(&p);
  if (r == nullptr) return;  // done inline
  if (UCS_PTR_IS_ERR(r)) {
    *failed = true;
    return;
  }
  ++*pending;
}

// A GET_INTO deadline (steady_clock ms mod 2^32) is near or past: a write
// issued now might land after the client stopped waiting. The margin covers
// the time from this check to the bytes landing (a one-sided write through
// shared memory or CMA completes within the put call).
bool PastDeadline(uint32_t deadline_ms) {
  constexpr int32_t kMarginMs = 5;
  const auto now = static_cast<uint32_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
  return static_cast<int32_t>(deadline_ms - now) < kMarginMs;
}

}  // namespace

void UcxRma::Settle(Transfer* t) {
  if (--t->pending > 0) return;
  --in_flight_;
  auto rep = std::make_unique<FrameReply>();
  if (!t->failed) bytes_moved_.fetch_add(t->moved, std::memory_order_relaxed);
  std::string body;
  if (t->h.opcode == Opcode::kGetInto) {
    body.assign(t->out.size() * kGetItemSize, '\0');
    for (size_t i = 0; i < t->out.size(); ++i) {
      GetRecord r = t->out[i];
      if (t->failed && r.status == StatusCode::kOk) r = GetRecord{StatusCode::kUnavailable, 0, 0};
      EncodeGetRecord(r, reinterpret_cast<std::byte*>(body.data()) + i * kGetItemSize);
    }
    t->refs.clear();  // the client has its bytes (flushed): unpin
  } else {
    TenantView v(node_, t->tenant);
    for (size_t i = 0; i < t->put.size(); ++i) {
      TenantView::PutLanding& p = t->landing[i];
      if (!p.reserved() && !p.staged()) continue;  // answered when the transfer started
      t->codes[i] = static_cast<uint8_t>(t->failed ? StatusCode::kUnavailable : v.FinishPut(p, t->staged[i]).code());
    }
    body.assign(reinterpret_cast<const char*>(t->codes.data()), t->codes.size());
  }
  handler_->OkReply(t->h, t->h.count, std::move(body), rep.get());
  Done done = std::move(t->done);
  delete t;
  done(std::move(rep));
}

namespace {
void SettleCallback(void* req, ucs_status_t st, void* user) {
  auto* t = static_cast<UcxRma::Transfer*>(user);
  if (st != UCS_OK) t->failed = true;
  ucp_request_free(req);
  t->rma->Settle(t);
}
}  // namespace

Status UcxRma::GetInto(ucp_ep_h ep, std::shared_ptr<UcxRegionTable> regions, TenantView v, const FrameHeader& h,
                       std::span<const std::byte> body, const Done& done) {
  thread_local std::vector<GetIntoRecord> in;
  KVMESH_RETURN_IF_ERROR(ParseGetIntoTable(h, body, &in));
  auto* t = new Transfer;
  t->rma = this;
  t->h = h;
  t->regions = std::move(regions);
  t->done = done;
  t->out.resize(in.size());
  t->refs.reserve(in.size());
  ++in_flight_;
  bool any = false;
  for (size_t i = 0; i < in.size(); ++i) {
    const GetIntoRecord& g = in[i];
    GetRecord& r = t->out[i];
    Result<BlockRef> ref = v.GetForTransfer(g.key);
    if (!ref.ok()) {
      r.status = ref.status().code();
      continue;
    }
    std::span<const std::byte> data = ref->data();
    r.size = ref->meta().logical_size;
    if (r.size > g.capacity) {
      r.status = StatusCode::kResourceExhausted;  // size tells the client what it needs
      continue;
    }
    if (g.deadline_ms != 0 && t->regions->same_host() && PastDeadline(g.deadline_ms)) {
      // The client may have given up on the call and reused the memory: write nothing.
      r = GetRecord{StatusCode::kDeadlineExceeded, 0, 0};
      continue;
    }
    ucp_rkey_h rkey = t->regions->Find(g.region, g.addr, r.size);
    if (rkey == nullptr) {
      r = GetRecord{StatusCode::kInvalidArgument, 0, 0};  // not inside a region this session registered
      continue;
    }
    if (ref->meta().codec != 0) {
      // Stored encoded: the client gets the decoded block, as from every other read.
      std::vector<std::byte>& d = t->decoded.emplace_back(r.size);
      Status s = kernels::DecodeBlock(data, d);
      if (!s.ok()) {
        r = GetRecord{StatusCode::kDataLoss, 0, 0};
        t->decoded.pop_back();
        continue;
      }
      data = d;
      r.checksum = Checksum64(d.data(), d.size());
    } else {
      r.checksum = ref->meta().checksum;
    }
    const std::byte* src = data.data();
    PostOp(t, MemhOf(src, r.size), &t->failed, &t->pending,
           [&](ucp_request_param_t* p) { return ucp_put_nbx(ep, src, r.size, g.addr, rkey, p); }, &SettleCallback);
    t->refs.push_back(std::move(*ref));
    t->moved += r.size;
    any = true;
  }
  if (any) {  // the answer may go only once the bytes are in the client's memory
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = &SettleCallback;
    p.user_data = t;
    void* r = ucp_ep_flush_nbx(ep, &p);
    if (UCS_PTR_IS_ERR(r)) t->failed = true;
    else if (r != nullptr) ++t->pending;
  }
  Settle(t);
  return Status::Ok();
}

Status UcxRma::PutFrom(ucp_ep_h ep, std::shared_ptr<UcxRegionTable> regions, TenantView v, const FrameHeader& h,
                       std::span<const std::byte> body, const Done& done) {
  auto* t = new Transfer;
  Status parsed = ParsePutFromTable(h, body, handler_->limits(), &t->put);
  if (!parsed.ok()) {
    delete t;
    return parsed;
  }
  t->rma = this;
  t->h = h;
  t->regions = std::move(regions);
  t->tenant = v.tenant();
  t->done = done;
  const size_t n = t->put.size();
  t->landing.resize(n);
  t->staged.resize(n);
  t->codes.assign(n, 0);
  ++in_flight_;
  for (size_t i = 0; i < n; ++i) {
    const PutFromRecord& f = t->put[i];
    ucp_rkey_h rkey = t->regions->Find(f.region, f.addr, f.put.size);
    if (rkey == nullptr) {
      t->codes[i] = static_cast<uint8_t>(StatusCode::kInvalidArgument);
      continue;
    }
    TenantView::PutLanding& p = t->landing[i] =
        v.StartPut(f.put.key, f.put.size, f.put.checksum, PutOptionsOf(f.put, h.flags));
    std::byte* dst;
    if (p.reserved()) {
      dst = p.chunk().data();
    } else if (p.staged()) {
      t->staged[i].resize(f.put.size);  // this node encodes on put: stage, then Put
      dst = t->staged[i].data();
    } else {
      t->codes[i] = static_cast<uint8_t>(v.FinishPut(p).code());  // refused, or stored already (OK): nothing to move
      continue;
    }
    PostOp(t, MemhOf(dst, f.put.size), &t->failed, &t->pending,
           [&](ucp_request_param_t* p) { return ucp_get_nbx(ep, dst, f.put.size, f.addr, rkey, p); },
           &SettleCallback);
    t->moved += f.put.size;
  }
  Settle(t);
  return Status::Ok();
}

}  // namespace kvmesh

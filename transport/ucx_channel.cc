#include "transport/ucx_channel.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <array>
#include <cstring>
#include <shared_mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "kvmesh/block_key.h"
#include "kvmesh/clock.h"
#include "transport/frame_plan.h"
#include "transport/local_index.h"
#include "transport/seq_calls.h"
#include "transport/sync_over_async.h"
#include "transport/ucx_worker.h"

namespace kvmesh {
namespace {

using namespace proto;
using Clock = std::chrono::steady_clock;

// Reused receive buffers for GET answers that cannot land in their callers'
// buffers (a rendezvous answer whose table is not known before its data, or
// whose payloads are not adjacent in the callers' memory): a channel keeps a
// few and hands them out again, so a large answer costs no allocation, no
// zero-filling and no page faults per frame. A lease returns its buffer when
// it goes. Thread-safety: thread-safe.
class AnswerPool : public std::enable_shared_from_this<AnswerPool> {
 public:
  struct Buffer {
    std::unique_ptr<std::byte[]> data;  // uninitialised: every byte is received before it is read
    size_t capacity = 0;
  };
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&&) = default;
    Lease& operator=(Lease&& o) noexcept {
      Return();
      pool_ = std::move(o.pool_);
      buf_ = std::move(o.buf_);
      size_ = o.size_;
      return *this;
    }
    ~Lease() { Return(); }
    explicit operator bool() const { return buf_ != nullptr; }
    std::span<std::byte> bytes() const { return {buf_->data.get(), size_}; }

   private:
    friend class AnswerPool;
    void Return() {
      if (buf_) pool_->Put(std::move(buf_));
      pool_.reset();
    }
    std::shared_ptr<AnswerPool> pool_;
    std::unique_ptr<Buffer> buf_;
    size_t size_ = 0;
  };

  // A buffer of at least n bytes: a kept one that is large enough, else the
  // largest kept one grown, else a new one.
  Lease Take(size_t n) {
    Lease l;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto best = free_.end();
      for (auto it = free_.begin(); it != free_.end(); ++it) {
        if (best == free_.end()) {
          best = it;
          continue;
        }
        const size_t c = (*it)->capacity, b = (*best)->capacity;
        if (b >= n ? (c >= n && c < b) : c > b) best = it;  // the smallest that fits, else the largest
      }
      if (best != free_.end()) {
        l.buf_ = std::move(*best);
        free_.erase(best);
      }
    }
    if (!l.buf_) l.buf_ = std::make_unique<Buffer>();
    if (l.buf_->capacity < n) {
      l.buf_->data.reset(new std::byte[n]);
      l.buf_->capacity = n;
      allocations_.fetch_add(1, std::memory_order_relaxed);
    }
    l.pool_ = shared_from_this();
    l.size_ = n;
    return l;
  }

 private:
  static constexpr size_t kKept = 4;  // buffers kept for reuse; a fifth one is freed
  void Put(std::unique_ptr<Buffer> b) {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_.size() < kKept) free_.push_back(std::move(b));
  }
  std::mutex mu_;
  std::vector<std::unique_ptr<Buffer>> free_;  // guarded by mu_

 public:
  std::atomic<uint64_t> allocations_{0};  // buffers allocated or grown
};

struct Pending {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;       // answer arrived (or the call failed)
  bool send_done = false;  // UCX no longer reads the request buffers
  Status call;
  FrameHeader header;
  std::vector<std::byte> body;
  // A two-sided GET frame: the items its answer's payloads go to (set
  // before the request is posted), and how the answer landed:
  std::span<GetItem> get_items;
  bool direct = false;     // body is the item table alone: every hit's payload is in its item's dst
  bool landing = false;    // a receive straight into get_items' dsts is under way
  bool abandoned = false;  // the caller gave up: nothing more may be written to its dsts
  AnswerPool::Lease pooled;  // the answer (table + payloads) landed here; body is empty
};

class Channel;
class UcxCallState;
bool StartRegistered(Channel* ch, UcxCallState* st, std::span<PutItem> put, std::span<GetItem> get,
                     const RequestOptions& o);
template <typename KeyOf, typename ItemBytes>
void StartKeys(Channel* ch, UcxCallState* st, Opcode op, uint8_t flags, size_t n, KeyOf key_of, ItemBytes item_bytes,
               const RequestOptions& o);

class Channel final : public SeqOverFrames<SyncOverAsync<UcxChannel>> {
  friend class UcxCallState;
  friend bool StartRegistered(Channel*, UcxCallState*, std::span<PutItem>, std::span<GetItem>, const RequestOptions&);
  template <typename KeyOf, typename ItemBytes>
  friend void StartKeys(Channel*, UcxCallState*, Opcode, uint8_t, size_t, KeyOf, ItemBytes, const RequestOptions&);

 public:
  explicit Channel(UcxChannelOptions o) : o_(std::move(o)) {}
  ~Channel() override {
    // Both endpoints forced: every send still in flight completes with an
    // error (its callback frees it) before the worker goes. The node sees the
    // watch endpoint's connection close and drops the session.
    if (watch_) CloseEp(watch_worker_.get(), watch_, UCP_EP_CLOSE_FLAG_FORCE);
    if (ep_) CloseEp(worker_.get(), ep_, UCP_EP_CLOSE_FLAG_FORCE);
    worker_.reset();
    watch_worker_.reset();
    // UCX calls back no more. What it dropped without a callback (a request
    // on the data endpoint after the node died) is freed here.
    for (InFlight* h : inflight_) delete h;
  }

  Status Init() {
    if (o_.context) {
      KVMESH_ASSIGN_OR_RETURN(worker_, UcxWorker::Create(o_.context, /*multi_thread=*/true));
    } else {
      KVMESH_ASSIGN_OR_RETURN(worker_, UcxWorker::Create(/*multi_thread=*/true));
    }
    // The watch endpoint lives on a worker of its own (same context): its
    // TCP connection is all that worker has, so the data worker, which a
    // waiting caller progresses once per round, has only shared-memory
    // transports to poll. On one worker every progress round also polled the
    // TCP transport's epoll set (an epoll_wait per round, and another per
    // wakeup), needed only to see the node die (docs/protocol.md "UCX").
    KVMESH_ASSIGN_OR_RETURN(watch_worker_, UcxWorker::Create(worker_->context(), /*multi_thread=*/true));
    ucp_am_handler_param_t hp{};
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG |
                    UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    hp.id = kUcxAmReply;
    hp.flags = UCP_AM_FLAG_WHOLE_MSG;
    hp.cb = &Channel::OnReply;
    hp.arg = this;
    KVMESH_UCX_RETURN(ucp_worker_set_am_recv_handler(worker_->get(), &hp));
    hp.cb = &Channel::OnWatchReply;  // the HELLO's answer comes back on the watch worker
    KVMESH_UCX_RETURN(ucp_worker_set_am_recv_handler(watch_worker_->get(), &hp));
    // Two endpoints to the node (docs/protocol.md "UCX"): the data endpoint
    // without peer error handling, so UCX may use shared memory and CMA
    // between processes of one host (UCX 1.13 offers peer-failure handling
    // on TCP only), and a watch endpoint with it, which carries the HELLO
    // (so its connection exists) and reports the node's death.
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    // A node with several workers: channels of this process take them in turn.
    const std::vector<std::string> workers = UnpackWorkerAddresses(o_.node_address);
    static std::atomic<size_t> next_worker{0};
    // A worker with a watch worker of its own publishes both (PackEndpointPair).
    const auto [data_address, watch_address] =
        UnpackEndpointPair(workers[next_worker.fetch_add(1, std::memory_order_relaxed) % workers.size()]);
    ep.address = reinterpret_cast<const ucp_address_t*>(data_address.data());
    ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    KVMESH_UCX_RETURN(ucp_ep_create(worker_->get(), &ep, &ep_));
    ep.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = [](void* arg, ucp_ep_h, ucs_status_t st) { static_cast<Channel*>(arg)->FailAll(st); };
    ep.err_handler.arg = this;
    ep.address = reinterpret_cast<const ucp_address_t*>(watch_address.data());
    KVMESH_UCX_RETURN(ucp_ep_create(watch_worker_->get(), &ep, &watch_));
    Hello h;
    h.client_id = o_.client_id;
    h.tenant = o_.tenant;
    h.token = o_.token;
    std::string body = EncodeHelloBody(h);
    auto p = std::make_shared<Pending>();
    KVMESH_RETURN_IF_ERROR(Roundtrip(Opcode::kHello, 0, 0, {{body.data(), body.size()}}, body.size(), p, {}));
    HelloAnswer a;
    KVMESH_RETURN_IF_ERROR(ParseHelloAnswerBody(p->body, &a));
    // Frames are split by the limits both ends accept: the node's, and this
    // client's for the answers (OnReply drops an answer over o_.limits, so a
    // GET split only by a node accepting larger frames never completed).
    server_limits_ = a.limits;
    server_limits_.max_body_bytes = std::min(server_limits_.max_body_bytes, o_.limits.max_body_bytes);
    server_limits_.max_items = std::min(server_limits_.max_items, o_.limits.max_items);
    if (o_.local_reads) local_status_ = MapLocal();
    else local_status_ = FailedPrecondition("local reads are off for this channel");
    return Status::Ok();
  }

  // LOCAL_MAP, then the node's pool and index mapped (once per process for
  // all the channels to that node). Not OK: this channel reads through the node.
  Status MapLocal() {
    std::string body(8, '\0');
    const uint64_t host = HostBootId();
    for (int i = 0; i < 8; ++i) body[i] = static_cast<char>(host >> (8 * i));
    auto p = std::make_shared<Pending>();
    KVMESH_RETURN_IF_ERROR(Roundtrip(Opcode::kLocalMap, 0, 0, {{body.data(), body.size()}}, body.size(), p, {}));
    LocalMapAnswer a;
    KVMESH_RETURN_IF_ERROR(ParseLocalMapAnswer(p->body, &a));
    struct stat st {};
    if (::stat(a.index_path.c_str(), &st) != 0) return NotFound("cannot stat " + a.index_path);
    // One mapping per node process and index (its memfd's inode), shared by
    // the channels to it: the pool's pages are mapped once.
    static std::mutex mu;
    static std::map<std::pair<uint64_t, uint64_t>, std::weak_ptr<LocalIndexReader>> open;
    std::lock_guard<std::mutex> lock(mu);
    std::erase_if(open, [](const auto& e) { return e.second.expired(); });  // nodes no channel maps any more
    std::weak_ptr<LocalIndexReader>& slot = open[{uint64_t(st.st_dev), uint64_t(st.st_ino)}];
    local_ = slot.lock();
    if (local_ == nullptr) {
      KVMESH_ASSIGN_OR_RETURN(local_, LocalIndexReader::Open(a.pool_path, a.pool_bytes, a.index_path, a.index_bytes));
      slot = local_;
    }
    return Status::Ok();
  }
  Status local_reads_status() const override { return local_status_; }
  // A batch of kLocalReadMaxBatch bytes or more whose every destination is
  // registered goes as GET_INTO even with local reads: the node's worker then
  // copies block after block while this thread checks the ones that landed
  // (two cores on one load), where a local read copies and checks on this
  // thread alone. One client loading whole prefixes in `bench-serve
  // --prefix-check` got 7.4 / 9.5 / 10.1 GB/s at 1k / 8k / 32k tokens with
  // local reads, 11.1 / 12.8 / 10.0 GB/s with GET_INTO; one 256 KiB GET per
  // call is 1.3-1.6x faster local, and 3.5-4.5x with 8 clients
  // (docs/guide.md "Local reads").
  static constexpr size_t kLocalReadMaxBatch = 4u << 20;
  bool LargeRegisteredBatch(std::span<GetItem> items) const {
    size_t bytes = 0;
    for (const GetItem& it : items) bytes += it.dst.size();
    if (bytes < kLocalReadMaxBatch) return false;
    std::shared_lock<std::shared_mutex> lock(regions_mu_);
    if (regions_.empty()) return false;
    for (const GetItem& it : items)
      if (RegionOf(it.dst.data(), it.dst.size()) == 0) return false;
    return true;
  }
  // Reads what items it can from the node's pool: marks them in `hit` and
  // returns their count (0 without local reads).
  size_t ReadLocal(std::span<GetItem> items, std::vector<uint8_t>* hit) {
    hit->assign(items.size(), 0);
    if (local_ == nullptr || broken_.load(std::memory_order_relaxed)) return 0;
    if (LargeRegisteredBatch(items)) return 0;
    size_t n = 0;
    for (size_t i = 0; i < items.size(); ++i) {
      GetItem& it = items[i];
      if (IsGroupedKey(it.key)) continue;  // the node checks a group is whole
      const size_t got = local_->Read(it.key, it.dst);
      if (got == 0) continue;
      it.size = got;
      it.status = Status::Ok();
      (*hit)[i] = 1;
      ++n;
    }
    local_hits_.fetch_add(n, std::memory_order_relaxed);
    local_misses_.fetch_add(items.size() - n, std::memory_order_relaxed);
    return n;
  }

  std::string_view transport() const override { return "ucx"; }
  AnswerCounts answer_counts() const override {
    return {direct_.load(), pooled_.load(), answers_->allocations_.load(), local_hits_.load(), local_misses_.load()};
  }
  void set_epoch(uint64_t e) override { epoch_.store(e); }

  // Asynchronous forms (router fan-out): Start* posts the request (UCX
  // sends it eagerly or starts the rendezvous) and returns; Wait progresses
  // this channel's worker until the answer is in. Defined after the class.
  // Put, Get, Exists and Erase are these, waited for at once (SyncOverAsync).
  bool async_calls() const override { return true; }
  void StartPut(std::span<PutItem> items, const RequestOptions& o, ChannelCall* call) override;
  void StartGet(std::span<GetItem> items, const RequestOptions& o, ChannelCall* call) override;
  // A GET whose every item local reads serve returns here, with no call
  // state (nothing allocated); the others take StartGet's path.
  Status Get(std::span<GetItem> items, const RequestOptions& o) override {
    thread_local std::vector<uint8_t> hit;
    const size_t local = ReadLocal(items, &hit);
    if (local == items.size()) return Status::Ok();
    ChannelCall call;
    StartGetRest(items, o, &call, hit, local);
    return call.Wait();
  }
  // StartGet after its local reads (`hit`: which items they served, `local` of them).
  void StartGetRest(std::span<GetItem> items, const RequestOptions& o, ChannelCall* call,
                    const std::vector<uint8_t>& hit, size_t local);
  void StartExists(std::span<const BlockKey> keys, std::span<uint8_t> found, bool touch, const RequestOptions& o,
                   ChannelCall* call) override;
  void StartErase(std::span<const BlockKey> keys, std::span<Status> statuses, const RequestOptions& o,
                  ChannelCall* call) override;

  // Answer parsers shared by the calls: PUT / per-key status bytes, GET.
  static Status FinishCodes(const Pending& p, size_t n, std::vector<uint8_t>* codes) {
    KVMESH_RETURN_IF_ERROR(ParseStatusBytes(p.header, p.body, codes));
    if (codes->size() != n) return Unavailable("answer count differs from the request");
    return Status::Ok();
  }
  // GET / GET_INTO answer: a GET record per item, then (GET) the hits'
  // payloads, copied into the items' destinations, or (GET_INTO, `into`)
  // nothing: the node already wrote them there. An answer that landed
  // straight in the destinations (p.direct) has only its table left to read.
  // Each hit is verified where it landed.
  Status FinishGet(const Pending& p, std::span<GetItem> items, bool into) const {
    const std::span<const std::byte> body = p.pooled ? p.pooled.bytes() : std::span<const std::byte>(p.body);
    const size_t table = size_t{p.header.count} * kGetItemSize;
    if (p.header.count != items.size() || body.size() < table || ((into || p.direct) && body.size() != table))
      return Unavailable(into ? "bad GET_INTO answer" : "bad GET answer");
    std::vector<GetRecord> recs;
    KVMESH_RETURN_IF_ERROR(ParseGetTable(p.header, body.first(table), o_.limits, &recs));
    const bool landed = into || p.direct;
    size_t off = table;
    for (size_t i = 0; i < items.size(); ++i) {
      GetItem& it = items[i];
      const GetRecord& r = recs[i];
      it.size = r.size;
      it.status = GetRecordStatus(r);
      if (!it.status.ok()) continue;
      const std::byte* src = body.data() + off;
      if (!landed) off += r.size;
      if (it.dst.size() < r.size) {
        it.status = into ? Unavailable("node wrote past the destination it was given")
                         : ResourceExhausted("destination smaller than the block");
        continue;
      }
      if (!landed) std::memcpy(it.dst.data(), src, r.size);
      it.status = VerifyPayload(it.dst.first(r.size), r.checksum);
    }
    return Status::Ok();
  }

  // Whether a GET answer whose table came first (in the AM header) can land
  // in its callers' buffers: every hit fits its item's dst and the hits'
  // payloads add up to the answer's data. `adjacent`: each hit's dst starts
  // where the previous hit's payload ends, so one contiguous receive at
  // `*start` places them all.
  static bool HitsFit(const FrameHeader& h, std::span<const std::byte> table, std::span<GetItem> items,
                      size_t data_len, const ProtocolLimits& limits, bool* adjacent, std::byte** start) {
    std::vector<GetRecord> recs;
    if (items.size() != h.count || !ParseGetTable(h, table, limits, &recs).ok()) return false;
    size_t sum = 0;
    std::byte* end = nullptr;
    *adjacent = true;
    *start = nullptr;
    for (size_t i = 0; i < recs.size(); ++i) {
      if (!GetRecordStatus(recs[i]).ok() || recs[i].size == 0) continue;
      if (items[i].dst.size() < recs[i].size) return false;
      if (*start == nullptr) *start = items[i].dst.data();
      else if (items[i].dst.data() != end) *adjacent = false;
      end = items[i].dst.data() + recs[i].size;
      sum += recs[i].size;
    }
    return sum == data_len;
  }

  // ---- registered memory (docs/protocol.md "Registered memory") ---------------
  // Over software RMA (UcxContext::software_rma_only) nothing is registered
  // with the node: batches go two-sided (the bounce path), as for memory
  // that was never registered.
  Status RegisterMemory(const MemoryRegion& r) override {
    if (worker_->context()->software_rma_only()) return Status::Ok();
    {
      std::shared_lock<std::shared_mutex> lock(regions_mu_);
      for (const Registered& g : regions_)
        if (g.region.id == r.id) return Status::Ok();
    }
    KVMESH_ASSIGN_OR_RETURN(std::shared_ptr<UcxMemory> mem, worker_->context()->MapRegion(r.base, r.bytes));
    MemRegister m;
    m.region = r.id;
    m.base = reinterpret_cast<uint64_t>(r.base);
    m.length = r.bytes;
    m.rkey = mem->rkey();
    m.host = HostBootId();
    const std::string body = EncodeMemRegister(m);
    auto p = std::make_shared<Pending>();
    KVMESH_RETURN_IF_ERROR(Roundtrip(Opcode::kMemRegister, 0, 0, {{const_cast<char*>(body.data()), body.size()}},
                                     body.size(), p, {}));
    std::unique_lock<std::shared_mutex> lock(regions_mu_);
    regions_.push_back(Registered{r, std::move(mem)});
    std::sort(regions_.begin(), regions_.end(),
              [](const Registered& a, const Registered& b) { return a.region.base < b.region.base; });
    return Status::Ok();
  }
  void UnregisterMemory(uint64_t id) override {
    std::shared_ptr<UcxMemory> mem;  // unmapped (when the last channel lets go) after the node forgot it
    {
      std::unique_lock<std::shared_mutex> lock(regions_mu_);
      auto it = std::find_if(regions_.begin(), regions_.end(), [&](const Registered& g) { return g.region.id == id; });
      if (it == regions_.end()) return;
      mem = std::move(it->mem);
      regions_.erase(it);
    }
    const std::string body = EncodeSeqId(id);  // MEM_UNREGISTER: region u64
    auto p = std::make_shared<Pending>();
    (void)Roundtrip(Opcode::kMemUnregister, 0, 0, {{const_cast<char*>(body.data()), body.size()}}, body.size(), p, {});
  }
  // The registered region holding [p, p + n), or 0. REQUIRES regions_mu_ held (shared).
  uint64_t RegionOf(const std::byte* p, size_t n) const {
    auto it = std::upper_bound(regions_.begin(), regions_.end(), p,
                               [](const std::byte* x, const Registered& g) { return x < g.region.base; });
    if (it == regions_.begin()) return 0;
    --it;
    return it->region.Contains(p, n) ? it->region.id : 0;
  }

  Status Pin(std::span<const BlockKey> keys, std::span<Status> st) override { return StatusCall(Opcode::kPin, keys, st); }
  Status Unpin(std::span<const BlockKey> keys, std::span<Status> st) override { return StatusCall(Opcode::kUnpin, keys, st); }
  Status Release(std::span<const BlockKey> keys, std::span<Status> st) override {
    return StatusCall(Opcode::kRelease, keys, st);
  }
  Result<std::string> StatsJson() override {
    auto p = std::make_shared<Pending>();
    KVMESH_RETURN_IF_ERROR(Roundtrip(Opcode::kStats, 0, 0, {}, 0, p, {}));
    return std::string(reinterpret_cast<const char*>(p->body.data()), p->body.size());
  }

  // Live sequences: SeqOverFrames (transport/seq_calls.h) over SeqRoundtrip below.

 private:
  // SeqFrameIo: one SEQ frame there and back (AM data = the pieces, unjoined).
  Status SeqRoundtrip(Opcode op, std::span<const std::span<const std::byte>> body, const RequestOptions& o,
                      std::vector<std::byte>* answer) override {
    std::vector<ucp_dt_iov_t> iov;
    uint64_t len = 0;
    for (std::span<const std::byte> b : body) {
      if (b.empty()) continue;
      iov.push_back({const_cast<std::byte*>(b.data()), b.size()});
      len += b.size();
    }
    auto p = std::make_shared<Pending>();
    KVMESH_RETURN_IF_ERROR(Roundtrip(op, 0, 0, std::move(iov), len, p, o));
    *answer = std::move(p->body);
    return Status::Ok();
  }
  // The node's limit from the HELLO (Init), bounded by what this client accepts.
  Result<uint64_t> SeqMaxBody() override {
    return std::min<uint64_t>(server_limits_.max_body_bytes, o_.limits.max_body_bytes);
  }

  Status KeyCall(Opcode op, uint8_t flags, std::span<const BlockKey> keys, const RequestOptions& o,
                 std::vector<uint8_t>* codes) {
    codes->clear();
    if (keys.empty()) return Status::Ok();
    std::string body;
    for (const BlockKey& k : keys) AppendKey(&body, k);
    auto p = std::make_shared<Pending>();
    KVMESH_RETURN_IF_ERROR(Roundtrip(op, flags, keys.size(), {{body.data(), body.size()}}, body.size(), p, o));
    return FinishCodes(*p, keys.size(), codes);
  }
  Status StatusCall(Opcode op, std::span<const BlockKey> keys, std::span<Status> st) {
    std::vector<uint8_t> codes;
    KVMESH_RETURN_IF_ERROR(KeyCall(op, 0, keys, {}, &codes));
    for (size_t i = 0; i < keys.size(); ++i) st[i] = ItemStatus(codes[i]);
    return Status::Ok();
  }

  // Posts one request (AM header = frame header, data = iov) and waits for the answer.
  Status Roundtrip(Opcode op, uint8_t flags, size_t count, std::vector<ucp_dt_iov_t> iov, uint64_t body_len,
                   const std::shared_ptr<Pending>& p, const RequestOptions& o) {
    Posted x;
    x.p = p;
    KVMESH_RETURN_IF_ERROR(Post(op, flags, count, iov, body_len, o, &x));
    return Await(x);  // iov (and what it points at) outlives the send
  }

  // What one UCX request in flight owns, freed by its callback (Release).
  // The data endpoint has no peer-failure handling: after the node died, UCX
  // may drop a request on it without ever calling back. Every holder is in
  // inflight_ until released, and ~Channel frees those left once the worker
  // is gone.
  struct InFlight {
    Channel* ch = nullptr;
    virtual ~InFlight() = default;
  };
  // A send: its Pending and its AM header bytes (inline; a HELLO's, which
  // adds the worker address, in hello_amh).
  // The request's bytes are the holder's own (the body copied in), so a call
  // that times out returns at once: UCX may finish or fail the send later
  // (a send to a dead node may never complete) without reading the caller's
  // memory.
  struct SendHolder final : InFlight {
    std::shared_ptr<Pending> p;
    std::array<std::byte, kHeaderSize + 8> amh{};
    std::vector<std::byte> hello_amh;
    std::vector<std::byte> body;
  };
  // A rendezvous receive of an answer: the Pending its bytes land in.
  struct RecvHolder final : InFlight {
    std::shared_ptr<Pending> p;
  };
  // Registers h (owned by the request UCX is about to be given) in inflight_.
  void Track(InFlight* h) {
    h->ch = this;
    std::lock_guard<std::mutex> lock(inflight_mu_);
    inflight_.insert(h);
  }
  // Frees h once UCX is done with it (its callback, or the request finished inline).
  static void Release(InFlight* h) {
    {
      std::lock_guard<std::mutex> lock(h->ch->inflight_mu_);
      h->ch->inflight_.erase(h);
    }
    delete h;
  }

  // A request Post sent whose answer Await has not collected yet.
  struct Posted {
    std::shared_ptr<Pending> p;  // set by the caller
    void* req = nullptr;         // the UCX send request (nullptr or an error: finished inline)
    uint64_t id = 0;
    Clock::time_point deadline;
  };

  // Sends the request; UCX reads iov and its buffers until p->send_done.
  // On an error nothing is left in flight.
  Status Post(Opcode op, uint8_t flags, size_t count, const std::vector<ucp_dt_iov_t>& iov, uint64_t body_len,
              const RequestOptions& o, Posted* x) {
    const std::shared_ptr<Pending>& p = x->p;
    if (op != Opcode::kHello && (count > server_limits_.max_items || body_len > server_limits_.max_body_bytes))
      return InvalidArgument("batch exceeds the node's limits");
    if (broken_) return Unavailable("UCX endpoint to the node failed");
    const auto deadline = Clock::now() + std::chrono::milliseconds(o.timeout_ms > 0 ? o.timeout_ms : o_.timeout_ms);
    FrameHeader h;
    h.opcode = op;
    h.flags = flags;
    h.request_id = next_id_++;
    h.epoch = epoch_.load();
    h.count = static_cast<uint32_t>(count);
    h.body_len = static_cast<uint32_t>(body_len);
    // AM header: the frame header, then this channel's session nonce; a
    // HELLO adds this worker's address (the node answers on an endpoint of
    // its own to it, docs/protocol.md "UCX"). UCX may read the header until
    // the send completes, so it lives in the send's holder, with the Pending.
    auto* holder = new SendHolder;
    holder->p = p;
    holder->body.resize(body_len);
    {
      size_t at = 0;
      for (const ucp_dt_iov_t& piece : iov) {
        std::memcpy(holder->body.data() + at, piece.buffer, piece.length);
        at += piece.length;
      }
    }
    HeaderBytes hb = EncodeHeader(h);
    std::memcpy(holder->amh.data(), hb.data(), kHeaderSize);
    std::memcpy(holder->amh.data() + kHeaderSize, &nonce_, 8);
    std::span<const std::byte> amh = holder->amh;
    if (op == Opcode::kHello) {
      // Both workers' addresses (PackEndpointPair): the node's data
      // endpoint goes to the first, its watch endpoint to the second.
      const std::string addr = PackEndpointPair(worker_->address(), watch_worker_->address());
      holder->hello_amh.assign(holder->amh.begin(), holder->amh.end());
      holder->hello_amh.insert(holder->hello_amh.end(), reinterpret_cast<const std::byte*>(addr.data()),
                               reinterpret_cast<const std::byte*>(addr.data()) + addr.size());
      amh = holder->hello_amh;
    }
    {
      std::lock_guard<std::mutex> lock(map_mu_);
      pending_[h.request_id] = p;
    }
    Track(holder);  // before the send: its callback may run on a progressing thread at once
    ucp_request_param_t rp{};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_DATATYPE;
    static const std::byte kNoBody{};
    rp.datatype = ucp_dt_make_contig(1);
    rp.user_data = holder;
    rp.cb.send = [](void* req, ucs_status_t, void* user) {
      auto* hp = static_cast<SendHolder*>(user);
      {
        std::lock_guard<std::mutex> lock(hp->p->mu);
        hp->p->send_done = true;
        hp->p->cv.notify_all();
      }
      Release(hp);
      ucp_request_free(req);
    };
    void* r = ucp_am_send_nbx(op == Opcode::kHello ? watch_ : ep_, kUcxAmRequest, amh.data(), amh.size(),
                              holder->body.empty() ? static_cast<const void*>(&kNoBody) : holder->body.data(),
                              holder->body.size(), &rp);
    if (r == nullptr || UCS_PTR_IS_ERR(r)) {
      Release(holder);
      std::lock_guard<std::mutex> lock(p->mu);
      p->send_done = true;
      if (UCS_PTR_IS_ERR(r)) {
        Forget(h.request_id);
        return UcxStatus(UCS_PTR_STATUS(r), "ucp_am_send_nbx", __FILE__, __LINE__);
      }
    }
    x->req = r;
    x->id = h.request_id;
    x->deadline = deadline;
    return Status::Ok();
  }

  // Progresses the worker until x's answer is in (and UCX no longer reads
  // its request), or its deadline: then the request is cancelled.
  Status Await(Posted& x) {
    const std::shared_ptr<Pending>& p = x.p;
    const auto deadline = x.deadline;
    auto finished = [&] {
      std::lock_guard<std::mutex> lock(p->mu);
      return p->done;
    };
    if (!Progress(finished, deadline)) {
      // The send holds only its own bytes (SendHolder): nothing to wait for.
      Forget(x.id);
      {
        std::lock_guard<std::mutex> lock(p->mu);
        if (p->done) return p->call;
        if (!p->landing) {
          p->abandoned = true;  // a late answer never touches the caller's buffers
          return DeadlineExceeded("no answer from the node within the timeout");
        }
      }
      // The answer is being received straight into the caller's buffers
      // (the node is sending it): that receive ends before they are handed
      // back, within one more timeout or the node's death.
      auto ended = [&] {
        std::lock_guard<std::mutex> lock(p->mu);
        return p->done || broken_.load();
      };
      (void)Progress(ended, Clock::now() + std::chrono::milliseconds(o_.timeout_ms));
      std::lock_guard<std::mutex> lock(p->mu);
      p->abandoned = true;
      return p->done ? p->call : DeadlineExceeded("no answer from the node within the timeout");
    }
    std::lock_guard<std::mutex> lock(p->mu);
    return p->call;
  }

  // The calling thread progresses the worker until pred() or the deadline (no
  // progress thread, so no hand-off and no sleeping thread to wake): one caller
  // at a time progresses; the others wait for it briefly and retry. Idle, the
  // progressing caller sleeps on the worker's wakeup fd.
  template <typename Pred>
  bool Progress(Pred pred, Clock::time_point deadline) {
    // The spin, the arming and the report to spin_budget_ are UcxPacer's
    // (transport/ucx_worker.h); a wait that times out reports nothing.
    UcxPacer pace(o_.progress, o_.spin_us, &spin_budget_);
    pace.Begin(Clock::now());
    auto done = [&] {
      pace.End(Clock::now());
      return true;
    };
    for (;;) {
      if (pred()) return done();
      const auto now = Clock::now();
      if (now >= deadline) return false;
      std::unique_lock<std::mutex> plk(progress_mu_, std::try_to_lock);
      if (!plk.owns_lock()) {
        std::unique_lock<std::mutex> w(idle_mu_);
        idle_cv_.wait_for(w, std::chrono::microseconds(200));
        pace.Yielded();
        continue;
      }
      // The watch worker: progressed when its fd fired, and at least every
      // kWatchEvery (a caller that only spins on the data worker sees the
      // node's death too); then armed again before the next sleep.
      if (watch_due_ || now - watch_seen_ >= kWatchEvery) {
        watch_due_ = watch_armed_ = false;
        watch_seen_ = now;
        watch_worker_->ProgressAll();
        if (pred()) return done();
      }
      if (ucp_worker_progress(worker_->get()) != 0) {
        StartRendezvous();
        pace.Event();
        continue;
      }
      StartRendezvous();
      if (pred()) return done();
      if (pace.Spinning(now)) continue;
      if (!watch_armed_) {
        if (!watch_worker_->Arm()) {  // events pending: progress it again
          watch_due_ = true;
          continue;
        }
        watch_armed_ = true;
      }
      if (!worker_->Arm()) continue;  // events pending
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count();
      pollfd pf[2] = {{worker_->efd(), POLLIN, 0}, {watch_worker_->efd(), POLLIN, 0}};
      ::poll(pf, 2, static_cast<int>(std::clamp<int64_t>(left, 0, 1)));
      if (pf[1].revents != 0) watch_due_ = true;
      pace.Slept();
      plk.unlock();
      idle_cv_.notify_all();
    }
  }

  void CloseEp(UcxWorker* worker, ucp_ep_h ep, uint32_t flags) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = flags;
    void* r = ucp_ep_close_nbx(ep, &p);
    if (r == nullptr || UCS_PTR_IS_ERR(r)) return;
    // A forced close completes locally (no word from the node is awaited).
    while (ucp_request_check_status(r) == UCS_INPROGRESS) ucp_worker_progress(worker->get());
    ucp_request_free(r);
  }

  void Forget(uint64_t id) {
    std::lock_guard<std::mutex> lock(map_mu_);
    pending_.erase(id);
  }
  void FailAll(ucs_status_t st) {
    broken_ = true;
    std::unordered_map<uint64_t, std::shared_ptr<Pending>> failed;
    {
      std::lock_guard<std::mutex> lock(map_mu_);
      failed.swap(pending_);
    }
    for (auto& [id, p] : failed) {
      std::lock_guard<std::mutex> lock(p->mu);
      p->call = Unavailable(std::string("UCX endpoint failed: ") + ucs_status_string(st));
      p->done = true;
      p->cv.notify_all();
    }
  }

  // The watch worker's answers: the HELLO's (small, eager). A rendezvous
  // there is refused (UCS_OK drops it): StartRendezvous receives on the
  // data worker only.
  static ucs_status_t OnWatchReply(void* arg, const void* header, size_t header_length, void* data, size_t length,
                                   const ucp_am_recv_param_t* param) {
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) return UCS_OK;
    return OnReply(arg, header, header_length, data, length, param);
  }

  static ucs_status_t OnReply(void* arg, const void* header, size_t header_length, void* data, size_t length,
                              const ucp_am_recv_param_t* param) {
    auto* self = static_cast<Channel*>(arg);
    FrameHeader h;
    const auto hb = std::span(static_cast<const std::byte*>(header), header_length);
    if (header_length < kHeaderSize || !DecodeHeader(hb.first(kHeaderSize), self->o_.limits, &h).ok() ||
        !h.is_response())
      return UCS_OK;  // not ours to trust: dropped (the caller times out)
    // A successful GET answer may carry its item table in the AM header,
    // after the frame header (docs/protocol.md "UCX"); the data is then the
    // payloads alone.
    const std::span<const std::byte> table = hb.subspan(kHeaderSize);
    if (!table.empty() &&
        (h.opcode != Opcode::kGet || h.status != StatusCode::kOk || table.size() != size_t{h.count} * kGetItemSize))
      return UCS_OK;
    if (h.body_len != table.size() + length) return UCS_OK;
    std::shared_ptr<Pending> p;
    {
      std::lock_guard<std::mutex> lock(self->map_mu_);
      auto it = self->pending_.find(h.request_id);
      if (it == self->pending_.end()) return UCS_OK;
      p = it->second;
      self->pending_.erase(it);
    }
    const auto* bytes = static_cast<const std::byte*>(data);
    std::lock_guard<std::mutex> lock(p->mu);
    p->header = h;
    p->body.assign(table.begin(), table.end());  // the header is UCX's only during this callback
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
      self->rndv_.push_back({p, h, data, table.size()});
      return UCS_INPROGRESS;
    }
    bool adjacent = false;
    std::byte* start = nullptr;
    if (!table.empty() && !p->abandoned &&
        HitsFit(h, table, p->get_items, length, self->o_.limits, &adjacent, &start)) {
      // Eager: each hit copied from UCX's buffer into its caller's buffer.
      std::vector<GetRecord> recs;
      (void)ParseGetTable(h, table, self->o_.limits, &recs);  // HitsFit parsed it
      size_t off = 0;
      for (size_t i = 0; i < recs.size(); ++i) {
        if (!GetRecordStatus(recs[i]).ok() || recs[i].size == 0) continue;
        std::memcpy(p->get_items[i].dst.data(), bytes + off, recs[i].size);
        off += recs[i].size;
      }
      p->direct = true;
      self->direct_.fetch_add(1, std::memory_order_relaxed);
    } else {
      p->body.insert(p->body.end(), bytes, bytes + length);
    }
    Complete(p.get());
    return UCS_OK;
  }

  static void Complete(Pending* p) {  // REQUIRES p->mu held
    p->call = p->header.status == StatusCode::kOk ? Status::Ok() : ParseErrorBody(p->header, p->body);
    p->done = true;
    p->cv.notify_all();
  }

  struct Rndv {
    std::shared_ptr<Pending> p;
    FrameHeader h;
    void* desc;
    size_t table;  // the item table's bytes that came in the AM header (in p->body)
  };

  // Receives the rendezvous answers OnReply queued. A GET answer whose
  // table came first lands straight in its callers' buffers when its hits
  // fit them and lie end to end there (one contiguous receive: UCX reads the
  // node's pool in place, no copy here at all); otherwise, and for a GET
  // answer whose table is in the data, it lands in a pooled buffer
  // (FinishGet copies out). Other answers land in their Pending's body.
  void StartRendezvous() {
    while (!rndv_.empty()) {
      Rndv rv = std::move(rndv_.front());
      rndv_.pop_front();
      const size_t data_len = rv.h.body_len - rv.table;
      std::byte* into = nullptr;
      {
        std::lock_guard<std::mutex> lock(rv.p->mu);
        bool adjacent = false;
        std::byte* start = nullptr;
        if (rv.table > 0 && !rv.p->abandoned &&
            HitsFit(rv.h, rv.p->body, rv.p->get_items, data_len, o_.limits, &adjacent, &start) && adjacent &&
            start != nullptr) {
          into = start;
          rv.p->direct = true;
          rv.p->landing = true;
          direct_.fetch_add(1, std::memory_order_relaxed);
        } else if (rv.table > 0 || (rv.h.opcode == Opcode::kGet && rv.h.status == StatusCode::kOk)) {
          rv.p->pooled = answers_->Take(rv.h.body_len);  // bounded by the limits DecodeHeader checked
          pooled_.fetch_add(1, std::memory_order_relaxed);
          std::memcpy(rv.p->pooled.bytes().data(), rv.p->body.data(), rv.table);
          rv.p->body.clear();
          into = rv.p->pooled.bytes().data() + rv.table;
        } else {
          rv.p->body.resize(rv.h.body_len);  // bounded by the limits DecodeHeader checked
          into = rv.p->body.data();
        }
      }
      ucp_request_param_t rp{};
      rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_DATATYPE;
      rp.datatype = ucp_dt_make_contig(1);
      auto* holder = new RecvHolder;
      holder->p = rv.p;
      Track(holder);
      rp.user_data = holder;
      rp.cb.recv_am = [](void* req, ucs_status_t st, size_t, void* user) {
        auto* hp = static_cast<RecvHolder*>(user);
        {
          std::lock_guard<std::mutex> lock(hp->p->mu);
          hp->p->landing = false;
          if (st == UCS_OK) Complete(hp->p.get());
          else {
            hp->p->call = Unavailable("UCX receive failed");
            hp->p->done = true;
            hp->p->cv.notify_all();
          }
        }
        Release(hp);
        ucp_request_free(req);
      };
      void* r = ucp_am_recv_data_nbx(worker_->get(), rv.desc, into, data_len, &rp);
      if (r == nullptr || UCS_PTR_IS_ERR(r)) {
        Release(holder);
        std::lock_guard<std::mutex> lock(rv.p->mu);
        rv.p->landing = false;
        if (r == nullptr) Complete(rv.p.get());
        else {
          rv.p->call = Unavailable("UCX receive failed");
          rv.p->done = true;
          rv.p->cv.notify_all();
        }
      }
    }
  }

  struct Registered {
    MemoryRegion region;
    std::shared_ptr<UcxMemory> mem;
  };
  mutable std::shared_mutex regions_mu_;
  std::vector<Registered> regions_;  // sorted by base; guarded by regions_mu_

  UcxChannelOptions o_;
  SpinBudget spin_budget_{o_.spin_us};  // kAdaptive: every waiting caller reports to it
  std::unique_ptr<UcxWorker> worker_;
  std::unique_ptr<UcxWorker> watch_worker_;  // the watch endpoint's alone (Init)
  // The watch worker's pacing (Progress), touched only by the caller holding progress_mu_:
  static constexpr std::chrono::milliseconds kWatchEvery{1};
  bool watch_armed_ = false;     // armed since its last progress: its fd announces what comes
  bool watch_due_ = true;        // its fd fired (or arming found events): progress it
  Clock::time_point watch_seen_;  // its last progress
  ucp_ep_h ep_ = nullptr;     // data: every frame but the HELLO, no peer error handling
  ucp_ep_h watch_ = nullptr;  // the HELLO, then only the node's death (peer error handling)
  std::atomic<bool> broken_{false};
  std::mutex progress_mu_;  // held by the one caller progressing the worker
  std::mutex idle_mu_;
  std::condition_variable idle_cv_;
  std::atomic<uint64_t> next_id_{1}, epoch_{0};
  const uint64_t nonce_ = std::random_device{}() * 0x100000001ull ^ std::random_device{}();
  ProtocolLimits server_limits_;  // the node's from the HELLO, bounded by o_.limits (Init); read-only after
  std::mutex map_mu_;
  std::unordered_map<uint64_t, std::shared_ptr<Pending>> pending_;  // guarded by map_mu_
  std::deque<Rndv> rndv_;  // touched only by the caller holding progress_mu_ (callbacks run inside its progress)
  std::shared_ptr<AnswerPool> answers_ = std::make_shared<AnswerPool>();  // GET answers that land off the callers' buffers
  std::atomic<uint64_t> direct_{0}, pooled_{0};  // answer_counts()
  std::atomic<uint64_t> local_hits_{0}, local_misses_{0};
  std::shared_ptr<LocalIndexReader> local_;  // the node's pool and index (MapLocal); null: none
  Status local_status_;                      // why local_ is null (Init)
  std::mutex inflight_mu_;
  std::unordered_set<InFlight*> inflight_;  // requests' holders not yet released; guarded by inflight_mu_
};

enum class UcxCallKind : uint8_t { kPut, kGet, kExists, kErase, kGetInto, kPutFrom };

// One UCX call in flight (ChannelCall state): its frames (several when the
// batch exceeds the node's limits, as the frame plan splits it,
// transport/frame_plan.h) and where the answers go. Post copies each frame's
// bytes into its send, so body and iov are scratch, reused frame to frame.
class UcxCallState final : public ChannelCallState {
 public:
  struct Frame {
    Channel::Posted x;
    FrameSpan f;  // its items in the call's batch
  };

  Status Wait() override {
    Status first = Status::Ok();
    for (Frame& fr : frames) {
      Status s = ch->Await(fr.x);
      if (s.ok()) s = Collect(fr);
      if (!s.ok() && first.ok()) first = std::move(s);
    }
    if (first.ok()) first = std::move(unsent);  // frames never sent fail the call after those that were
    frames.clear();                             // the Pendings go; buffers keep their capacity
    unsent = Status::Ok();
    if (!outer.empty()) {  // some items were read locally: the node's answers go back to their places
      for (size_t i = 0; i < rest.size(); ++i) {
        outer[rest_at[i]].size = rest[i].size;
        outer[rest_at[i]].status = std::move(rest[i].status);
      }
      outer = {};
    }
    return first;
  }

  // Posts frame f, its body in `body` (the first `table` bytes) and iov.
  bool PostFrame(Opcode op, uint8_t flags, FrameSpan f, uint64_t len, const RequestOptions& o) {
    Frame& fr = frames.emplace_back();
    fr.f = f;
    fr.x.p = std::make_shared<Pending>();
    if (kind == UcxCallKind::kGet) fr.x.p->get_items = get.subspan(f.begin, f.size());
    unsent = ch->Post(op, flags, f.size(), iov, len, o, &fr.x);
    if (unsent.ok()) return true;
    frames.pop_back();
    return false;
  }

  Channel* ch = nullptr;
  UcxCallKind kind = UcxCallKind::kPut;
  std::vector<Frame> frames;
  Status unsent;  // why the rest of the batch was not sent (OK: all of it was)
  std::span<PutItem> put;
  std::span<GetItem> get;
  std::span<uint8_t> found;
  std::span<Status> statuses;
  std::string body;  // the frame's item table, or its key list
  std::vector<ucp_dt_iov_t> iov;
  std::vector<uint8_t> codes;
  // A GET some of whose items were read locally: the caller's items (outer),
  // and the others (rest, at rest_at in outer), which the frames ask for.
  std::span<GetItem> outer;
  std::vector<GetItem> rest;
  std::vector<uint32_t> rest_at;

 private:
  // Copies frame fr's answers into the caller's items.
  Status Collect(const Frame& fr) {
    const FrameSpan f = fr.f;
    switch (kind) {
      case UcxCallKind::kGet:
      case UcxCallKind::kGetInto: return ch->FinishGet(*fr.x.p, get.subspan(f.begin, f.size()), kind == UcxCallKind::kGetInto);
      case UcxCallKind::kPutFrom:
      case UcxCallKind::kPut:
      case UcxCallKind::kExists:
      case UcxCallKind::kErase: break;
    }
    KVMESH_RETURN_IF_ERROR(Channel::FinishCodes(*fr.x.p, f.size(), &codes));
    for (size_t i = 0; i < f.size(); ++i) {
      const size_t at = f.begin + i;
      if (kind == UcxCallKind::kPut || kind == UcxCallKind::kPutFrom) put[at].status = ItemStatus(codes[i]);
      if (kind == UcxCallKind::kExists) found[at] = codes[i] ? 1 : 0;
      if (kind == UcxCallKind::kErase) statuses[at] = ItemStatus(codes[i]);
    }
    return Status::Ok();
  }
};

UcxCallState* BeginCall(Channel* ch, ChannelCall* call, UcxCallKind kind) {
  UcxCallState* st = call->StartAs<UcxCallState>();
  st->ch = ch;
  st->kind = kind;
  st->frames.clear();
  st->unsent = Status::Ok();
  st->outer = {};
  return st;
}

// Posts the key lists of items [0, n) (key_of(i)) in the frames the node's
// limits allow (item_bytes(i): what item i adds to a frame).
template <typename KeyOf, typename ItemBytes>
void StartKeys(Channel* ch, UcxCallState* st, Opcode op, uint8_t flags, size_t n, KeyOf key_of, ItemBytes item_bytes,
               const RequestOptions& o) {
  for (size_t at = 0; at < n;) {
    const FrameSpan f{at, FrameEnd(at, n, ch->server_limits_, item_bytes)};
    const uint64_t len = BuildKeyTable(f, key_of, &st->body);
    st->iov.assign(1, {st->body.data(), st->body.size()});
    if (!st->PostFrame(op, flags, f, len, o)) return;
    at = f.end;
  }
}

// When every item's bytes lie in memory registered with this channel, posts
// the batch as PUT_FROM / GET_INTO (the node moves the bytes one-sidedly) and
// returns true; otherwise posts nothing and returns false.
bool StartRegistered(Channel* ch, UcxCallState* st, std::span<PutItem> put, std::span<GetItem> get,
                     const RequestOptions& o) {
  const size_t n = put.empty() ? get.size() : put.size();
  thread_local std::vector<uint64_t> region;
  region.assign(n, 0);
  {
    std::shared_lock<std::shared_mutex> lock(ch->regions_mu_);
    if (ch->regions_.empty()) return false;
    for (size_t i = 0; i < n; ++i) {
      region[i] = put.empty() ? ch->RegionOf(get[i].dst.data(), get[i].dst.size())
                              : ch->RegionOf(put[i].data.data(), put[i].data.size());
      if (region[i] == 0) return false;
    }
  }
  st->kind = put.empty() ? UcxCallKind::kGetInto : UcxCallKind::kPutFrom;
  st->put = put;
  st->get = get;
  // The call's deadline (the one Post sets), for a node on this host: it
  // writes nothing into our memory once we may have given up on it.
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(o.timeout_ms > 0 ? o.timeout_ms : ch->o_.timeout_ms);
  uint32_t deadline_ms = static_cast<uint32_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline.time_since_epoch()).count());
  if (deadline_ms == 0) deadline_ms = 1;  // 0 means none
  const size_t item = put.empty() ? kGetIntoItemSize : kPutFromItemSize;
  for (size_t at = 0; at < n;) {
    const FrameSpan f{at, FrameEnd(at, n, ch->server_limits_, [&](size_t) { return item; })};
    st->body.assign(f.size() * item, '\0');
    std::byte* out = reinterpret_cast<std::byte*>(st->body.data());
    for (size_t i = f.begin; i < f.end; ++i, out += item) {
      if (!put.empty()) {
        PutFromRecord r;
        r.put = PutRecord{put[i].key, static_cast<uint32_t>(put[i].data.size()), o.priority, 0,
                          PayloadChecksum({}, put[i].data)};
        r.region = region[i];
        r.addr = reinterpret_cast<uint64_t>(put[i].data.data());
        EncodePutFromRecord(r, out);
      } else {
        GetIntoRecord r{get[i].key, region[i], reinterpret_cast<uint64_t>(get[i].dst.data()),
                        static_cast<uint32_t>(std::min<size_t>(get[i].dst.size(), UINT32_MAX)), deadline_ms};
        EncodeGetIntoRecord(r, out);
      }
    }
    st->iov.assign(1, {st->body.data(), st->body.size()});
    if (!st->PostFrame(put.empty() ? Opcode::kGetInto : Opcode::kPutFrom, o.replace ? kFlagReplace : 0, f,
                       st->body.size(), o))
      break;
    at = f.end;
  }
  return true;
}

void Channel::StartPut(std::span<PutItem> items, const RequestOptions& o, ChannelCall* call) {
  if (items.empty()) return call->Finish(Status::Ok());
  UcxCallState* st = BeginCall(this, call, UcxCallKind::kPut);
  if (StartRegistered(this, st, items, {}, o)) return;
  st->put = items;
  auto size_of = [&](size_t i) -> uint64_t { return items[i].data.size(); };
  auto refuse = [&](size_t i, Status s) { items[i].status = std::move(s); };
  auto piece = [&](size_t i) { return PutPiece{items[i].key, {}, items[i].data, o.priority}; };
  auto payload = [&](std::span<const std::byte> b) { st->iov.push_back({const_cast<std::byte*>(b.data()), b.size()}); };
  for (size_t at = 0; at < items.size();) {
    const FrameSpan f = NextPutFrame(at, items.size(), server_limits_, size_of, refuse);
    if (f.empty()) return;
    st->iov.assign(1, {});  // the item table, once built
    const uint64_t len = BuildPutTable(f, piece, &st->body, payload);
    st->iov[0] = {st->body.data(), st->body.size()};
    if (!st->PostFrame(Opcode::kPut, o.replace ? kFlagReplace : 0, f, len, o)) return;
    at = f.end;
  }
}

void Channel::StartGet(std::span<GetItem> items, const RequestOptions& o, ChannelCall* call) {
  thread_local std::vector<uint8_t> hit;
  const size_t local = ReadLocal(items, &hit);
  if (local == items.size()) return call->Finish(Status::Ok());
  StartGetRest(items, o, call, hit, local);
}

void Channel::StartGetRest(std::span<GetItem> items, const RequestOptions& o, ChannelCall* call,
                           const std::vector<uint8_t>& hit, size_t local) {
  UcxCallState* st = BeginCall(this, call, UcxCallKind::kGet);
  if (local > 0) {
    st->rest.clear();
    st->rest_at.clear();
    for (size_t i = 0; i < items.size(); ++i) {
      if (hit[i]) continue;
      st->rest.push_back(items[i]);
      st->rest_at.push_back(static_cast<uint32_t>(i));
    }
    st->outer = items;
    items = st->rest;
  }
  if (StartRegistered(this, st, {}, items, o)) return;
  st->get = items;
  StartKeys(
      this, st, Opcode::kGet, 0, items.size(), [&](size_t i) { return items[i].key; },
      [&](size_t i) { return GetItemBytes(items[i].dst.size(), server_limits_); }, o);
}

void Channel::StartExists(std::span<const BlockKey> keys, std::span<uint8_t> found, bool touch,
                          const RequestOptions& o, ChannelCall* call) {
  if (keys.empty()) return call->Finish(Status::Ok());
  UcxCallState* st = BeginCall(this, call, UcxCallKind::kExists);
  st->found = found;
  StartKeys(
      this, st, Opcode::kExists, touch ? kFlagTouch : 0, keys.size(), [&](size_t i) { return keys[i]; },
      [](size_t) { return kKeyItemBytes; }, o);
}

void Channel::StartErase(std::span<const BlockKey> keys, std::span<Status> statuses, const RequestOptions& o,
                         ChannelCall* call) {
  if (keys.empty()) return call->Finish(Status::Ok());
  UcxCallState* st = BeginCall(this, call, UcxCallKind::kErase);
  st->statuses = statuses;
  StartKeys(
      this, st, Opcode::kErase, 0, keys.size(), [&](size_t i) { return keys[i]; },
      [](size_t) { return kKeyItemBytes; }, o);
}

}  // namespace

Result<std::unique_ptr<UcxChannel>> UcxChannel::Connect(UcxChannelOptions options) {
  auto c = std::make_unique<Channel>(std::move(options));
  KVMESH_RETURN_IF_ERROR(c->Init());
  return std::unique_ptr<UcxChannel>(std::move(c));
}

}  // namespace kvmesh

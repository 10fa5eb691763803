#include "shard_node/server/ucx_server.h"

#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include "shard_node/server/frame_handler.h"
#include "shard_node/server/ucx_rma.h"
#include "transport/asio.h"
#include "transport/ucx_worker.h"

namespace kvmesh {
namespace {

namespace asio = boost::asio;
using namespace proto;

// Longest client worker address a HELLO may carry (UCX addresses of tcp, shm
// and RDMA transports are a few hundred bytes).
constexpr size_t kMaxClientAddress = 4096;
constexpr size_t kMaxSessions = 4096;  // beyond: the least recently used one is closed
constexpr long kBusyWaitNs = 100'000;    // longest sleep on the worker fd with work under way

// A request whose body is (being) received.
struct Incoming {
  uint64_t nonce = 0;  // the client's session nonce (AM header bytes 40..47)
  std::string client_address;  // HELLO only: the client's worker address (AM header bytes 48..)
  FrameHeader header;
  std::vector<std::byte> body;
  void* rndv_desc = nullptr;  // set while the body waits for ucp_am_recv_data_nbx
  bool malformed = false;
};

// A reply in flight: owns every byte the send reads, and the pins
// (rep.refs) on the pool blocks it sends from, until the send completes.
struct Outgoing {
  FrameReply rep;
  std::vector<ucp_dt_iov_t> iov;
  std::vector<std::byte> amh;  // a GET answer's AM header: frame header + item table (see Send)
  uint64_t nonce = 0;          // the session it answers
  std::chrono::steady_clock::time_point since;  // when the send was posted
};

// Largest GET item table that rides in the AM header (with the worker's own
// max_am_header bound): 256 items.
constexpr size_t kMaxTableInHeader = 256 * kGetItemSize;

class Server final : public UcxServer {
 public:
  // One client session (a channel's nonce): the endpoint this node created
  // to the client's worker, so it owns it. A reply endpoint from UCX would be
  // freed by UCX when the client goes, possibly while a request of that
  // client is still queued here; an owned endpoint is only failed (error
  // callback), and this loop closes it.
  struct Session {
    Server* server = nullptr;
    uint64_t nonce = 0;
    ucp_ep_h ep = nullptr;     // data: every answer but the HELLO's, one-sided transfers; no peer error handling
    ucp_ep_h watch = nullptr;  // the HELLO answer, then only the client's death (peer error handling)
    ConnectionAuth auth;  // the HELLO's identity: its frames act in that tenant's namespace
    bool failed = false;  // the error callback ran: no more sends, close it
    uint64_t last_used = 0;
    // Its remote-memory capability (auth.memory): the client memory it
    // registered (MEM_REGISTER) and its one-sided transfers.
    std::unique_ptr<UcxSessionMemory> memory;
  };

  Server(ShardNode* node, UcxServerOptions o, const std::atomic<uint64_t>* epoch)
      : node_(node), o_(o), handler_(node, o.limits, o.token, epoch), sd_(io_), watch_sd_(io_) {}
  // The worker goes first, while the maps its send callbacks erase from are
  // still here: destroying it purges the sends still pending on its
  // endpoints (to a client that vanished) and calls them back.
  ~Server() override {
    Stop();
    worker_.reset();
    watch_worker_.reset();
  }

  // A worker of `context` (shared with the node's other workers) serving
  // one-sided transfers over `pools`, mapped on that context.
  Status Init(std::shared_ptr<UcxContext> context, UcxRma::Pools pools) {
    KVMESH_ASSIGN_OR_RETURN(worker_, UcxWorker::Create(std::move(context), /*multi_thread=*/false));
    KVMESH_ASSIGN_OR_RETURN(rma_, UcxRma::Create(node_, worker_.get(), &handler_, std::move(pools)));
    ucp_am_handler_param_t hp{};
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG |
                    UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    hp.id = kUcxAmRequest;
    hp.flags = UCP_AM_FLAG_WHOLE_MSG;
    hp.cb = &Server::OnRequest;
    hp.arg = this;
    KVMESH_UCX_RETURN(ucp_worker_set_am_recv_handler(worker_->get(), &hp));
    // The sessions' watch endpoints (TCP, peer-failure handling) live on a
    // worker of their own, progressed by WatchLoop on the same thread: the
    // data worker, progressed every round of Loop, then has no TCP
    // connection (UCX's TCP transport makes an epoll_wait on every progress
    // of a worker that uses it). HELLOs arrive there.
    KVMESH_ASSIGN_OR_RETURN(watch_worker_, UcxWorker::Create(worker_->context(), /*multi_thread=*/false));
    hp.cb = &Server::OnWatchRequest;
    KVMESH_UCX_RETURN(ucp_worker_set_am_recv_handler(watch_worker_->get(), &hp));
    address_ = PackEndpointPair(worker_->address(), watch_worker_->address());
    int fd = ::dup(worker_->efd());
    if (fd < 0) return ErrnoStatus("dup(ucx efd)", errno);
    sd_.assign(fd);
    fd = ::dup(watch_worker_->efd());
    if (fd < 0) return ErrnoStatus("dup(ucx efd)", errno);
    watch_sd_.assign(fd);
    asio::co_spawn(io_, Loop(), asio::detached);
    asio::co_spawn(io_, WatchLoop(), asio::detached);
    thread_ = std::thread([this] { io_.run(); });
    return Status::Ok();
  }

  const std::string& address() const override { return address_; }
  uint64_t requests() const override { return requests_.load(); }
  std::vector<uint64_t> worker_requests() const override { return {requests()}; }
  uint64_t one_sided_bytes() const override { return rma_->bytes_moved(); }
  uint64_t warm_pending_bytes() const override { return rma_->warmer()->bytes_pending(); }
  uint64_t warmed_bytes() const override { return rma_->warmer()->bytes_warmed(); }
  uint64_t admitted(Opcode op) const override { return handler_.admitted(op); }
  uint64_t stale_refused() const override { return handler_.stale.load(); }
  size_t pool_mappings() const override { return rma_->pools().size(); }
  const UcxRma::Pools& pools() const { return rma_->pools(); }

  void Stop() override {
    if (stopped_.exchange(true)) return;
    asio::post(io_, [this] {
      boost::system::error_code ec;
      sd_.cancel(ec);
      watch_sd_.cancel(ec);
      io_.stop();
    });
    if (thread_.joinable()) thread_.join();
    // Close every session (force: pending sends complete with an error), then
    // let those sends and closes finish before the worker goes.
    while (!sessions_.empty()) CloseSession(sessions_.begin());
    for (int i = 0; i < 1000 && (!inflight_.empty() || !closing_.empty() || (rma_ && rma_->in_flight() > 0)); ++i) {
      worker_->ProgressAll();
      watch_worker_->ProgressAll();
      ReapCloses();
    }
  }

 private:
  // The Asio loop: progress, handle what arrived, arm, sleep on the efd.
  // The spin and its report to the budget are UcxPacer's
  // (transport/ucx_worker.h): a wait is a gap between two activities, and
  // only an idle one (nothing in flight) is reported.
  asio::awaitable<void> Loop() {
    using Clock = std::chrono::steady_clock;
    SpinBudget budget(o_.spin_us);
    UcxPacer pace(o_.progress, o_.spin_us, &budget);
    pace.Begin(Clock::now());
    bool idle = false;  // the gap since the last activity had nothing in flight
    auto active = [&] {
      const auto now = Clock::now();
      if (idle) pace.End(now);
      idle = false;
      pace.Begin(now);
    };
    for (;;) {
      if (ucp_worker_progress(worker_->get()) != 0) {
        worker_->ProgressAll();
        active();
      }
      CloseFailed();
      ReapCloses();
      SweepPinned();
      StartRendezvous();
      if (!ready_.empty()) {
        HandleReady();
        active();
        continue;
      }
      const bool busy = !inflight_.empty() || !receiving_.empty() || !closing_.empty() || rma_->in_flight() > 0;
      if (!busy) idle = true;
      if (pace.Spinning(Clock::now())) {
        // Spinning: the next request is served without a wakeup. Yield to the
        // io_context between rounds so Stop's cancel gets in.
        co_await asio::post(io_, asio::use_awaitable);
        continue;
      }
      if (busy) {
        // Replies or rendezvous receives under way need progress the wakeup
        // fd does not always announce: wait on it at most kBusyWaitNs, then
        // progress again. (Spinning instead kept this thread runnable, so on
        // oversubscribed cores the peer it waits for got the CPU only at the
        // next scheduler tick: milliseconds per rendezvous.)
        if (worker_->Arm()) {
          pollfd pf{worker_->efd(), POLLIN, 0};
          const timespec ts{0, kBusyWaitNs};
          ::ppoll(&pf, 1, &ts, nullptr);
        }
        co_await asio::post(io_, asio::use_awaitable);  // lets Stop's cancel in
        continue;
      }
      if (!worker_->Arm()) continue;  // events pending: progress again
      boost::system::error_code ec;
      co_await sd_.async_wait(asio::posix::descriptor_base::wait_read, asio::redirect_error(asio::use_awaitable, ec));
      if (ec) co_return;
      pace.Slept();
    }
  }

  // The watch worker: progressed when its fd fires, on the loop's thread.
  // What it received (a HELLO) or saw (a client's death) is Loop's to
  // handle: Loop may be asleep on the data worker's fd, so it is woken.
  asio::awaitable<void> WatchLoop() {
    for (;;) {
      bool any = false;
      while (ucp_worker_progress(watch_worker_->get()) != 0) any = true;
      if (any) (void)ucp_worker_signal(worker_->get());  // a wakeup; its status changes nothing here
      if (!watch_worker_->Arm()) continue;  // events pending: progress again
      boost::system::error_code ec;
      co_await watch_sd_.async_wait(asio::posix::descriptor_base::wait_read,
                                    asio::redirect_error(asio::use_awaitable, ec));
      if (ec) co_return;
    }
  }

  // The watch worker's requests: HELLOs (small, eager). A rendezvous there is
  // refused (UCS_OK drops it): StartRendezvous receives on the data worker.
  static ucs_status_t OnWatchRequest(void* arg, const void* header, size_t header_length, void* data, size_t length,
                                     const ucp_am_recv_param_t* param) {
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) return UCS_OK;
    return OnRequest(arg, header, header_length, data, length, param);
  }

  static ucs_status_t OnRequest(void* arg, const void* header, size_t header_length, void* data, size_t length,
                                const ucp_am_recv_param_t* param) {
    auto* self = static_cast<Server*>(arg);
    auto in = std::make_unique<Incoming>();
    const auto hb = std::span<const std::byte>(static_cast<const std::byte*>(header), header_length);
    bool ok = header_length >= kHeaderSize + 8 && header_length <= kHeaderSize + 8 + kMaxClientAddress &&
              DecodeHeader(hb.first(kHeaderSize), self->handler_.limits(), &in->header).ok() &&
              !in->header.is_response() && in->header.body_len == length;
    if (ok) {
      std::memcpy(&in->nonce, hb.data() + kHeaderSize, 8);
      // A HELLO carries the client's worker address (this node answers on an
      // endpoint of its own to it); no other frame does.
      const size_t addr = header_length - kHeaderSize - 8;
      ok = (in->header.opcode == Opcode::kHello) == (addr > 0);
      in->client_address.assign(reinterpret_cast<const char*>(hb.data()) + kHeaderSize + 8, addr);
    }
    if (!ok) {
      self->handler_.malformed.fetch_add(1);  // dropped; a malformed peer gets no answer
      return UCS_OK;
    }
    if (in->header.opcode != Opcode::kHello) {
      // Nothing before the handshake: a frame of a session that has not
      // authenticated is dropped at its header, its body never received.
      // (A client sends no frame before its HELLO is answered, and this
      // loop answers a HELLO only once it has handled it.)
      auto it = self->sessions_.find(in->nonce);
      if (it == self->sessions_.end() || it->second->failed || !it->second->auth.hello_done) {
        self->handler_.auth_failures.fetch_add(1);
        return UCS_OK;
      }
    }
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
      in->body.resize(length);  // bounded: DecodeHeader checked body_len against the limits
      in->rndv_desc = data;
      self->rndv_.push_back(std::move(in));
      return UCS_INPROGRESS;  // the descriptor is kept for ucp_am_recv_data_nbx
    }
    in->body.assign(static_cast<const std::byte*>(data), static_cast<const std::byte*>(data) + length);
    self->ready_.push_back(std::move(in));
    return UCS_OK;
  }

  void StartRendezvous() {
    while (!rndv_.empty()) {
      Incoming* in = rndv_.front().release();
      rndv_.pop_front();
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_DATATYPE;
      p.datatype = ucp_dt_make_contig(1);
      p.user_data = this;
      p.cb.recv_am = [](void* req, ucs_status_t st, size_t, void* user) {
        (void)user;
        auto* self = static_cast<Server*>(user);
        auto it = self->receiving_.find(req);
        if (it != self->receiving_.end()) {
          if (st == UCS_OK) self->ready_.push_back(std::move(it->second));
          self->receiving_.erase(it);
        }
        ucp_request_free(req);
      };
      void* r = ucp_am_recv_data_nbx(worker_->get(), in->rndv_desc, in->body.data(), in->body.size(), &p);
      if (r == nullptr) {
        ready_.emplace_back(in);
      } else if (UCS_PTR_IS_ERR(r)) {
        delete in;
      } else {
        receiving_[r].reset(in);
      }
    }
  }

  void HandleReady() {
    while (!ready_.empty()) {
      std::unique_ptr<Incoming> in = std::move(ready_.front());
      ready_.pop_front();
      requests_.fetch_add(1, std::memory_order_relaxed);
      auto it = sessions_.find(in->nonce);
      if (in->header.opcode == Opcode::kHello && it == sessions_.end()) it = OpenSession(in->nonce, in->client_address);
      if (it == sessions_.end() || it->second->failed) {
        // No session (a frame before HELLO, or its client is gone): nowhere to answer.
        handler_.malformed.fetch_add(1);
        continue;
      }
      Session& ss = *it->second;
      ss.last_used = ++use_clock_;
      // Every frame, one-sided ones included, enters through the handler;
      // those it hands to the session's UcxSessionMemory are answered when
      // their transfer is done.
      auto out = std::make_unique<Outgoing>();
      const FrameOutcome oc = handler_.Handle(in->header, in->body, &ss.auth, &out->rep);
      if (oc == FrameOutcome::kClose) {
        CloseSession(it);
        continue;
      }
      if (oc == FrameOutcome::kLater) continue;
      // "Closing" a UCX peer otherwise forgets its handshake: its next frame
      // must be a (valid) HELLO again.
      if (oc != FrameOutcome::kReply) ss.auth.Reset();
      // HELLO answers go on the watch endpoint: its connection then exists
      // both ways, so either side's death is seen.
      out->nonce = ss.nonce;
      Send(in->header.opcode == Opcode::kHello ? ss.watch : ss.ep, std::move(out),
           in->header.opcode == Opcode::kGet && oc == FrameOutcome::kReply);
    }
  }

  using Sessions = std::map<uint64_t, std::unique_ptr<Session>>;

  // A session for a HELLO: an endpoint of this node's own to the client's
  // worker, with an error callback. end() when it cannot be made.
  Sessions::iterator OpenSession(uint64_t nonce, const std::string& address) {
    if (sessions_.size() >= kMaxSessions) {
      auto lru = sessions_.begin();
      for (auto i = sessions_.begin(); i != sessions_.end(); ++i)
        if (i->second->last_used < lru->second->last_used) lru = i;
      CloseSession(lru);
    }
    auto ss = std::make_unique<Session>();
    ss->server = this;
    ss->nonce = nonce;
    // The data endpoint without peer error handling (UCX may then use shared
    // memory and CMA between processes of one host); the watch endpoint with
    // it: UCX 1.13 handles peer failure on TCP only. The client's HELLO
    // carries its data and watch workers' addresses (PackEndpointPair; a
    // plain address serves both); the watch endpoint is this node's watch
    // worker's, so the data worker has no TCP connection to poll.
    const auto [data_address, watch_address] = UnpackEndpointPair(address);
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.address = reinterpret_cast<const ucp_address_t*>(data_address.data());
    ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    if (ucp_ep_create(worker_->get(), &ep, &ss->ep) != UCS_OK) return sessions_.end();
    ep.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = [](void* arg, ucp_ep_h, ucs_status_t) {
      auto* s = static_cast<Session*>(arg);
      s->failed = true;  // closed by the loop (CloseFailed), never from inside UCX's callback
      s->server->failed_.push_back(s->nonce);
    };
    ep.err_handler.arg = ss.get();
    ep.address = reinterpret_cast<const ucp_address_t*>(watch_address.data());
    if (ucp_ep_create(watch_worker_->get(), &ep, &ss->watch) != UCS_OK) {
      CloseEp(ss->ep, 0, nullptr);
      return sessions_.end();
    }
    // A finished transfer's answer goes to the session if it is still there.
    ss->memory = std::make_unique<UcxSessionMemory>(rma_.get(), ss->ep, [this, nonce](std::unique_ptr<FrameReply> rep) {
      auto it = sessions_.find(nonce);
      if (it == sessions_.end() || it->second->failed) return;  // the client is gone
      auto o = std::make_unique<Outgoing>();
      o->rep = std::move(*rep);
      o->nonce = nonce;
      Send(it->second->ep, std::move(o), /*get_answer=*/false);
    });
    ss->auth.memory = ss->memory.get();
    return sessions_.emplace(nonce, std::move(ss)).first;
  }

  // Closes the session's endpoints and forgets the session, both forced:
  // their pending operations complete at once with an error (a dead client's
  // would never complete on the data endpoint, which has no peer-failure
  // handling); the close requests are reaped later, the session's remote keys
  // with them (no operation is left on them then).
  void CloseSession(Sessions::iterator it) {
    CloseEp(it->second->watch, UCP_EP_CLOSE_FLAG_FORCE, nullptr);
    CloseEp(it->second->ep, UCP_EP_CLOSE_FLAG_FORCE, it->second->memory->regions());
    sessions_.erase(it);
  }
  void CloseEp(ucp_ep_h ep, uint32_t flags, std::shared_ptr<UcxRegionTable> regions) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = flags;
    void* r = ucp_ep_close_nbx(ep, &p);
    if (r != nullptr && !UCS_PTR_IS_ERR(r)) closing_.push_back({r, std::move(regions)});
  }

  void CloseFailed() {
    for (uint64_t nonce : failed_) {
      auto it = sessions_.find(nonce);
      if (it != sessions_.end() && it->second->failed) CloseSession(it);
    }
    failed_.clear();
  }

  void ReapCloses() {
    // A watch endpoint's close completes in its worker's progress, which
    // its fd need not announce.
    if (!closing_.empty()) watch_worker_->ProgressAll();
    for (size_t i = 0; i < closing_.size();) {
      if (ucp_request_check_status(closing_[i].req) == UCS_INPROGRESS) {
        ++i;
        continue;
      }
      ucp_request_free(closing_[i].req);
      closing_[i] = closing_.back();
      closing_.pop_back();
    }
  }

  // Sends a reply: the frame header as the AM header, the body's pieces as
  // the AM data, gathered from where they lie: a GET's payloads straight
  // from their pool slots, pinned (out->rep.refs) until the send completes,
  // with no copy. A GET answer's item table rides in the AM header after the
  // frame header when it fits (docs/protocol.md "UCX"), so the data is the
  // payloads alone: the client, knowing every size before it accepts the
  // data, receives them straight into its callers' buffers, and a single
  // payload goes as one contiguous buffer, which UCX's rendezvous reads in
  // place from the mapped pool. A send to a client that stopped reading may
  // not complete (the data endpoint has no peer-failure handling):
  // SweepPinned closes its session after max_pinned_send_ms, which completes
  // the send and drops its pins.
  void Send(ucp_ep_h ep, std::unique_ptr<Outgoing> out, bool get_answer) {
    auto& pieces = out->rep.pieces;  // pieces[0] is the header: it goes as the AM header
    const void* amh = out->rep.header.data();
    size_t amh_len = kHeaderSize;
    size_t first = 1;
    if (get_answer && pieces.size() >= 2 && TableFitsHeader(out->rep, pieces[1].size())) {
      out->amh.resize(kHeaderSize + pieces[1].size());
      std::memcpy(out->amh.data(), out->rep.header.data(), kHeaderSize);
      std::memcpy(out->amh.data() + kHeaderSize, pieces[1].data(), pieces[1].size());
      amh = out->amh.data();
      amh_len = out->amh.size();
      first = 2;
    }
    for (size_t i = first; i < pieces.size(); ++i)
      if (!pieces[i].empty()) out->iov.push_back({const_cast<std::byte*>(pieces[i].data()), pieces[i].size()});
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_DATATYPE;
    // An empty answer body (SEQ_TRUNCATE, SEQ_RELEASE, a GET of misses)
    // goes as zero contiguous bytes: UCX refuses an iov datatype with no
    // entries. One piece goes contiguous (rendezvous zero-copy).
    static const std::byte kNoBody{};
    const void* data = &kNoBody;
    size_t count = 0;
    p.datatype = ucp_dt_make_contig(1);
    if (out->iov.size() == 1) {
      data = out->iov[0].buffer;
      count = out->iov[0].length;
    } else if (out->iov.size() > 1) {
      p.datatype = ucp_dt_make_iov();
      data = out->iov.data();
      count = out->iov.size();
    }
    Outgoing* raw = out.get();
    p.user_data = this;
    p.cb.send = [](void* req, ucs_status_t, void* user) {
      auto* self = static_cast<Server*>(user);
      if (self->inflight_.erase(req) == 0) self->abandoned_.erase(req);
      ucp_request_free(req);
    };
    void* r = ucp_am_send_nbx(ep, kUcxAmReply, amh, amh_len, data, count, &p);
    if (r == nullptr || UCS_PTR_IS_ERR(r)) return;  // sent (or failed) at once: `out` may go
    raw->since = std::chrono::steady_clock::now();
    inflight_[r] = std::move(out);
  }

  // A successful GET answer whose item table (`table` bytes) fits the AM
  // header: only those carry it there; an error answer keeps its message as data.
  bool TableFitsHeader(const FrameReply& rep, size_t table) const {
    if (table > kMaxTableInHeader || kHeaderSize + table > worker_->max_am_header()) return false;
    FrameHeader h;
    const ProtocolLimits any{UINT32_MAX, UINT32_MAX, UINT32_MAX};
    return DecodeHeader(rep.header, any, &h).ok() && h.status == StatusCode::kOk &&
           size_t{h.count} * kGetItemSize == table;
  }

  // Ends the sends that have held pool pins for longer than
  // max_pinned_send_ms (their client stopped reading): closes their sessions
  // (forced) and drops their pins. UCX 1.13 does not always complete such a
  // send on a forced close (a rendezvous whose RTS the client never took
  // stays a request of UCX's), so the reply is kept, unpinned, among the
  // abandoned ones until its callback comes, and the loop no longer waits
  // for it. Its slots stay mapped; should UCX still read them, the client's
  // checksum check turns whatever they then hold into a miss. Checked at
  // most every 100 ms.
  void SweepPinned() {
    if (inflight_.empty()) return;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_sweep_ < std::chrono::milliseconds(100)) return;
    last_sweep_ = now;
    std::vector<void*> stuck;
    for (const auto& [req, o] : inflight_)
      if (!o->rep.refs.empty() && now - o->since > std::chrono::milliseconds(o_.max_pinned_send_ms))
        stuck.push_back(req);
    for (void* req : stuck) {
      auto o = inflight_.find(req);
      if (o == inflight_.end()) continue;  // completed by an earlier close
      auto it = sessions_.find(o->second->nonce);
      if (it != sessions_.end()) CloseSession(it);  // may complete (and erase) the send
      o = inflight_.find(req);
      if (o == inflight_.end()) continue;
      o->second->rep.refs.clear();
      abandoned_[req] = std::move(o->second);
      inflight_.erase(o);
    }
  }

  ShardNode* node_;
  UcxServerOptions o_;
  FrameHandler handler_;
  std::unique_ptr<UcxRma> rma_;  // holds the pool mappings; declared before worker_, so they outlive it
  asio::io_context io_{1};
  asio::posix::stream_descriptor sd_;
  asio::posix::stream_descriptor watch_sd_;  // the watch worker's fd (dup)
  std::unique_ptr<UcxWorker> worker_;
  std::unique_ptr<UcxWorker> watch_worker_;  // the sessions' watch endpoints (WatchLoop)
  std::string address_;                      // PackEndpointPair(data, watch)
  std::thread thread_;
  std::atomic<bool> stopped_{false};
  std::atomic<uint64_t> requests_{0};
  // Everything below is touched by the loop thread only (UCX callbacks run inside its progress calls).
  std::deque<std::unique_ptr<Incoming>> rndv_, ready_;
  std::map<void*, std::unique_ptr<Incoming>> receiving_;
  std::map<void*, std::unique_ptr<Outgoing>> inflight_;
  std::map<void*, std::unique_ptr<Outgoing>> abandoned_;  // unpinned by SweepPinned, awaiting UCX's callback
  Sessions sessions_;              // by client session nonce
  std::vector<uint64_t> failed_;   // sessions whose endpoint failed, to close
  struct Closing {
    void* req;                                 // the endpoint close request
    std::shared_ptr<UcxRegionTable> regions;   // its session's remote keys
  };
  std::vector<Closing> closing_;   // endpoint close requests in progress
  uint64_t use_clock_ = 0;
  std::chrono::steady_clock::time_point last_sweep_;  // SweepPinned's last look
};

// Several workers over one node: independent Servers, one address for all.
class Workers final : public UcxServer {
 public:
  explicit Workers(std::vector<std::unique_ptr<Server>> servers) : servers_(std::move(servers)) {
    std::vector<std::string> addresses;
    for (auto& s : servers_) addresses.push_back(s->address());
    address_ = PackWorkerAddresses(addresses);
  }
  ~Workers() override { Stop(); }
  const std::string& address() const override { return address_; }
  uint64_t requests() const override {
    uint64_t n = 0;
    for (auto& s : servers_) n += s->requests();
    return n;
  }
  std::vector<uint64_t> worker_requests() const override {
    std::vector<uint64_t> v;
    for (auto& s : servers_) v.push_back(s->requests());
    return v;
  }
  uint64_t one_sided_bytes() const override {
    uint64_t n = 0;
    for (auto& s : servers_) n += s->one_sided_bytes();
    return n;
  }
  uint64_t warm_pending_bytes() const override {
    uint64_t n = 0;
    for (auto& s : servers_) n += s->warm_pending_bytes();
    return n;
  }
  uint64_t warmed_bytes() const override {
    uint64_t n = 0;
    for (auto& s : servers_) n += s->warmed_bytes();
    return n;
  }
  uint64_t admitted(Opcode op) const override {
    uint64_t n = 0;
    for (auto& s : servers_) n += s->admitted(op);
    return n;
  }
  uint64_t stale_refused() const override {
    uint64_t n = 0;
    for (auto& s : servers_) n += s->stale_refused();
    return n;
  }
  size_t pool_mappings() const override {
    std::set<const UcxMemory*> distinct;
    for (auto& s : servers_)
      for (const auto& m : s->pools()) distinct.insert(m.get());
    return distinct.size();
  }
  void Stop() override {
    for (auto& s : servers_) s->Stop();
  }

 private:
  std::vector<std::unique_ptr<Server>> servers_;
  std::string address_;
};

}  // namespace

Result<std::unique_ptr<UcxServer>> UcxServer::Start(ShardNode* node, UcxServerOptions options,
                                                    const std::atomic<uint64_t>* epoch) {
  if (options.workers < 1 || options.workers > 255) return InvalidArgument("UCX workers must be in 1..255");
  // One context for all workers (each driven by its own thread, hence
  // mt_workers_shared when there are several): the pool is mapped once.
  KVMESH_ASSIGN_OR_RETURN(std::shared_ptr<UcxContext> context, UcxContext::Create(options.workers > 1));
  KVMESH_ASSIGN_OR_RETURN(UcxRma::Pools pools, UcxRma::MapPools(node, *context));
  std::vector<std::unique_ptr<Server>> servers;
  for (int i = 0; i < options.workers; ++i) {
    auto s = std::make_unique<Server>(node, options, epoch);
    KVMESH_RETURN_IF_ERROR(s->Init(context, pools));
    servers.push_back(std::move(s));
  }
  if (servers.size() == 1) return std::unique_ptr<UcxServer>(std::move(servers[0]));
  return std::unique_ptr<UcxServer>(std::make_unique<Workers>(std::move(servers)));
}

}  // namespace kvmesh

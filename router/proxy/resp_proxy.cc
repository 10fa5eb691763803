#include "router/proxy/resp_proxy.h"

#include <algorithm>
#include <atomic>
#include <list>
#include <thread>
#include <unordered_set>

#include "kvmesh/router.h"
#include "router/proxy/resp_engine.h"
#include "transport/asio.h"
#include "transport/asio_listener.h"
#include "transport/asio_tls.h"
#include "transport/resp/resp_commands.h"
#include "transport/resp/resp_connection.h"
#include "transport/resp/resp_session.h"

namespace kvmesh {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;

constexpr size_t kMaxRunCommands = 256;  // commands parsed per read
constexpr size_t kFlushBytes = 8u << 20; // answers gathered before they are written (or the limit, if lower)
constexpr size_t kFirstReadBytes = 256u << 10;  // an authenticated connection's read buffer at first ...
constexpr size_t kMaxReadBytes = 4u << 20;      // ... and as far as pipelining grows it

// The keys a segment of side-by-side commands touches: a command that reads
// a key another one writes, or writes one another reads (or writes, unless
// both are blind writes: RespCommands::KeyAccess), starts the next segment,
// so each connection's commands keep their order.
class Segment {
 public:
  bool Conflicts(const RespCommand& c) const {
    const RespCommands::KeyAccess a = RespCommands::Access(c);
    for (size_t i = a.first; i < a.end; i += a.step) {
      const std::string_view k = c[i];
      if (writes_.count(k)) return true;
      if (a.writes && reads_.count(k)) return true;
      if (a.writes && !a.blind && blind_.count(k)) return true;
      if (!a.writes && blind_.count(k)) return true;
    }
    return false;
  }
  void Add(const RespCommand& c) {
    const RespCommands::KeyAccess a = RespCommands::Access(c);
    for (size_t i = a.first; i < a.end; i += a.step) (a.writes ? (a.blind ? blind_ : writes_) : reads_).insert(c[i]);
  }
  void Clear() {
    reads_.clear();
    writes_.clear();
    blind_.clear();
  }

 private:
  std::unordered_set<std::string_view> reads_, writes_, blind_;
};

class Proxy final : public RespProxy {
 public:
  explicit Proxy(RespProxyOptions o)
      : o_(std::move(o)),
        commands_(FrontOptions(o_)),
        helpers_(1),
        limiter_(o_.limits.max_connections, o_.limits.max_connections_per_peer) {
    const uint32_t n = std::max<uint32_t>(1, o_.io_threads);
    for (uint32_t i = 0; i < n; ++i) loops_.push_back(std::make_unique<Loop>());
    acceptor_ = std::make_unique<tcp::acceptor>(loops_[0]->io);
  }
  ~Proxy() override { Stop(); }

  Status Bind() {
    if (!o_.map) return InvalidArgument("RESP proxy needs a shard map source");
    boost::system::error_code ec;
    auto addr = asio::ip::make_address(o_.host, ec);
    if (ec) return InvalidArgument("bad listen address " + o_.host + ": " + ec.message());
    tcp::endpoint ep(addr, o_.port);
    acceptor_->open(ep.protocol(), ec);
    if (!ec) acceptor_->set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_->bind(ep, ec);
    if (!ec) acceptor_->listen(asio::socket_base::max_listen_connections, ec);
    if (ec) return Unavailable("RESP proxy listen on " + o_.host + ":" + std::to_string(o_.port) + ": " + ec.message());
    port_ = acceptor_->local_endpoint().port();
    RespEngineOptions eo;
    eo.map = o_.map;
    eo.refresh = o_.refresh;
    eo.stats = o_.stats;
    eo.timeout_ms = o_.timeout_ms;
    eo.block_bytes = o_.block_bytes;
    eo.link.client_id = o_.client_id;
    eo.link.tenant = o_.tenant;
    eo.link.token = o_.token;
    eo.link.connect_timeout_ms = o_.connect_timeout_ms;
    eo.link.limits.max_block_bytes =
        static_cast<uint32_t>(std::clamp<uint64_t>(o_.block_bytes, eo.link.limits.max_block_bytes, UINT32_MAX));
    eo.link.limits.max_body_bytes = std::max<uint32_t>(eo.link.limits.max_body_bytes, eo.link.limits.max_block_bytes + (1u << 20));
    if (o_.tls.enabled()) {
      if (o_.client_tls) {
        KVMESH_ASSIGN_OR_RETURN(tls_, MakeTlsServerContext(o_.tls, o_.tls.client_auth == "all"));
      }
      KVMESH_ASSIGN_OR_RETURN(eo.link.tls, MakeAsioTlsClientContext(o_.tls));
      eo.link.verify_hostname = o_.tls.verify_hostname;
    }
    engine_options_ = eo;
    for (auto& l : loops_) l->engines.push_back(std::make_unique<RespEngine>(l->io, helpers_, eo));
    asio::co_spawn(loops_[0]->io, Accept(), asio::detached);
    for (auto& l : loops_) {
      Loop* lp = l.get();
      lp->guard.emplace(asio::make_work_guard(lp->io));
      lp->thread = std::thread([lp] { lp->io.run(); });
    }
    return Status::Ok();
  }

  uint16_t port() const override { return port_; }
  uint64_t commands() const override { return commands_.commands(); }
  uint64_t tls_failures() const override { return tls_failures_.load(std::memory_order_relaxed); }
  uint64_t connections_refused() const override { return limiter_.refused(); }
  const WatchCounters& timeouts() const override { return timeouts_; }

  void Stop() override {
    if (stopped_.exchange(true)) return;
    for (size_t i = 0; i < loops_.size(); ++i) {
      Loop* lp = loops_[i].get();
      asio::post(lp->io, [this, lp, first = i == 0] {
        boost::system::error_code ec;
        if (first) acceptor_->close(ec);
        for (auto& e : lp->engines)
          if (e) e->Stop();
        for (tcp::socket* s : lp->conns) s->close(ec);
        lp->io.stop();
      });
    }
    for (auto& l : loops_)
      if (l->thread.joinable()) l->thread.join();
    helpers_.join();  // map refreshes and stats calls (bounded by their timeouts)
  }

 private:
  struct Loop {
    asio::io_context io{1};
    std::optional<asio::executor_work_guard<asio::io_context::executor_type>> guard;
    // By identity: [0] the cluster's, [i] tenant i's, made at its first use.
    // Destroyed before io (they post nothing once stopped).
    std::vector<std::unique_ptr<RespEngine>> engines;
    std::list<tcp::socket*> conns;       // open client connections (closed by Stop)
    std::thread thread;
  };

  static RespFrontOptions FrontOptions(const RespProxyOptions& o) {
    RespFrontOptions f;
    f.block_bytes = o.block_bytes;
    f.max_value_bytes = o.max_value_bytes;
    f.rules = o.rules;
    f.auth = o.auth;
    f.role = "proxy";
    return f;
  }

  // The engine for `identity` on `loop`: made at first use, its node links
  // saying HELLO as that tenant.
  RespEngine& EngineFor(Loop& loop, uint32_t identity) {
    if (identity >= loop.engines.size()) loop.engines.resize(identity + 1);
    std::unique_ptr<RespEngine>& e = loop.engines[identity];
    if (!e) {
      RespEngineOptions eo = engine_options_;
      if (identity > 0 && identity <= o_.tenants.size()) {
        eo.link.tenant = o_.tenants[identity - 1].name;
        eo.link.token = o_.tenants[identity - 1].token;
        eo.stats = nullptr;  // the cluster's totals are not a tenant's
      }
      e = std::make_unique<RespEngine>(loop.io, helpers_, eo);
    }
    return *e;
  }

  asio::awaitable<void> Accept() {
    size_t next = 0;
    for (;;) {
      boost::system::error_code ec;
      Loop& l = *loops_[next++ % loops_.size()];
      tcp::socket s = co_await acceptor_->async_accept(l.io, asio::redirect_error(asio::use_awaitable, ec));
      if (ec) {
        if (!acceptor_->is_open()) co_return;
        if (ec == asio::error::no_descriptors || ec == asio::error::no_buffer_space) {
          asio::steady_timer t(loops_[0]->io, std::chrono::milliseconds(50));  // no spinning on the same error
          co_await t.async_wait(asio::redirect_error(asio::use_awaitable, ec));
        }
        continue;
      }
      // $.limits: connections of this port and of one peer.
      const tcp::endpoint peer = s.remote_endpoint(ec);
      ConnectionLimiter::Slot slot = ec ? ConnectionLimiter::Slot() : limiter_.Admit(peer.address());
      if (!slot) {
        if (!ec && !tls_) RespRefuseConnection(s);
        s.close(ec);
        continue;
      }
      asio::co_spawn(l.io, Connection(l, std::move(s), std::move(slot)), asio::detached);
    }
  }

  // One client connection, on its loop: plain, or TLS after its handshake
  // (ServeAccepted). The TLS handshake and AUTH within handshake_timeout_ms,
  // a command begun within read_timeout_ms, answers taken within
  // write_timeout_ms.
  asio::awaitable<void> Connection(Loop& loop, tcp::socket s, [[maybe_unused]] ConnectionLimiter::Slot slot) {
    auto reg = loop.conns.insert(loop.conns.end(), &s);
    RespLoopOptions lo;
    lo.max_bulk = RespMaxBulk(o_.max_value_bytes);
    lo.preauth = RespPreauthBytes(o_.limits, lo.max_bulk);
    lo.flush_bytes = std::min<uint64_t>(kFlushBytes, o_.limits.max_pending_answer_bytes);
    lo.max_run = kMaxRunCommands;
    lo.first_read_bytes = kFirstReadBytes;
    lo.grow_read_bytes = kMaxReadBytes;
    lo.keep_read_bytes = kMaxReadBytes;
    Runner runner(*this, loop);
    co_await ServeAccepted(s, {tls_.get(), o_.limits, &timeouts_, &tls_failures_},
                           [&](auto& stream, ConnectionWatch& watch) {
                             return ServeRespCommands(stream, watch, commands_, lo, runner);
                           });
    loop.conns.erase(reg);
  }

  // The commands of one client connection, run by the loop's engines.
  //
  // Backpressure: the answers the connection holds (fetched, not yet
  // written) stay within its AnswerBudget ($.limits.max_pending_answer_bytes,
  // plus the one answer it takes next): ops whose reads would go past it
  // wait, and answers are written as soon as they are due in order, so a
  // client that stops reading stops the fetching (and, after the write
  // timeout, loses its connection). Nothing more is read from the client
  // while its answers are being written.
  class Runner final : public RespRunner {
   public:
    Runner(Proxy& p, Loop& loop) : p_(p), loop_(loop), budget_(p.o_.limits.max_pending_answer_bytes), wake_(loop.io) {}

    // Segments of commands side by side, answered in order.
    asio::awaitable<bool> Run(std::span<const RespCommand> cmds, RespConnection& c) override {
      c.watch.Busy();  // waiting for the nodes is bounded by their timeout, not the client's
      const size_t n = cmds.size();
      size_t i = 0;
      while (i < n && !c.quit && !broken_) {
        ops_.clear();
        seg_.Clear();
        // A segment runs as one identity: an AUTH that changes it ends the segment.
        const uint32_t identity = c.state.identity;
        while (i < n && !c.quit && (ops_.empty() || !seg_.Conflicts(cmds[i])) && c.state.identity == identity) {
          seg_.Add(cmds[i]);
          ops_.push_back(p_.commands_.Compile(cmds[i], &c.state, &c.quit));
          ++i;
        }
        raw_.clear();
        for (auto& op : ops_) raw_.push_back(op.get());
        finished_.assign(ops_.size(), 0);
        reserved_.assign(ops_.size(), 0);
        bool batch_done = false;
        RespEngine& engine = p_.EngineFor(loop_, identity);
        engine_ = &engine;
        engine.Run(
            raw_, p_.commands_.Env(),
            [&batch_done, this] {
              batch_done = true;
              wake_.cancel();
            },
            &budget_,
            [this](size_t k, uint64_t r) {
              finished_[k] = 1;
              reserved_[k] = r;
              wake_.cancel();
            });
        // Take the answers in order as they come; write them when the budget
        // wants room (an op waits) or they are many.
        size_t next = 0;
        while (next < ops_.size()) {
          const size_t before = next;
          for (; next < ops_.size() && finished_[next]; ++next) {
            if (!broken_) ops_[next]->Answer(&c.out);
            unwritten_ += reserved_[next];
          }
          if (next != before) engine.Taken(&budget_, next);
          if (next == ops_.size()) break;
          if (!broken_ && !c.out.empty() &&
              (budget_.parked() || budget_.held() > budget_.limit() || c.out.bytes() > c.flush_bytes)) {
            if (!co_await c.Flush()) {
              broken_ = true;  // the client is gone: let the rest run out, answer nothing
              engine.Abandon(&budget_);
            }
            c.watch.Busy();
            continue;
          }
          if (!finished_[next]) co_await Wait();
        }
        while (!batch_done) co_await Wait();  // the engine is done with the ops (and these callbacks)
        ops_.clear();  // the answers keep what they borrow
        if (!broken_ && !c.out.empty() && i < n && (c.out.bytes() > c.flush_bytes || budget_.held() > budget_.limit())) {
          if (!co_await c.Flush()) broken_ = true;
          c.watch.Busy();
        }
        engine_ = nullptr;
      }
      co_return !broken_;
    }

    // The answers written give their bytes back to the budget (through the
    // segment's engine, else the connection's identity's).
    void Written(RespConnection& c) override {
      (engine_ ? *engine_ : p_.EngineFor(loop_, c.state.identity)).Written(&budget_, unwritten_);
      unwritten_ = 0;
    }

   private:
    // Until an op of the segment is answered (the engine's callbacks cancel the wait).
    asio::awaitable<void> Wait() {
      wake_.expires_at(asio::steady_timer::time_point::max());
      boost::system::error_code ec;
      co_await wake_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    }

    Proxy& p_;
    Loop& loop_;
    AnswerBudget budget_;
    asio::steady_timer wake_;
    RespEngine* engine_ = nullptr;  // the engine of the segment running now
    std::vector<std::unique_ptr<RespOp>> ops_;
    std::vector<RespOp*> raw_;
    Segment seg_;
    std::vector<uint8_t> finished_;
    std::vector<uint64_t> reserved_;
    uint64_t unwritten_ = 0;  // the budget the answers in `out` hold
    bool broken_ = false;
  };

  RespProxyOptions o_;
  RespCommands commands_;
  asio::thread_pool helpers_;
  std::vector<std::unique_ptr<Loop>> loops_;
  std::unique_ptr<tcp::acceptor> acceptor_;  // on loop 0
  RespEngineOptions engine_options_;          // the cluster identity's; tenants' differ in the HELLO
  std::shared_ptr<asio::ssl::context> tls_;   // the client port's (null: plain)
  std::atomic<uint64_t> tls_failures_{0};
  ConnectionLimiter limiter_;                 // $.limits: connections per port and per peer
  WatchCounters timeouts_;
  uint16_t port_ = 0;
  std::atomic<bool> stopped_{false};
};

}  // namespace

Result<std::unique_ptr<RespProxy>> RespProxy::Start(RespProxyOptions options) {
  auto p = std::make_unique<Proxy>(std::move(options));
  KVMESH_RETURN_IF_ERROR(p->Bind());
  return std::unique_ptr<RespProxy>(std::move(p));
}

Result<std::unique_ptr<RespProxy>> RespProxy::Start(Router* router, RespProxyOptions options) {
  if (!options.map) options.map = [router] { return router->map(); };
  return Start(std::move(options));
}

}  // namespace kvmesh

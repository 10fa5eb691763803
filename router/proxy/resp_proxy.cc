#include "router/proxy/resp_proxy.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <list>
#include <thread>
#include <unordered_set>

#include "kvmesh/router.h"
#include "router/proxy/resp_engine.h"
#include "transport/asio.h"
#include "transport/asio_listener.h"
#include "transport/resp/resp_commands.h"
#include "transport/resp/resp_session.h"
#include "transport/asio_tls.h"

namespace kvmesh {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;

constexpr size_t kMaxRunCommands = 256;  // commands parsed per read
constexpr size_t kFlushBytes = 8u << 20; // answers gathered before they are written (or the limit, if lower)
constexpr size_t kFirstReadBytes = 256u << 10;  // an authenticated connection's read buffer at first ...
constexpr size_t kMaxReadBytes = 4u << 20;      // ... and as far as pipelining grows it
constexpr size_t kPreauthReadBytes = 4u << 10;  // one that has not authenticated yet (at most preauth_max_bytes)

std::vector<asio::const_buffer> Buffers(const RespReply& r) {
  std::vector<asio::const_buffer> b;
  b.reserve(r.pieces().size());
  for (auto p : r.pieces()) b.emplace_back(p.data(), p.size());
  return b;
}

// Writes `r` through TLS, small pieces merged into records; the watch closes
// the connection when the client does not take it within the write timeout.
asio::awaitable<void> WriteReply(asio::ssl::stream<tcp::socket&>& s, const RespReply& r, ConnectionWatch& watch,
                                 boost::system::error_code& ec) {
  std::string stage;
  std::vector<asio::const_buffer> bufs = CoalesceForTls(Buffers(r), &stage);
  co_await WatchedWrite(s, bufs, watch, ec);
}

// Writes `r`: at once when the socket takes it all (the usual case: no loop
// turn for the completion), else the rest asynchronously, as above.
asio::awaitable<void> WriteReply(tcp::socket& s, const RespReply& r, ConnectionWatch& watch,
                                 boost::system::error_code& ec) {
  std::vector<asio::const_buffer> bufs = Buffers(r);
  co_await WatchedWrite(s, bufs, watch, ec);  // non-blocking socket
}

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

  // One client connection, on its loop: plain, or TLS after its handshake.
  asio::awaitable<void> Connection(Loop& loop, tcp::socket s, [[maybe_unused]] ConnectionLimiter::Slot slot) {
    boost::system::error_code ec;
    s.set_option(tcp::no_delay(true), ec);
    auto reg = loop.conns.insert(loop.conns.end(), &s);
    {
      // The TLS handshake and AUTH within handshake_timeout_ms, a command
      // begun within read_timeout_ms, answers taken within write_timeout_ms.
      ConnectionWatch watch(s, o_.limits, &timeouts_);
      if (!tls_) {
        s.non_blocking(true, ec);  // WriteReply writes at once when it can
        co_await Serve(loop, s, watch);
      } else {
        asio::ssl::stream<tcp::socket&> tls(s, *tls_);
        co_await tls.async_handshake(asio::ssl::stream_base::server, asio::redirect_error(asio::use_awaitable, ec));
        if (ec) tls_failures_.fetch_add(1, std::memory_order_relaxed);
        else co_await Serve(loop, tls, watch);
      }
    }
    loop.conns.erase(reg);
    s.shutdown(tcp::socket::shutdown_both, ec);
    s.close(ec);
  }

  // The commands of one client connection.
  //
  // Backpressure: the answers the connection holds (fetched, not yet
  // written) stay within its AnswerBudget ($.limits.max_pending_answer_bytes,
  // plus the one answer it takes next): ops whose reads would go past it
  // wait, and answers are written as soon as they are due in order, so a
  // client that stops reading stops the fetching (and, after the write
  // timeout, loses its connection). Nothing more is read from the client
  // while its answers are being written.
  template <typename Stream>
  asio::awaitable<void> Serve(Loop& loop, Stream& s, ConnectionWatch& watch) {
    boost::system::error_code ec;
    const uint64_t max_bulk = RespMaxBulk(o_.max_value_bytes);
    const uint64_t preauth = RespPreauthBytes(o_.limits, max_bulk);
    const bool needs_auth = o_.auth && o_.auth->required();
    const uint64_t flush_bytes = std::min<uint64_t>(kFlushBytes, o_.limits.max_pending_answer_bytes);
    RespSessionState state;
    state.id = commands_.NextClientId();
    if (!needs_auth) watch.Authenticated();
    auto authed = [&] { return !needs_auth || state.authenticated; };
    RespReadBuffer buf;
    size_t filled = 0;
    RespCommandParser parser;
    std::vector<RespCommand> cmds(kMaxRunCommands);
    std::vector<std::unique_ptr<RespOp>> ops;
    std::vector<RespOp*> raw;
    Segment seg;
    AnswerBudget budget(o_.limits.max_pending_answer_bytes);
    uint64_t unwritten = 0;  // the budget the answers in `out` hold
    std::vector<uint8_t> finished;
    std::vector<uint64_t> reserved;
    asio::steady_timer wake(loop.io);  // cancelled when an op of the segment is answered
    bool quit = false, need_read = true, broken = false;
    RespReply out;
    // Writes `out` and gives its bytes back to the budget; false when the client is gone.
    auto flush = [&](RespEngine& engine) -> asio::awaitable<bool> {
      co_await WriteReply(s, out, watch, ec);
      out = RespReply();
      engine.Written(&budget, unwritten);
      unwritten = 0;
      co_return !ec;
    };
    while (!quit) {
      if (need_read) {
        const size_t max_buf = authed() ? max_bulk + kRespMaxInline + 64 : preauth;
        if (!buf.MakeRoom(filled, authed() ? kFirstReadBytes : kPreauthReadBytes, parser.wanted(), max_buf)) {
          if (!authed()) {  // cannot be a valid command (before AUTH: larger than it may be)
            out = RespReply();
            out.Err("ERR Protocol error: command longer than " + std::to_string(preauth) + " bytes before AUTH");
            co_await WriteReply(s, out, watch, ec);
          }
          break;
        }
        if (filled > 0) watch.Reading();  // a command has begun: it must keep arriving
        else watch.Idle();
        const size_t n = co_await s.async_read_some(asio::buffer(buf.data() + filled, buf.capacity() - filled),
                                                    asio::redirect_error(asio::use_awaitable, ec));
        if (ec) break;
        filled += n;
        // A read that filled the buffer: the client pipelines more than it
        // holds. Grow it (up to kMaxReadBytes) so that one round trip to the
        // nodes carries the whole pipeline, not a buffer's worth of it.
        if (filled == buf.capacity() && buf.capacity() < kMaxReadBytes && authed())
          buf.Resize(std::min(buf.capacity() * 2, kMaxReadBytes), filled);
      }
      // Parse what has arrived (up to kMaxRunCommands; one at a time before
      // AUTH, so that what follows it is read with the limits it lifts).
      const bool was_authed = authed();
      const size_t max_cmds = was_authed ? kMaxRunCommands : 1;
      size_t used = 0, n = 0;
      bool error = false;
      std::string err;
      while (n < max_cmds) {
        size_t u = 0;
        const RespParse p = parser.Parse(std::string_view(buf.data() + used, filled - used),
                                         was_authed ? max_bulk : preauth, &cmds[n], &u, &err);
        if (p == RespParse::kNeedMore) break;
        if (p == RespParse::kError) {
          if (!was_authed) err += " (at most " + std::to_string(preauth) + " bytes before AUTH)";
          error = true;
          break;
        }
        used += u;
        if (!cmds[n].empty()) ++n;
      }
      need_read = n < max_cmds;
      if (n > 0) watch.Busy();  // waiting for the nodes is bounded by their timeout, not the client's
      // Run them: segments of commands side by side, answered in order.
      size_t i = 0;
      while (i < n && !quit && !broken) {
        ops.clear();
        seg.Clear();
        // A segment runs as one identity: an AUTH that changes it ends the segment.
        const uint32_t identity = state.identity;
        while (i < n && !quit && (ops.empty() || !seg.Conflicts(cmds[i])) && state.identity == identity) {
          seg.Add(cmds[i]);
          ops.push_back(commands_.Compile(cmds[i], &state, &quit));
          ++i;
        }
        raw.clear();
        for (auto& op : ops) raw.push_back(op.get());
        finished.assign(ops.size(), 0);
        reserved.assign(ops.size(), 0);
        bool batch_done = false;
        RespEngine& engine = EngineFor(loop, identity);
        engine.Run(
            raw, commands_.Env(),
            [&batch_done, &wake] {
              batch_done = true;
              wake.cancel();
            },
            &budget,
            [&finished, &reserved, &wake](size_t k, uint64_t r) {
              finished[k] = 1;
              reserved[k] = r;
              wake.cancel();
            });
        // Take the answers in order as they come; write them when the budget
        // wants room (an op waits) or they are many.
        size_t next = 0;
        while (next < ops.size()) {
          const size_t before = next;
          for (; next < ops.size() && finished[next]; ++next) {
            if (!broken) ops[next]->Answer(&out);
            unwritten += reserved[next];
          }
          if (next != before) engine.Taken(&budget, next);
          if (next == ops.size()) break;
          if (!broken && !out.empty() &&
              (budget.parked() || budget.held() > budget.limit() || out.bytes() > flush_bytes)) {
            if (!co_await flush(engine)) {
              broken = true;  // the client is gone: let the rest run out, answer nothing
              engine.Abandon(&budget);
            }
            watch.Busy();
            continue;
          }
          if (!finished[next]) {
            wake.expires_at(asio::steady_timer::time_point::max());
            boost::system::error_code wec;
            co_await wake.async_wait(asio::redirect_error(asio::use_awaitable, wec));
          }
        }
        while (!batch_done) {  // the engine is done with the ops (and these callbacks)
          wake.expires_at(asio::steady_timer::time_point::max());
          boost::system::error_code wec;
          co_await wake.async_wait(asio::redirect_error(asio::use_awaitable, wec));
        }
        ops.clear();  // the answers keep what they borrow
        if (!broken && !out.empty() && i < n && (out.bytes() > flush_bytes || budget.held() > budget.limit())) {
          if (!co_await flush(engine)) broken = true;
          watch.Busy();
        }
      }
      if (!was_authed && authed()) watch.Authenticated();
      if (broken) break;
      if (error) out.Err("ERR Protocol error: " + err);
      if (!out.empty()) {
        if (!co_await flush(EngineFor(loop, state.identity))) break;
      }
      if (error) break;
      // Keep the unparsed tail (the commands that pointed into buf are answered).
      if (used > 0) {
        std::memmove(buf.data(), buf.data() + used, filled - used);
        filled -= used;
      }
      if (filled == 0 && buf.capacity() > kMaxReadBytes) buf.Resize(kFirstReadBytes, 0);  // after one large command
    }
  }

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

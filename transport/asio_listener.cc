#include "transport/asio_listener.h"

#include <algorithm>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

namespace kvmesh {

namespace asio = boost::asio;
using asio::ip::tcp;
using Clock = std::chrono::steady_clock;

// ---- ConnectionLimiter --------------------------------------------------------------

struct ConnectionLimiter::State {
  const uint32_t max_total, max_per_peer;
  mutable std::mutex mu;
  uint64_t total = 0;                                  // guarded by mu
  std::unordered_map<std::string, uint32_t> per_peer;  // guarded by mu; only peers with a connection
  std::atomic<uint64_t> refused{0};
  State(uint32_t t, uint32_t p) : max_total(t), max_per_peer(p) {}
};

ConnectionLimiter::ConnectionLimiter(uint32_t max_connections, uint32_t max_per_peer)
    : state_(std::make_shared<State>(max_connections, max_per_peer)) {}

ConnectionLimiter::Slot& ConnectionLimiter::Slot::operator=(Slot&& o) noexcept {
  if (this != &o) {
    Release();
    state_ = std::move(o.state_);
    peer_ = std::move(o.peer_);
  }
  return *this;
}

void ConnectionLimiter::Slot::Release() {
  if (!state_) return;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    --state_->total;
    auto it = state_->per_peer.find(peer_);
    if (it != state_->per_peer.end() && --it->second == 0) state_->per_peer.erase(it);
  }
  state_.reset();
}

ConnectionLimiter::Slot ConnectionLimiter::Admit(const asio::ip::address& peer) {
  Slot slot;
  // An IPv4 peer reached over an IPv6 socket counts as the IPv4 address.
  const asio::ip::address a =
      peer.is_v6() && peer.to_v6().is_v4_mapped() ? asio::ip::address(asio::ip::make_address_v4(asio::ip::v4_mapped, peer.to_v6())) : peer;
  std::string key = a.to_string();
  std::lock_guard<std::mutex> lock(state_->mu);
  uint32_t& n = state_->per_peer[key];
  if ((state_->max_total != 0 && state_->total >= state_->max_total) ||
      (state_->max_per_peer != 0 && n >= state_->max_per_peer)) {
    if (n == 0) state_->per_peer.erase(key);
    state_->refused.fetch_add(1, std::memory_order_relaxed);
    return slot;
  }
  ++n;
  ++state_->total;
  slot.state_ = state_;
  slot.peer_ = std::move(key);
  return slot;
}

uint64_t ConnectionLimiter::refused() const { return state_->refused.load(std::memory_order_relaxed); }

uint64_t ConnectionLimiter::open() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->total;
}

// ---- ConnectionWatch ----------------------------------------------------------------

namespace {
enum Phase : int { kIdle = 0, kReading = 1, kWriting = 2, kBusy = 3 };

std::chrono::milliseconds Ms(int64_t v) { return std::chrono::milliseconds(v); }
}  // namespace

struct ConnectionWatch::State {
  State(tcp::socket& s, const LimitsConfig& l, WatchCounters* c)
      : socket(&s), timer(s.get_executor()), counters(c), start(Clock::now()), since(start) {
    handshake = Ms(l.handshake_timeout_ms);
    read = Ms(l.read_timeout_ms);
    write = Ms(l.write_timeout_ms);
    idle = Ms(l.idle_timeout_ms);
    std::chrono::milliseconds shortest = std::min({handshake, read, write});
    if (idle.count() > 0) shortest = std::min(shortest, idle);
    tick = std::max<Clock::duration>(shortest / 4, std::chrono::milliseconds(1));
  }

  tcp::socket* socket;  // null once the watch is gone
  asio::steady_timer timer;
  WatchCounters* counters;
  std::chrono::milliseconds handshake, read, write, idle;
  Clock::duration tick;
  Clock::time_point start, since;  // accepted; the phase began or made progress
  int phase = kIdle;
  bool authenticated = false;
  bool armed = false;
  const char* expired = nullptr;

  // The time this connection is closed at, unless something happens first
  // (time_point::max(): never), and why.
  Clock::time_point Deadline(const char** why) const {
    Clock::time_point d = Clock::time_point::max();
    *why = nullptr;
    auto consider = [&](Clock::time_point t, const char* w) {
      if (t < d) d = t, *why = w;
    };
    if (!authenticated) consider(start + handshake, "handshake");
    if (phase == kReading) consider(since + read, "read");
    if (phase == kWriting) consider(since + write, "write");
    if (phase == kIdle && authenticated && idle.count() > 0) consider(since + idle, "idle");
    return d;
  }

  static void Arm(const std::shared_ptr<State>& st) {
    const char* why = nullptr;
    const Clock::time_point d = st->Deadline(&why);
    if (d == Clock::time_point::max()) {  // nothing to watch: sleep until a state change arms again
      st->armed = false;
      return;
    }
    const Clock::time_point now = Clock::now();
    st->armed = true;
    st->timer.expires_at(std::min(d, now + st->tick));
    st->timer.async_wait([st](const boost::system::error_code& ec) {
      if (ec || st->socket == nullptr || st->expired != nullptr) {
        st->armed = false;
        return;
      }
      const char* w = nullptr;
      if (Clock::now() >= st->Deadline(&w) && w != nullptr) {
        st->expired = w;
        st->armed = false;
        if (st->counters) {
          std::atomic<uint64_t>& c = w[0] == 'h' ? st->counters->handshake
                                     : w[0] == 'r' ? st->counters->read
                                     : w[0] == 'w' ? st->counters->write
                                                   : st->counters->idle;
          c.fetch_add(1, std::memory_order_relaxed);
        }
        boost::system::error_code ignore;
        if (w[0] == 'w') {
          // An answer the peer does not take: reset the connection, so the
          // kernel drops what it still holds of it (a FIN would wait behind
          // it until the peer reads) and the peer sees the close at once.
          st->socket->set_option(asio::socket_base::linger(true, 0), ignore);
        }
        st->socket->close(ignore);  // every pending operation fails now
        return;
      }
      Arm(st);
    });
  }
};

ConnectionWatch::ConnectionWatch(tcp::socket& socket, const LimitsConfig& limits, WatchCounters* counters)
    : st_(std::make_shared<State>(socket, limits, counters)) {
  State::Arm(st_);
}

ConnectionWatch::~ConnectionWatch() {
  st_->socket = nullptr;
  st_->timer.cancel();
}

void ConnectionWatch::Set(int phase) {
  st_->phase = phase;
  st_->since = Clock::now();
  if (!st_->armed && st_->expired == nullptr) State::Arm(st_);
}

void ConnectionWatch::Authenticated() {
  if (st_->authenticated) return;
  st_->authenticated = true;
}
void ConnectionWatch::Idle() { Set(kIdle); }
void ConnectionWatch::Reading() { Set(kReading); }
void ConnectionWatch::Writing() { Set(kWriting); }
void ConnectionWatch::Busy() { Set(kBusy); }
bool ConnectionWatch::authenticated() const { return st_->authenticated; }
const char* ConnectionWatch::expired() const { return st_->expired; }

// ---- AsioListener -------------------------------------------------------------------

namespace {

// A session holding its connection's slot until it ends.
asio::awaitable<void> RunSession(const AsioListener::Session* session, tcp::socket s,
                                 [[maybe_unused]] ConnectionLimiter::Slot slot) {  // held until the session ends
  co_await (*session)(std::move(s));
}

class Listener final : public AsioListener {
 public:
  Listener(AsioListenerOptions o, Session session)
      : o_(std::move(o)), session_(std::move(session)), limiter_(o_.max_connections, o_.max_connections_per_peer) {
    for (uint32_t i = 0; i < o_.session_threads; ++i) ios_.push_back(std::make_unique<asio::io_context>(1));
  }
  ~Listener() override { Stop(); }

  Status Bind() {
    boost::system::error_code ec;
    auto addr = asio::ip::make_address(o_.host, ec);
    if (ec) return InvalidArgument("bad listen address " + o_.host + ": " + ec.message());
    tcp::endpoint ep(addr, o_.port);
    acceptor_.open(ep.protocol(), ec);
    if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(ep, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) return Unavailable(o_.what + " listen on " + o_.host + ":" + std::to_string(o_.port) + ": " + ec.message());
    port_ = acceptor_.local_endpoint().port();
    asio::co_spawn(accept_io_, Accept(), asio::detached);
    for (auto& io : ios_) guards_.emplace_back(asio::make_work_guard(*io));
    threads_.emplace_back([this] { accept_io_.run(); });
    for (auto& io : ios_) threads_.emplace_back([p = io.get()] { p->run(); });
    return Status::Ok();
  }

  uint16_t port() const override { return port_; }
  uint64_t refused() const override { return limiter_.refused(); }
  uint64_t open() const override { return limiter_.open(); }

  void Stop() override {
    if (stopped_.exchange(true)) return;
    asio::post(accept_io_, [this] {
      boost::system::error_code ec;
      acceptor_.close(ec);
      accept_io_.stop();
    });
    for (auto& io : ios_) io->stop();
    for (auto& t : threads_)
      if (t.joinable()) t.join();
  }

 private:
  asio::awaitable<void> Accept() {
    for (;;) {
      boost::system::error_code ec;
      asio::io_context& io = ios_.empty() ? accept_io_ : *ios_[next_io_ % ios_.size()];
      tcp::socket s = co_await acceptor_.async_accept(io, asio::redirect_error(asio::use_awaitable, ec));
      if (ec) {
        if (!acceptor_.is_open()) co_return;
        if (ec == asio::error::no_descriptors || ec == asio::error::no_buffer_space) {
          // Out of file descriptors: wait a little instead of spinning on the same error.
          asio::steady_timer t(accept_io_, std::chrono::milliseconds(50));
          co_await t.async_wait(asio::redirect_error(asio::use_awaitable, ec));
        }
        continue;
      }
      const tcp::endpoint peer = s.remote_endpoint(ec);
      ConnectionLimiter::Slot slot = ec ? ConnectionLimiter::Slot() : limiter_.Admit(peer.address());
      if (!slot) {  // over a limit (or already gone): closed before it costs more than this
        if (!ec && o_.on_refused) {
          s.non_blocking(true, ec);
          o_.on_refused(s);
        }
        s.close(ec);
        continue;
      }
      ++next_io_;
      asio::co_spawn(io, RunSession(&session_, std::move(s), std::move(slot)), asio::detached);
    }
  }

  const AsioListenerOptions o_;
  const Session session_;
  ConnectionLimiter limiter_;
  // Order matters for destruction: the pending accept on accept_io_ holds a
  // socket of one of ios_, so accept_io_ must go first (declared after).
  std::vector<std::unique_ptr<asio::io_context>> ios_;
  std::vector<asio::executor_work_guard<asio::io_context::executor_type>> guards_;
  asio::io_context accept_io_{1};
  tcp::acceptor acceptor_{accept_io_};
  size_t next_io_ = 0;  // accept thread only
  std::vector<std::thread> threads_;
  uint16_t port_ = 0;
  std::atomic<bool> stopped_{false};
};

}  // namespace

Result<std::unique_ptr<AsioListener>> AsioListener::Start(AsioListenerOptions options, Session session) {
  auto l = std::make_unique<Listener>(std::move(options), std::move(session));
  KVMESH_RETURN_IF_ERROR(l->Bind());
  return std::unique_ptr<AsioListener>(std::move(l));
}

}  // namespace kvmesh

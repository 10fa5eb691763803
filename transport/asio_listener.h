// transport/asio_listener.h — the acceptor and session lifetime every kvmesh
// Asio TCP server shares (the data server, the RESP fronts, the HTTP server),
// and the limits a server puts on one connection ($.limits, docs/security.md
// "Resource limits"): how many connections a port and a peer may hold
// (ConnectionLimiter), and how long a connection may take to authenticate,
// to send a frame it began, to take an answer, or sit idle (ConnectionWatch).
//
// A listener binds host:port (0 = a free port), accepts connections and runs
// `session(socket)` as a coroutine per connection. Threads:
//   session_threads == 0: one thread accepts and runs every session;
//   session_threads == N: one accept thread plus N session threads, each with
//     its own single-threaded io_context; connections are spread round robin,
//     so a session's handlers never hop threads.
// A connection past max_connections (or max_connections_per_peer from its
// peer address) is closed at accept, after `on_refused` (e.g. a RESP error
// line written without waiting), and never reaches `session`.
// Stop() closes the acceptor, stops the io_contexts and joins the threads.
// Sessions still suspended then are destroyed with the listener (their frames
// go with the io_contexts), so whatever a session references must outlive the
// listener: owners declare it as their last member, or Stop() it first.
//
// Asio appears in this header, so only .cc files include it (as transport/asio.h).
// Thread-safety: Start/Stop/port from one thread; `session` runs on the
// listener's threads; ConnectionLimiter is thread-safe; a ConnectionWatch
// belongs to its connection's thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "kvmesh/config.h"
#include "kvmesh/status.h"
#include "transport/asio.h"

namespace kvmesh {

// Open connections of one listening port, in all and per peer address.
class ConnectionLimiter {
  struct State;

 public:
  // 0: no limit.
  ConnectionLimiter(uint32_t max_connections, uint32_t max_per_peer);

  // Held by a connection for its lifetime; empty when it was refused.
  class Slot {
   public:
    Slot() = default;
    Slot(Slot&&) noexcept = default;
    Slot& operator=(Slot&& o) noexcept;
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;
    ~Slot() { Release(); }
    explicit operator bool() const { return state_ != nullptr; }

   private:
    friend class ConnectionLimiter;
    void Release();
    std::shared_ptr<State> state_;
    std::string peer_;
  };

  // A slot for a connection from `peer`, or an empty one (counted in
  // refused()) when the port or that peer is at its limit.
  Slot Admit(const boost::asio::ip::address& peer);
  uint64_t refused() const;
  uint64_t open() const;

 private:
  std::shared_ptr<State> state_;  // slots keep it alive
};

// Counts of connections a ConnectionWatch closed, by reason (may be shared
// by every connection of a server).
struct WatchCounters {
  std::atomic<uint64_t> handshake{0}, read{0}, write{0}, idle{0};
};

// The timeouts of one server connection ($.limits): a connection is closed
// (its socket, so every pending operation fails at once) when
//   * it has not authenticated handshake_timeout_ms after it was accepted
//     (the TLS handshake, then HELLO or AUTH; ports that want no credentials
//     call Authenticated() after the TLS handshake);
//   * a frame or command has begun and no byte of it came for read_timeout_ms;
//   * an answer waited write_timeout_ms for the peer to take any byte (the
//     connection is reset: the kernel drops the unsent answer at once);
//   * it was idle (authenticated, nothing begun) for idle_timeout_ms (0: never).
// A state change is a clock read: the connection's one timer is re-armed
// only when it fires, and sleeps at most a quarter of the shortest timeout,
// so a timeout is noticed within a quarter of its length.
class ConnectionWatch {
 public:
  // REQUIRES: socket outlives the watch, and both belong to one thread.
  ConnectionWatch(boost::asio::ip::tcp::socket& socket, const LimitsConfig& limits, WatchCounters* counters = nullptr);
  ~ConnectionWatch();  // stops watching; the socket is left as it is
  ConnectionWatch(const ConnectionWatch&) = delete;
  ConnectionWatch& operator=(const ConnectionWatch&) = delete;

  void Authenticated();  // the handshake is over (idempotent)
  void Idle();           // waiting for the next frame or command, nothing of it buffered
  void Reading();        // a frame or command has begun, or more of it came
  void Writing();        // an answer waits for the peer (or it took some of it)
  void Busy();           // the server works on the connection's commands (bounded elsewhere): no timeout
  bool authenticated() const;
  // Why a timeout closed the connection ("handshake", "read", "write",
  // "idle"), or nullptr.
  const char* expired() const;

 private:
  struct State;
  void Set(int phase);
  std::shared_ptr<State> st_;
};

// Writes every buffer of `bufs` (modified) on `s`, waiting with the watch
// in its writing state (each byte the peer takes restarts the write timeout).
// A plain socket must be in non-blocking mode: what it takes at once costs no
// loop turn. ec is set on failure (a watch that closed the socket: its error).
template <typename Stream>
boost::asio::awaitable<void> WatchedWrite(Stream& s, std::vector<boost::asio::const_buffer>& bufs,
                                          ConnectionWatch& watch, boost::system::error_code& ec);

struct AsioListenerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;              // 0 = a free port
  uint32_t session_threads = 0;   // see above
  std::string what = "TCP";       // names the server in errors: "<what> listen on host:port: ..."
  uint32_t max_connections = 0;           // open connections; 0: no limit
  uint32_t max_connections_per_peer = 0;  // from one peer address; 0: no limit
  // Called on the accept thread with a connection refused by the limits,
  // before it is closed: it may write a short error without blocking.
  std::function<void(boost::asio::ip::tcp::socket&)> on_refused;
};

class AsioListener {
 public:
  using Session = std::function<boost::asio::awaitable<void>(boost::asio::ip::tcp::socket)>;

  // Binds, listens and starts the threads. The listen error is Unavailable
  // (InvalidArgument for an unparsable host).
  static Result<std::unique_ptr<AsioListener>> Start(AsioListenerOptions options, Session session);
  virtual ~AsioListener() = default;
  virtual uint16_t port() const = 0;
  // Stops accepting, stops every session thread and joins them. Idempotent.
  virtual void Stop() = 0;
  // Connections closed at accept by the limits; connections open now.
  virtual uint64_t refused() const = 0;
  virtual uint64_t open() const = 0;
};

// ---- implementation of the template above ----

namespace asio_detail {
// Drops the first n bytes of bufs.
inline void Consume(std::vector<boost::asio::const_buffer>& bufs, size_t n) {
  size_t i = 0;
  while (i < bufs.size() && n >= bufs[i].size()) n -= bufs[i++].size();
  bufs.erase(bufs.begin(), bufs.begin() + static_cast<std::ptrdiff_t>(i));
  if (!bufs.empty()) bufs[0] += n;
}
}  // namespace asio_detail

template <typename Stream>
boost::asio::awaitable<void> WatchedWrite(Stream& s, std::vector<boost::asio::const_buffer>& bufs,
                                          ConnectionWatch& watch, boost::system::error_code& ec) {
  namespace asio = boost::asio;
  ec = {};
  if constexpr (std::is_same_v<Stream, asio::ip::tcp::socket>) {
    size_t n = s.write_some(bufs, ec);
    if (ec == asio::error::would_block || ec == asio::error::try_again) ec = {}, n = 0;
    if (ec) co_return;
    asio_detail::Consume(bufs, n);
  }
  while (!bufs.empty()) {
    watch.Writing();
    const size_t n = co_await s.async_write_some(bufs, asio::redirect_error(asio::use_awaitable, ec));
    if (ec) co_return;
    asio_detail::Consume(bufs, n);
  }
}

}  // namespace kvmesh

// transport/asio_listener.h — the acceptor and session lifetime every kvmesh
// Asio TCP server shares (the data server, the RESP fronts, the HTTP server).
//
// A listener binds host:port (0 = a free port), accepts connections and runs
// `session(socket)` as a coroutine per connection. Threads:
//   session_threads == 0: one thread accepts and runs every session;
//   session_threads == N: one accept thread plus N session threads, each with
//     its own single-threaded io_context; connections are spread round robin,
//     so a session's handlers never hop threads.
// Stop() closes the acceptor, stops the io_contexts and joins the threads.
// Sessions still suspended then are destroyed with the listener (their frames
// go with the io_contexts), so whatever a session references must outlive the
// listener: owners declare it as their last member, or Stop() it first.
//
// Asio appears in this header, so only .cc files include it (as transport/asio.h).
// Thread-safety: Start/Stop/port from one thread; `session` runs on the
// listener's threads.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "kvmesh/status.h"
#include "transport/asio.h"

namespace kvmesh {

struct AsioListenerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;              // 0 = a free port
  uint32_t session_threads = 0;   // see above
  std::string what = "TCP";       // names the server in errors: "<what> listen on host:port: ..."
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
};

}  // namespace kvmesh

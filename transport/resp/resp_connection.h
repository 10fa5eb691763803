// transport/resp/resp_connection.h — the connection loop both RESP fronts
// share (the node-local front, resp_session.h, and the cluster proxy,
// router/proxy/resp_proxy.cc): read into a growing buffer, parse what has
// arrived (resp_protocol.h, incrementally), hand each run of commands to the
// front's runner, write the answers in command order, keep the unparsed tail.
// What differs between the fronts is the runner: how a run of commands
// becomes answers (at once on the node, through the node links' engine on
// the proxy).
//
// Limits ($.limits, docs/security.md "Resource limits"): before a front that
// wants a password has seen AUTH, commands are parsed one at a time, no bulk
// string longer than preauth bytes is accepted (refused at its header) and no
// more than that is buffered; a command begun must keep arriving
// (read_timeout_ms); answers must be taken (write_timeout_ms). A protocol
// error is answered and closes only its own connection.
//
// Asio appears in this header: include it from .cc files only.
// Thread-safety: one connection, on its I/O thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

#include <boost/asio/ssl.hpp>

#include "transport/asio.h"
#include "transport/asio_listener.h"
#include "transport/resp/resp_commands.h"
#include "transport/resp/resp_protocol.h"

namespace kvmesh {

// A front's sizes for its connections.
struct RespLoopOptions {
  uint64_t max_bulk = 64u << 20;     // longest bulk string accepted once authenticated
  uint64_t preauth = 4u << 10;       // before AUTH: longest bulk string, and most bytes buffered (RespPreauthBytes)
  uint64_t flush_bytes = 8u << 20;   // answers a runner holds before it writes them (RespConnection::flush_bytes)
  size_t max_run = 256;              // commands parsed per run once authenticated (before AUTH: 1)
  size_t first_read_bytes = 64u << 10;   // an authenticated connection's read buffer at first
  size_t preauth_read_bytes = 4u << 10;  // one that has not authenticated yet
  // A read that fills the buffer grows it (doubling) up to this, so that one
  // run takes a deep pipeline (0: only as a command needs).
  size_t grow_read_bytes = 0;
  size_t keep_read_bytes = 1u << 20;  // a buffer larger than this shrinks back to first_read_bytes once empty
};

// One connection as its runner sees it.
class RespConnection {
 public:
  explicit RespConnection(ConnectionWatch& w) : watch(w) {}
  virtual ~RespConnection() = default;
  // Writes `out` (then empty; what it borrowed is released) and tells the
  // runner (Written); false when the client is gone.
  virtual boost::asio::awaitable<bool> Flush() = 0;

  ConnectionWatch& watch;   // its timeouts (e.g. Busy() while the runner waits for others)
  RespSessionState state;  // who the client is (AUTH) and its CLIENT ID
  RespReply out;           // answers not yet written, in command order
  bool quit = false;       // QUIT ran: the loop ends once `out` is written
  uint64_t flush_bytes = 0;  // RespLoopOptions::flush_bytes
};

// How a front turns commands into answers.
class RespRunner {
 public:
  virtual ~RespRunner() = default;
  // Runs `cmds` in order (they point into the read buffer, which stays put
  // until this returns), each one's answer added to c.out in order; sets
  // c.quit after QUIT and runs nothing after it. May write answers early
  // (c.Flush) to bound what it holds. False when the client is gone (a
  // Flush failed): the connection ends, nothing more is answered.
  virtual boost::asio::awaitable<bool> Run(std::span<const RespCommand> cmds, RespConnection& c) = 0;
  // c.out was written: what the runner counted for it is free again.
  virtual void Written(RespConnection& c) = 0;
};

// The commands of one connection over `s` (a non-blocking tcp::socket, or
// boost::asio::ssl::stream<tcp::socket&>), until the client closes, QUIT, a
// protocol error, a failed write or a timeout of `watch`. Calls
// watch.Authenticated() when the client has authenticated (at once when
// `commands` wants no password). REQUIRES: commands and runner outlive it.
template <typename Stream>
boost::asio::awaitable<void> ServeRespCommands(Stream& s, ConnectionWatch& watch, const RespCommands& commands,
                                               const RespLoopOptions& o, RespRunner& runner);

extern template boost::asio::awaitable<void> ServeRespCommands(boost::asio::ip::tcp::socket&, ConnectionWatch&,
                                                               const RespCommands&, const RespLoopOptions&,
                                                               RespRunner&);
extern template boost::asio::awaitable<void> ServeRespCommands(
    boost::asio::ssl::stream<boost::asio::ip::tcp::socket&>&, ConnectionWatch&, const RespCommands&,
    const RespLoopOptions&, RespRunner&);

}  // namespace kvmesh

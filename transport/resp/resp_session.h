// transport/resp/resp_session.h — one RESP connection, shared by both RESP
// fronts: read, parse (resp_protocol.h), run the commands, write the answers
// of a pipelined run in one gathered write, in command order.
//
// Where commands run is the front's choice:
//   ServeRespConnection, workers == nullptr: inline on the connection's Asio
//     I/O thread, one command at a time (the node-local front: store calls
//     are in-memory and never block);
//   ServeRespConnection, workers != nullptr: the parsed run goes to the worker
//     pool and the connection awaits it (router calls block on the network,
//     so they never run on an I/O thread);
//   ServeRespConnectionBlocking: a thread of the connection's own, blocking
//     socket I/O, the parsed run made right there (the proxy: its router
//     calls block, but only this connection waits for them, and a request
//     costs no thread hand-off).
// In every mode a connection reads nothing more until its run is answered,
// which keeps pipelined answers in order. A protocol error is answered and
// closes only its own connection.
//
// Asio appears in this header: include it from .cc files only.
#pragma once

#include <cstdint>

#include "transport/resp/resp_protocol.h"
#include "transport/asio.h"

namespace kvmesh {

struct RespConnectionOptions {
  uint64_t max_bulk_bytes = 16u << 20;  // longest bulk string the parser accepts
  uint64_t max_value_bytes = 1u << 20;  // sizes the offloaded runs (see .cc)
  boost::asio::thread_pool* workers = nullptr;
};

// REQUIRES: commands (and workers) outlive the coroutine.
boost::asio::awaitable<void> ServeRespConnection(boost::asio::ip::tcp::socket s, RespCommands* commands,
                                                 RespConnectionOptions o);

// Serves the connected, blocking stream socket `fd` on the calling thread
// until the peer closes it, a QUIT, a protocol error (answered first), or
// another thread shuts the socket down (shutdown(fd, SHUT_RDWR): how an owner
// stops it; the call then returns once the run in progress is answered or
// fails). Pipelined commands are parsed into runs as in the worker mode and
// run inline. o.workers is ignored. Does not close fd.
// REQUIRES: commands outlives the call.
void ServeRespConnectionBlocking(int fd, RespCommands* commands, const RespConnectionOptions& o);

}  // namespace kvmesh

// shard_node/server/resp_session.h — one RESP connection, shared by both RESP
// fronts: read, parse (resp_protocol.h), run the commands, write the answers
// of a pipelined run in one gathered write, in command order.
//
// Where commands run is the front's choice:
//   workers == nullptr: inline on the connection's I/O thread, one command at
//     a time (the node-local front: store calls are in-memory and never block);
//   workers != nullptr: the parsed run goes to the worker pool and the
//     connection awaits it (the proxy: router calls block on the network, so
//     they never run on an I/O thread). The connection reads nothing more
//     until its run is answered, which keeps pipelined answers in order.
// A protocol error is answered and closes only its own connection.
//
// Asio appears in this header: include it from .cc files only.
#pragma once

#include <cstdint>

#include "shard_node/server/resp_protocol.h"
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

}  // namespace kvmesh

// transport/resp/resp_session.h — one RESP connection of a front whose store
// answers at once (the node-local front): read, parse (resp_protocol.h), run
// each command to its answer (resp_commands.h, resp_ops.h) on the
// connection's Asio I/O thread, and write the answers of a pipelined run in
// one gathered write, in command order. The proxy, whose answers come from
// other nodes, runs its connections on its own event loop
// (router/proxy/resp_proxy.cc).
//
// A connection reads nothing more until its run is answered (at most 8 MiB
// of answers are held before they are written). A protocol error is answered
// and closes only its own connection. With a TLS context the connection
// speaks TLS (a client that does not, or does not finish its handshake within
// 10 s, is dropped); each command's I/O runs as the identity the connection
// has proved (resp_commands.h).
//
// Asio appears in this header: include it from .cc files only.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>

#include <boost/asio/ssl.hpp>

#include "transport/asio.h"
#include "transport/resp/resp_commands.h"

namespace kvmesh {

// The store behind a front that answers at once.
class RespSyncBackend {
 public:
  virtual ~RespSyncBackend() = default;
  // Runs one step's I/Os (resp_ops.h executor contract: reads first, then
  // writes in order) as `identity` (RespSessionState::identity) and fills in
  // their results.
  virtual void Run(uint32_t identity, std::span<BlockIo> ios) = 0;
};

struct RespConnectionOptions {
  uint64_t max_bulk_bytes = 64u << 20;  // longest bulk string the parser accepts
  // Non-null: the connection speaks TLS with this server context.
  std::shared_ptr<boost::asio::ssl::context> tls;
  // Counts handshakes that failed (may be null).
  std::atomic<uint64_t>* tls_failures = nullptr;
};

// REQUIRES: commands and backend outlive the coroutine.
boost::asio::awaitable<void> ServeRespConnection(boost::asio::ip::tcp::socket s, const RespCommands* commands,
                                                 RespSyncBackend* backend, RespConnectionOptions o);

// The parser bound for a front that takes values up to max_value_bytes: the
// value plus room for the command around it.
inline uint64_t RespMaxBulk(uint64_t max_value_bytes) { return max_value_bytes + (64u << 10); }

}  // namespace kvmesh

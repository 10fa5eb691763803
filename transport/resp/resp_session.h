// transport/resp/resp_session.h — one RESP connection of a front whose store
// answers at once (the node-local front): the connection loop both fronts
// share (resp_connection.h: read, parse incrementally, write the answers of
// a pipelined run in one gathered write, in command order) with a runner
// that runs each command to its answer (resp_commands.h, resp_ops.h) on the
// connection's Asio I/O thread. The proxy, whose answers come from other
// nodes, runs the same loop with a runner over its engines
// (router/proxy/resp_proxy.cc).
//
// Backpressure: a connection reads nothing more until its run is answered,
// and a run stops once its answers hold more than min(8 MiB,
// $.limits.max_pending_answer_bytes) — counting a pinned block's whole chunk,
// not only the value it carries — so what one connection holds of the node is
// bounded by that plus one answer. An answer the client does not take within
// $.limits.write_timeout_ms closes the connection and releases its blocks.
// Before a front that wants a password has seen AUTH, no bulk string longer
// than $.limits.preauth_max_bytes is accepted (refused at its header) and no
// more than that is buffered; the TLS handshake and AUTH must be over within
// handshake_timeout_ms; a command begun must keep arriving (read_timeout_ms).
// A protocol error is answered and closes only its own connection. With a TLS
// context the connection speaks TLS; each command's I/O runs as the identity
// the connection has proved (resp_commands.h).
//
// Asio appears in this header: include it from .cc files only.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <span>

#include <boost/asio/ssl.hpp>

#include "kvmesh/config.h"
#include "transport/asio.h"
#include "transport/asio_listener.h"
#include "transport/resp/resp_commands.h"

namespace kvmesh {

// The store behind a front that answers at once.
class RespSyncBackend {
 public:
  virtual ~RespSyncBackend() = default;
  // Runs one step's I/Os (resp_ops.h executor contract: reads first, then
  // writes in order) as `identity` (RespSessionState::identity) and fills in
  // their results. Adds to *held the bytes the answers keep beyond the values
  // they carry (the rest of a pinned block's chunk), which the connection
  // counts against its bound until the answers are written.
  virtual void Run(uint32_t identity, std::span<BlockIo> ios, uint64_t* held) = 0;
};

struct RespConnectionOptions {
  uint64_t max_bulk_bytes = 64u << 20;  // longest bulk string the parser accepts (once authenticated)
  LimitsConfig limits;                  // $.limits
  // Non-null: the connection speaks TLS with this server context.
  std::shared_ptr<boost::asio::ssl::context> tls;
  // Counts handshakes that failed (may be null).
  std::atomic<uint64_t>* tls_failures = nullptr;
  WatchCounters* timeouts = nullptr;  // connections closed by a timeout (may be null)
};

// REQUIRES: commands and backend outlive the coroutine.
boost::asio::awaitable<void> ServeRespConnection(boost::asio::ip::tcp::socket s, const RespCommands* commands,
                                                 RespSyncBackend* backend, RespConnectionOptions o);

// The parser bound for a front that takes values up to max_value_bytes: the
// value plus room for the command around it.
inline uint64_t RespMaxBulk(uint64_t max_value_bytes) { return max_value_bytes + (64u << 10); }

// What a RESP front accepts from a connection that has not authenticated
// yet: bulk strings and buffered bytes of at most this.
inline uint64_t RespPreauthBytes(const LimitsConfig& l, uint64_t max_bulk) {
  return std::min<uint64_t>(l.preauth_max_bytes, max_bulk);
}

// The answer "-ERR max number of clients reached" written (without waiting)
// to a connection a RESP port refuses at accept, as Redis does.
void RespRefuseConnection(boost::asio::ip::tcp::socket& s);

}  // namespace kvmesh

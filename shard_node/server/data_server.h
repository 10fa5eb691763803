// shard_node/server/data_server.h — serves one ShardNode over TCP with the
// kvmesh wire protocol (docs/protocol.md), on Boost.Asio.
//
// Each connection is one coroutine: read a header, check it (DecodeHeader:
// every length against the limits before allocating), read the body, answer.
// Reads and writes go to the socket at once and wait only when it is not
// ready (no loop turn per completed read); headers and short bodies are
// staged so that one recv usually brings a whole GET or EXISTS frame.
// A client may pipeline: frames are answered in order. Store operations are
// in-memory and never block on I/O; GET answers are written with
// scatter/gather straight from pool memory (BlockRefs pin the blocks until the
// write completes). A malformed, truncated or oversize frame closes only its
// own connection. The first frame must be HELLO: it carries the cluster
// secret, or a tenant's name and token (the node's $.auth.tenants); wrong or
// missing credentials are refused (PermissionDenied) and the connection closed
// before any data operation; a data frame before it is refused at its header,
// its body never read. A connection answers one frame at a time, so what it
// holds of the node is one answer (at most max_body_bytes, the blocks pinned
// until written); an answer the client does not take within
// $.limits.write_timeout_ms closes the connection and releases its blocks. A request whose epoch is non-zero and older than
// the node's current epoch is answered StaleEpoch (carrying the node's epoch).
//
// Thread-safety: Start/Stop from one thread; everything else is internal.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "kvmesh/config.h"
#include "kvmesh/status.h"
#include "transport/protocol.h"

namespace boost::asio::ssl {
class context;
}

namespace kvmesh {

class ShardNode;

struct DataServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;  // 0 = a free port
  uint32_t threads = 2;
  proto::ProtocolLimits limits;
  std::string token;  // the cluster secret a HELLO without a tenant name must carry (empty: none)
  // $.limits: connections per port and per peer, the handshake, read, write
  // and idle timeouts. Before its HELLO a connection's data frames are
  // refused at their header (PermissionDenied, then closed): no body is read.
  LimitsConfig conn_limits;
  // TLS on every connection ($.tls; MakeTlsServerContext): the handshake
  // comes first, then the frames as above. nullptr: plain TCP.
  std::shared_ptr<boost::asio::ssl::context> tls;
};

class DataServer {
 public:
  // REQUIRES: node and epoch outlive the server.
  static Result<std::unique_ptr<DataServer>> Start(ShardNode* node, DataServerOptions options,
                                                   const std::atomic<uint64_t>* epoch);
  virtual ~DataServer() = default;
  virtual uint16_t port() const = 0;
  // Stops accepting, closes every connection, joins the threads. Idempotent.
  virtual void Stop() = 0;
  // Prometheus text lines for this server's counters and latency summaries.
  virtual std::string MetricsText() const = 0;
};

}  // namespace kvmesh

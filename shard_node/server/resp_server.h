// shard_node/server/resp_server.h — the node-local Redis-protocol (RESP2)
// front: redis-cli, redis-benchmark and Redis-backed KV-cache connectors work
// unchanged against this node's store. It is the zero-hop path: every key is
// answered from this node, whichever node the router would place it on. For a
// cluster-wide front that sends each key to its owner, see resp_proxy.h
// (`kvmesh proxy`); both speak resp_protocol.h and name keys with RespKey.
//
// Commands run inline on the front's one I/O thread (store calls never
// block); pipelined commands are answered in one gathered write, GET answers
// straight from pool memory (the blocks stay pinned until written).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "kvmesh/status.h"

namespace kvmesh {

class ShardNode;

struct RespServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  uint64_t max_value_bytes = 16u << 20;  // the slot size: a larger SET is answered an error
  // Longest bulk string accepted at all (0: max(max_value_bytes, 16 MiB)); a
  // longer one is a protocol error that closes the connection.
  uint64_t max_bulk_bytes = 0;
};

class RespServer {
 public:
  // REQUIRES: node outlives the server.
  static Result<std::unique_ptr<RespServer>> Start(ShardNode* node, RespServerOptions options);
  virtual ~RespServer() = default;
  virtual uint16_t port() const = 0;
  virtual void Stop() = 0;
  virtual uint64_t commands() const = 0;
};

}  // namespace kvmesh

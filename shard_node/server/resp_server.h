// shard_node/server/resp_server.h — a Redis-protocol (RESP2) front on a shard
// node, so redis-cli, redis-benchmark and Redis-backed KV-cache connectors
// work unchanged against this node's store.
//
// Commands: PING [msg], ECHO, GET, SET key value (options such as EX are
// accepted and ignored: kvmesh evicts by policy), MGET, MSET, EXISTS, DEL,
// INFO, DBSIZE, SELECT 0, QUIT, plus the handshake answers clients ask for
// (COMMAND, CONFIG GET, CLIENT ...). Keys and values are binary-safe; a key
// is stored under BlockKey = xxHash3-128("resp\0" + key), so RESP keys never
// meet router block keys. Values are blocks: at most the store's slot size.
// Requests are parsed with every length bounded (bulk <= max_value_bytes,
// array <= 1M elements, inline line <= 64 KiB); a protocol error closes only
// that connection. Pipelined commands are answered in one gathered write;
// GET answers come straight from pool memory.
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
  uint64_t max_value_bytes = 16u << 20;
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

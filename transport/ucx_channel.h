// transport/ucx_channel.h — the client side of one shard node over UCX
// active messages, speaking the kvmesh protocol (docs/protocol.md): AM header
// = frame header, AM data = frame body (UCX picks eager or rendezvous by
// size; UCX_TLS passes through). One worker per channel and no progress
// thread: a waiting caller progresses the worker itself (one at a time; idle,
// it sleeps on the worker's wakeup fd), so an answer needs no thread hand-off.
// Callers on any thread post sends and wait for their answers by request id,
// bounded by the timeout.
//
// Thread-safety: thread-safe (ShardChannel contract).
#pragma once

#include <memory>
#include <string>

#include "transport/protocol.h"
#include "transport/shard_channel.h"

namespace kvmesh {

struct UcxChannelOptions {
  std::string node_address;  // the node's UCX worker address (bytes)
  std::string client_id = "kvmesh-ucx-client";
  std::string tenant;
  std::string token;
  int64_t timeout_ms = 2000;
  proto::ProtocolLimits limits;  // bounds on answers this client accepts
};

class UcxChannel : public ShardChannel {
 public:
  // Creates the worker and endpoint and performs the HELLO.
  static Result<std::unique_ptr<UcxChannel>> Connect(UcxChannelOptions options);
  virtual void set_epoch(uint64_t epoch) = 0;
};

}  // namespace kvmesh

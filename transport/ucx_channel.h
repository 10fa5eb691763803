// transport/ucx_channel.h — the client side of one shard node over UCX
// active messages, speaking the kvmesh protocol (docs/protocol.md): AM header
// = frame header, AM data = frame body (UCX picks eager or rendezvous by
// size; UCX_TLS passes through). One worker per channel and no progress
// thread: a waiting caller progresses the worker itself (one at a time;
// idle, it spins briefly and then sleeps on the worker's wakeup fd, as
// options.progress says), so an answer needs no thread hand-off.
//
// Registered memory (RegisterMemory): the region is mapped in the client's
// context and its remote key sent to the node once (MEM_REGISTER); a batch
// whose every block lies in registered memory then goes as GET_INTO /
// PUT_FROM, and the node moves the bytes itself with one-sided puts and gets
// (docs/protocol.md "Registered memory"). Other batches take the active-
// message path, whose answers land in a bounce buffer.
//
// Local reads: a node on this host lets the cluster identity map its pool
// and a shared index of its blocks (LOCAL_MAP, transport/local_index.h); a
// GET then copies each block the index holds straight from the pool into
// the caller's buffer and checks it, and only the rest goes to the node.
// Callers on any thread post sends and wait for their answers by request id,
// bounded by the timeout.
//
// Thread-safety: thread-safe (ShardChannel contract).
#pragma once

#include <memory>
#include <string>

#include "transport/protocol.h"
#include "transport/shard_channel.h"
#include "transport/ucx_worker.h"

namespace kvmesh {

struct UcxChannelOptions {
  std::string node_address;  // the node's UCX worker address (bytes)
  std::string client_id = "kvmesh-ucx-client";
  std::string tenant;  // a tenant of $.auth.tenants ("": the cluster's own identity)
  std::string token;   // the tenant's token, else the cluster secret ($.auth.token)
  int64_t timeout_ms = 2000;
  proto::ProtocolLimits limits;  // bounds on answers this client accepts
  // The client's UCP context, shared by its channels so registered memory is
  // mapped once (NetworkClient shares one); null: a context of its own.
  std::shared_ptr<UcxContext> context;
  // How a waiting caller progresses the worker, and the longest it spins
  // before sleeping on the wakeup fd (kHybrid, kAdaptive).
  UcxProgress progress = UcxProgress::kAdaptive;
  int64_t spin_us = 100;
  // Local reads (transport/local_index.h): after the HELLO, ask the node to
  // map its pool (LOCAL_MAP); when it does (same host, cluster identity),
  // GETs read the blocks its index holds straight from the pool, with no
  // message, and ask the node for the rest ($.transport.ucx.local_reads).
  bool local_reads = true;
};

class UcxChannel : public ShardChannel {
 public:
  // Creates the worker and endpoint and performs the HELLO.
  static Result<std::unique_ptr<UcxChannel>> Connect(UcxChannelOptions options);
  virtual void set_epoch(uint64_t epoch) = 0;
  // Where the answers of two-sided GET frames landed: `direct`, straight in
  // the callers' buffers; `pooled`, in a reused receive buffer (then copied
  // out); `pool_allocations`, receive buffers the pool allocated or grew.
  // `local_hits` / `local_misses`: GET items read from the node's pool
  // through local reads / that local reads could not serve (asked of the node).
  struct AnswerCounts {
    uint64_t direct = 0, pooled = 0, pool_allocations = 0;
    uint64_t local_hits = 0, local_misses = 0;
  };
  // Whether the node let this channel read its pool (local_reads), and why not.
  virtual Status local_reads_status() const = 0;
  virtual AnswerCounts answer_counts() const = 0;
};

}  // namespace kvmesh

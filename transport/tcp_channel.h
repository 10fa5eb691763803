// transport/tcp_channel.h — the client side of one shard node over TCP and
// the kvmesh wire protocol (docs/protocol.md).
//
// A channel keeps a small pool of connections to its node, each opened with a
// HELLO (client id, tenant, token) on first use. A call takes the first
// connection with no call in flight, else the next one round robin, so a lone
// caller keeps to one warm connection and concurrent callers spread over the
// pool. Callers share connections: a call writes
// its frame under the connection's write lock and waits for the answer with
// its request id, so many calls are in flight on one connection (pipelining).
// There is no reader thread: one waiting caller at a time reads the socket
// (leader/follower), routes each answer to its waiter and reads GET payloads
// straight into the callers' buffers, so an uncontended call has no thread
// hand-off. Over plain TCP the reader waits in a blocking recv into a small
// read-ahead buffer, so one recv brings an answer's header, item table and
// payload head (docs/guide.md, "TCP GET with 8 clients"). Every call is
// bounded by the timeout:
// a node that dies or stalls gives Unavailable / DeadlineExceeded, never a hang.
// After a failed connect the channel answers Unavailable without retrying for
// `reconnect_backoff_ms`, so a dead node costs callers nothing.
//
// Thread-safety: thread-safe (ShardChannel contract).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "transport/protocol.h"
#include "transport/shard_channel.h"

namespace kvmesh {

class TlsClientContext;

struct TcpChannelOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  std::string client_id = "kvmesh-client";
  std::string tenant;                 // a tenant of $.auth.tenants ("": the cluster's own identity)
  std::string token;                  // the tenant's token, else the cluster secret ($.auth.token); may be empty
  uint32_t connections = 2;           // pool size
  int64_t timeout_ms = 2000;          // per call (RequestOptions::timeout_ms overrides)
  int64_t connect_timeout_ms = 1000;  // connect + HELLO
  int64_t reconnect_backoff_ms = 100;
  proto::ProtocolLimits limits;       // bounds on answers this client accepts
  // TLS to a node whose data port has it ($.tls): the node's certificate is
  // verified against `host`. nullptr: plain TCP.
  std::shared_ptr<const TlsClientContext> tls;
};

class TcpChannel : public ShardChannel {
 public:
  // Never fails: connections open lazily on first use.
  static std::unique_ptr<TcpChannel> Create(TcpChannelOptions options);

  // The shard-map epoch sent with every request (0 = unversioned).
  virtual void set_epoch(uint64_t epoch) = 0;
  // The node's epoch from the last StaleEpoch answer (0 if none).
  virtual uint64_t last_node_epoch() const = 0;
  // Node id from the HELLO answer ("" before the first connection).
  virtual std::string node_id() const = 0;

  // MATCH_PREFIX: number of leading keys stored on this node (hits touched).
  virtual Status MatchPrefix(std::span<const BlockKey> keys, uint32_t* matched, const RequestOptions& o) = 0;

  // Opens (or checks) one connection now; OK when the HELLO was accepted.
  virtual Status Connect() = 0;
};

}  // namespace kvmesh

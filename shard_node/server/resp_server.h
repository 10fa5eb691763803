// shard_node/server/resp_server.h — the node-local Redis-protocol (RESP2)
// front: redis-cli, redis-benchmark and Redis-backed KV-cache connectors work
// unchanged against this node's store. It is the zero-hop path: every key is
// answered from this node, whichever node the router would place it on. For a
// cluster-wide front that sends each key to its owner, see
// router/proxy/resp_proxy.h (`kvmesh proxy`); both speak
// transport/resp/resp_commands.h and store values as resp_value.h lays them
// out, so a key SET through either is the key the other answers.
//
// Commands run inline on the front's one I/O thread (store calls never
// block); pipelined commands are answered in one gathered write, GET answers
// straight from pool memory (the blocks stay pinned until written). A small
// value in a large chunk is copied out instead, so a connection's answers pin
// at most about twice the bytes they carry, and a connection holds a bounded
// amount of them before it stops reading (resp_session.h).
//
// Identities: a connection that logged in as a tenant (AUTH user password,
// with `auth` from MakeClusterAuth over the node's $.auth, so its identities
// are the node's TenantRegistry indices) reaches the store through a
// TenantView of that tenant (its namespace, its quota; INFO and DBSIZE show
// its own figures); the cluster identity sees the node's own store. With
// `tls` set the port speaks TLS only ($.tls; client certificates required
// when client_auth is "all").
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "kvmesh/config.h"
#include "kvmesh/status.h"
#include "transport/resp/resp_value.h"

namespace kvmesh {

class ShardNode;
class RespAuth;
struct WatchCounters;
class RespCluster;

struct RespServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  uint64_t max_value_bytes = 64u << 20;  // $.resp.max_value_bytes: larger SETs are answered an error
  RespKeyRules rules;                    // $.resp groups
  std::shared_ptr<const RespAuth> auth;  // null: no AUTH needed
  TlsConfig tls;                         // $.tls: enabled() makes the port TLS only
  // $.resp.cluster: the slots view (shard_node/server/cluster_slots.h); null: not cluster mode.
  std::shared_ptr<const RespCluster> cluster;
  // $.limits: connections per port and per peer, what a connection may send
  // before AUTH, the timeouts, the answer bytes it may hold
  // (transport/resp/resp_session.h).
  LimitsConfig limits;
};

class RespServer {
 public:
  // REQUIRES: node outlives the server.
  static Result<std::unique_ptr<RespServer>> Start(ShardNode* node, RespServerOptions options);
  virtual ~RespServer() = default;
  virtual uint16_t port() const = 0;
  virtual void Stop() = 0;
  virtual uint64_t commands() const = 0;
  virtual uint64_t tls_failures() const = 0;  // handshakes that failed
  virtual uint64_t connections_refused() const = 0;  // closed at accept by $.limits
  virtual const WatchCounters& timeouts() const = 0;  // connections closed by a timeout
};

}  // namespace kvmesh

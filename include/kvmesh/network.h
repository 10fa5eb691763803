// kvmesh/network.h — the router over the network (launch modes 2 and 3).
//
// A NetworkClient asks the coordinator for the shard map (GET /map: model,
// live nodes and their ports, groups, epoch), opens a pooled, pipelined TCP
// channel per node, and hands out the same Router API as the embedded mode.
// When a node answers "stale epoch" the router refreshes the map and retries
// once; a background thread also refreshes every refresh_ms so that nodes the
// coordinator removed (dead) or added (joined) are routed around / to.
// Channels to nodes whose address did not change are kept across refreshes.
//
//   kvmesh::NetworkClientOptions o;
//   o.coordinator = "127.0.0.1:7070";
//   auto client = kvmesh::NetworkClient::Connect(o).value();
//   kvmesh::Router& r = client->router();
//   r.Put(tokens, blocks);
//   size_t cached = r.MatchPrefix(tokens).value();
//
// Thread-safety: every method is thread-safe; the Router is shared.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "kvmesh/router.h"
#include "kvmesh/status.h"

namespace kvmesh {

struct NetworkClientOptions {
  // "host:port" of the coordinator's HTTP API (required), or several
  // separated by commas (an etcd-backed control plane: each is tried in turn,
  // starting with the one that answered last).
  std::string coordinator;
  std::string client_id = "kvmesh-client";
  std::string tenant_salt;  // keys of different salts never meet (the client's own sub-namespace)
  // Credentials. Without `tenant`, `token` is the cluster secret
  // ($.auth.token). With `tenant`, the client is that tenant of
  // $.auth.tenants and `token` is the tenant's token (or password): the nodes
  // then keep its blocks in the tenant's namespace, whatever the salt.
  std::string tenant;
  std::string token;
  // TLS to a cluster with $.tls (the coordinator's API and the nodes' data
  // ports; docs/security.md): on when tls_ca is set. The servers'
  // certificates must chain to tls_ca and name the host dialled; with
  // $.tls.client_auth "all" the client shows tls_cert / tls_key.
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  int64_t timeout_ms = 2000;
  int64_t connect_timeout_ms = 1000;
  uint32_t connections_per_node = 2;
  int64_t refresh_ms = 1000;  // background map refresh period (0: only on stale epoch)
  // UCX channels (a cluster with "transport": {"backend": "ucx"}): how a
  // waiting caller progresses the worker, "poll" | "event" | "hybrid" (spin
  // ucx_spin_us after the last event, then sleep) | "adaptive" (spin up to
  // ucx_spin_us while waits are short, then sleep), as $.transport.ucx.
  std::string ucx_progress = "adaptive";
  int64_t ucx_spin_us = 100;
  // Local reads from nodes on this host that offer them, as
  // $.transport.ucx.local_reads (transport/ucx_channel.h).
  bool ucx_local_reads = true;
};

class NetworkClient {
 public:
  // Fetches the map (retrying until timeout_ms) and builds the router.
  static Result<std::unique_ptr<NetworkClient>> Connect(NetworkClientOptions options);
  ~NetworkClient();

  Router& router();
  // Fetches the coordinator's map now; installs it when its epoch is newer.
  Status Refresh();
  uint64_t epoch() const;
  size_t num_nodes() const;

 private:
  struct Impl;
  explicit NetworkClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvmesh

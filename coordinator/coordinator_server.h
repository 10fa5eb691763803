// coordinator/coordinator_server.h — the `kvmesh coordinator` daemon: cluster
// membership, heartbeats and shard-map epochs, behind an HTTP/JSON control API
// (docs/launch.md lists every endpoint).
//
//   POST /register  {"id","host","weight","ports":{"data","http","resp"},"ucx"} -> {"epoch","heartbeat_ms"}
//                   (400 naming the JSON path and the reason: a wrong type, a
//                   port outside 1..65535, weight <= 0, an unknown key)
//   POST /heartbeat {"id","stats":{...},"eviction":{key:[scores]}}  -> {"epoch","eviction_peers":{key:[scores]}}
//                   (404: unknown, register again; 400: a bad "eviction",
//                   naming its path; eviction/score_exchange.h)
//   POST /leave     {"id"}                -> {"epoch"}  (clean shutdown)
//   GET  /map     the published shard map (router/map_json.h)
//   GET  /nodes   members with their last heartbeat age
//   GET  /stats   counters and the sum of the nodes' last reported stats
//   GET  /healthz
//
// With $.tls the API is HTTPS; with its client_auth "admin" (the default) or
// "all" the calls that need the secret also need a client certificate the
// cluster CA signed (mutual TLS for nodes).
// With a cluster secret ($.auth.token) every endpoint but /healthz needs
// `Authorization: Bearer <secret>`; GET /map also takes a tenant's
// `Authorization: Basic` (transport/http_auth.h). A refused request is
// answered 401 (no or malformed credentials) or 403 (wrong ones) on its head,
// before its body is read (a chunked body's trailer never carries
// credentials), changes nothing, and is logged as an {"event":"auth_refused"}
// line on stderr (at most 20 a second; "suppressed" counts the rest).
// Bodies are bounded per route (413 at the head), JSON in depth (400), and a
// heartbeat's stats are reduced to the counters /stats sums
// (coordinator/membership.h; docs/security.md, "Resource limits").
//
// Every membership change (a node joins, rejoins with new ports, leaves, or
// misses heartbeats for dead_after_ms) advances the epoch by one. The first
// epoch is the start time in Unix milliseconds, so epochs keep growing when
// the coordinator restarts (its state is in memory: nodes re-register on the
// 404 their next heartbeat gets). Placement is
// rendezvous hashing, so a join or a removal moves only the keys whose top
// node changes (about 1/N).
//
// The state and the handlers are a Membership (coordinator/membership.h);
// this class serves it over HTTP and runs its reaper every heartbeat_ms / 2.
//
// Thread-safety: Start/Stop from one thread; handlers and the reaper share
// the Membership (thread-safe).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "kvmesh/config.h"
#include "kvmesh/status.h"

namespace kvmesh {

class CoordinatorServer {
 public:
  // Serves on config.coordinator.host:port (port_override when non-zero... or
  // 0 = a free port when both are 0).
  static Result<std::unique_ptr<CoordinatorServer>> Start(const ClusterConfig& config, uint16_t port_override = 0);
  virtual ~CoordinatorServer() = default;
  virtual uint16_t port() const = 0;
  virtual uint64_t epoch() const = 0;
  virtual size_t live_nodes() const = 0;
  // {"event":"listening","role":"coordinator","node_id":"coordinator","ports":{"http":P}}
  virtual std::string ListeningJson() const = 0;
  virtual void Stop() = 0;
};

}  // namespace kvmesh

// shard_node/server/resp_proxy.h — the cluster-wide Redis-protocol front: a
// RESP endpoint whose every key goes through the Router to the node that owns
// it, so an unmodified Redis client sees the whole cluster as one Redis.
//
// Where it runs (design): a stateless proxy process, `kvmesh proxy
// --coordinator HOST:PORT` (cli/cmd_proxy.cc), in the manner of twemproxy
// or Envoy's Redis proxy, rather than a front inside each node daemon:
//   - it holds no data, only a NetworkClient (shard map from the coordinator,
//     pooled pipelined channels), so any number of proxies can run, next to
//     the clients or behind a load balancer, and one dying loses nothing;
//   - a node that dies takes only its keys with it (they read nil), never the
//     front, which a per-node front would;
//   - nodes stay what they were: the node-local front (resp_server.h) is kept
//     as the zero-hop path for clients that know which node they want.
// Both fronts speak resp_protocol.h and store a key under RespKey(key), and
// the proxy places RespKey(key) with the router's rendezvous hashing (no
// affinity hint), so a key SET through the proxy is the key its owner's
// node-local front answers.
//
// Threads: the connections run on io_threads Asio threads that never block;
// each connection's parsed run of commands goes to a pool of `workers`
// threads that make the (blocking) router calls, consecutive GETs/SETs of a
// pipelined run as one router batch (one fan-out, the slowest node's round
// trip). A connection reads nothing more until its run is answered, so
// answers keep the command order.
//
// Failure behaviour: a key whose node cannot be reached reads nil (GET/MGET),
// counts as absent (EXISTS/DEL) and a SET to it answers "-ERR Unavailable...";
// a value over max_value_bytes (the slot size) answers "-ERR ResourceExhausted:
// value of N bytes exceeds the slot size ..." and keeps the connection; a
// protocol error closes only its own connection.
//
// Thread-safety: Start/Stop from one thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "kvmesh/status.h"

namespace kvmesh {

class Router;

// Cluster-wide figures for DBSIZE and INFO (e.g. the coordinator's /stats).
struct RespClusterStats {
  uint64_t nodes = 0, blocks = 0, bytes_stored = 0, hits = 0, misses = 0, evictions = 0;
};

struct RespProxyOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;                     // 0 = a free port
  uint64_t max_value_bytes = 1u << 20;   // the cluster's slot size ($.store.slot_bytes)
  uint64_t max_bulk_bytes = 0;           // parser bound (0: max(max_value_bytes, 16 MiB))
  uint32_t io_threads = 1;               // connection threads
  uint32_t workers = 4;                  // threads making router calls
  int64_t timeout_ms = 0;                // per router operation (0: the router's default)
  // Called (on a worker) by DBSIZE and INFO; unset: DBSIZE answers 0.
  std::function<Result<RespClusterStats>()> stats;
};

class RespProxy {
 public:
  // REQUIRES: router outlives the proxy (it is shared; the router is thread-safe).
  static Result<std::unique_ptr<RespProxy>> Start(Router* router, RespProxyOptions options);
  virtual ~RespProxy() = default;
  virtual uint16_t port() const = 0;
  // Stops accepting, waits for the router calls in flight, closes every
  // connection, joins the threads. Idempotent.
  virtual void Stop() = 0;
  virtual uint64_t commands() const = 0;
};

}  // namespace kvmesh

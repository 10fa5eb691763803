// router/proxy/resp_proxy.h — the cluster-wide Redis-protocol front: a
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
// Threads (design, docs/resp.md "Threads"): a router call blocks on the
// network, so the question is which thread waits for it. Each connection gets
// a thread of its own (up to connection_threads of them) that reads the
// socket, parses a pipelined run and makes the run's router calls inline,
// consecutive GETs/SETs as one router batch (one fan-out, the slowest node's
// round trip): a request costs no thread hand-off, and the TCP channel's
// leader/follower reader lets that thread read its node's answer itself.
// (The former path, an Asio I/O thread handing each run to a worker and
// back, cost two hand-offs per request; it now serves only the connections
// beyond connection_threads: io_threads Asio threads that never block, and
// `workers` threads for their router calls.) A connection reads nothing more
// until its run is answered, so answers keep the command order.
//
// Failure behaviour: a key whose node cannot be reached reads nil (GET/MGET),
// counts as absent (EXISTS/DEL) and a SET to it answers "-ERR Unavailable...";
// a value over max_value_bytes (the slot size) answers "-ERR ResourceExhausted:
// value of N bytes exceeds the slot size ..." and keeps the connection; a
// protocol error closes only its own connection.
//
// Thread-safety: Start/Stop from one thread; commands() from any.
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
  // Connections served by a thread of their own (see above). Connections
  // beyond this many go to the Asio path below.
  uint32_t connection_threads = 1024;
  uint32_t io_threads = 1;               // accept, and the Asio connections past connection_threads
  uint32_t workers = 4;                  // router calls of the Asio connections
  int64_t timeout_ms = 0;                // per router operation (0: the router's default)
  // Called by DBSIZE and INFO, on the connection's thread (or a worker), so
  // possibly from many threads at once; unset: DBSIZE answers 0.
  std::function<Result<RespClusterStats>()> stats;
};

class RespProxy {
 public:
  // REQUIRES: router outlives the proxy (it is shared; the router is thread-safe).
  static Result<std::unique_ptr<RespProxy>> Start(Router* router, RespProxyOptions options);
  virtual ~RespProxy() = default;
  virtual uint16_t port() const = 0;
  // Stops accepting, shuts the connection threads' sockets down, waits for
  // the router calls in flight (bounded by the router timeout), joins the
  // threads. Connections on the Asio path are closed when the proxy is
  // destroyed. Idempotent.
  virtual void Stop() = 0;
  virtual uint64_t commands() const = 0;
};

}  // namespace kvmesh

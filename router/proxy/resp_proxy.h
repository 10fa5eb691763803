// router/proxy/resp_proxy.h — the cluster-wide Redis-protocol front: a
// RESP endpoint whose every key goes to the node that owns it, so an
// unmodified Redis client sees the whole cluster as one Redis.
//
// Where it runs (design): a stateless proxy process, `kvmesh proxy
// --coordinator HOST:PORT` (cli/cmd_proxy.cc), in the manner of twemproxy
// or Envoy's Redis proxy, rather than a front inside each node daemon:
//   - it holds no data, only the shard map (from the coordinator, through a
//     NetworkClient) and a connection per node, so any number of proxies can
//     run, next to the clients or behind a load balancer, and one dying
//     loses nothing;
//   - a node that dies takes only its keys with it (they read nil), never the
//     front, which a per-node front would;
//   - nodes stay what they were: the node-local front
//     (shard_node/server/resp_server.h) is kept as the zero-hop path.
// Both fronts speak transport/resp/resp_commands.h and store values as
// transport/resp/resp_value.h lays them out, so a key SET through the proxy
// is the key its owner's node-local front answers.
//
// Event loop (design, docs/resp.md "Event loop"): io_threads loops (one by
// default), each a single thread that owns its client connections, its
// connection to every node (router/proxy/node_link.h) and an engine
// (router/proxy/resp_engine.h). A connection parses what has arrived, runs
// its commands as ops (several side by side when no two touch the same key,
// e.g. a pipelined run of GETs), and the engine sends the block I/O of every
// connection's ops that arrived together to each node as one frame per kind:
// commands of many clients cost one node round trip, and no request crosses
// a thread. Answers go back in each connection's command order. Nothing on
// the loop blocks: map refreshes and INFO's cluster statistics run on a
// helper thread.
//
// Failure behaviour: a key whose node cannot be reached reads nil (GET/MGET),
// counts as absent (EXISTS/DEL) and a SET to it answers "-ERR Unavailable...";
// a value over max_value_bytes answers "-ERR ResourceExhausted: ..." and
// keeps the connection; a protocol error closes only its own connection.
//
// Thread-safety: Start/Stop from one thread; commands() from any.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "kvmesh/status.h"
#include "transport/resp/resp_value.h"

namespace kvmesh {

class Router;
class ShardMap;
class RespAuth;

// Cluster-wide figures for DBSIZE and INFO (e.g. the coordinator's /stats).
struct RespClusterStats {
  uint64_t nodes = 0, blocks = 0, bytes_stored = 0, hits = 0, misses = 0, evictions = 0;
};

struct RespProxyOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;                      // 0 = a free port
  uint64_t max_value_bytes = 64u << 20;   // $.resp.max_value_bytes: larger SETs are answered an error
  uint64_t block_bytes = 1u << 20;        // the nodes' slot size ($.store.slot_bytes): value parts
  uint32_t io_threads = 1;                // event loops; connections are spread over them
  int64_t timeout_ms = 2000;              // per node frame
  int64_t connect_timeout_ms = 1000;      // connect + HELLO to a node
  // The HELLO the proxy sends the nodes.
  std::string client_id = "kvmesh-proxy";
  std::string tenant;
  std::string token;                      // $.auth.token
  RespKeyRules rules;                     // $.resp groups
  std::shared_ptr<const RespAuth> auth;   // who may use the proxy (null: anyone)
  // The shard map to place keys with (called on the loops: cheap, never
  // blocking). Required.
  std::function<std::shared_ptr<const ShardMap>()> map;
  // Fetches a newer map (a node answered StaleEpoch); blocking, run on a
  // helper thread. May be empty.
  std::function<Status()> refresh;
  // DBSIZE and INFO figures; blocking, run on a helper thread. Empty:
  // DBSIZE answers 0.
  std::function<Result<RespClusterStats>()> stats;
};

class RespProxy {
 public:
  static Result<std::unique_ptr<RespProxy>> Start(RespProxyOptions options);
  // The same over a router's current map (Router::map); refresh unset.
  // REQUIRES: router outlives the proxy.
  static Result<std::unique_ptr<RespProxy>> Start(Router* router, RespProxyOptions options);
  virtual ~RespProxy() = default;
  virtual uint16_t port() const = 0;
  // Stops accepting, closes every client and node connection (what was in
  // flight is never answered), stops the loops and joins their threads.
  // Idempotent.
  virtual void Stop() = 0;
  virtual uint64_t commands() const = 0;
};

}  // namespace kvmesh

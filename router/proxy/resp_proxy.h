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
// Identities (design, docs/resp.md "AUTH and tenants"): a connection that
// logged in as tenant i (RespAuth, MakeClusterAuth over $.auth: AUTH user
// password) has its commands run by its loop's engine for that tenant, whose
// node links say HELLO with the tenant's name and token (tenants[i-1]): so
// the node scopes every key to the tenant's namespace and counts its quota,
// and the proxy never scopes keys itself. An engine (and its links) is made
// the first time a tenant's connection on that loop runs a command, and
// shared by every connection of that tenant on the loop. The cluster
// identity (the "default" user) uses the links with `tenant`/`token`.
//
// TLS: with tls.enabled() the node links speak TLS to the nodes' data ports,
// verifying them against tls.ca and presenting tls.cert (mutual TLS), and,
// unless client_tls is false, the client port speaks TLS only (client
// certificates required when client_auth is "all").
//
// INFO and DBSIZE show the cluster's figures (`stats`) to the cluster
// identity only; a tenant's DBSIZE answers 0 and its INFO has no keyspace
// figures (the coordinator's totals are every tenant's).
//
// Limits ($.limits, docs/security.md "Resource limits"): connections per
// port and per peer; before AUTH nothing but the handshake (no bulk string or
// buffered command over preauth_max_bytes, all within handshake_timeout_ms);
// a connection's unwritten answers bounded (AnswerBudget in resp_engine.h:
// past it the proxy fetches nothing more for it); read, write and idle
// timeouts.
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

#include <vector>

#include "kvmesh/config.h"
#include "kvmesh/status.h"
#include "transport/resp/resp_value.h"

namespace kvmesh {

class Router;
class ShardMap;
class RespAuth;
struct WatchCounters;

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
  // Identity i (1..n) of `auth` reaches the nodes as tenants[i-1] ($.auth.tenants).
  std::vector<TenantConfig> tenants;
  TlsConfig tls;                          // $.tls: the node links, and the client port with client_tls
  bool client_tls = true;                 // $.resp.tls
  // The shard map to place keys with (called on the loops: cheap, never
  // blocking). Required.
  std::function<std::shared_ptr<const ShardMap>()> map;
  // Fetches a newer map (a node answered StaleEpoch); blocking, run on a
  // helper thread. May be empty.
  std::function<Status()> refresh;
  // DBSIZE and INFO figures; blocking, run on a helper thread. Empty:
  // DBSIZE answers 0.
  std::function<Result<RespClusterStats>()> stats;
  // $.limits: connections per port and per peer, what a client may send
  // before AUTH, the handshake, read, write and idle timeouts, and the
  // answer bytes one connection may hold before its reads stop fetching.
  LimitsConfig limits;
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
  virtual uint64_t tls_failures() const = 0;  // client handshakes that failed
  virtual uint64_t connections_refused() const = 0;  // closed at accept by $.limits
  virtual const WatchCounters& timeouts() const = 0;  // connections closed by a timeout
};

}  // namespace kvmesh

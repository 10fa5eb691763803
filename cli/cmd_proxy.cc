// kvmesh proxy --config F [--coordinator host:port] [--resp-port P] ...
//
// The cluster-wide Redis-protocol front (router/proxy/resp_proxy.h): a
// stateless process that sends every key to the node that owns it. Run as
// many as you like; each one reads the shard map from the coordinator.
#include <unistd.h>

#include <iostream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/daemon_signals.h"
#include "common/bounded_json.h"
#include "common/credentials.h"
#include "kvmesh/config.h"
#include "kvmesh/network.h"
#include "router/map_fetch.h"
#include "router/proxy/resp_proxy.h"
#include "transport/resp/resp_commands.h"
#include "transport/http_client.h"
#include "transport/socket_util.h"
#include "transport/fd_tls_client.h"

namespace kvmesh::cli {
namespace {

// DBSIZE/INFO figures: the coordinator's /stats totals (node heartbeats, so
// up to one heartbeat period old).
Result<RespClusterStats> CoordinatorStats(const std::vector<CoordinatorAddress>& coordinators, int64_t timeout_ms,
                                          const std::string& token, std::shared_ptr<const TlsClientContext> tls) {
  HttpRequestOptions h;
  if (!token.empty()) h.authorization = BearerAuthorization(token);
  h.tls = std::move(tls);
  size_t at = 0;
  KVMESH_ASSIGN_OR_RETURN(HttpResult r, CoordinatorRequest(coordinators, &at, "GET", "/stats", "", timeout_ms, h));
  if (r.status != 200) return Unavailable("coordinator /stats: HTTP " + std::to_string(r.status));
  // Bounded in depth before "totals" is copied (common/bounded_json.h).
  const nlohmann::json j = ParseBoundedJson(r.body).value_or(nlohmann::json());
  if (!j.is_object()) return Unavailable("coordinator /stats: not JSON");
  RespClusterStats s;
  try {  // a field of another type throws: never past this function (it runs on a proxy worker)
    s.nodes = j.value("live_nodes", uint64_t{0});
    const nlohmann::json t = j.value("totals", nlohmann::json::object());
    s.blocks = t.value("blocks", uint64_t{0});
    s.bytes_stored = t.value("bytes_stored", uint64_t{0});
    s.hits = t.value("hits", uint64_t{0});
    s.misses = t.value("misses", uint64_t{0});
    s.evictions = t.value("evictions", uint64_t{0});
  } catch (const nlohmann::json::exception& e) {
    return Unavailable(std::string("coordinator /stats: ") + e.what());
  }
  return s;
}

}  // namespace

void AddProxyCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("proxy", "Run a cluster-wide Redis-protocol proxy (every key to the node that owns it)");
  struct Args {
    std::string config, coordinator, host = "127.0.0.1", token;
    int port = 6380;
    uint32_t io_threads = 1;
    uint64_t max_value_bytes = 0;
    int64_t timeout_ms = 0;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--config", a->config, "cluster config JSON (slot size, coordinator, token, $.resp)")->required();
  cmd->add_option("--coordinator", a->coordinator,
                  "coordinator host:port, or several separated by commas (default: $.coordinator)");
  cmd->add_option("--host", a->host, "listen address (default 127.0.0.1)");
  cmd->add_option("--resp-port", a->port, "RESP port (default 6380; 0 = a free port)")->check(CLI::Range(0, 65535));
  cmd->add_option("--io-threads", a->io_threads,
                  "event loops; each owns its client connections and one connection per node (default 1)")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--max-value-bytes", a->max_value_bytes, "largest value (default: $.resp.max_value_bytes, 64 MiB)");
  cmd->add_option("--timeout-ms", a->timeout_ms, "per node request (default $.transport.timeout_ms)");
  cmd->add_option("--token", a->token, "shared secret: the nodes' HELLO and the RESP password (overrides $.auth.token)");
  cmd->callback([a, exit_code] {
    BlockStopSignals();
    auto fail = [&](const Status& s) {
      std::cerr << "kvmesh proxy: " << s.ToString() << "\n";
      *exit_code = 1;
    };
    Result<ClusterConfig> c = LoadConfigFile(a->config);
    if (!c.ok()) return fail(c.status());
    NetworkClientOptions n;
    n.coordinator = a->coordinator;
    if (n.coordinator.empty()) n.coordinator = ConfigCoordinators(c->coordinator);
    if (n.coordinator.empty()) return fail(InvalidArgument("no coordinator: pass --coordinator or set $.coordinator.port"));
    n.client_id = "kvmesh-proxy";
    n.token = a->token.empty() ? c->auth.token : a->token;
    if (c->tls.enabled()) {  // the proxy reaches the cluster as one of its own processes
      n.tls_ca = c->tls.ca;
      n.tls_cert = c->tls.cert;
      n.tls_key = c->tls.key;
    }
    n.timeout_ms = a->timeout_ms > 0 ? a->timeout_ms : c->transport.timeout_ms;
    n.connect_timeout_ms = c->transport.connect_timeout_ms;
    auto coordinators = ParseCoordinatorList(n.coordinator);
    if (!coordinators.ok()) return fail(coordinators.status());
    auto client = NetworkClient::Connect(n);
    if (!client.ok()) return fail(client.status());
    NetworkClient* nc = client->get();
    RespProxyOptions o;
    o.host = a->host;
    o.port = static_cast<uint16_t>(a->port);
    o.max_value_bytes = a->max_value_bytes ? a->max_value_bytes : c->resp.max_value_bytes;
    o.block_bytes = c->store.slot_bytes ? c->store.slot_bytes : c->model.FullBlockBytes();
    o.io_threads = a->io_threads;
    o.timeout_ms = n.timeout_ms;
    o.connect_timeout_ms = n.connect_timeout_ms;
    o.token = n.token;
    o.rules = RespRulesFromConfig(c->resp);
    AuthConfig auth = c->auth;  // the "default" user's password: the token the proxy uses
    auth.token = n.token;
    o.auth = MakeClusterAuth(auth);
    o.tenants = auth.tenants;
    o.tls = c->tls;  // node links; the client port too unless $.resp.tls is false
    o.client_tls = c->resp.tls;
    o.limits = c->limits;  // connections, timeouts, what a client may send before AUTH, answers held
    o.map = [nc] { return nc->router().map(); };
    o.refresh = [nc] { return nc->Refresh(); };
    std::shared_ptr<const TlsClientContext> stats_tls;
    if (c->tls.enabled()) {
      TlsClientOptions t;
      t.ca = c->tls.ca;
      t.cert = c->tls.cert;
      t.key = c->tls.key;
      t.verify_hostname = c->tls.verify_hostname;
      auto ctx = TlsClientContext::Create(t);
      if (!ctx.ok()) return fail(ctx.status());
      stats_tls = *ctx;
    }
    o.stats = [coordinators = *coordinators, t = n.timeout_ms, token = n.token, stats_tls] {
      return CoordinatorStats(coordinators, t, token, stats_tls);
    };
    auto proxy = RespProxy::Start(o);
    if (!proxy.ok()) return fail(proxy.status());
    nlohmann::json j{{"event", "listening"}, {"role", "proxy"}, {"host", o.host}, {"pid", ::getpid()},
                     {"coordinator", n.coordinator}, {"nodes", nc->num_nodes()},
                     {"max_value_bytes", o.max_value_bytes}, {"block_bytes", o.block_bytes},
                     {"auth", o.auth != nullptr}, {"tenants", o.tenants.size()},
                     {"tls", c->tls.enabled() && o.client_tls}, {"ports", {{"resp", (*proxy)->port()}}}};
    PrintLine(j.dump());
    int sig = WaitForStopSignal();
    (*proxy)->Stop();
    PrintLine("{\"event\":\"stopped\",\"role\":\"proxy\",\"signal\":" + std::to_string(sig) + "}");
  });
}

}  // namespace kvmesh::cli

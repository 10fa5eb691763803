#include "shard_node/server/node_daemon.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "kvmesh/build_config.h"
#include "router/map_fetch.h"
#include "shard_node/server/cluster_slots.h"
#include "shard_node/server/data_server.h"
#include "shard_node/server/resp_server.h"
#include "transport/local_index.h"
#include "transport/resp/resp_commands.h"
#if defined(KVMESH_HAVE_UCX)
#include "shard_node/server/ucx_server.h"
#include "transport/ucx_worker.h"
#endif
#include "common/bounded_json.h"
#include "common/credentials.h"
#include "eviction/score_exchange.h"
#include "shard_node/shard_node.h"
#include "transport/http_auth.h"
#include "transport/http_client.h"
#include "transport/asio_listener.h"
#include "transport/http_server.h"
#include "transport/socket_util.h"
#include "transport/fd_tls_client.h"
#include "transport/asio_tls.h"

namespace kvmesh {
namespace {

using nlohmann::json;

// The largest body the HTTP port takes: POST /policy {"policy": NAME}; every
// other route takes none (larger: 413 at the request's head).
constexpr uint64_t kMaxPolicyBodyBytes = 4 << 10;

void LogEvent(const std::string& node_id, json j) {
  j["ts_ms"] = std::chrono::duration_cast<std::chrono::milliseconds>(
                   std::chrono::system_clock::now().time_since_epoch()).count();
  j["role"] = "node";
  j["node_id"] = node_id;
  // Fields may carry a client's bytes (a refused path): never throw on bad UTF-8.
  std::fprintf(stderr, "%s\n", j.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
  std::fflush(stderr);
}

class Daemon final : public NodeDaemon {
 public:
  Daemon(const ClusterConfig& c, NodeDaemonOptions o) : config_(c), o_(std::move(o)) {}
  ~Daemon() override { Stop(); }

  Status Start() {
    const NodeConfig* nc = config_.FindNode(o_.node_id);
    if (nc == nullptr) return NotFound("node id \"" + o_.node_id + "\" is not in the config");
    node_cfg_ = *nc;
    KVMESH_ASSIGN_OR_RETURN(node_, ShardNode::Create(config_, o_.node_id));
    DataServerOptions d;
    d.host = nc->host;
    d.port = nc->ports.data;
    d.threads = config_.transport.io_threads;
    d.token = config_.auth.token;
    d.conn_limits = config_.limits;
    HttpTls http_tls;
    if (config_.tls.enabled()) {
      // Data port: a certificate only with client_auth "all". HTTP: the same
      // context; admin calls then check the certificate (transport/http_auth.h).
      KVMESH_ASSIGN_OR_RETURN(d.tls, MakeTlsServerContext(config_.tls, config_.tls.client_auth == "all"));
      http_tls = d.tls;
      TlsClientOptions c;  // this node as the coordinator's client: it shows its certificate
      c.ca = config_.tls.ca;
      c.cert = config_.tls.cert;
      c.key = config_.tls.key;
      c.verify_hostname = config_.tls.verify_hostname;
      KVMESH_ASSIGN_OR_RETURN(coord_tls_, TlsClientContext::Create(c));
    }
    d.limits.max_body_bytes = static_cast<uint32_t>(std::min<uint64_t>(config_.transport.max_frame_bytes, UINT32_MAX));
    d.limits.max_items = config_.transport.max_batch_items;
    // With a codec a slot holds an encoded block, but a put carries the raw
    // block (the node encodes it): the limit is the larger of the two.
    const uint64_t block_limit = node_->codec() ? std::max<uint64_t>(node_->store().slot_bytes(), config_.model.FullBlockBytes())
                                                : node_->store().slot_bytes();
    d.limits.max_block_bytes = static_cast<uint32_t>(std::min<uint64_t>(block_limit, UINT32_MAX));
    KVMESH_ASSIGN_OR_RETURN(data_, DataServer::Start(node_.get(), d, &epoch_));
    if (config_.transport.backend == "ucx") {
#if defined(KVMESH_HAVE_UCX)
      UcxServerOptions u;
      u.limits = d.limits;
      u.token = d.token;
      KVMESH_ASSIGN_OR_RETURN(u.progress, ParseUcxProgress(config_.transport.ucx_progress));
      u.spin_us = config_.transport.ucx_spin_us;
      // 0: one worker per core, up to 4 (each worker's loop copies GET
      // answers into its clients' memory, so many clients keep every core
      // copying; docs/guide.md has the 1-vs-2-worker runs on 2 cores).
      u.workers = config_.transport.ucx_workers > 0
                      ? static_cast<int>(config_.transport.ucx_workers)
                      : static_cast<int>(std::clamp<unsigned>(std::thread::hardware_concurrency(), 1, 4));
      KVMESH_ASSIGN_OR_RETURN(ucx_, UcxServer::Start(node_.get(), u, &epoch_));
      ucx_address_ = HexEncode(ucx_->address());
#else
      return FailedPrecondition("$.transport.backend is \"ucx\" but this build has no UCX (KVMESH_WITH_UCX)");
#endif
    }
    if (o_.resp) {
      RespServerOptions r;
      r.host = nc->host;
      r.port = nc->ports.resp;
      r.max_value_bytes = config_.resp.max_value_bytes;
      r.rules = RespRulesFromConfig(config_.resp);
      r.limits = config_.limits;
      r.auth = MakeClusterAuth(config_.auth);  // identities in config order, as the node's TenantRegistry
      if (config_.resp.tls) r.tls = config_.tls;
      if (config_.resp.cluster) {
        cluster_ = std::make_shared<ClusterSlots>();
        r.cluster = cluster_;
      }
      KVMESH_ASSIGN_OR_RETURN(resp_, RespServer::Start(node_.get(), r));
      // Without a coordinator this node is the whole cluster: every slot is its own.
      if (cluster_ && o_.coordinator.empty())
        cluster_->Install(SingleNodeClusterView(o_.node_id, nc->host, resp_->port(), data_->port()));
    }
    HttpServerOptions ho;
    ho.tls = std::move(http_tls);
    ho.head_check = [this](const HttpServerRequest& head) { return HttpHead(head); };  // before any body is read
    KVMESH_ASSIGN_OR_RETURN(http_, HttpServer::Start(nc->host, nc->ports.http,
                                                     [this](const HttpServerRequest& r) { return Http(r); },
                                                     std::move(ho)));
    if (!o_.coordinator.empty()) {
      KVMESH_ASSIGN_OR_RETURN(coordinators_, ParseCoordinatorList(o_.coordinator));
      heart_ = std::thread([this] { Heartbeats(); });
    }
    return Status::Ok();
  }

  std::string ucx_address() const override { return ucx_address_; }
  std::string ListeningJson() const override {
    json ports = {{"data", data_->port()}, {"http", http_->port()}};
    if (resp_) ports["resp"] = resp_->port();
    if (KvEventPublisher* ev = node_->events()) {  // $.events: the PUB socket and its replay ROUTER
      ports["events"] = ev->port();
      ports["events_replay"] = ev->replay_port();
    }
    json j{{"event", "listening"}, {"role", "node"}, {"node_id", o_.node_id}, {"host", node_cfg_.host},
           {"pid", ::getpid()}, {"tls", config_.tls.enabled()}, {"ports", ports}};
    if (!ucx_address_.empty()) j["ucx_address"] = ucx_address_;  // hex worker address
    return j.dump();
  }
  uint16_t data_port() const override { return data_->port(); }
  uint64_t epoch() const override { return epoch_.load(); }

  void Stop() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    cv_.notify_all();
    if (heart_.joinable()) heart_.join();
    if (registered_)  // let routers move on at once instead of after dead_after_ms
      (void)CoordinatorRequest(coordinators_, &coord_at_, "POST", "/leave", json{{"id", o_.node_id}}.dump(), 500,
                               CoordinatorAuth());
    if (http_) http_->Stop();
    if (resp_) resp_->Stop();
#if defined(KVMESH_HAVE_UCX)
    if (ucx_) ucx_->Stop();
#endif
    if (data_) data_->Stop();
  }

 private:
  // The cluster secret on every call to the coordinator (transport/http_auth.h).
  HttpRequestOptions CoordinatorAuth() const {
    HttpRequestOptions h;
    if (!config_.auth.token.empty()) h.authorization = BearerAuthorization(config_.auth.token);
    h.tls = coord_tls_;  // HTTPS with this node's certificate when the cluster has $.tls
    return h;
  }

  // The HTTP server's head check: credentials and the body limit, before any body is read.
  HttpHeadDecision HttpHead(const HttpServerRequest& head) {
    const std::string path = head.target.substr(0, head.target.find('?'));
    HttpHeadDecision d;
    d.max_body_bytes = head.method == "POST" && path == "/policy" ? kMaxPolicyBodyBytes : 0;
    d.refuse = Authorize(head, path);
    return d;
  }

  // Everything but /healthz (statistics, metrics, the policy switch) takes the
  // cluster secret: the refusal (counted and logged), or nothing.
  std::optional<HttpServerResponse> Authorize(const HttpServerRequest& r, const std::string& path) {
    if (path == "/healthz") return std::nullopt;
    const bool admin_cert = config_.tls.enabled() && config_.tls.client_auth != "none";
    if (HttpAuthDecision d = AuthorizeHttp(config_.auth, r, HttpAccess::kAdmin, admin_cert); !d.allowed) {
      http_refused_.fetch_add(1, std::memory_order_relaxed);
      uint64_t suppressed = 0;
      if (refusal_log_.Allow(&suppressed)) {
        json e{{"event", "auth_refused"}, {"port", "http"}, {"method", r.method.substr(0, 16)},
               {"path", path.substr(0, 128)}, {"peer", r.peer}, {"status", d.status}, {"reason", d.reason}};
        if (suppressed) e["suppressed"] = suppressed;
        LogEvent(o_.node_id, std::move(e));
      }
      return RefusalResponse(d);
    }
    return std::nullopt;
  }

  HttpServerResponse Http(const HttpServerRequest& r) {
    std::string path = r.target.substr(0, r.target.find('?'));
    if (path == "/healthz") return {200, "text/plain", "ok\n"};
    if (auto refused = Authorize(r, path)) return std::move(*refused);  // already refused at the head over HTTP
    if (path == "/stats") {
      node_->ReconcileTenants();
      return {200, "application/json", node_->StatsJson() + "\n"};
    }
    if (path == "/metrics") return {200, "text/plain; version=0.0.4", Metrics()};
    if (path == "/policy") {  // GET: the eviction policy; POST {"policy": NAME}: switch it at run time
      if (r.method == "POST") {
        json body = ParseBoundedJson(r.body).value_or(json());
        if (!body.is_object() || !body.contains("policy") || !body["policy"].is_string())
          return {400, "application/json", json{{"error", "expected {\"policy\": NAME}"}}.dump() + "\n"};
        Status s = node_->SetEvictionPolicy(body["policy"].get<std::string>());
        if (!s.ok()) return {400, "application/json", json{{"error", s.ToString()}}.dump() + "\n"};
        std::printf("%s\n", json{{"event", "policy_switched"}, {"node_id", o_.node_id},
                                  {"policy", node_->store().policy_name()}}.dump().c_str());
        std::fflush(stdout);
      }
      return {200, "application/json", json{{"policy", node_->store().policy_name()}}.dump() + "\n"};
    }
    return {404, "text/plain", "not found\n"};
  }

  std::string Metrics() {
    NodeStats st = node_->Stats();
    const StoreStats& s = st.store;
    std::string out = data_->MetricsText();
    auto g = [&](const char* name, const char* type, uint64_t v) {
      out += std::string("# TYPE ") + name + " " + type + "\n" + name + " " + std::to_string(v) + "\n";
    };
    g("kvmesh_store_blocks", "gauge", s.blocks);
    g("kvmesh_store_bytes", "gauge", s.bytes_stored);
    g("kvmesh_store_capacity_bytes", "gauge", s.capacity_bytes);
    g("kvmesh_store_pinned_blocks", "gauge", s.pinned_blocks);
    g("kvmesh_store_hits_total", "counter", s.hits);
    g("kvmesh_store_misses_total", "counter", s.misses);
    g("kvmesh_store_puts_total", "counter", s.puts);
    g("kvmesh_store_evictions_total", "counter", s.evictions);
    g("kvmesh_store_corrupt_total", "counter", s.corrupt);
    if (const LocalIndexWriter* li = node_->local_index()) {  // local reads (transport/local_index.h)
      g("kvmesh_local_reads_total", "counter", li->reads());
      g("kvmesh_local_published_total", "counter", li->published());
    }
    g("kvmesh_shard_map_epoch", "gauge", epoch_.load());
    g("kvmesh_http_auth_refused_total", "counter", http_refused_.load(std::memory_order_relaxed));
    if (resp_) {
      g("kvmesh_resp_commands_total", "counter", resp_->commands());
      g("kvmesh_resp_connections_refused_total", "counter", resp_->connections_refused());
      const WatchCounters& t = resp_->timeouts();
      out += "# TYPE kvmesh_resp_connection_timeouts_total counter\n";
      for (auto [kind, v] : {std::pair{"handshake", &t.handshake}, std::pair{"read", &t.read},
                             std::pair{"write", &t.write}, std::pair{"idle", &t.idle}})
        out += std::string("kvmesh_resp_connection_timeouts_total{kind=\"") + kind + "\"} " + std::to_string(v->load()) + "\n";
    }
#if defined(KVMESH_HAVE_UCX)
    if (ucx_) g("kvmesh_ucx_requests_total", "counter", ucx_->requests());
    if (ucx_) g("kvmesh_ucx_one_sided_bytes_total", "counter", ucx_->one_sided_bytes());
    if (ucx_) g("kvmesh_ucx_warm_pending_bytes", "gauge", ucx_->warm_pending_bytes());
#endif
    if (TieredStore* t = node_->tiers()) out += t->PrometheusText();  // tiers and pressure
    node_->ReconcileTenants();
    out += node_->tenants().PrometheusText();  // kvmesh_tenant_*{tenant="..."}
    return out;
  }

  void Heartbeats() {
    const auto period = std::chrono::milliseconds(config_.coordinator.heartbeat_ms);
    std::unique_lock<std::mutex> lock(mu_);
    bool logged_unreachable = false;
    do {
      lock.unlock();
      Status s = registered_ ? Heartbeat() : Register();
      if (s.ok() && cluster_ && ClusterViewStale()) {
        Status m = RefreshClusterView();
        if (!m.ok() && !cluster_logged_)
          LogEvent(o_.node_id, {{"event", "cluster_map_failed"}, {"error", m.ToString()}});
        cluster_logged_ = !m.ok();
      }
      if (!s.ok() && !logged_unreachable) {
        const bool refused = s.code() == StatusCode::kPermissionDenied;  // the cluster secret does not match
        LogEvent(o_.node_id, {{"event", refused ? "coordinator_refused" : "coordinator_unreachable"},
                              {"error", s.ToString()}});
        logged_unreachable = true;
      } else if (s.ok()) {
        logged_unreachable = false;
      }
      lock.lock();
    } while (!cv_.wait_for(lock, period, [this] { return stopping_; }));
  }

  Status Register() {
    json body = {{"id", o_.node_id}, {"host", node_cfg_.host}, {"weight", node_cfg_.weight},
                 {"ports", {{"data", data_->port()}, {"http", http_->port()}, {"resp", resp_ ? resp_->port() : 0}}}};
    if (!ucx_address_.empty()) body["ucx"] = ucx_address_;
    KVMESH_ASSIGN_OR_RETURN(HttpResult r,
                            CoordinatorRequest(coordinators_, &coord_at_, "POST", "/register", body.dump(),
                                               config_.coordinator.heartbeat_ms * 2, CoordinatorAuth()));
    if (r.status == 401 || r.status == 403)
      return PermissionDenied("register: HTTP " + std::to_string(r.status) + " " + r.body);
    if (r.status != 200) return Unavailable("register: HTTP " + std::to_string(r.status) + " " + r.body);
    json a = ParseBoundedJson(r.body).value_or(json());  // the coordinator's answer, bounded in depth
    if (!a.is_object() || !a.contains("epoch") || !a["epoch"].is_number_unsigned())
      return Unavailable("register: bad answer");
    epoch_.store(a["epoch"].get<uint64_t>());
    registered_ = true;
    LogEvent(o_.node_id, {{"event", "registered"}, {"epoch", epoch_.load()}});
    return Status::Ok();
  }

  // Cluster mode: no view yet, or one of another epoch than the heartbeat's.
  bool ClusterViewStale() const {
    const std::shared_ptr<const RespClusterView> v = cluster_->View();
    return !v || v->epoch != epoch_.load();
  }

  // Cluster mode: the slots of the map the coordinator publishes now.
  Status RefreshClusterView() {
    KVMESH_ASSIGN_OR_RETURN(PublishedMap pm, FetchPublishedMap(coordinators_, &coord_at_,
                                                               config_.coordinator.heartbeat_ms * 2, CoordinatorAuth()));
    KVMESH_ASSIGN_OR_RETURN(std::shared_ptr<const RespClusterView> v, BuildClusterView(pm, o_.node_id));
    size_t own = 0;
    for (int32_t o : v->owner) own += (o >= 0 && o == v->self);
    const std::shared_ptr<const RespClusterView> prev = cluster_->View();
    const bool changed = !prev || prev->epoch != v->epoch;
    cluster_->Install(v);
    if (changed)
      LogEvent(o_.node_id, {{"event", "cluster_slots"}, {"epoch", v->epoch}, {"nodes", v->nodes.size()},
                            {"slots_owned", own}});
    return Status::Ok();
  }

  Status Heartbeat() {
    StoreStats s = node_->Stats().store;
    json body = {{"id", o_.node_id},
                 {"stats", {{"blocks", s.blocks}, {"bytes_stored", s.bytes_stored}, {"hits", s.hits},
                            {"misses", s.misses}, {"puts", s.puts}, {"evictions", s.evictions}}}};
    // The node's eviction groups' scores; the answer's "eviction_peers" are
    // the other nodes' sums, which the groups add to their own (every stripe
    // of every node then follows one expert: docs/eviction.md).
    json eviction = json::object();
    for (const PolicyGroups::Entry& e : node_->policy_groups().Snapshot()) eviction[e.key] = e.own;
    if (!eviction.empty()) body["eviction"] = std::move(eviction);
    // A coordinator that is down or cut off from etcd sends it to the next,
    // which answers 404 (it does not know this node): it registers there.
    auto sent = CoordinatorRequest(coordinators_, &coord_at_, "POST", "/heartbeat", body.dump(),
                                   config_.coordinator.heartbeat_ms * 2, CoordinatorAuth());
    if (!sent.ok() || sent->status != 200) node_->policy_groups().SetPeers({});  // no peers heard: decide alone
    KVMESH_ASSIGN_OR_RETURN(HttpResult r, std::move(sent));
    if (r.status == 404) {  // the coordinator dropped us (restart or a long pause): join again
      registered_ = false;
      return Register();
    }
    if (r.status == 401 || r.status == 403) return PermissionDenied("heartbeat: HTTP " + std::to_string(r.status));
    if (r.status != 200) return Unavailable("heartbeat: HTTP " + std::to_string(r.status));
    json a = ParseBoundedJson(r.body).value_or(json());  // the coordinator's answer, bounded in depth
    if (a.is_object() && a.contains("epoch") && a["epoch"].is_number_unsigned()) epoch_.store(a["epoch"].get<uint64_t>());
    node_->policy_groups().SetPeers(a.is_object() ? ParsePeerScores(a.value("eviction_peers", json())) : PeerScores{});
    return Status::Ok();
  }

  const ClusterConfig config_;
  NodeDaemonOptions o_;
  NodeConfig node_cfg_;
  std::unique_ptr<ShardNode> node_;
  std::atomic<uint64_t> epoch_{0};
  std::unique_ptr<DataServer> data_;
  std::unique_ptr<RespServer> resp_;
  std::shared_ptr<ClusterSlots> cluster_;  // $.resp.cluster
  bool cluster_logged_ = false;             // the heartbeat thread's: a failed map fetch was logged
#if defined(KVMESH_HAVE_UCX)
  std::unique_ptr<UcxServer> ucx_;
#endif
  std::string ucx_address_;  // hex; empty without the UCX backend
  std::unique_ptr<HttpServer> http_;
  std::atomic<uint64_t> http_refused_{0};
  EventRateLimiter refusal_log_;
  std::vector<CoordinatorAddress> coordinators_;  // o_.coordinator: one or several
  size_t coord_at_ = 0;                            // the heartbeat thread's (Stop's once it ended): the one that answered last
  std::shared_ptr<const TlsClientContext> coord_tls_;  // with $.tls
  std::thread heart_;
  std::atomic<bool> registered_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;  // guarded by mu_
};

}  // namespace

Result<std::unique_ptr<NodeDaemon>> NodeDaemon::Start(const ClusterConfig& config, NodeDaemonOptions options) {
  auto d = std::make_unique<Daemon>(config, std::move(options));
  KVMESH_RETURN_IF_ERROR(d->Start());
  return std::unique_ptr<NodeDaemon>(std::move(d));
}

}  // namespace kvmesh

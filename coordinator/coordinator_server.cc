#include "coordinator/coordinator_server.h"

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/json_reader.h"
#include "router/map_json.h"
#include "transport/http_auth.h"
#include "transport/http_server.h"

namespace kvmesh {
namespace {

using nlohmann::json;
using SteadyClock = std::chrono::steady_clock;

int64_t UnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// One structured event per line on stderr (docs/architecture.md, "Observability").
void LogEvent(json j) {
  j["ts_ms"] = UnixMs();
  j["role"] = "coordinator";
  // Fields may carry a client's bytes (a refused path): never throw on bad UTF-8.
  std::fprintf(stderr, "%s\n", j.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
  std::fflush(stderr);
}

struct Member {
  ShardInfo info;
  std::string ucx;  // hex UCX worker address ("" without UCX)
  SteadyClock::time_point last;
  json stats = json::object();
};

class Coordinator final : public CoordinatorServer {
 public:
  explicit Coordinator(const ClusterConfig& c) : config_(c) {}
  ~Coordinator() override { Stop(); }

  Status Start(uint16_t port) {
    auto s = HttpServer::Start(config_.coordinator.host, port,
                               [this](const HttpServerRequest& r) { return Handle(r); });
    if (!s.ok()) return s.status();
    http_ = std::move(*s);
    reaper_ = std::thread([this] { Reap(); });
    return Status::Ok();
  }

  uint16_t port() const override { return http_->port(); }
  uint64_t epoch() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return epoch_;
  }
  size_t live_nodes() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return members_.size();
  }
  std::string ListeningJson() const override {
    return json{{"event", "listening"}, {"role", "coordinator"}, {"node_id", "coordinator"},
                {"host", config_.coordinator.host}, {"pid", ::getpid()}, {"ports", {{"http", port()}}}}
        .dump();
  }

  void Stop() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    cv_.notify_all();
    if (reaper_.joinable()) reaper_.join();
    if (http_) http_->Stop();
  }

 private:
  static HttpServerResponse Json(int status, const json& j) { return {status, "application/json", j.dump() + "\n"}; }

  // Who may call what (transport/http_auth.h): /healthz is open, reading the
  // map takes the cluster secret or a tenant's credentials, everything else
  // (membership writes, /nodes, /stats) the cluster secret.
  static HttpAccess AccessFor(const std::string& method, const std::string& path) {
    if (path == "/healthz") return HttpAccess::kOpen;
    if (method == "GET" && path == "/map") return HttpAccess::kRead;
    return HttpAccess::kAdmin;
  }

  HttpServerResponse Handle(const HttpServerRequest& r) {
    std::string path = r.target.substr(0, r.target.find('?'));
    // Checked before the body is read: a refused request changes nothing.
    if (HttpAuthDecision d = AuthorizeHttp(config_.auth, r, AccessFor(r.method, path)); !d.allowed) {
      uint64_t suppressed = 0;
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++auth_refused_;
      }
      if (refusal_log_.Allow(&suppressed)) {
        json e{{"event", "auth_refused"}, {"method", r.method.substr(0, 16)}, {"path", path.substr(0, 128)},
               {"peer", r.peer}, {"status", d.status}, {"reason", d.reason}};
        if (suppressed) e["suppressed"] = suppressed;
        LogEvent(std::move(e));
      }
      return RefusalResponse(d);
    }
    if (r.method == "GET") {
      if (path == "/healthz") return {200, "text/plain", "ok\n"};
      if (path == "/map") return {200, "application/json", MapJson() + "\n"};
      if (path == "/nodes") return Json(200, NodesJson());
      if (path == "/stats") return Json(200, StatsJson());
      return Json(404, {{"error", "no such endpoint: " + path}});
    }
    if (r.method != "POST") return Json(405, {{"error", "use GET or POST"}});
    json body = json::parse(r.body, nullptr, false);
    if (body.is_discarded() || !body.is_object() || !body.contains("id") || !body["id"].is_string() ||
        body["id"].get<std::string>().empty())
      return Json(400, {{"error", "body must be a JSON object with a non-empty string \"id\""}});
    const std::string id = body["id"].get<std::string>();
    if (path == "/register") return Register(id, body);
    if (path == "/heartbeat") {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = members_.find(id);
      if (it == members_.end()) return Json(404, {{"error", "unknown node " + id + ": register again"}, {"epoch", epoch_}});
      it->second.last = SteadyClock::now();
      if (body.contains("stats") && body["stats"].is_object()) it->second.stats = body["stats"];
      return Json(200, {{"epoch", epoch_}});
    }
    if (path == "/leave") {
      std::lock_guard<std::mutex> lock(mu_);
      if (members_.erase(id)) {
        ++epoch_;
        ++removals_;
        LogEvent({{"event", "node_left"}, {"node_id", id}, {"epoch", epoch_}});
      }
      return Json(200, {{"epoch", epoch_}});
    }
    return Json(404, {{"error", "no such endpoint: " + path}});
  }

  // A registration names its JSON path and reason when it is refused (400),
  // like a bad config: {"id", "host"?, "weight"?, "ports": {"data", "http"?,
  // "resp"?}, "ucx"?}; unknown keys are refused too.
  HttpServerResponse Register(const std::string& id, const json& b) {
    ShardInfo s;
    s.id = id;
    s.host = "127.0.0.1";
    s.weight = 1.0;
    std::string ucx;
    ObjectReader r(b, "$");
    r.Child("id", /*required=*/true);  // its value was checked by the caller
    r.Optional("host", &s.host).Optional("weight", &s.weight).Optional("ucx", &ucx);
    if (const json* p = r.Child("ports", /*required=*/true); p != nullptr && r.ok()) {
      ObjectReader pr(*p, "$.ports");
      pr.Required("data", &s.ports.data).Optional("http", &s.ports.http).Optional("resp", &s.ports.resp);
      if (pr.ok() && s.ports.data == 0) pr.Fail("data", "must be a port in 1..65535");
      if (Status st = pr.Finish(); !st.ok()) return Json(400, {{"error", "bad registration: " + st.message()}});
    }
    if (r.ok() && !(s.weight > 0)) r.Fail("weight", "must be > 0");
    if (r.ok() && s.host.empty()) r.Fail("host", "must not be empty");
    if (Status st = r.Finish(); !st.ok()) return Json(400, {{"error", "bad registration: " + st.message()}});
    std::lock_guard<std::mutex> lock(mu_);
    auto it = members_.find(id);
    const bool rejoin = it != members_.end();
    if (!rejoin || it->second.info.host != s.host || it->second.info.ports.data != s.ports.data ||
        it->second.info.weight != s.weight) {
      ++epoch_;
      ++registrations_;
      LogEvent({{"event", rejoin ? "node_rejoined" : "node_joined"}, {"node_id", id}, {"epoch", epoch_},
                {"data_port", s.ports.data}});
    }
    Member& m = members_[id];
    m.info = s;
    m.ucx = ucx;
    m.last = SteadyClock::now();
    return Json(200, {{"epoch", epoch_}, {"heartbeat_ms", config_.coordinator.heartbeat_ms}});
  }

  std::string MapJson() const {
    PublishedMap pm;
    pm.model = config_.model;
    pm.placement = config_.placement;
    std::lock_guard<std::mutex> lock(mu_);
    pm.epoch = epoch_;
    pm.backend = config_.transport.backend;
    for (const auto& [id, m] : members_) {
      pm.nodes.push_back(m.info);
      if (!m.ucx.empty()) pm.ucx_addresses[id] = m.ucx;
    }
    return PublishedMapToJson(pm);
  }

  json NodesJson() const {
    std::lock_guard<std::mutex> lock(mu_);
    json nodes = json::array();
    const auto now = SteadyClock::now();
    for (const auto& [id, m] : members_) {
      nodes.push_back({{"id", id}, {"host", m.info.host}, {"weight", m.info.weight},
                       {"ports", {{"data", m.info.ports.data}, {"http", m.info.ports.http}, {"resp", m.info.ports.resp}}},
                       {"last_heartbeat_ms_ago",
                        std::chrono::duration_cast<std::chrono::milliseconds>(now - m.last).count()}});
    }
    return {{"epoch", epoch_}, {"nodes", nodes}};
  }

  json StatsJson() const {
    std::lock_guard<std::mutex> lock(mu_);
    json per = json::object();
    json totals = json::object();
    for (const auto& [id, m] : members_) {
      per[id] = m.stats;
      for (auto it = m.stats.begin(); it != m.stats.end(); ++it)
        if (it->is_number_unsigned()) totals[it.key()] = totals.value(it.key(), uint64_t{0}) + it->get<uint64_t>();
    }
    return {{"epoch", epoch_}, {"live_nodes", members_.size()}, {"registrations", registrations_},
            {"removals", removals_}, {"auth_refused", auth_refused_}, {"totals", totals}, {"nodes", per}};
  }

  void Reap() {
    const auto period = std::chrono::milliseconds(std::max<int64_t>(10, config_.coordinator.heartbeat_ms / 2));
    const auto dead_after = std::chrono::milliseconds(config_.coordinator.dead_after_ms);
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, period, [this] { return stopping_; })) {
      const auto now = SteadyClock::now();
      for (auto it = members_.begin(); it != members_.end();) {
        if (now - it->second.last > dead_after) {
          ++epoch_;
          ++removals_;
          LogEvent({{"event", "node_removed"}, {"node_id", it->first}, {"reason", "missed heartbeats"}, {"epoch", epoch_}});
          it = members_.erase(it);
        } else {
          ++it;
        }
      }
    }
  }

  const ClusterConfig config_;
  std::unique_ptr<HttpServer> http_;
  std::thread reaper_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;                  // guarded by mu_
  // Starts at the wall-clock milliseconds, so that epochs keep growing across
  // a coordinator restart (routers ignore maps older than the one they hold).
  uint64_t epoch_ = static_cast<uint64_t>(UnixMs());  // guarded by mu_
  uint64_t registrations_ = 0, removals_ = 0;  // guarded by mu_
  uint64_t auth_refused_ = 0;                  // guarded by mu_
  EventRateLimiter refusal_log_;
  std::map<std::string, Member> members_;  // guarded by mu_
};

}  // namespace

Result<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(const ClusterConfig& config, uint16_t port_override) {
  auto c = std::make_unique<Coordinator>(config);
  KVMESH_RETURN_IF_ERROR(c->Start(port_override ? port_override : config.coordinator.port));
  return std::unique_ptr<CoordinatorServer>(std::move(c));
}

}  // namespace kvmesh

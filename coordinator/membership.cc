#include "coordinator/membership.h"

#include <cctype>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

#include <nlohmann/json.hpp>

#include "common/bounded_json.h"
#include "common/json_reader.h"
#include "eviction/score_exchange.h"
#include "router/map_json.h"
#include "transport/http_auth.h"

namespace kvmesh {
namespace {

using nlohmann::json;
using SteadyClock = std::chrono::steady_clock;

int64_t UnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A heartbeat's node counters: only kHeartbeatCounters, as last reported.
using Counters = std::map<std::string, uint64_t>;

struct Member {
  ShardInfo info;
  std::string ucx;  // hex UCX worker address ("" without UCX)
  SteadyClock::time_point last;
  Counters stats;       // never a client's JSON: the counters it reported, nothing else
  PeerScores eviction;  // its eviction groups' scores, as last sent (eviction/score_exchange.h)
};

// "$.stats" of a heartbeat: an object whose known counters are non-negative
// integers; other keys are dropped (a newer node may send more).
Result<Counters> ParseCounters(const json& j) {
  if (!j.is_object()) return InvalidArgument("$.stats: must be an object of counters");
  Counters out;
  for (const char* name : kHeartbeatCounters) {
    auto it = j.find(name);
    if (it == j.end()) continue;
    if (!it->is_number_unsigned())
      return InvalidArgument(std::string("$.stats.") + name + ": must be a non-negative integer");
    out[name] = it->get<uint64_t>();
  }
  return out;
}

bool IsHex(const std::string& s) {
  for (char c : s)
    if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

// The largest body each route takes (membership.h).
uint64_t BodyLimit(const std::string& method, const std::string& path) {
  if (method != "POST") return 0;
  if (path == "/heartbeat") return kMaxHeartbeatBodyBytes;
  if (path == "/register") return kMaxRegisterBodyBytes;
  return kMaxSmallBodyBytes;
}

}  // namespace

struct Membership::Impl {
  const ClusterConfig config;
  EventSink sink;
  mutable std::mutex mu;
  // Starts at the wall-clock milliseconds, so that epochs keep growing across
  // a coordinator restart (routers ignore maps older than the one they hold).
  uint64_t epoch = static_cast<uint64_t>(UnixMs());  // guarded by mu
  uint64_t registrations = 0, removals = 0;          // guarded by mu
  uint64_t auth_refused = 0;                         // guarded by mu
  std::map<std::string, Member> members;             // guarded by mu
  EventRateLimiter refusal_log;
  // $.coordinator.etcd (membership.h): members and map live in etcd.
  const bool etcd;
  // guarded by mu: until when etcd counts as reachable (max: always; min: not now)
  SteadyClock::time_point store_reachable_until = SteadyClock::time_point::max();
  std::string published;                     // guarded by mu: the map last read from etcd ("" = none yet)
  std::vector<ShardInfo> published_nodes;    // guarded by mu: its nodes
  std::vector<std::string> left;             // guarded by mu: /leave ids not yet taken
  json store_status = json::object();        // guarded by mu

  Impl(const ClusterConfig& c, EventSink s)
      : config(c), sink(std::move(s)), etcd(c.coordinator.etcd.enabled()) {
    if (etcd) epoch = 0;  // the epoch is etcd's (Publish)
  }

  // etcd mode while etcd is out of reach: this coordinator cannot speak for
  // the cluster; nodes and clients try the next one. REQUIRES mu held.
  std::optional<HttpServerResponse> Unreachable() const {
    if (etcd && SteadyClock::now() >= store_reachable_until)
      return Json(503, {{"error", "this coordinator cannot reach etcd: try another"}, {"epoch", epoch}});
    return std::nullopt;
  }

  // One structured event per line (docs/architecture.md, "Observability").
  void Log(json j) {
    j["ts_ms"] = UnixMs();
    j["role"] = "coordinator";
    // Fields may carry a client's bytes (a refused path): never throw on bad UTF-8.
    const std::string line = j.dump(-1, ' ', false, json::error_handler_t::replace);
    if (sink) {
      sink(line);
    } else {
      std::fprintf(stderr, "%s\n", line.c_str());
      std::fflush(stderr);
    }
  }

  // Answers may echo a client's bytes (an unknown path): never throw on bad UTF-8.
  static HttpServerResponse Json(int status, const json& j) {
    return {status, "application/json", j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n"};
  }

  // Who may call what (transport/http_auth.h): /healthz is open, reading the
  // map takes the cluster secret or a tenant's credentials, everything else
  // (membership writes, /nodes, /stats) the cluster secret.
  static HttpAccess AccessFor(const std::string& method, const std::string& path) {
    if (path == "/healthz") return HttpAccess::kOpen;
    if (method == "GET" && path == "/map") return HttpAccess::kRead;
    return HttpAccess::kAdmin;
  }

  // The refusal of a request whose credentials do not allow it (counted and
  // logged), or nothing. Needs the head only.
  std::optional<HttpServerResponse> Authorize(const HttpServerRequest& r, const std::string& path) {
    const bool admin_cert = config.tls.enabled() && config.tls.client_auth != "none";  // mutual TLS for nodes
    if (HttpAuthDecision d = AuthorizeHttp(config.auth, r, AccessFor(r.method, path), admin_cert); !d.allowed) {
      uint64_t suppressed = 0;
      {
        std::lock_guard<std::mutex> lock(mu);
        ++auth_refused;
      }
      if (refusal_log.Allow(&suppressed)) {
        json e{{"event", "auth_refused"}, {"method", r.method.substr(0, 16)}, {"path", path.substr(0, 128)},
               {"peer", r.peer}, {"status", d.status}, {"reason", d.reason}};
        if (suppressed) e["suppressed"] = suppressed;
        Log(std::move(e));
      }
      return RefusalResponse(d);
    }
    return std::nullopt;
  }

  HttpHeadDecision Admit(const HttpServerRequest& head) {
    const std::string path = head.target.substr(0, head.target.find('?'));
    HttpHeadDecision d;
    d.refuse = Authorize(head, path);
    d.max_body_bytes = BodyLimit(head.method, path);
    return d;
  }

  HttpServerResponse Handle(const HttpServerRequest& r) {
    std::string path = r.target.substr(0, r.target.find('?'));
    // Checked before the body is read (over HTTP, Admit already did on the
    // head): a refused request changes nothing.
    if (auto refused = Authorize(r, path)) return std::move(*refused);
    if (const uint64_t limit = BodyLimit(r.method, path); r.body.size() > limit)
      return Json(413, {{"error", "request body larger than " + std::to_string(limit) + " bytes"}});
    if (r.method == "GET") {
      if (path == "/healthz") return {200, "text/plain", "ok\n"};
      if (path == "/map") {
        if (etcd) {
          std::lock_guard<std::mutex> lock(mu);
          if (auto refused = Unreachable()) return std::move(*refused);
          if (published.empty()) return Json(503, {{"error", "no shard map in etcd yet (no leader has published)"}});
          return {200, "application/json", published + "\n"};
        }
        return {200, "application/json", MapJson() + "\n"};
      }
      if (path == "/nodes") return Json(200, NodesJson());
      if (path == "/stats") return Json(200, StatsJson());
      return Json(404, {{"error", "no such endpoint: " + path}});
    }
    if (r.method != "POST") return Json(405, {{"error", "use GET or POST"}});
    // Bounded in depth before anything copies or dumps it (common/bounded_json.h).
    Result<json> parsed = ParseBoundedJson(r.body, kMaxNetworkJsonDepth);
    if (!parsed.ok() && parsed.status().message() != "not valid JSON")
      return Json(400, {{"error", "bad body: " + parsed.status().message()}});
    json body = parsed.ok() ? std::move(parsed).value() : json();
    if (!body.is_object() || !body.contains("id") || !body["id"].is_string() || body["id"].get<std::string>().empty())
      return Json(400, {{"error", "body must be a JSON object with a non-empty string \"id\""}});
    const std::string id = body["id"].get<std::string>();
    if (id.size() > kMaxNodeIdBytes)
      return Json(400, {{"error", "$.id: longer than " + std::to_string(kMaxNodeIdBytes) + " bytes"}});
    if (path == "/register") return Register(id, body);
    if (path == "/heartbeat") {
      // Eviction groups' scores (eviction/score_exchange.h): the answer
      // carries the other nodes' sums. A bad one refuses the heartbeat whole.
      PeerScores eviction;
      if (body.contains("eviction")) {
        Result<PeerScores> e = ParseScores(body["eviction"], "$.eviction");
        if (!e.ok()) return Json(400, {{"error", "bad heartbeat: " + e.status().message()}});
        eviction = std::move(e).value();
      }
      std::optional<Counters> stats;
      if (body.contains("stats")) {
        Result<Counters> s = ParseCounters(body["stats"]);
        if (!s.ok()) return Json(400, {{"error", "bad heartbeat: " + s.status().message()}});
        stats = std::move(s).value();
      }
      std::lock_guard<std::mutex> lock(mu);
      if (auto refused = Unreachable()) return std::move(*refused);
      auto it = members.find(id);
      if (it == members.end()) return Json(404, {{"error", "unknown node " + id + ": register again"}, {"epoch", epoch}});
      it->second.last = SteadyClock::now();
      if (stats) it->second.stats = std::move(*stats);
      it->second.eviction = std::move(eviction);
      json answer = {{"epoch", epoch}};
      if (!it->second.eviction.empty()) {
        std::vector<const PeerScores*> others;
        for (const auto& [other, m] : members)
          if (other != id && !m.eviction.empty()) others.push_back(&m.eviction);
        answer["eviction_peers"] = ScoresToJson(SumPeers(it->second.eviction, others));
      }
      return Json(200, answer);
    }
    if (path == "/leave") {
      std::lock_guard<std::mutex> lock(mu);
      if (etcd) {  // the owner deletes its registration in etcd; the leader publishes the map without it
        if (members.erase(id)) {
          left.push_back(id);
          Log({{"event", "node_left"}, {"node_id", id}});
        }
        return Json(200, {{"epoch", epoch}});
      }
      if (members.erase(id)) {
        ++epoch;
        ++removals;
        Log({{"event", "node_left"}, {"node_id", id}, {"epoch", epoch}});
      }
      return Json(200, {{"epoch", epoch}});
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
    if (r.ok() && s.host.size() > kMaxHostBytes) r.Fail("host", "longer than " + std::to_string(kMaxHostBytes) + " bytes");
    if (r.ok() && ucx.size() > kMaxUcxAddressBytes)
      r.Fail("ucx", "longer than " + std::to_string(kMaxUcxAddressBytes) + " hex digits");
    if (r.ok() && !IsHex(ucx)) r.Fail("ucx", "must be hex digits (the UCX worker address)");
    if (Status st = r.Finish(); !st.ok()) return Json(400, {{"error", "bad registration: " + st.message()}});
    std::lock_guard<std::mutex> lock(mu);
    if (auto refused = Unreachable()) return std::move(*refused);
    auto it = members.find(id);
    const bool rejoin = it != members.end();
    if (!rejoin && members.size() >= kMaxMembers)
      return Json(503, {{"error", "too many members (at most " + std::to_string(kMaxMembers) + ")"}});
    if (etcd) {  // the epoch advances when the leader publishes the map with it
      if (!rejoin) Log({{"event", "node_joined"}, {"node_id", id}, {"data_port", s.ports.data}});
    } else if (!rejoin || it->second.info.host != s.host || it->second.info.ports.data != s.ports.data ||
        it->second.info.weight != s.weight) {
      ++epoch;
      ++registrations;
      Log({{"event", rejoin ? "node_rejoined" : "node_joined"}, {"node_id", id}, {"epoch", epoch},
           {"data_port", s.ports.data}});
    }
    Member& m = members[id];
    m.info = s;
    m.ucx = ucx;
    m.last = SteadyClock::now();
    return Json(200, {{"epoch", epoch}, {"heartbeat_ms", config.coordinator.heartbeat_ms}});
  }

  std::string MapJson() const {
    PublishedMap pm;
    pm.model = config.model;
    pm.placement = config.placement;
    std::lock_guard<std::mutex> lock(mu);
    pm.epoch = epoch;
    pm.backend = config.transport.backend;
    for (const auto& [id, m] : members) {
      pm.nodes.push_back(m.info);
      if (!m.ucx.empty()) pm.ucx_addresses[id] = m.ucx;
    }
    return PublishedMapToJson(pm);
  }

  json NodesJson() const {
    std::lock_guard<std::mutex> lock(mu);
    json nodes = json::array();
    if (etcd) {  // the published map's nodes; "local": those that talk to this coordinator
      for (const ShardInfo& n : published_nodes)
        nodes.push_back({{"id", n.id}, {"host", n.host}, {"weight", n.weight},
                         {"ports", {{"data", n.ports.data}, {"http", n.ports.http}, {"resp", n.ports.resp}}}});
      json local = json::array();
      for (const auto& [id, m] : members) local.push_back(id);
      return {{"epoch", epoch}, {"nodes", nodes}, {"local", local}};
    }
    const auto now = SteadyClock::now();
    for (const auto& [id, m] : members) {
      nodes.push_back({{"id", id}, {"host", m.info.host}, {"weight", m.info.weight},
                       {"ports", {{"data", m.info.ports.data}, {"http", m.info.ports.http}, {"resp", m.info.ports.resp}}},
                       {"last_heartbeat_ms_ago",
                        std::chrono::duration_cast<std::chrono::milliseconds>(now - m.last).count()}});
    }
    return {{"epoch", epoch}, {"nodes", nodes}};
  }

  json StatsJson() const {
    std::lock_guard<std::mutex> lock(mu);
    json per = json::object();
    json totals = json::object();
    for (const auto& [id, m] : members) {
      json mine = json::object();
      for (const auto& [name, v] : m.stats) {
        mine[name] = v;
        totals[name] = totals.value(name, uint64_t{0}) + v;
      }
      per[id] = std::move(mine);
    }
    json out = {{"epoch", epoch}, {"live_nodes", etcd ? published_nodes.size() : members.size()},
                {"registrations", registrations}, {"removals", removals}, {"auth_refused", auth_refused},
                {"totals", totals}, {"nodes", per}};
    if (etcd) out["etcd"] = store_status;
    return out;
  }
};

Membership::Membership(const ClusterConfig& config, EventSink sink)
    : impl_(std::make_unique<Impl>(config, std::move(sink))) {}
Membership::~Membership() = default;

HttpServerResponse Membership::Handle(const HttpServerRequest& r) { return impl_->Handle(r); }
HttpHeadDecision Membership::Admit(const HttpServerRequest& head) { return impl_->Admit(head); }

void Membership::Reap(SteadyClock::time_point now) {
  Impl& im = *impl_;
  const auto dead_after = std::chrono::milliseconds(im.config.coordinator.dead_after_ms);
  std::lock_guard<std::mutex> lock(im.mu);
  for (auto it = im.members.begin(); it != im.members.end();) {
    if (im.etcd && now - it->second.last > dead_after) {  // its lease then runs out in etcd
      im.Log({{"event", "node_silent"}, {"node_id", it->first}});
      it = im.members.erase(it);
    } else if (now - it->second.last > dead_after) {
      ++im.epoch;
      ++im.removals;
      im.Log({{"event", "node_removed"}, {"node_id", it->first}, {"reason", "missed heartbeats"}, {"epoch", im.epoch}});
      it = im.members.erase(it);
    } else {
      ++it;
    }
  }
}

uint64_t Membership::epoch() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->epoch;
}

size_t Membership::live_nodes() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->etcd ? impl_->published_nodes.size() : impl_->members.size();
}

std::vector<Membership::LocalMember> Membership::LocalMembers() const {
  const auto dead_after = std::chrono::milliseconds(impl_->config.coordinator.dead_after_ms);
  const auto now = SteadyClock::now();
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<LocalMember> out;
  for (const auto& [id, m] : impl_->members)
    if (now - m.last <= dead_after) out.push_back({m.info, m.ucx});
  return out;
}

std::vector<std::string> Membership::TakeLeft() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return std::exchange(impl_->left, {});
}

void Membership::Publish(const std::string& map_json) {
  Result<PublishedMap> pm = ParsePublishedMap(map_json);
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (!pm.ok() || pm->epoch < impl_->epoch) return;  // epochs only grow
  impl_->epoch = pm->epoch;
  impl_->published = map_json;
  impl_->published_nodes = pm->nodes;
}

void Membership::SetStoreReachable(bool reachable) {
  SetStoreReachableUntil(reachable ? SteadyClock::time_point::max() : SteadyClock::time_point::min());
}

void Membership::SetStoreReachableUntil(SteadyClock::time_point until) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->store_reachable_until = until;
}

void Membership::LogEvent(const std::string& json_object) {
  json j = json::parse(json_object, nullptr, /*allow_exceptions=*/false);
  if (j.is_object()) impl_->Log(std::move(j));
}

void Membership::SetStoreStatus(const std::string& json_object) {
  json j = json::parse(json_object, nullptr, /*allow_exceptions=*/false);
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->store_status = std::move(j);
}

}  // namespace kvmesh

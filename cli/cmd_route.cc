// kvmesh route --config F --source NAME=tcp://HOST:PUB[,tcp://HOST:REPLAY] ... [--host H] [--port P]
//
// KV-aware routing as a service beside the coordinator (docs/kv-events.md
// "Routing"): subscribes to the KV events of each source (a kvmesh node with
// $.events, or an engine's publisher), keeps the prefix index and answers
// over HTTP/JSON:
//   POST /route {"tokens": [...] | "keys": ["<32 hex>", ...], "candidates": [NAME, ...], "salt": ""}
//        -> {"keys": n, "matches": [{"instance", "blocks", "gpu_blocks", "cpu_blocks", "load", "score"}, ...]}
//        (best first; candidates default to every source)
//   POST /load  {"instance": NAME, "load": 0..1}
//   POST /routed {"instance": NAME, "tokens": [...] | "keys": [...], "salt": ""}
//        (approximate mode, --approx-ttl: the request was sent to NAME, so its
//        blocks count as on NAME's device until the TTL passes)
//   GET  /stats -> {"blocks", "memory_bytes", "instances", "approx_entries", "subscriber": {...}}
// Tokens are keyed as the router keys them for the whole model (every layer
// and head) under `salt` (RouterOptions::tenant_salt).
#include <unistd.h>

#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/daemon_signals.h"
#include "common/bounded_json.h"
#include "coordinator/kv_subscriber.h"
#include "kvmesh/block_key.h"
#include "kvmesh/config.h"
#include "kvmesh/kv_route.h"
#include "transport/http_server.h"

namespace kvmesh::cli {
namespace {

using nlohmann::json;

HttpServerResponse Error(int status, const std::string& why) {
  return {status, "application/json", json{{"error", why}}.dump() + "\n"};
}

struct RouteService {
  explicit RouteService(RouteWeights w) : index(w) {}
  ModelSpec model;
  KvIndex index;
  std::vector<std::string> names;
  KvEventSubscriber* sub = nullptr;

  // The request's block keys, from "tokens" (keyed as the router keys them)
  // or "keys"; an error response when neither is well formed.
  std::optional<HttpServerResponse> Keys(const json& j, std::vector<BlockKey>& keys) const {
    if (j.contains("tokens")) {
      if (!j["tokens"].is_array()) return Error(400, "$.tokens: expected an array of token ids");
      std::vector<TokenId> tokens;
      tokens.reserve(j["tokens"].size());
      for (const json& t : j["tokens"]) {
        if (!t.is_number_unsigned() || t.get<uint64_t>() > UINT32_MAX)
          return Error(400, "$.tokens: every token must be an integer in 0..4294967295");
        tokens.push_back(static_cast<TokenId>(t.get<uint64_t>()));
      }
      std::string salt;
      if (j.contains("salt")) {
        if (!j["salt"].is_string()) return Error(400, "$.salt: expected a string");
        salt = j["salt"].get<std::string>();
      }
      KeyDeriver d(model.model_id, salt, model.block_tokens);
      keys = d.Keys(tokens, Range{0, model.num_layers}, Range{0, model.num_kv_heads});
    } else if (j.contains("keys") && j["keys"].is_array()) {
      for (const json& k : j["keys"]) {
        if (!k.is_string()) return Error(400, "$.keys: expected 32-hex-digit strings");
        Result<BlockKey> key = BlockKey::FromHex(k.get<std::string>());
        if (!key.ok()) return Error(400, "$.keys: " + key.status().message());
        keys.push_back(*key);
      }
    } else {
      return Error(400, "$: expected \"tokens\" or \"keys\"");
    }
    return std::nullopt;
  }

  HttpServerResponse Route(const json& j) const {
    std::vector<BlockKey> keys;
    if (auto e = Keys(j, keys)) return *e;
    std::vector<std::string> candidates = names;
    if (j.contains("candidates")) {
      if (!j["candidates"].is_array()) return Error(400, "$.candidates: expected an array of instance names");
      candidates.clear();
      for (const json& c : j["candidates"]) {
        if (!c.is_string()) return Error(400, "$.candidates: expected instance names (strings)");
        candidates.push_back(c.get<std::string>());
      }
    }
    json matches = json::array();
    for (const PrefixMatch& m : index.Route(keys, candidates))
      matches.push_back({{"instance", m.instance}, {"blocks", m.blocks}, {"gpu_blocks", m.gpu_blocks},
                         {"cpu_blocks", m.cpu_blocks}, {"load", m.load}, {"score", m.score}});
    return {200, "application/json", json{{"keys", keys.size()}, {"matches", matches}}.dump() + "\n"};
  }

  HttpServerResponse Handle(const HttpServerRequest& r) {
    const std::string path = r.target.substr(0, r.target.find('?'));
    if (path == "/healthz") return {200, "text/plain", "ok\n"};
    if (path == "/stats" && r.method == "GET") {
      const KvSubscriberStats s = sub ? sub->Stats() : KvSubscriberStats{};
      return {200, "application/json",
              json{{"blocks", index.blocks()},
                   {"memory_bytes", index.memory_bytes()},
                   {"instances", index.instances()},
                   {"approx_entries", index.approx_entries()},
                   {"subscriber",
                    {{"batches", s.batches}, {"gaps", s.gaps}, {"replays", s.replays}, {"snapshots", s.snapshots},
                     {"snapshot_continuations", s.snapshot_continuations}, {"bad_batches", s.bad_batches}}}}
                      .dump() + "\n"};
    }
    if (r.method != "POST" || (path != "/route" && path != "/load" && path != "/routed"))
      return Error(404, "no such endpoint");
    Result<json> j = ParseBoundedJson(r.body, kMaxNetworkJsonDepth);
    if (!j.ok() || !j->is_object()) return Error(400, "the body must be a JSON object");
    if (path == "/route") return Route(*j);
    if (!j->contains("instance") || !(*j)["instance"].is_string()) return Error(400, "$.instance: expected a name");
    if (path == "/routed") {
      std::vector<BlockKey> keys;
      if (auto e = Keys(*j, keys)) return *e;
      Status s = index.Routed((*j)["instance"].get<std::string>(), keys);
      if (!s.ok()) return Error(s.code() == StatusCode::kFailedPrecondition ? 409 : 400, s.message());
      return {200, "application/json", "{\"ok\":true}\n"};
    }
    if (!j->contains("load") || !(*j)["load"].is_number()) return Error(400, "$.load: expected a number in 0..1");
    Status s = index.SetLoad((*j)["instance"].get<std::string>(), (*j)["load"].get<double>());
    if (!s.ok()) return Error(400, s.message());
    return {200, "application/json", "{\"ok\":true}\n"};
  }
};

// NAME=PUB[,REPLAY]
Result<KvEventSource> ParseSource(const std::string& s, const std::string& topic) {
  const size_t eq = s.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == s.size())
    return InvalidArgument("--source " + s + ": expected NAME=tcp://HOST:PORT[,tcp://HOST:REPLAY_PORT]");
  KvEventSource src;
  src.instance = s.substr(0, eq);
  const std::string rest = s.substr(eq + 1);
  const size_t comma = rest.find(',');
  src.endpoint = rest.substr(0, comma);
  if (comma != std::string::npos) src.replay_endpoint = rest.substr(comma + 1);
  src.topic = topic;
  return src;
}

}  // namespace

void AddRouteCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("route", "Run the KV-aware routing service: a prefix index over KV events, over HTTP");
  struct Args {
    std::string config, host = "127.0.0.1", topic;
    std::vector<std::string> sources, instances;
    int port = 0;
    double approx_ttl_s = 0;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--config", a->config, "cluster config JSON (the model: how tokens are keyed)")->required();
  cmd->add_option("--source", a->sources,
                  "NAME=tcp://HOST:PORT[,tcp://HOST:REPLAY_PORT]: a KV event publisher (repeat; a node's "
                  "`listening` line has its events and events_replay ports)");
  cmd->add_option("--instance", a->instances,
                  "NAME: a candidate with no event source (repeat), routed by history only (--approx-ttl)");
  cmd->add_option("--approx-ttl", a->approx_ttl_s,
                  "approximate mode: seconds a block POSTed to /routed counts as on that instance (0: off)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--topic", a->topic, "subscription topic prefix (default: $.events.topic)");
  cmd->add_option("--host", a->host, "HTTP listen address (default 127.0.0.1)");
  cmd->add_option("--port", a->port, "HTTP port (default 0: a free port, on the listening line)")
      ->check(CLI::Range(0, 65535));
  cmd->callback([a, exit_code] {
    BlockStopSignals();
    auto fail = [&](const Status& s) {
      std::cerr << "kvmesh route: " << s.ToString() << "\n";
      *exit_code = 1;
    };
    Result<ClusterConfig> c = LoadConfigFile(a->config);
    if (!c.ok()) return fail(c.status());
    if (a->sources.empty() && a->instances.empty())
      return fail(InvalidArgument("give at least one --source or --instance"));
    if (!a->instances.empty() && a->approx_ttl_s <= 0)
      return fail(InvalidArgument("--instance needs --approx-ttl: with no events, only routing history places blocks"));
    RouteWeights w;
    w.approx_ttl_s = a->approx_ttl_s;
    auto svc = std::make_unique<RouteService>(w);
    svc->model = c->model;
    std::vector<KvEventSource> sources;
    for (const std::string& s : a->sources) {
      Result<KvEventSource> src = ParseSource(s, a->topic.empty() ? c->events.topic : a->topic);
      if (!src.ok()) return fail(src.status());
      svc->names.push_back(src->instance);
      sources.push_back(*src);
    }
    for (const std::string& n : a->instances) svc->names.push_back(n);
    std::unique_ptr<KvEventSubscriber> sub;
    if (!sources.empty()) {
      auto started = KvEventSubscriber::Start(&svc->index, sources);
      if (!started.ok()) return fail(started.status());
      sub = std::move(*started);
    }
    svc->sub = sub.get();
    RouteService* s = svc.get();
    auto http = HttpServer::Start(a->host, static_cast<uint16_t>(a->port),
                                  [s](const HttpServerRequest& r) { return s->Handle(r); });
    if (!http.ok()) return fail(http.status());
    PrintLine(json{{"event", "listening"}, {"role", "route"}, {"host", a->host}, {"pid", ::getpid()},
                   {"ports", {{"http", (*http)->port()}}}, {"sources", svc->names}}
                  .dump());
    WaitForStopSignal();
    (*http)->Stop();
    if (sub) sub->Stop();
    *exit_code = 0;
  });
}

}  // namespace kvmesh::cli

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "kvmesh/config.h"

using namespace kvmesh;
using nlohmann::json;

namespace {
json Base() {
  return json::parse(R"({
    "name": "t",
    "model": {"model_id": "m", "num_layers": 4, "num_kv_heads": 4, "head_dim": 64,
              "dtype": "fp16", "block_tokens": 16, "num_experts": 8},
    "nodes": [
      {"id": "n0", "memory": {"host": "16MiB"}},
      {"id": "n1", "memory": {"host": 16777216}, "weight": 2.0, "ports": {"data": 0}}
    ],
    "eviction": {"policy": "lru-priority", "priority_classes": 4, "aging_s": 30},
    "placement": {"replicas": 1, "groups": {"a": ["n0"], "b": ["n1"]},
                  "affinity": [{"expert": "0-3", "group": "a"}, {"expert": 4, "group": "b"}]}
  })");
}

// Parses j and returns the error message ("" when it parsed).
std::string Error(const json& j) {
  auto r = ParseConfig(j.dump());
  return r.ok() ? "" : r.status().message();
}
}  // namespace

TEST_CASE("A valid config parses with every field", "[config]") {
  auto r = ParseConfig(Base().dump());
  REQUIRE(r.ok());
  const ClusterConfig& c = *r;
  CHECK(c.model.block_tokens == 16);
  CHECK(c.model.FullBlockBytes() == 2u * 4 * 4 * 16 * 64 * 2);
  REQUIRE(c.nodes.size() == 2);
  CHECK(c.nodes[0].memory.host == 16u << 20);
  CHECK(c.nodes[1].weight == 2.0);
  CHECK(c.placement.affinity[0].values == Range{0, 4});
  CHECK(c.placement.affinity[1].values == Range{4, 5});
  CHECK(c.eviction.aging_s == 30);
}

TEST_CASE("Bad configs name the JSON path and the reason", "[config]") {
  struct Case {
    const char* what;
    std::function<void(json&)> mutate;
    const char* expect;  // substring of the message
  };
  const Case cases[] = {
      {"unknown top-level key", [](json& j) { j["colour"] = "red"; }, "$.colour: unknown key"},
      {"unknown nested key", [](json& j) { j["nodes"][1]["memory"]["hots"] = "1GB"; }, "$.nodes[1].memory.hots: unknown key"},
      {"wrong type", [](json& j) { j["model"]["num_layers"] = "four"; }, "$.model.num_layers: expected an integer, got a string"},
      {"wrong type bool", [](json& j) { j["nodes"] = json::object(); }, "$.nodes: expected an array"},
      {"missing required", [](json& j) { j["model"].erase("head_dim"); }, "$.model.head_dim: required field is missing"},
      {"missing model", [](json& j) { j.erase("model"); }, "$.model: required field is missing"},
      {"missing node id", [](json& j) { j["nodes"][0].erase("id"); }, "$.nodes[0].id: required field is missing"},
      {"zero size", [](json& j) { j["nodes"][0]["memory"]["host"] = "0GB"; }, "$.nodes[0].memory.host: size must be positive"},
      {"negative size", [](json& j) { j["nodes"][0]["memory"]["host"] = -5; }, "$.nodes[0].memory.host: size must be positive"},
      {"unparsable size", [](json& j) { j["nodes"][1]["memory"]["host"] = "lots"; }, "$.nodes[1].memory.host: cannot parse size 'lots'"},
      {"bad unit", [](json& j) { j["nodes"][1]["memory"]["host"] = "12XB"; }, "$.nodes[1].memory.host: cannot parse size '12XB': unknown unit"},
      {"duplicate node id", [](json& j) { j["nodes"][1]["id"] = "n0"; }, "$.nodes[1].id: duplicate node id \"n0\" (first at $.nodes[0].id)"},
      {"group names unknown node", [](json& j) { j["placement"]["groups"]["b"] = {"n1", "n7"}; }, "$.placement.groups.b[1]: shard group \"b\" names unknown node \"n7\""},
      {"block_tokens 0", [](json& j) { j["model"]["block_tokens"] = 0; }, "$.model.block_tokens: must be > 0"},
      {"negative integer", [](json& j) { j["model"]["num_layers"] = -1; }, "$.model.num_layers: must not be negative"},
      {"bad dtype", [](json& j) { j["model"]["dtype"] = "fp7"; }, "$.model.dtype: unknown dtype 'fp7'"},
      {"affinity to unknown group", [](json& j) { j["placement"]["affinity"][0]["group"] = "zz"; }, "$.placement.affinity[0].group: unknown shard group \"zz\""},
      {"affinity bad range", [](json& j) { j["placement"]["affinity"][0]["expert"] = "5-2"; }, "$.placement.affinity[0].expert: expected"},
      {"no budget", [](json& j) { j["nodes"][0]["memory"] = json::object(); }, "$.nodes[0].memory: needs a device or host budget"},
      {"priority classes", [](json& j) { j["eviction"]["priority_classes"] = 99; }, "$.eviction.priority_classes: must be in 1..8"},
      {"zero weight", [](json& j) { j["nodes"][0]["weight"] = 0; }, "$.nodes[0].weight: must be > 0"},
      {"replicas 0", [](json& j) { j["placement"]["replicas"] = 0; }, "$.placement.replicas: must be >= 1"},
      {"ucx progress", [](json& j) { j["transport"] = {{"ucx", {{"progress", "spin"}}}}; },
       "$.transport.ucx.progress: expected \"poll\", \"event\", \"hybrid\" or \"adaptive\", got \"spin\""},
      {"ucx spin", [](json& j) { j["transport"] = {{"ucx", {{"spin_us", -1}}}}; }, "$.transport.ucx.spin_us: must"},
      {"ucx workers", [](json& j) { j["transport"] = {{"ucx", {{"workers", 65}}}}; }, "$.transport.ucx.workers: must"},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    json j = Base();
    c.mutate(j);
    std::string err = Error(j);
    INFO(err);
    CHECK(err.find(c.expect) != std::string::npos);
  }
}

TEST_CASE("$.transport.ucx.progress: adaptive by default, every mode accepted", "[config]") {
  auto d = ParseConfig(Base().dump());
  REQUIRE(d.ok());
  CHECK(d->transport.ucx_progress == "adaptive");
  CHECK(d->transport.ucx_spin_us == 100);
  CHECK(d->transport.ucx_workers == 0);  // one per core, up to 4
  for (const char* mode : {"poll", "event", "hybrid", "adaptive"}) {
    json j = Base();
    j["transport"] = {{"ucx", {{"progress", mode}, {"spin_us", 40}, {"workers", 2}}}};
    auto r = ParseConfig(j.dump());
    INFO(mode);
    REQUIRE(r.ok());
    CHECK(r->transport.ucx_progress == mode);
    CHECK(r->transport.ucx_spin_us == 40);
    CHECK(r->transport.ucx_workers == 2);
  }
}

TEST_CASE("Invalid JSON is reported as such", "[config]") {
  auto r = ParseConfig("{ \"model\": ");
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message().find("$: not valid JSON") == 0);
  auto f = LoadConfigFile("/nonexistent/kvmesh.json");
  REQUIRE_FALSE(f.ok());
  CHECK(f.status().message().find("/nonexistent/kvmesh.json") != std::string::npos);
}

TEST_CASE("$.sequences: every key optional with today's defaults, bad values name their path", "[config]") {
  const ClusterConfig d = ParseConfig(Base().dump()).value();
  CHECK(d.sequences.idle_timeout_ms == 10 * 60 * 1000);
  CHECK(d.sequences.max_sequences == 4096);
  CHECK(d.sequences.max_slices == 64);
  CHECK(d.sequences.max_sequence_tokens == 1u << 20);
  json j = Base();
  j["sequences"] = {{"idle_timeout_ms", 2500}, {"max_sequences", 3}};
  const ClusterConfig c = ParseConfig(j.dump()).value();
  CHECK(c.sequences.idle_timeout_ms == 2500);
  CHECK(c.sequences.max_sequences == 3);
  CHECK(c.sequences.max_slices == 64);  // untouched keys keep their defaults
  CHECK(c.sequences.max_sequence_tokens == 1u << 20);

  struct Case {
    json value;
    const char* expect;
  };
  const Case cases[] = {
      {{{"idle_timeout_ms", 0}}, "$.sequences.idle_timeout_ms: must be in 1.."},
      {{{"idle_timeout_ms", -5}}, "$.sequences.idle_timeout_ms: must be in 1.."},
      {{{"idle_timeout_ms", "10s"}}, "$.sequences.idle_timeout_ms: expected an integer, got a string"},
      {{{"max_sequences", 0}}, "$.sequences.max_sequences: must be in 1..16777216, got 0"},
      {{{"max_sequences", -1}}, "$.sequences.max_sequences: must not be negative"},
      {{{"max_slices", 1.5}}, "$.sequences.max_slices: expected an integer, got a number"},
      {{{"max_sequence_tokens", 0}}, "$.sequences.max_sequence_tokens: must be in 1.."},
      {{{"max_sequence_tokens", 1ull << 33}}, "$.sequences.max_sequence_tokens: too large"},
      {{{"max_sequencez", 1}}, "$.sequences.max_sequencez: unknown key"},
      {json::array(), "$.sequences: expected an object"},
  };
  for (const Case& k : cases) {
    json b = Base();
    b["sequences"] = k.value;
    const std::string err = Error(b);
    INFO(b["sequences"].dump() << " -> " << err);
    CHECK(err.find(k.expect) != std::string::npos);
  }
}

TEST_CASE("$.events: off by default, every key optional, bad values name their path", "[config]") {
  const ClusterConfig d = ParseConfig(Base().dump()).value();
  CHECK_FALSE(d.events.enabled);
  CHECK(d.events.port == 0);
  CHECK(d.events.replay_buffer == 10000);
  CHECK(d.events.hash == "bytes");
  json j = Base();
  j["events"] = {{"enabled", true}, {"port", 5557}, {"replay_port", 5558}, {"topic", "kv@n0"}, {"hash", "int"}};
  const ClusterConfig c = ParseConfig(j.dump()).value();
  CHECK(c.events.enabled);
  CHECK(c.events.port == 5557);
  CHECK(c.events.replay_port == 5558);
  CHECK(c.events.topic == "kv@n0");
  CHECK(c.events.hash == "int");
  CHECK(c.events.queue_events == 65536);  // untouched keys keep their defaults

  struct Case {
    json value;
    const char* expect;
  };
  const Case cases[] = {
      {{{"enabled", 1}}, "$.events.enabled: expected true or false"},
      {{{"port", 70000}}, "$.events.port: too large"},
      {{{"port", 5557}, {"replay_port", 5557}}, "$.events.replay_port: must differ from $.events.port"},
      {{{"replay_buffer", 0}}, "$.events.replay_buffer: must be in 1..1048576 batches, got 0"},
      {{{"queue_events", 8}}, "$.events.queue_events: must be in 16..16777216, got 8"},
      {{{"max_batch_events", 0}}, "$.events.max_batch_events: must be in 1..65536"},
      {{{"hash", "sha256"}}, "$.events.hash: must be \"bytes\" or \"int\""},
      {{{"host", ""}}, "$.events.host: must not be empty"},
      {{{"endpoint", "tcp://*:5557"}}, "$.events.endpoint: unknown key"},
  };
  for (const Case& k : cases) {
    json b = Base();
    b["events"] = k.value;
    const std::string err = Error(b);
    INFO(b["events"].dump() << " -> " << err);
    CHECK(err.find(k.expect) != std::string::npos);
  }
}

// Found by fuzz/fuzz_config.cc (fuzz/corpus/config/crash-number-overflow):
// the loader threw json::out_of_range from its error path and the daemon died.
TEST_CASE("A number no double holds is refused as invalid JSON, not thrown", "[config]") {
  for (const char* text : {"[\n99999999.99999e9999 }", R"({"name": 1e400})", "{\"model\": -1e99999}"}) {
    INFO(text);
    Result<ClusterConfig> r = ParseConfig(text);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(r.status().message(), Catch::StartsWith("$: not valid JSON"));
  }
}

TEST_CASE("$.limits: every key optional with safe defaults, bad values name their path", "[config]") {
  const ClusterConfig d = ParseConfig(Base().dump()).value();
  CHECK(d.limits.max_connections == 4096);
  CHECK(d.limits.max_connections_per_peer == 1024);
  CHECK(d.limits.preauth_max_bytes == 64u << 10);
  CHECK(d.limits.handshake_timeout_ms == 10000);
  CHECK(d.limits.read_timeout_ms == 30000);
  CHECK(d.limits.write_timeout_ms == 30000);
  CHECK(d.limits.idle_timeout_ms == 0);
  CHECK(d.limits.max_pending_answer_bytes == 32u << 20);
  json j = Base();
  j["limits"] = {{"preauth_max_bytes", "16KiB"}, {"idle_timeout_ms", 600000}, {"max_pending_answer_bytes", "8MiB"}};
  const ClusterConfig c = ParseConfig(j.dump()).value();
  CHECK(c.limits.preauth_max_bytes == 16u << 10);
  CHECK(c.limits.idle_timeout_ms == 600000);
  CHECK(c.limits.max_pending_answer_bytes == 8u << 20);
  CHECK(c.limits.write_timeout_ms == 30000);  // untouched keys keep their defaults

  struct Case {
    json value;
    const char* expect;
  };
  const Case cases[] = {
      {{{"max_connections", 0}}, "$.limits.max_connections: must be in 1..1048576, got 0"},
      {{{"max_connections_per_peer", 5000}}, "$.limits.max_connections_per_peer: must be at most max_connections"},
      {{{"preauth_max_bytes", 100}}, "$.limits.preauth_max_bytes: must be in 1KiB..16MiB, got 100"},
      {{{"preauth_max_bytes", "1GiB"}}, "$.limits.preauth_max_bytes: must be in 1KiB..16MiB"},
      {{{"handshake_timeout_ms", 0}}, "$.limits.handshake_timeout_ms: must be in 1.."},
      {{{"read_timeout_ms", -1}}, "$.limits.read_timeout_ms: must be in 1.."},
      {{{"write_timeout_ms", "5s"}}, "$.limits.write_timeout_ms: expected an integer, got a string"},
      {{{"idle_timeout_ms", -1}}, "$.limits.idle_timeout_ms: must be in 0.."},
      {{{"max_pending_answer_bytes", 1000}}, "$.limits.max_pending_answer_bytes: must be in 64KiB..4GiB, got 1000"},
      {{{"max_conections", 1}}, "$.limits.max_conections: unknown key"},
      {json::array(), "$.limits: expected an object"},
  };
  for (const Case& k : cases) {
    json b = Base();
    b["limits"] = k.value;
    const std::string err = Error(b);
    INFO(b["limits"].dump() << " -> " << err);
    CHECK(err.find(k.expect) != std::string::npos);
  }
}

TEST_CASE("A config nested deeper than any real one is refused with its path, not a crash", "[config]") {
  std::string deep = R"({"model": {"model_id": )";
  for (int i = 0; i < 200000; ++i) deep += "[";
  for (int i = 0; i < 200000; ++i) deep += "]";
  deep += "}}";
  const std::string err = Error(json::parse("{}"));  // sanity: the helper works on a small document
  CHECK(!err.empty());
  auto r = ParseConfig(deep);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message() == "$: nested deeper than 64 levels");
}

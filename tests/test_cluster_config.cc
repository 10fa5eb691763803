// The cluster sections of the config: transport, coordinator, auth.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "kvmesh/config.h"

using namespace kvmesh;
using nlohmann::json;

namespace {
json Base() {
  return json::parse(R"({
    "model": {"model_id": "m", "num_layers": 2, "num_kv_heads": 2, "head_dim": 64, "block_tokens": 16},
    "nodes": [{"id": "n0", "memory": {"host": "16MiB"}}]
  })");
}
std::string Error(const json& j) {
  auto r = ParseConfig(j.dump());
  return r.ok() ? "" : r.status().message();
}
}  // namespace

TEST_CASE("Cluster sections parse with their defaults and values", "[config][cluster]") {
  auto d = ParseConfig(Base().dump());
  REQUIRE(d.ok());
  CHECK(d->transport.backend == "tcp");
  CHECK(d->coordinator.port == 0);
  CHECK(d->auth.token.empty());
  json j = Base();
  j["transport"] = {{"backend", "ucx"}, {"io_threads", 3}, {"max_frame_bytes", "8MiB"}, {"timeout_ms", 500}};
  j["coordinator"] = {{"host", "127.0.0.1"}, {"port", 7000}, {"heartbeat_ms", 100}, {"dead_after_ms", 400}};
  j["auth"] = {{"token", "s3cret"}};
  auto r = ParseConfig(j.dump());
  REQUIRE(r.ok());
  CHECK(r->transport.backend == "ucx");
  CHECK(r->transport.io_threads == 3);
  CHECK(r->transport.max_frame_bytes == 8u << 20);
  CHECK(r->coordinator.port == 7000);
  CHECK(r->coordinator.dead_after_ms == 400);
  CHECK(r->auth.token == "s3cret");
}

TEST_CASE("Bad cluster sections name the JSON path", "[config][cluster]") {
  json j = Base();
  j["transport"] = {{"backend", "carrier-pigeon"}};
  CHECK_THAT(Error(j), Catch::StartsWith("$.transport.backend:"));
  j = Base();
  j["transport"] = {{"max_frame_bytes", "1KiB"}};
  CHECK_THAT(Error(j), Catch::StartsWith("$.transport.max_frame_bytes:"));
  j = Base();
  j["transport"] = {{"bogus", 1}};
  CHECK_THAT(Error(j), Catch::StartsWith("$.transport.bogus: unknown key"));
  j = Base();
  j["coordinator"] = {{"heartbeat_ms", 500}, {"dead_after_ms", 100}};
  CHECK_THAT(Error(j), Catch::StartsWith("$.coordinator.dead_after_ms:"));
  j = Base();
  j["coordinator"] = {{"port", 70000}};
  CHECK_THAT(Error(j), Catch::StartsWith("$.coordinator.port:"));
  j = Base();
  j["auth"] = {{"token", 5}};
  CHECK_THAT(Error(j), Catch::StartsWith("$.auth.token:"));
}

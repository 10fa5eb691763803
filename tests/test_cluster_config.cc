// The cluster sections of the config: transport, coordinator (and its etcd), auth.
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

TEST_CASE("Tenants parse with their quota and namespace", "[config][cluster][security]") {
  json j = Base();
  j["auth"] = json::parse(R"({"token": "cluster", "tenants": [
      {"name": "acme", "token": "a-secret", "quota": "64MiB"},
      {"name": "globex", "password": "g-secret", "namespace": "shared"},
      {"name": "initech", "token": "i-secret", "namespace": "shared"}]})");
  auto r = ParseConfig(j.dump());
  REQUIRE(r.ok());
  REQUIRE(r->auth.tenants.size() == 3);
  const TenantConfig* a = r->auth.FindTenant("acme");
  REQUIRE(a != nullptr);
  CHECK(a->token == "a-secret");
  CHECK(a->quota_bytes == 64u << 20);
  CHECK(a->ns == "acme");  // its own namespace by default
  CHECK(r->auth.FindTenant("globex")->token == "g-secret");
  CHECK(r->auth.FindTenant("globex")->quota_bytes == 0);
  CHECK(r->auth.FindTenant("initech")->ns == "shared");
  CHECK(r->auth.FindTenant("nobody") == nullptr);
}

TEST_CASE("Bad tenants name the JSON path", "[config][cluster][security]") {
  const std::pair<const char*, const char*> bad[] = {
      {R"({"tenants": [{"name": "a", "token": "x"}]})", "$.auth.tenants: needs $.auth.token"},
      {R"({"token": "c", "tenants": {"name": "a"}})", "$.auth.tenants: expected an array"},
      {R"({"token": "c", "tenants": [{"token": "x"}]})", "$.auth.tenants[0].name:"},
      {R"({"token": "c", "tenants": [{"name": "a"}]})", "$.auth.tenants[0]: needs a \"token\""},
      {R"({"token": "c", "tenants": [{"name": "a", "token": "x", "password": "y"}]})", "$.auth.tenants[0]: give"},
      {R"({"token": "c", "tenants": [{"name": "a", "token": ""}]})", "$.auth.tenants[0].token: must not be empty"},
      {R"({"token": "c", "tenants": [{"name": "a:b", "token": "x"}]})", "$.auth.tenants[0].name: must be"},
      {R"({"token": "c", "tenants": [{"name": "a", "token": "x", "quota": "0"}]})", "$.auth.tenants[0].quota:"},
      {R"({"token": "c", "tenants": [{"name": "a", "token": "x", "quota": "lots"}]})", "$.auth.tenants[0].quota:"},
      {R"({"token": "c", "tenants": [{"name": "a", "token": "x", "namespace": ""}]})",
       "$.auth.tenants[0].namespace: must not be empty"},
      {R"({"token": "c", "tenants": [{"name": "a", "token": "x", "colour": 1}]})", "$.auth.tenants[0].colour: unknown key"},
      {R"({"token": "c", "tenants": [{"name": "a", "token": "x"}, {"name": "a", "token": "y"}]})",
       "$.auth.tenants[1].name: duplicate tenant \"a\" (first at $.auth.tenants[0].name)"},
      {R"({"token": "c", "tenants": [{"name": "a", "password": "c"}]})", "$.auth.tenants[0]: its secret must differ"},
  };
  for (const auto& [auth, want] : bad) {
    json j = Base();
    j["auth"] = json::parse(auth);
    INFO(auth);
    CHECK_THAT(Error(j), Catch::StartsWith(want));
  }
  json j = Base();
  j["auth"] = json::parse(R"({"token": "c", "tenants": [{"name": "a", "token": "x"}]})");
  j["auth"]["tenants"][0]["token"] = std::string(257, 't');
  CHECK_THAT(Error(j), Catch::StartsWith("$.auth.tenants[0].token: at most 256 bytes"));
}

TEST_CASE("$.coordinator.etcd and addresses: off by default, values, errors naming their path", "[config][cluster]") {
  auto d = ParseConfig(Base().dump());
  REQUIRE(d.ok());
  CHECK(!d->coordinator.etcd.enabled());  // the default launch needs no etcd
  CHECK(d->coordinator.addresses.empty());
  json j = Base();
  j["name"] = "c1";
  j["coordinator"] = {{"addresses", {"10.0.0.1:7070", "10.0.0.2:7070"}},
                      {"etcd", {{"endpoints", {"10.0.0.1:2379"}}, {"lease_ms", 3000}, {"user", "u"}, {"password", "p"}}}};
  auto r = ParseConfig(j.dump());
  REQUIRE(r.ok());
  CHECK(r->coordinator.addresses.size() == 2);
  CHECK(r->coordinator.etcd.enabled());
  CHECK(r->coordinator.etcd.prefix == "/kvmesh/c1/");
  CHECK(r->coordinator.etcd.lease_ms == 3000);
  const std::pair<json, std::string> bad[] = {
      {{{"etcd", {{"lease_ms", 2000}}}}, "$.coordinator.etcd.endpoints:"},
      {{{"etcd", {{"endpoints", json::array()}}}}, "$.coordinator.etcd.endpoints:"},
      {{{"etcd", {{"endpoints", {"no-port"}}}}}, "$.coordinator.etcd.endpoints[0]:"},
      {{{"etcd", {{"endpoints", {"h:1", 5}}}}}, "$.coordinator.etcd.endpoints[1]:"},
      {{{"etcd", {{"endpoints", {"h:1"}}, {"lease_ms", 10}}}}, "$.coordinator.etcd.lease_ms:"},
      {{{"etcd", {{"endpoints", {"h:1"}}, {"request_timeout_ms", 5000}}}}, "$.coordinator.etcd.request_timeout_ms:"},
      {{{"etcd", {{"endpoints", {"h:1"}}, {"prefix", "/x"}}}}, "$.coordinator.etcd.prefix:"},
      {{{"etcd", {{"endpoints", {"h:1"}}, {"user", "u"}}}}, "$.coordinator.etcd.password:"},
      {{{"etcd", {{"endpoints", {"h:1"}}, {"tls", true}}}}, "$.coordinator.etcd.tls:"},
      {{{"etcd", {{"endpoints", {"h:1"}}, {"colour", 1}}}}, "$.coordinator.etcd.colour: unknown key"},
      {{{"addresses", {"h:70000"}}}, "$.coordinator.addresses[0]:"},
      {{{"addresses", "h:1"}}, "$.coordinator.addresses:"},
  };
  for (const auto& [coordinator, path] : bad) {
    json k = Base();
    k["coordinator"] = coordinator;
    INFO(coordinator.dump());
    CHECK_THAT(Error(k), Catch::StartsWith(path));
  }
}

// The coordinator's limits in process (issue 39, finding 9): the JSON depth
// bound every network JSON goes through (common/bounded_json.h), and the
// Membership handlers (coordinator/membership.h) fed requests directly, as the
// fuzz target does: deep or large bodies are refused and change nothing,
// a heartbeat's stats keep only the counters the coordinator sums, and the
// head check (Membership::Admit) decides credentials and body limits before a
// body exists. tests/test_http_limits.cc checks the same over HTTP against
// real daemons.
#include <catch2/catch.hpp>

#include <string>

#include <nlohmann/json.hpp>

#include "common/credentials.h"
#include "coordinator/membership.h"
#include "common/bounded_json.h"

using namespace kvmesh;
using nlohmann::json;

namespace {

ClusterConfig Config(const std::string& token) {
  auto c = ParseConfig(R"({
    "model": {"model_id": "m", "num_layers": 2, "num_kv_heads": 2, "head_dim": 16, "block_tokens": 16},
    "nodes": [{"id": "n0", "memory": {"host": "1MiB"}}]
  })");
  REQUIRE(c.ok());
  c->auth.token = token;
  return *c;
}

HttpServerRequest Post(const std::string& path, std::string body, std::string authorization = "") {
  return HttpServerRequest{"POST", path, std::move(body), std::move(authorization), "test"};
}

HttpServerRequest Get(const std::string& path, std::string authorization = "") {
  return HttpServerRequest{"GET", path, "", std::move(authorization), "test"};
}

std::string Nested(size_t levels) { return std::string(levels, '[') + std::string(levels, ']'); }

}  // namespace

TEST_CASE("Coordinator limits: ParseBoundedJson refuses documents nested deeper than its bound, before building them",
          "[limits]") {
  CHECK(ParseBoundedJson("{}").ok());
  CHECK(ParseBoundedJson("7").ok());
  CHECK(ParseBoundedJson(R"({"a": {"b": [1, 2, {"c": null}]}})").ok());
  CHECK(ParseBoundedJson(Nested(kMaxNetworkJsonDepth)).ok());
  auto deep = ParseBoundedJson(Nested(kMaxNetworkJsonDepth + 1));
  REQUIRE_FALSE(deep.ok());
  CHECK_THAT(deep.status().message(), Catch::Contains("deeper than 16 levels"));
  CHECK(ParseBoundedJson(Nested(3), 3).ok());
  CHECK_FALSE(ParseBoundedJson(Nested(4), 3).ok());
  // A million levels: refused (the pass stops at level 17), never copied or dumped.
  auto huge = ParseBoundedJson(Nested(1000000));
  REQUIRE_FALSE(huge.ok());
  CHECK_THAT(huge.status().message(), Catch::Contains("deeper than"));
  // Depth counts containers, not brackets inside strings.
  CHECK(ParseBoundedJson(R"({"a": ")" + Nested(100) + "\"}").ok());
  // Comments only where the caller allows them (a config file).
  CHECK_FALSE(ParseBoundedJson("// a comment\n{\"a\": 1}").ok());
  CHECK(ParseBoundedJson("// a comment\n{\"a\": 1}", kMaxNetworkJsonDepth, /*ignore_comments=*/true).ok());
  CHECK_FALSE(ParseBoundedJson("/* [[[ */" + Nested(20), kMaxNetworkJsonDepth, true).ok());
  // Not JSON, trailing bytes, a number no double holds: refused, never thrown.
  for (const char* bad : {"", "{", "{} {}", "[1,]", "{\"a\" 1}", "1e400", "nul"}) {
    auto r = ParseBoundedJson(bad);
    INFO(bad);
    CHECK_FALSE(r.ok());
  }
}

TEST_CASE("Coordinator limits: a heartbeat a million levels deep is refused and /stats still answers", "[limits]") {
  Membership m(Config(""), [](const std::string&) {});
  REQUIRE(m.Handle(Post("/register", R"({"id": "n0", "ports": {"data": 9}})")).status == 200);
  const uint64_t epoch = m.epoch();
  for (const std::string& deep :
       {R"({"id": "n0", "stats": {"deep": )" + Nested(1000000) + "}}",
        R"({"id": "n0", "eviction": {"k": )" + Nested(100000) + "}}", Nested(100000)}) {
    HttpServerResponse r = m.Handle(Post("/heartbeat", deep));
    CHECK((r.status == 400 || r.status == 413));
  }
  // Within the size limit, the depth bound is what refuses it.
  HttpServerResponse r = m.Handle(Post("/heartbeat", R"({"id": "n0", "stats": {"deep": )" + Nested(100000) + "}}"));
  CHECK(r.status == 400);
  CHECK_THAT(r.body, Catch::Contains("deeper than"));
  r = m.Handle(Get("/stats"));
  REQUIRE(r.status == 200);
  json s = json::parse(r.body);
  CHECK(s["nodes"]["n0"] == json::object());
  CHECK(m.epoch() == epoch);
}

TEST_CASE("Coordinator limits: a heartbeat stores only the counters the coordinator sums", "[limits]") {
  Membership m(Config(""), [](const std::string&) {});
  REQUIRE(m.Handle(Post("/register", R"({"id": "n0", "ports": {"data": 9}})")).status == 200);
  REQUIRE(m.Handle(Post("/register", R"({"id": "n1", "ports": {"data": 10}})")).status == 200);
  CHECK(m.Handle(Post("/heartbeat", R"({"id": "n0", "stats": {"blocks": 3, "bytes_stored": 30, "hits": 1,
      "misses": 2, "puts": 3, "evictions": 0, "colour": "blue", "nested": {"a": [1]}, "pinned_blocks": 1}})"))
            .status == 200);
  CHECK(m.Handle(Post("/heartbeat", R"({"id": "n1", "stats": {"blocks": 4}, "extra": {"x": [[1]]}})")).status == 200);
  json s = json::parse(m.Handle(Get("/stats")).body);
  CHECK(s["nodes"]["n0"] == json{{"blocks", 3}, {"bytes_stored", 30}, {"hits", 1}, {"misses", 2}, {"puts", 3},
                                 {"evictions", 0}});
  CHECK(s["nodes"]["n1"] == json{{"blocks", 4}});
  CHECK(s["totals"] == json{{"blocks", 7}, {"bytes_stored", 30}, {"hits", 1}, {"misses", 2}, {"puts", 3},
                            {"evictions", 0}});
  // A known counter of another type refuses the heartbeat whole, naming its path; nothing changes.
  for (const char* bad : {R"({"id": "n1", "stats": {"blocks": -4}})", R"({"id": "n1", "stats": {"blocks": 4.5}})",
                          R"({"id": "n1", "stats": {"hits": [1]}})", R"({"id": "n1", "stats": "all good"})"}) {
    HttpServerResponse r = m.Handle(Post("/heartbeat", bad));
    INFO(bad << " -> " << r.body);
    CHECK(r.status == 400);
    CHECK_THAT(r.body, Catch::Contains("$.stats"));
  }
  CHECK(json::parse(m.Handle(Get("/stats")).body)["nodes"]["n1"] == json{{"blocks", 4}});
}

TEST_CASE("Coordinator limits: registrations are bounded in their fields and number, and ids everywhere", "[limits]") {
  Membership m(Config(""), [](const std::string&) {});
  const std::string long_id(300, 'x');
  struct Bad {
    std::string path, body, what;
  };
  const std::vector<Bad> bad = {
      {"/register", R"({"id": ")" + long_id + R"(", "ports": {"data": 9}})", "$.id"},
      {"/register", R"({"id": "n0", "host": ")" + std::string(300, 'h') + R"(", "ports": {"data": 9}})", "$.host"},
      {"/register", R"({"id": "n0", "ucx": ")" + std::string(20000, 'a') + R"(", "ports": {"data": 9}})", "$.ucx"},
      {"/register", R"({"id": "n0", "ucx": "not hex", "ports": {"data": 9}})", "$.ucx"},
      {"/heartbeat", R"({"id": ")" + long_id + R"("})", "$.id"},
      {"/leave", R"({"id": ")" + long_id + R"("})", "$.id"},
  };
  for (const Bad& b : bad) {
    HttpServerResponse r = m.Handle(Post(b.path, b.body));
    INFO(b.path << " -> " << r.status << " " << r.body);
    CHECK(r.status == 400);
    CHECK_THAT(r.body, Catch::Contains(b.what));
  }
  CHECK(m.live_nodes() == 0);
  CHECK(m.Handle(Post("/register", R"({"id": "n0", "ucx": "00ff", "ports": {"data": 9}})")).status == 200);
  CHECK(m.live_nodes() == 1);
  // At most kMaxMembers members: the next new one is refused, a member already in rejoins.
  for (size_t i = 1; i < kMaxMembers; ++i)
    REQUIRE(m.Handle(Post("/register", R"({"id": "m)" + std::to_string(i) + R"(", "ports": {"data": 9}})")).status ==
            200);
  CHECK(m.live_nodes() == kMaxMembers);
  const uint64_t epoch = m.epoch();
  HttpServerResponse r = m.Handle(Post("/register", R"({"id": "one-too-many", "ports": {"data": 9}})"));
  CHECK(r.status == 503);
  CHECK(m.epoch() == epoch);
  CHECK(m.Handle(Post("/register", R"({"id": "n0", "ports": {"data": 10}})")).status == 200);
  CHECK(m.live_nodes() == kMaxMembers);
}

TEST_CASE("Coordinator limits: the head check refuses bad credentials and oversized bodies before a body is read",
          "[limits]") {
  Membership m(Config("s3cret"), [](const std::string&) {});
  const std::string ok = BearerAuthorization("s3cret");
  // Credentials: decided on the head alone, and each refusal counted once.
  HttpHeadDecision d = m.Admit(Post("/register", "", ""));
  REQUIRE(d.refuse);
  CHECK(d.refuse->status == 401);
  d = m.Admit(Post("/register", "", BearerAuthorization("wrong")));
  REQUIRE(d.refuse);
  CHECK(d.refuse->status == 403);
  d = m.Admit(Get("/healthz"));
  CHECK_FALSE(d.refuse);
  CHECK(d.max_body_bytes == 0);
  // Each route's body limit.
  d = m.Admit(Post("/heartbeat", "", ok));
  CHECK_FALSE(d.refuse);
  CHECK(d.max_body_bytes == kMaxHeartbeatBodyBytes);
  d = m.Admit(Post("/register", "", ok));
  CHECK(d.max_body_bytes == kMaxRegisterBodyBytes);
  d = m.Admit(Post("/leave", "", ok));
  CHECK(d.max_body_bytes == kMaxSmallBodyBytes);
  d = m.Admit(Get("/stats", ok));
  CHECK(d.max_body_bytes == 0);
  json s = json::parse(m.Handle(Get("/stats", ok)).body);
  CHECK(s["auth_refused"] == 2);
  // Called directly (the fuzz target), the handler enforces the same limits.
  HttpServerResponse r = m.Handle(Post("/heartbeat", std::string(kMaxHeartbeatBodyBytes + 1, ' '), ok));
  CHECK(r.status == 413);
  r = m.Handle(Post("/leave", R"({"id": "x", "pad": ")" + std::string(kMaxSmallBodyBytes, 'p') + "\"}", ok));
  CHECK(r.status == 413);
}

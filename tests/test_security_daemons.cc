// The control plane with a cluster secret ($.auth.token), and tenants end to
// end: real `kvmesh coordinator` and `kvmesh node` processes on 127.0.0.1
// (ports chosen at run time). Membership writes without the secret are
// refused (401/403), change nothing (the epoch stays) and are logged as JSON
// events; nodes and clients that hold the secret work as before. Tenants'
// routers (C++ and the C ABI) read the map with their own credentials and
// never meet each other's blocks, whatever salt they choose.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <fstream>
#include <thread>

#include "cluster_process.h"
#include "test_time.h"
#include "common/credentials.h"
#include "kvmesh/kvmesh.h"
#include "kvmesh/network.h"
#include "transport/http_client.h"

using namespace kvmesh;
using kvmesh::testing::Process;
using kvmesh::testing::TimeBound;
using namespace std::chrono_literals;

namespace {

const std::string kBin = KVMESH_BIN;
const std::string kSecret = "cluster-s3cret";

// daemons-local.json plus $.auth, in a temporary file removed on destruction.
struct SecretConfig {
  std::string path;
  explicit SecretConfig(const nlohmann::json& auth) {
    static int n = 0;
    auto j = nlohmann::json::parse(std::ifstream(std::string(KVMESH_SOURCE_DIR) + "/cluster_configs/daemons-local.json"));
    j["auth"] = auth;
    path = "/tmp/kvmesh-auth-test-" + std::to_string(::getpid()) + "-" + std::to_string(n++) + ".json";
    std::ofstream(path) << j.dump();
  }
  ~SecretConfig() { ::unlink(path.c_str()); }
};

HttpRequestOptions Auth(const std::string& header) {
  HttpRequestOptions o;
  o.authorization = header;
  return o;
}

struct Daemons {
  explicit Daemons(nlohmann::json auth = nlohmann::json{{"token", kSecret}}) : cfg(std::move(auth)) {}
  SecretConfig cfg;
  Process coord;
  std::vector<std::unique_ptr<Process>> nodes;
  uint16_t port = 0;

  std::string addr() const { return "127.0.0.1:" + std::to_string(port); }
  void StartCoordinator() {
    REQUIRE(coord.Start({kBin, "coordinator", "--config", cfg.path, "--port", "0"}, /*merge_stderr=*/true));
    auto j = coord.WaitEvent("listening", TimeBound(10s));
    REQUIRE(j);
    port = (*j)["ports"]["http"].get<uint16_t>();
  }
  Process& StartNode(const std::string& id, const std::vector<std::string>& extra = {}) {
    auto p = std::make_unique<Process>();
    std::vector<std::string> argv{kBin, "node", "--config", cfg.path, "--id", id, "--coordinator", addr(), "--no-resp"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    REQUIRE(p->Start(argv, /*merge_stderr=*/true));
    REQUIRE(p->WaitEvent("listening", TimeBound(10s)));
    nodes.push_back(std::move(p));
    return *nodes.back();
  }
  Result<HttpResult> Call(const std::string& method, const std::string& target, const std::string& body,
                          const std::string& authorization = "") {
    return HttpRequest("127.0.0.1", port, method, target, body, 1000, Auth(authorization));
  }
  // /nodes with the secret.
  nlohmann::json Nodes() {
    auto r = Call("GET", "/nodes", "", BearerAuthorization(kSecret));
    REQUIRE(r.ok());
    REQUIRE(r->status == 200);
    return nlohmann::json::parse(r->body);
  }
  uint64_t WaitNodes(size_t n) {
    const auto end = std::chrono::steady_clock::now() + 10s;
    while (std::chrono::steady_clock::now() < end) {
      auto j = Nodes();
      if (j["nodes"].size() == n) return j["epoch"].get<uint64_t>();
      std::this_thread::sleep_for(50ms);
    }
    FAIL("coordinator did not reach " << n << " nodes");
    return 0;
  }
};

}  // namespace

TEST_CASE("Control plane: register, heartbeat and leave without the cluster secret are refused and the epoch stays",
          "[cluster][security]") {
  Daemons d;
  d.StartCoordinator();
  d.StartNode("n0");  // holds the secret (the config's $.auth.token)
  const uint64_t epoch = d.WaitNodes(1);

  const std::string rogue = R"({"id": "rogue", "host": "127.0.0.1", "ports": {"data": 9}})";
  struct Try {
    const char* target;
    std::string body, authorization;
    int status;
  };
  const std::vector<Try> tries = {
      {"/register", rogue, "", 401},
      {"/register", rogue, BearerAuthorization("wrong"), 403},
      {"/register", rogue, BearerAuthorization(kSecret + "x"), 403},
      {"/register", rogue, BearerAuthorization(kSecret.substr(0, kSecret.size() - 1)), 403},
      {"/register", rogue, "Token " + kSecret, 401},
      {"/register", rogue, BasicAuthorization("rogue", kSecret), 403},
      {"/heartbeat", R"({"id": "rogue"})", "", 401},
      {"/heartbeat", R"({"id": "n0", "stats": {"blocks": 999}})", BearerAuthorization("wrong"), 403},
      {"/leave", R"({"id": "n0"})", "", 401},
      {"/leave", R"({"id": "n0"})", BearerAuthorization("wrong"), 403},
      {"/policy", R"({"policy": "lru"})", "", 401},  // no such endpoint: refused before it is looked up
  };
  for (const Try& t : tries) {
    auto r = d.Call("POST", t.target, t.body, t.authorization);
    REQUIRE(r.ok());
    INFO(t.target << " with '" << t.authorization << "' -> " << r->status << " " << r->body);
    CHECK(r->status == t.status);
  }
  for (const char* target : {"/map", "/nodes", "/stats"}) {
    auto r = d.Call("GET", target, "");
    REQUIRE(r.ok());
    CHECK(r->status == 401);
  }
  auto health = d.Call("GET", "/healthz", "");
  REQUIRE(health.ok());
  CHECK(health->status == 200);

  // Nothing changed: n0 alone, same epoch, its stats not overwritten, over several heartbeats.
  std::this_thread::sleep_for(500ms);
  auto nodes = d.Nodes();
  REQUIRE(nodes["nodes"].size() == 1);
  CHECK(nodes["nodes"][0]["id"] == "n0");
  CHECK(nodes["epoch"].get<uint64_t>() == epoch);
  auto stats = d.Call("GET", "/stats", "", BearerAuthorization(kSecret));
  REQUIRE(stats.ok());
  auto sj = nlohmann::json::parse(stats->body);
  CHECK(sj["nodes"]["n0"].value("blocks", uint64_t{0}) == 0);
  CHECK(sj["auth_refused"].get<uint64_t>() == tries.size() + 3);

  // Each refusal is a JSON event on the coordinator's stderr, naming the path, the status and the peer.
  auto ev = d.coord.WaitEvent("auth_refused", TimeBound(5s));
  REQUIRE(ev);
  CHECK((*ev)["path"] == "/register");
  CHECK((*ev)["status"] == 401);
  CHECK((*ev)["reason"] == "missing credentials");
  CHECK((*ev)["peer"].get<std::string>().rfind("127.0.0.1:", 0) == 0);
  ev = d.coord.WaitEvent("auth_refused", TimeBound(5s));
  REQUIRE(ev);
  CHECK((*ev)["status"] == 403);
  CHECK((*ev)["reason"] == "wrong cluster secret");

  // With the secret the same writes go through and move the epoch.
  auto ok = d.Call("POST", "/register", rogue, BearerAuthorization(kSecret));
  REQUIRE(ok.ok());
  CHECK(ok->status == 200);
  CHECK(d.Nodes()["epoch"].get<uint64_t>() == epoch + 1);
  ok = d.Call("POST", "/leave", R"({"id": "rogue"})", BearerAuthorization(kSecret));
  REQUIRE(ok.ok());
  CHECK(ok->status == 200);
  CHECK(d.Nodes()["epoch"].get<uint64_t>() == epoch + 2);
}

TEST_CASE("Control plane: a node with a wrong secret never joins, and the map and a node metrics need the secret",
          "[cluster][security]") {
  Daemons d;
  d.StartCoordinator();
  Process& bad = d.StartNode("n1", {"--token", "not-the-secret"});
  auto refused = bad.WaitEvent("coordinator_refused", TimeBound(5s));
  REQUIRE(refused);
  CHECK_THAT((*refused)["error"].get<std::string>(), Catch::Contains("HTTP 403"));
  auto ev = d.coord.WaitEvent("auth_refused", TimeBound(5s));
  REQUIRE(ev);
  CHECK((*ev)["path"] == "/register");
  CHECK(d.Nodes()["nodes"].empty());

  Process& good = d.StartNode("n0");
  d.WaitNodes(1);

  // A client without the secret cannot read the map (at once, not after its timeout).
  NetworkClientOptions o;
  o.coordinator = d.addr();
  o.timeout_ms = 5000;
  const auto t0 = std::chrono::steady_clock::now();
  auto anon = NetworkClient::Connect(o);
  REQUIRE(!anon.ok());
  CHECK(anon.status().code() == StatusCode::kPermissionDenied);
  CHECK(std::chrono::steady_clock::now() - t0 < 2s);
  o.token = kSecret;
  auto client = NetworkClient::Connect(o);
  REQUIRE(client.ok());
  Router& r = (*client)->router();
  std::vector<std::byte> block(r.model().FullBlockBytes(), std::byte{7});
  std::vector<TokenId> toks(r.block_tokens(), 3);
  const std::span<const std::byte> spans[] = {block};
  REQUIRE(r.Put(toks, spans).ok());
  CHECK(r.MatchPrefix(toks).value() == 1);

  // A node's HTTP port: /healthz is open, the rest takes the secret.
  (void)good;
  uint16_t http = 0;
  {
    auto nodes = d.Nodes();
    REQUIRE(nodes["nodes"].size() == 1);
    http = nodes["nodes"][0]["ports"]["http"].get<uint16_t>();
  }
  auto m = HttpRequest("127.0.0.1", http, "GET", "/metrics", "", 1000);
  REQUIRE(m.ok());
  CHECK(m->status == 401);
  auto p = HttpRequest("127.0.0.1", http, "POST", "/policy", R"({"policy": "lru"})", 1000, Auth(BearerAuthorization("x")));
  REQUIRE(p.ok());
  CHECK(p->status == 403);
  auto h = HttpRequest("127.0.0.1", http, "GET", "/healthz", "", 1000);
  REQUIRE(h.ok());
  CHECK(h->status == 200);
  m = HttpRequest("127.0.0.1", http, "GET", "/metrics", "", 1000, Auth(BearerAuthorization(kSecret)));
  REQUIRE(m.ok());
  CHECK(m->status == 200);
  CHECK_THAT(m->body, Catch::Contains("kvmesh_http_auth_refused_total 2"));
  CHECK_THAT(m->body, Catch::Contains("kvmesh_store_blocks 1"));
}

TEST_CASE("Tenants end to end: two tenants with the same salt share nothing, over C++ and the C ABI",
          "[cluster][security][tenants]") {
  Daemons d(nlohmann::json::parse(R"({"token": "cluster-s3cret", "tenants": [
      {"name": "alpha", "token": "alpha-pass"}, {"name": "beta", "password": "beta-pass"}]})"));
  d.StartCoordinator();
  d.StartNode("n0");
  d.StartNode("n1");
  d.WaitNodes(2);
  auto connect = [&](const std::string& tenant, const std::string& token) {
    NetworkClientOptions o;
    o.coordinator = d.addr();
    o.tenant = tenant;
    o.token = token;
    o.tenant_salt = "everyone-uses-this-salt";
    o.timeout_ms = 3000;
    return NetworkClient::Connect(o);
  };
  // The map takes a tenant's credentials (Basic), and only the right ones.
  auto wrong = connect("alpha", "beta-pass");
  REQUIRE_FALSE(wrong.ok());
  CHECK(wrong.status().code() == StatusCode::kPermissionDenied);
  auto alpha = connect("alpha", "alpha-pass");
  auto beta = connect("beta", "beta-pass");
  REQUIRE(alpha.ok());
  REQUIRE(beta.ok());
  // A tenant reads the map and nothing else of the control plane.
  auto nodes = d.Call("GET", "/nodes", "", BasicAuthorization("alpha", "alpha-pass"));
  REQUIRE(nodes.ok());
  CHECK(nodes->status == 403);
  auto reg = d.Call("POST", "/leave", R"({"id": "n0"})", BasicAuthorization("alpha", "alpha-pass"));
  REQUIRE(reg.ok());
  CHECK(reg->status == 403);
  CHECK(d.Nodes()["nodes"].size() == 2);

  Router& ra = (*alpha)->router();
  Router& rb = (*beta)->router();
  const size_t bytes = ra.model().FullBlockBytes();
  std::vector<TokenId> toks(3 * ra.block_tokens());
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<TokenId>(1000 + i);
  CHECK(ra.Keys(toks) == rb.Keys(toks));  // the same key bytes
  std::vector<std::vector<std::byte>> a_blocks, b_blocks;
  for (int i = 0; i < 3; ++i) {
    a_blocks.emplace_back(bytes, std::byte(0xA0 + i));
    b_blocks.emplace_back(bytes, std::byte(0xB0 + i));
  }
  std::vector<std::span<const std::byte>> a_spans(a_blocks.begin(), a_blocks.end());
  std::vector<std::span<const std::byte>> b_spans(b_blocks.begin(), b_blocks.end());
  REQUIRE(ra.Put(toks, a_spans).ok());
  CHECK(ra.MatchPrefix(toks).value() == 3);
  CHECK(rb.MatchPrefix(toks).value() == 0);  // beta cannot even tell alpha's prefix is cached
  std::vector<std::byte> dst(bytes);
  const auto keys = rb.Keys(toks);
  GetItem g{keys[0], dst, 0, {}};
  REQUIRE(rb.GetBatch(std::span<GetItem>(&g, 1)).ok());
  CHECK(g.status.code() == StatusCode::kNotFound);
  REQUIRE(rb.Put(toks, b_spans).ok());
  GetItem ga{keys[1], dst, 0, {}};
  REQUIRE(ra.GetBatch(std::span<GetItem>(&ga, 1)).ok());
  REQUIRE(ga.status.ok());
  CHECK(dst == a_blocks[1]);  // alpha's bytes, not beta's

  // The C ABI: beta by its password sees its own blocks only.
  kvmesh_options o = kvmesh_default_options();
  const std::string coord = d.addr();
  o.coordinator = coord.c_str();
  o.tenant = "beta";
  o.token = "alpha-pass";
  o.tenant_salt = "everyone-uses-this-salt";
  kvmesh_client* c = nullptr;
  CHECK(kvmesh_connect(&o, &c) == KVMESH_PERMISSION_DENIED);
  o.token = "beta-pass";
  REQUIRE(kvmesh_connect(&o, &c) == KVMESH_OK);
  size_t matched = 0;
  REQUIRE(kvmesh_match_prefix(c, toks.data(), toks.size(), &matched) == KVMESH_OK);
  CHECK(matched == 3);
  size_t got = 0;
  REQUIRE(kvmesh_get_block(c, toks.data(), toks.size(), 2, dst.data(), dst.size(), &got) == KVMESH_OK);
  CHECK(dst == b_blocks[2]);
  kvmesh_key k0{keys[0].hi, keys[0].lo};
  REQUIRE(kvmesh_erase(c, &k0, 1) == KVMESH_OK);
  kvmesh_close(c);
  CHECK(ra.MatchPrefix(toks).value() == 3);  // beta's erase took beta's block only
  CHECK(rb.MatchPrefix(toks).value() == 0);

  // Per-tenant figures on the nodes' /metrics (with the cluster secret).
  uint64_t alpha_blocks = 0;
  const nlohmann::json members = d.Nodes();
  REQUIRE(members["nodes"].size() == 2);
  for (const auto& n : members["nodes"]) {
    auto m = HttpRequest("127.0.0.1", n["ports"]["http"].get<uint16_t>(), "GET", "/metrics", "", 1000,
                         Auth(BearerAuthorization(kSecret)));
    REQUIRE(m.ok());
    REQUIRE(m->status == 200);
    const std::string line = "\nkvmesh_tenant_blocks{tenant=\"alpha\"} ";
    auto pos = m->body.find(line);
    REQUIRE(pos != std::string::npos);
    alpha_blocks += std::stoull(m->body.substr(pos + line.size()));
    CHECK_THAT(m->body, Catch::Contains("kvmesh_tenant_puts_total{tenant=\"beta\"}"));
  }
  CHECK(alpha_blocks == 3);
}

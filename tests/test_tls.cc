// TLS ($.tls, docs/security.md) with certificates made at run time by
// tests/make_test_certs.sh (openssl CLI): a node's data port in process over
// loopback, and the coordinator's HTTPS API with mutual TLS for nodes between
// real `kvmesh coordinator` / `kvmesh node` processes (ports chosen at run time).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "cluster_process.h"
#include "test_data.h"
#include "test_time.h"
#include "common/credentials.h"
#include "kvmesh/config.h"
#include "kvmesh/network.h"
#include "shard_node/server/data_server.h"
#include "shard_node/shard_node.h"
#include "transport/http_client.h"
#include "transport/tcp_channel.h"
#include "transport/tls_client.h"
#include "transport/tls_server.h"

using namespace kvmesh;
using kvmesh::testing::Process;
using namespace std::chrono_literals;

namespace {

const std::string kBin = KVMESH_BIN;
const std::string kSource = KVMESH_SOURCE_DIR;

// The test binary's PKI (tests/make_test_certs.sh), removed at exit.
const testing::TestPki& Certs() { return testing::TestCerts(kSource); }

TlsConfig ServerTls(const std::string& name = "node", const std::string& client_auth = "none") {
  TlsConfig t;
  t.cert = Certs()(name + ".pem");
  t.key = Certs()(name + ".key");
  t.ca = Certs()("ca.pem");
  t.client_auth = client_auth;
  return t;
}

std::shared_ptr<const TlsClientContext> ClientTls(const std::string& ca = "ca.pem", const std::string& who = "") {
  TlsClientOptions o;
  o.ca = Certs()(ca);
  if (!who.empty()) {
    o.cert = Certs()(who + ".pem");
    o.key = Certs()(who + ".key");
  }
  auto c = TlsClientContext::Create(o);
  REQUIRE(c.ok());
  return *c;
}

struct TlsNode {
  std::atomic<uint64_t> epoch{0};
  std::unique_ptr<ShardNode> node;
  std::unique_ptr<DataServer> server;
  explicit TlsNode(const TlsConfig& tls, bool require_client_cert = false) {
    auto c = ParseConfig(R"({
      "model": {"model_id": "m", "num_layers": 2, "num_kv_heads": 2, "head_dim": 64, "block_tokens": 16},
      "nodes": [{"id": "n0", "memory": {"host": "16MiB"}}], "store": {"slot_bytes": "64KiB", "stripes": 2}})");
    REQUIRE(c.ok());
    auto n = ShardNode::Create(*c, "n0");
    REQUIRE(n.ok());
    node = std::move(*n);
    DataServerOptions o;
    auto ctx = MakeTlsServerContext(tls, require_client_cert);
    REQUIRE(ctx.ok());
    o.tls = *ctx;
    auto s = DataServer::Start(node.get(), o, &epoch);
    REQUIRE(s.ok());
    server = std::move(*s);
  }
  std::unique_ptr<TcpChannel> Channel(std::shared_ptr<const TlsClientContext> tls, const std::string& host = "127.0.0.1") {
    TcpChannelOptions o;
    o.host = host;
    o.port = server->port();
    o.tls = std::move(tls);
    o.connections = 1;
    o.timeout_ms = 3000;
    return TcpChannel::Create(o);
  }
};

std::vector<std::byte> Payload(uint64_t seed, size_t n) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> v(n);
  for (auto& b : v) b = static_cast<std::byte>(rng());
  return v;
}

}  // namespace

TEST_CASE("TLS: a node's data port round-trips blocks over TLS and refuses plain TCP and unknown CAs",
          "[cluster][security][tls]") {
  TlsNode n(ServerTls());
  auto ch = n.Channel(ClientTls());
  REQUIRE(ch->Connect().ok());
  // Blocks larger than a TLS record, several per frame, pipelined on one connection.
  std::vector<std::vector<std::byte>> data;
  std::vector<PutItem> puts;
  for (int i = 0; i < 12; ++i) data.push_back(Payload(i, 1000 + 5000 * i));
  for (int i = 0; i < 12; ++i) puts.push_back(PutItem{BlockKey{7, uint64_t(i)}, data[i], {}});
  REQUIRE(ch->Put(puts, {}).ok());
  for (auto& p : puts) CHECK(p.status.ok());
  std::vector<std::vector<std::byte>> dst(12, std::vector<std::byte>(64 << 10));
  std::vector<GetItem> gets;
  for (int i = 0; i < 12; ++i) gets.push_back(GetItem{BlockKey{7, uint64_t(i)}, dst[i], 0, {}});
  REQUIRE(ch->Get(gets, {}).ok());
  for (int i = 0; i < 12; ++i) {
    REQUIRE(gets[i].status.ok());
    REQUIRE(gets[i].size == data[i].size());
    CHECK(std::equal(data[i].begin(), data[i].end(), dst[i].begin()));
  }
  // Concurrent callers share the TLS connection (one reads while others write).
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 25; ++i) {
        std::vector<std::byte> out(64 << 10);
        GetItem g{BlockKey{7, uint64_t((t + i) % 12)}, out, 0, {}};
        if (ch->Get(std::span<GetItem>(&g, 1), {}).ok() && g.status.ok()) ok.fetch_add(1);
      }
    });
  for (auto& t : threads) t.join();
  CHECK(ok.load() == 100);

  // A plain client: the handshake fails, the connection is closed, the node counts it.
  Status plain = n.Channel(nullptr)->Connect();
  CHECK(plain.code() == StatusCode::kUnavailable);
  // A client that trusts another CA refuses the node's certificate.
  Status rogue = n.Channel(ClientTls("rogue-ca.pem"))->Connect();
  CHECK(rogue.code() == StatusCode::kUnavailable);
  CHECK_THAT(rogue.message(), Catch::Contains("certificate verify failed"));
  // A certificate may name the host by DNS name as well as by IP address.
  CHECK(n.Channel(ClientTls(), "localhost")->Connect().ok());
  // The node counts the two failed handshakes (the plain client, the one that refused its certificate).
  // The client gives up first: under TLS 1.3 the node reads the refusing client's alert only after
  // that client's Connect returned, so the count may lag by a moment (seen once in CI).
  const std::string want = "kvmesh_tls_handshake_failures_total 2\n";
  const auto deadline = std::chrono::steady_clock::now() + kvmesh::testing::TimeBound(5000ms);
  while (n.server->MetricsText().find(want) == std::string::npos &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(10ms);
  CHECK_THAT(n.server->MetricsText(), Catch::Contains(want));
}

TEST_CASE("TLS: a server presenting a certificate the CA did not sign or for another host is refused",
          "[cluster][security][tls]") {
  TlsNode rogue(ServerTls("rogue"));
  Status s = rogue.Channel(ClientTls())->Connect();
  CHECK(s.code() == StatusCode::kUnavailable);
  CHECK_THAT(s.message(), Catch::Contains("certificate verify failed"));
  TlsNode elsewhere(ServerTls("elsewhere"));
  s = elsewhere.Channel(ClientTls())->Connect();
  CHECK(s.code() == StatusCode::kUnavailable);
  CHECK_THAT(s.message(), Catch::Contains("mismatch"));
}

TEST_CASE("TLS: with client_auth all the data port wants a client certificate the cluster CA signed",
          "[cluster][security][tls]") {
  TlsNode n(ServerTls("node", "all"), /*require_client_cert=*/true);
  CHECK(n.Channel(ClientTls())->Connect().code() == StatusCode::kUnavailable);  // none shown
  CHECK(n.Channel(ClientTls("ca.pem", "rogue"))->Connect().code() == StatusCode::kUnavailable);
  CHECK(n.Channel(ClientTls("ca.pem", "client"))->Connect().ok());
}

TEST_CASE("TLS: the config names the JSON path of a bad TLS setting", "[security][tls]") {
  auto base = [] {
    auto j = nlohmann::json::parse(R"({
      "model": {"model_id": "m", "num_layers": 2, "num_kv_heads": 2, "head_dim": 64, "block_tokens": 16},
      "nodes": [{"id": "n0", "memory": {"host": "16MiB"}}]})");
    j["tls"] = {{"cert", Certs()("node.pem")}, {"key", Certs()("node.key")}, {"ca", Certs()("ca.pem")}};
    return j;
  };
  auto error = [](const nlohmann::json& j) {
    auto r = ParseConfig(j.dump());
    return r.ok() ? std::string() : r.status().message();
  };
  auto ok = ParseConfig(base().dump());
  REQUIRE(ok.ok());
  CHECK(ok->tls.enabled());
  CHECK(ok->tls.client_auth == "admin");
  auto j = base();
  j["tls"]["cert"] = "/nonexistent/node.pem";
  CHECK_THAT(error(j), Catch::StartsWith("$.tls.cert: cannot read \"/nonexistent/node.pem\""));
  j = base();
  j["tls"].erase("ca");
  CHECK_THAT(error(j), Catch::StartsWith("$.tls.ca:"));
  j = base();
  j["tls"]["client_auth"] = "sometimes";
  CHECK_THAT(error(j), Catch::StartsWith("$.tls.client_auth: must be"));
  j = base();
  j["tls"]["ciphers"] = "all";
  CHECK_THAT(error(j), Catch::StartsWith("$.tls.ciphers: unknown key"));
  // Files that exist but do not fit are found when the context is made, and name the path too.
  TlsConfig t = ServerTls();
  t.key = Certs()("client.key");
  auto ctx = MakeTlsServerContext(t, false);
  REQUIRE_FALSE(ctx.ok());
  CHECK_THAT(ctx.status().message(), Catch::StartsWith("$.tls.key:"));
  t = ServerTls();
  t.cert = Certs()("ca.key");
  ctx = MakeTlsServerContext(t, false);
  REQUIRE_FALSE(ctx.ok());
  CHECK_THAT(ctx.status().message(), Catch::StartsWith("$.tls.cert:"));
}

TEST_CASE("TLS: coordinator and nodes over HTTPS, membership writes need the secret and a client certificate",
          "[cluster][security][tls]") {
  auto j = nlohmann::json::parse(std::ifstream(kSource + "/cluster_configs/daemons-local.json"));
  j["auth"] = {{"token", "tls-secret"}};
  j["tls"] = {{"cert", Certs()("node.pem")}, {"key", Certs()("node.key")}, {"ca", Certs()("ca.pem")}};
  const std::string path = "/tmp/kvmesh-tls-test-" + std::to_string(::getpid()) + ".json";
  std::ofstream(path) << j.dump();
  Process coord, node;
  REQUIRE(coord.Start({kBin, "coordinator", "--config", path, "--port", "0"}, /*merge_stderr=*/true));
  auto l = coord.WaitEvent("listening", 10s);
  REQUIRE(l);
  CHECK((*l)["tls"] == true);
  const uint16_t port = (*l)["ports"]["http"].get<uint16_t>();
  const std::string addr = "127.0.0.1:" + std::to_string(port);
  REQUIRE(node.Start({kBin, "node", "--config", path, "--id", "n0", "--coordinator", addr, "--no-resp"}, true));
  REQUIRE(node.WaitEvent("listening", 10s));
  REQUIRE(node.WaitEvent("registered", 10s));  // over HTTPS, with its certificate and the secret
  ::unlink(path.c_str());

  auto call = [&](const std::string& method, const std::string& target, const std::string& body,
                  std::shared_ptr<const TlsClientContext> tls) {
    HttpRequestOptions o;
    o.authorization = BearerAuthorization("tls-secret");
    o.tls = std::move(tls);
    return HttpRequest("127.0.0.1", port, method, target, body, 2000, o);
  };
  // Plain HTTP gets no answer from an HTTPS port.
  auto plain = call("GET", "/map", "", nullptr);
  CHECK_FALSE(plain.ok());
  // The secret alone does not register a node: a client certificate is needed too.
  const std::string rogue = R"({"id": "rogue", "ports": {"data": 9}})";
  auto no_cert = call("POST", "/register", rogue, ClientTls());
  REQUIRE(no_cert.ok());
  CHECK(no_cert->status == 403);
  CHECK_THAT(no_cert->body, Catch::Contains("client certificate"));
  auto wrong_ca = call("POST", "/register", rogue, ClientTls("ca.pem", "rogue"));
  CHECK((!wrong_ca.ok() || wrong_ca->status == 403));
  // Reading the map takes no certificate; the member list (admin) does.
  auto map = call("GET", "/map", "", ClientTls());
  REQUIRE(map.ok());
  CHECK(map->status == 200);
  auto nodes = call("GET", "/nodes", "", ClientTls("ca.pem", "client"));
  REQUIRE(nodes.ok());
  REQUIRE(nodes->status == 200);
  auto nj = nlohmann::json::parse(nodes->body);
  REQUIRE(nj["nodes"].size() == 1);
  CHECK(nj["nodes"][0]["id"] == "n0");

  // A router over TLS end to end: the map over HTTPS, blocks over the TLS data port.
  NetworkClientOptions o;
  o.coordinator = addr;
  o.token = "tls-secret";
  o.tls_ca = Certs()("ca.pem");
  o.timeout_ms = 3000;
  auto client = NetworkClient::Connect(o);
  REQUIRE(client.ok());
  Router& r = (*client)->router();
  std::vector<std::byte> block(r.model().FullBlockBytes(), std::byte{0x5A});
  std::vector<TokenId> toks(r.block_tokens(), 11);
  const std::span<const std::byte> spans[] = {block};
  REQUIRE(r.Put(toks, spans).ok());
  CHECK(r.MatchPrefix(toks).value() == 1);
  std::vector<std::byte> back(block.size());
  GetItem g{r.Keys(toks).at(0), back, 0, {}};
  REQUIRE(r.GetBatch(std::span<GetItem>(&g, 1)).ok());
  REQUIRE(g.status.ok());
  CHECK(back == block);
  // Without TLS the same client gets nothing.
  o.tls_ca.clear();
  o.timeout_ms = 1000;
  CHECK_FALSE(NetworkClient::Connect(o).ok());
}

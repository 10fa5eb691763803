// The RESP ports with $.tls and tenants, end to end: a real `kvmesh
// coordinator`, two `kvmesh node`s and a `kvmesh proxy` on 127.0.0.1 (ports
// chosen at run time, certificates made at run time by
// tests/make_test_certs.sh), driven by the real `redis-cli --tls`. SET/GET
// work over TLS on a node's RESP port and on the proxy (whose node links
// speak TLS to the TLS data ports with its certificate), with and without a
// client certificate; a plain client gets nothing; tenants logged in with
// `--user/--pass` do not see each other's values through either front.
// Every process is killed by its destructor, whatever the test does.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "cluster_process.h"

using kvmesh::testing::Process;
using namespace std::chrono_literals;

namespace {

const std::string kBin = KVMESH_BIN;
const std::string kCli = KVMESH_REDIS_CLI;
const std::string kSource = KVMESH_SOURCE_DIR;

bool Have(const std::string& path) { return !path.empty() && ::access(path.c_str(), X_OK) == 0; }

// Runs a command to its end (bounded) and returns its stdout and stderr.
std::string Run(const std::vector<std::string>& argv, std::chrono::milliseconds timeout = 10s) {
  auto out = kvmesh::testing::RunToEnd(argv, timeout, /*merge_stderr=*/true);
  REQUIRE(out);
  return *out;
}

// A throwaway PKI and a config with tenants and TLS, removed at the end.
struct Setup {
  std::string dir, config;
  explicit Setup(const std::string& client_auth, bool resp_tls = true) {
    dir = "/tmp/kvmesh-resp-tls-" + std::to_string(::getpid()) + "-" + client_auth + (resp_tls ? "" : "-plain");
    REQUIRE(std::system(("bash " + kSource + "/tests/make_test_certs.sh " + dir).c_str()) == 0);
    auto j = nlohmann::json::parse(std::ifstream(kSource + "/cluster_configs/daemons-local.json"));
    j["nodes"] = nlohmann::json::array();
    for (const char* id : {"n0", "n1"})
      j["nodes"].push_back({{"id", id}, {"host", "127.0.0.1"}, {"ports", {{"data", 0}, {"http", 0}, {"resp", 0}}},
                            {"memory", {{"host", "64MiB"}}}});
    j["auth"] = {{"token", "cluster-secret"},
                 {"tenants", {{{"name", "alpha"}, {"password", "alpha-pw"}}, {{"name", "beta"}, {"token", "beta-pw"}}}}};
    j["tls"] = {{"cert", dir + "/node.pem"}, {"key", dir + "/node.key"}, {"ca", dir + "/ca.pem"},
                {"client_auth", client_auth}};
    j["resp"] = {{"tls", resp_tls}};
    config = dir + "/cluster.json";
    std::ofstream(config) << j.dump();
  }
  ~Setup() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  std::string operator()(const std::string& f) const { return dir + "/" + f; }
};

struct TlsCluster {
  const Setup& s;
  Process coord, proxy;
  std::map<std::string, std::unique_ptr<Process>> nodes;
  std::map<std::string, uint16_t> node_resp;
  uint16_t port = 0;

  explicit TlsCluster(const Setup& setup, bool tls = true) : s(setup) {
    REQUIRE(coord.Start({kBin, "coordinator", "--config", s.config, "--port", "0"}));
    auto c = coord.WaitEvent("listening", 10s);
    REQUIRE(c);
    const std::string addr = "127.0.0.1:" + std::to_string((*c)["ports"]["http"].get<uint16_t>());
    for (const char* id : {"n0", "n1"}) {
      auto p = std::make_unique<Process>();
      REQUIRE(p->Start({kBin, "node", "--config", s.config, "--id", id, "--coordinator", addr}, /*merge_stderr=*/true));
      auto j = p->WaitEvent("listening", 10s);
      REQUIRE(j);
      node_resp[id] = (*j)["ports"]["resp"].get<uint16_t>();
      REQUIRE(p->WaitEvent("registered", 10s));
      nodes[id] = std::move(p);
    }
    REQUIRE(proxy.Start({kBin, "proxy", "--config", s.config, "--coordinator", addr, "--resp-port", "0",
                         "--timeout-ms", "2000"}));
    auto j = proxy.WaitEvent("listening", 10s);
    REQUIRE(j);
    CHECK((*j)["nodes"].get<int>() == 2);
    CHECK((*j)["tls"] == tls);
    CHECK((*j)["tenants"].get<int>() == 2);
    port = (*j)["ports"]["resp"].get<uint16_t>();
  }

  // redis-cli over TLS as `user`, with the client certificate when `cert`.
  std::string Cli(uint16_t p, const std::string& user, const std::string& pw, std::vector<std::string> args,
                  bool cert = false) {
    std::vector<std::string> argv = {kCli, "-h", "127.0.0.1", "-p", std::to_string(p), "--tls", "--cacert", s("ca.pem")};
    if (cert) argv.insert(argv.end(), {"--cert", s("client.pem"), "--key", s("client.key")});
    argv.insert(argv.end(), {"--user", user, "--pass", pw, "--no-auth-warning"});
    argv.insert(argv.end(), args.begin(), args.end());
    return Run(argv);
  }
};

}  // namespace

TEST_CASE("RESP TLS: redis-cli --tls on a node's RESP port and the proxy, tenants apart, plain refused",
          "[resp][tls][tenants][redis]") {
  if (!Have(kCli)) {
    WARN("SKIP: redis-cli not installed");
    return;
  }
  Setup setup("admin");
  TlsCluster c(setup);
  const std::vector<uint16_t> fronts = {c.node_resp["n0"], c.port};
  for (const uint16_t p : fronts) {
    INFO("RESP port " << p);
    // The cluster identity, without and with a client certificate.
    CHECK(c.Cli(p, "default", "cluster-secret", {"SET", "k", "over-tls"}) == "OK\n");
    CHECK(c.Cli(p, "default", "cluster-secret", {"GET", "k"}, /*cert=*/true) == "over-tls\n");
    CHECK(c.Cli(p, "default", "cluster-secret", {"PING"}) == "PONG\n");
    // Tenants: the same key bytes, two values; B cannot read, test for or delete A's.
    CHECK(c.Cli(p, "alpha", "alpha-pw", {"SET", "shared", "alpha-value"}) == "OK\n");
    CHECK(c.Cli(p, "beta", "beta-pw", {"GET", "shared"}) == "\n");  // nil
    CHECK(c.Cli(p, "beta", "beta-pw", {"EXISTS", "shared"}) == "0\n");
    CHECK(c.Cli(p, "beta", "beta-pw", {"DEL", "shared"}) == "0\n");
    CHECK(c.Cli(p, "default", "cluster-secret", {"GET", "shared"}) == "\n");
    CHECK(c.Cli(p, "alpha", "alpha-pw", {"GET", "shared"}) == "alpha-value\n");
    CHECK(c.Cli(p, "alpha", "wrong", {"GET", "shared"}).find("alpha-value") == std::string::npos);
    // A plain client gets no answer from a TLS port.
    const std::string plain = Run({kCli, "-h", "127.0.0.1", "-p", std::to_string(p), "--user", "alpha", "--pass",
                                   "alpha-pw", "--no-auth-warning", "GET", "shared"});
    CHECK(plain.find("alpha-value") == std::string::npos);
    // Nor does a client that trusts another CA.
    const std::string rogue = Run({kCli, "-h", "127.0.0.1", "-p", std::to_string(p), "--tls", "--cacert",
                                   setup("rogue-ca.pem"), "--user", "alpha", "--pass", "alpha-pw", "--no-auth-warning",
                                   "GET", "shared"});
    CHECK(rogue.find("alpha-value") == std::string::npos);
  }
  // A tenant's value set through the proxy is the tenant's on its owner's node-local front.
  CHECK(c.Cli(c.port, "alpha", "alpha-pw", {"SET", "{t}via-proxy", "v1"}) == "OK\n");
  int found = 0;
  for (const auto& [id, rp] : c.node_resp) {
    found += c.Cli(rp, "alpha", "alpha-pw", {"GET", "{t}via-proxy"}) == "v1\n";
    CHECK(c.Cli(rp, "beta", "beta-pw", {"GET", "{t}via-proxy"}) == "\n");
  }
  CHECK(found == 1);
}

TEST_CASE("RESP TLS: with client_auth all, redis-cli needs a client certificate the CA signed",
          "[resp][tls][redis]") {
  if (!Have(kCli)) {
    WARN("SKIP: redis-cli not installed");
    return;
  }
  Setup setup("all");
  TlsCluster c(setup);
  for (const uint16_t p : {c.node_resp["n0"], c.port}) {
    INFO("RESP port " << p);
    CHECK(c.Cli(p, "alpha", "alpha-pw", {"SET", "m", "mutual"}, /*cert=*/true) == "OK\n");
    CHECK(c.Cli(p, "alpha", "alpha-pw", {"GET", "m"}, /*cert=*/true) == "mutual\n");
    CHECK(c.Cli(p, "alpha", "alpha-pw", {"GET", "m"}, /*cert=*/false).find("mutual") == std::string::npos);
  }
}

TEST_CASE("RESP TLS: $.resp.tls false keeps the RESP ports plain while the proxy reaches the nodes over TLS",
          "[resp][tls][redis]") {
  if (!Have(kCli)) {
    WARN("SKIP: redis-cli not installed");
    return;
  }
  Setup setup("admin", /*resp_tls=*/false);
  TlsCluster c(setup, /*tls=*/false);
  for (const uint16_t p : {c.node_resp["n0"], c.port}) {
    INFO("RESP port " << p);
    auto cli = [&](std::vector<std::string> args) {
      std::vector<std::string> argv = {kCli, "-h", "127.0.0.1", "-p", std::to_string(p), "--user", "beta",
                                       "--pass", "beta-pw", "--no-auth-warning"};
      argv.insert(argv.end(), args.begin(), args.end());
      return Run(argv);
    };
    CHECK(cli({"SET", "p", "plain"}) == "OK\n");
    CHECK(cli({"GET", "p"}) == "plain\n");
  }
}

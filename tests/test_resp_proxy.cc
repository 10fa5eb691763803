// The cluster-wide RESP front end to end: a real `kvmesh coordinator`, three
// `kvmesh node` processes and a `kvmesh proxy` on 127.0.0.1 (ports chosen at
// run time), driven by the real redis-cli and by raw sockets. Every key must
// reach the node that owns it (the owner's node-local front answers it), a
// SIGKILLed node's keys read nil while the others still answer, pipelined
// commands are answered in order, and bad input closes only its connection.
// Every process is killed by its destructor, whatever the test does.
#include <catch2/catch.hpp>

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "cluster_process.h"
#include "common/credentials.h"
#include "kvmesh/config.h"
#include "transport/http_client.h"
#include "transport/socket_util.h"

using namespace kvmesh;
using kvmesh::testing::Process;
using namespace std::chrono_literals;
using SteadyClock = std::chrono::steady_clock;

namespace {

const std::string kBin = KVMESH_BIN;
const std::string kCli = KVMESH_REDIS_CLI;
const std::string kConfig = std::string(KVMESH_SOURCE_DIR) + "/cluster_configs/daemons-local.json";
const std::vector<std::string> kNodes = {"n0", "n1", "n2"};

bool Have(const std::string& path) { return !path.empty() && ::access(path.c_str(), X_OK) == 0; }

// Runs a command to its end (bounded) and returns its stdout.
std::string Run(const std::vector<std::string>& argv, std::chrono::milliseconds timeout = 10s) {
  auto out = kvmesh::testing::RunToEnd(argv, timeout);
  REQUIRE(out);
  return *out;
}

std::vector<std::string> Lines(const std::string& s) {
  std::vector<std::string> v;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) v.push_back(l);
  return v;
}

// A coordinator, three nodes and one proxy.
struct ProxyCluster {
  std::string config;
  Process coord, proxy;
  std::map<std::string, std::unique_ptr<Process>> nodes;
  std::map<std::string, uint16_t> node_resp;
  uint16_t coord_port = 0, port = 0;

  explicit ProxyCluster(const std::string& config = kConfig) : config(config) {
    REQUIRE(coord.Start({kBin, "coordinator", "--config", config, "--port", "0"}));
    auto c = coord.WaitEvent("listening", 10s);
    REQUIRE(c);
    coord_port = (*c)["ports"]["http"].get<uint16_t>();
    for (const auto& id : kNodes) {
      auto p = std::make_unique<Process>();
      REQUIRE(p->Start({kBin, "node", "--config", config, "--id", id, "--coordinator", addr()}));
      auto j = p->WaitEvent("listening", 10s);
      REQUIRE(j);
      node_resp[id] = (*j)["ports"]["resp"].get<uint16_t>();
      nodes[id] = std::move(p);
    }
    WaitNodes(kNodes.size());
    REQUIRE(proxy.Start({kBin, "proxy", "--config", config, "--coordinator", addr(), "--resp-port", "0",
                         "--timeout-ms", "1000", "--max-value-bytes", "4194304"}));
    auto j = proxy.WaitEvent("listening", 10s);
    REQUIRE(j);
    CHECK((*j)["role"] == "proxy");
    CHECK((*j)["nodes"].get<int>() == 3);
    CHECK((*j)["max_value_bytes"].get<uint64_t>() == (4u << 20));  // --max-value-bytes
    CHECK((*j)["block_bytes"].get<uint64_t>() == (1u << 20));      // $.store.slot_bytes
    port = (*j)["ports"]["resp"].get<uint16_t>();
  }
  std::string addr() const { return "127.0.0.1:" + std::to_string(coord_port); }
  void WaitNodes(size_t n) {
    const auto end = SteadyClock::now() + 10s;
    while (SteadyClock::now() < end) {
      // With a cluster secret the coordinator answers /nodes only to callers holding it.
      HttpRequestOptions h;
      if (auto c = LoadConfigFile(config); c.ok() && !c->auth.token.empty()) h.authorization = BearerAuthorization(c->auth.token);
      auto r = HttpRequest("127.0.0.1", coord_port, "GET", "/nodes", "", 1000, h);
      if (r.ok() && r->status == 200 && nlohmann::json::parse(r->body)["nodes"].size() == n) return;
      std::this_thread::sleep_for(50ms);
    }
    FAIL("coordinator did not reach " << n << " nodes");
  }
  std::string Cli(std::vector<std::string> args, uint16_t p = 0, const std::string& password = "") {
    std::vector<std::string> argv = {kCli, "-p", std::to_string(p ? p : port)};
    if (!password.empty()) argv.insert(argv.end(), {"-a", password, "--no-auth-warning"});
    argv.insert(argv.end(), args.begin(), args.end());
    return Run(argv);
  }
  // The node whose node-local front holds `key` ("" when none, "many" when several).
  std::string Owner(const std::string& key) {
    std::string owner;
    for (const auto& [id, rp] : node_resp) {
      if (!nodes.at(id)->running()) continue;
      if (Cli({"exists", key}, rp) == "1\n") owner = owner.empty() ? id : "many";
    }
    return owner;
  }
};

// A raw connection to the proxy.
struct Conn {
  UniqueFd fd;
  explicit Conn(uint16_t port) {
    auto f = ConnectTcp("127.0.0.1", port, SteadyClock::now() + 2s);
    REQUIRE(f.ok());
    fd = std::move(*f);
  }
  void Send(const std::string& s) {
    REQUIRE(WriteAll(fd.get(), s.data(), s.size(), SteadyClock::now() + 5s).ok());
  }
  std::string Read(size_t n) {
    std::string out(n, '\0');
    REQUIRE(ReadFull(fd.get(), out.data(), n, 5000, {}).ok());
    return out;
  }
  // True when the peer closed the connection within the timeout (after any bytes).
  bool ClosedByPeer(std::chrono::milliseconds timeout = 3s) {
    const auto end = SteadyClock::now() + timeout;
    char b[4096];
    while (SteadyClock::now() < end) {
      pollfd p{fd.get(), POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      ssize_t n = ::recv(fd.get(), b, sizeof(b), 0);
      if (n == 0 || (n < 0 && errno == ECONNRESET)) return true;
    }
    return false;
  }
};

std::string BulkStr(const std::string& s) { return "$" + std::to_string(s.size()) + "\r\n" + s + "\r\n"; }
std::string Cmd(std::initializer_list<std::string> args) {
  std::string c = "*" + std::to_string(args.size()) + "\r\n";
  for (const auto& a : args) c += BulkStr(a);
  return c;
}

}  // namespace

TEST_CASE("RESP proxy: redis-cli SET/GET/MGET/DEL reach the node that owns each key", "[resp][proxy]") {
  if (!Have(kCli)) {
    WARN("SKIP: redis-cli not installed");
    return;
  }
  ProxyCluster c;
  CHECK(c.Cli({"ping"}) == "PONG\n");
  std::vector<std::string> mset = {"mset"}, mget = {"mget"};
  for (int i = 0; i < 12; ++i) {
    mset.push_back("key:" + std::to_string(i));
    mset.push_back("value-" + std::to_string(i * 7));
    mget.push_back("key:" + std::to_string(i));
  }
  mget.push_back("never-set");
  CHECK(c.Cli({"set", "alpha", "one"}) == "OK\n");
  CHECK(c.Cli({"get", "alpha"}) == "one\n");
  CHECK(c.Cli(mset) == "OK\n");
  auto got = Lines(c.Cli(mget));
  REQUIRE(got.size() == 13);
  for (int i = 0; i < 12; ++i) CHECK(got[i] == "value-" + std::to_string(i * 7));
  CHECK(got[12] == "");  // nil
  // Each key is on exactly one node, the one its node-local front answers,
  // and the keys are spread over every node.
  std::map<std::string, int> per_node;
  for (int i = 0; i < 12; ++i) {
    const std::string key = "key:" + std::to_string(i);
    const std::string owner = c.Owner(key);
    CHECK(owner != "");
    CHECK(owner != "many");
    ++per_node[owner];
    if (owner.size() == 2) CHECK(c.Cli({"get", key}, c.node_resp[owner]) == "value-" + std::to_string(i * 7) + "\n");
  }
  CHECK(per_node.size() == 3);
  CHECK(c.Cli({"exists", "key:0", "key:1", "nope"}) == "2\n");
  CHECK(c.Cli({"del", "key:0", "key:1", "nope"}) == "2\n");
  CHECK(c.Cli({"get", "key:0"}) == "\n");
  CHECK(c.Owner("key:1") == "");
  CHECK_THAT(c.Cli({"info"}), Catch::Contains("role:proxy") && Catch::Contains("live_nodes:3"));
  // A key SET on its owner's node-local front is read through the proxy. SET
  // replaces the value of a key already stored, as in Redis (the PUT frame's
  // replace flag: one round trip).
  std::string fresh, fresh_owner;
  for (int i = 0; i < 20 && fresh_owner.empty(); ++i) {  // a key whose owner is n1
    fresh = "fresh:" + std::to_string(i);
    CHECK(c.Cli({"set", fresh, "v"}) == "OK\n");
    if (c.Owner(fresh) == "n1") fresh_owner = "n1";
    CHECK(c.Cli({"del", fresh}) == "1\n");
  }
  REQUIRE(fresh_owner == "n1");
  CHECK(c.Cli({"set", fresh, "from-n1"}, c.node_resp["n1"]) == "OK\n");
  CHECK(c.Cli({"get", fresh}) == "from-n1\n");
  CHECK(c.Cli({"set", "alpha", "two"}) == "OK\n");
  CHECK(c.Cli({"get", "alpha"}) == "two\n");
  CHECK(c.Cli({"set", fresh, "from-proxy"}) == "OK\n");  // replaces what the node-local front stored
  CHECK(c.Cli({"get", fresh}, c.node_resp["n1"]) == "from-proxy\n");
  CHECK(c.Cli({"mset", "alpha", "three", "alpha", "four"}) == "OK\n");  // in order: the last wins
  CHECK(c.Cli({"get", "alpha"}) == "four\n");
  CHECK(c.Cli({"del", "alpha"}) == "1\n");
}

TEST_CASE("RESP proxy: a killed node's keys read nil while the other nodes still answer", "[resp][proxy]") {
  if (!Have(kCli)) {
    WARN("SKIP: redis-cli not installed");
    return;
  }
  ProxyCluster c;
  std::vector<std::string> mset = {"mset"}, mget = {"mget"};
  for (int i = 0; i < 24; ++i) {
    mset.push_back("k" + std::to_string(i));
    mset.push_back("v" + std::to_string(i));
    mget.push_back("k" + std::to_string(i));
  }
  REQUIRE(c.Cli(mset) == "OK\n");
  std::vector<std::string> owner(24);
  for (int i = 0; i < 24; ++i) owner[i] = c.Owner("k" + std::to_string(i));
  const std::string victim = owner[0];
  REQUIRE(victim.size() == 2);
  c.nodes[victim]->Kill(SIGKILL);
  REQUIRE(c.nodes[victim]->Wait(5s));
  // At once (the coordinator has not noticed yet) and after it removed the node.
  for (int round = 0; round < 2; ++round) {
    auto got = Lines(c.Cli(mget));
    REQUIRE(got.size() == 24);
    for (int i = 0; i < 24; ++i) {
      INFO("round " << round << " key k" << i << " on " << owner[i]);
      CHECK(got[i] == (owner[i] == victim ? "" : "v" + std::to_string(i)));
    }
    CHECK(c.Cli({"ping"}) == "PONG\n");
    if (round == 0) c.WaitNodes(2);
  }
  // After the map refresh (1 s period) new keys land on the two live nodes.
  std::this_thread::sleep_for(1200ms);
  CHECK(c.Cli({"set", "after", "x"}) == "OK\n");
  CHECK(c.Cli({"get", "after"}) == "x\n");
}

TEST_CASE("RESP proxy: pipelined commands are answered in order, bad input closes only its connection",
          "[resp][proxy]") {
  ProxyCluster c;
  std::mt19937_64 rng(11);
  Conn a(c.port);
  // 200 commands in one write: SET k_i, GET k_i, GET k_{i-1}, and an MGET every 10.
  std::string req, want;
  std::vector<std::string> vals;
  for (int i = 0; i < 50; ++i) {
    std::string v(1 + rng() % 3000, '\0');
    for (auto& ch : v) ch = static_cast<char>(rng());  // binary, with \r\n and NUL
    vals.push_back(v);
    const std::string k = "p" + std::to_string(i);
    req += Cmd({"SET", k, v}) + Cmd({"GET", k});
    want += "+OK\r\n" + BulkStr(v);
    req += Cmd({"GET", "p" + std::to_string(i - 1)});
    want += i == 0 ? "$-1\r\n" : BulkStr(vals[i - 1]);
    if (i % 10 == 9) {
      req += Cmd({"MGET", k, "missing", "p0"});
      want += "*3\r\n" + BulkStr(v) + "$-1\r\n" + BulkStr(vals[0]);
    }
  }
  a.Send(req);
  CHECK(a.Read(want.size()) == want);
  // A value over the slot size (1 MiB) is stored over several blocks; one
  // over the proxy's maximum (--max-value-bytes 4 MiB) is an error and the
  // connection stays.
  std::string big((1u << 20) + 1, 'x');
  big[12345] = 'y';
  a.Send(Cmd({"SET", "big", big}) + Cmd({"GET", "big"}));
  CHECK(a.Read(5 + BulkStr(big).size()) == "+OK\r\n" + BulkStr(big));
  std::string huge((4u << 20) + 1, 'x');
  a.Send(Cmd({"SET", "huge", huge}) + Cmd({"PING"}));
  const std::string err = "-ERR ResourceExhausted: value of 4194305 bytes exceeds the maximum of 4194304 bytes\r\n";
  CHECK(a.Read(err.size() + 7) == err + "+PONG\r\n");
  // Malformed input: answered, then only that connection is closed.
  Conn b(c.port);
  b.Send("*2\r\n$3\r\nGET\r\n$abc\r\n");
  CHECK(b.Read(5) == "-ERR ");
  CHECK(b.ClosedByPeer());
  Conn d(c.port);
  d.Send("*1\r\n$999999999999\r\n");
  CHECK(d.Read(5) == "-ERR ");
  CHECK(d.ClosedByPeer());
  a.Send(Cmd({"GET", "p3"}));
  CHECK(a.Read(BulkStr(vals[3]).size()) == BulkStr(vals[3]));
  a.Send("PING\r\n");
  CHECK(a.Read(7) == "+PONG\r\n");
}

TEST_CASE("RESP proxy and node: redis-cli -a PASSWORD works, a data command before AUTH gets NOAUTH",
          "[resp][proxy][auth]") {
  if (!Have(kCli)) {
    WARN("SKIP: redis-cli not installed");
    return;
  }
  // daemons-local.json with a shared secret ($.auth.token: the RESP password too).
  std::ifstream in(kConfig);
  nlohmann::json j = nlohmann::json::parse(in);
  j["auth"] = {{"token", "pw-7f3a"}};
  char tmpl[] = "/tmp/kvmesh-resp-auth-XXXXXX";
  const int fd = ::mkstemp(tmpl);
  REQUIRE(fd >= 0);
  const std::string text = j.dump();
  REQUIRE(::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()));
  ::close(fd);
  struct Unlink {
    std::string p;
    ~Unlink() { ::unlink(p.c_str()); }
  } unlink_cfg{tmpl};
  ProxyCluster c(tmpl);
  for (const auto& [name, port] : std::vector<std::pair<std::string, uint16_t>>{{"proxy", c.port}, {"n0", c.node_resp["n0"]}}) {
    INFO(name);
    CHECK_THAT(c.Cli({"set", "k-" + name, "v"}, port), Catch::Contains("NOAUTH Authentication required."));
    CHECK_THAT(c.Cli({"ping"}, port), Catch::Contains("NOAUTH"));
    CHECK(c.Cli({"set", "k-" + name, "v"}, port, "pw-7f3a") == "OK\n");
    CHECK(c.Cli({"get", "k-" + name}, port, "pw-7f3a") == "v\n");
    CHECK_THAT(c.Cli({"get", "k-" + name}, port, "wrong"), Catch::Contains("NOAUTH"));
  }
  // The proxy reached the nodes with the token (a key SET through it is on its owner).
  CHECK(c.Cli({"exists", "k-proxy"}, c.port, "pw-7f3a") == "1\n");
}

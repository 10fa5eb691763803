// The RESP (Redis protocol) front of a real `kvmesh node` process, driven by
// the real redis-cli and redis-benchmark when they are installed.
#include <catch2/catch.hpp>

#include <sys/socket.h>
#include <unistd.h>

#include <random>
#include <thread>

#include "cluster_process.h"
#include "transport/socket_util.h"

using namespace kvmesh;
using kvmesh::testing::Process;
using namespace std::chrono_literals;

namespace {

const std::string kConfig = std::string(KVMESH_SOURCE_DIR) + "/cluster_configs/daemons-local.json";

// Runs a command and returns its stdout (the process is bounded by `timeout`).
std::string Run(const std::vector<std::string>& argv, std::chrono::milliseconds timeout = 30s) {
  auto out = kvmesh::testing::RunToEnd(argv, timeout);
  REQUIRE(out);
  return *out;
}

bool Have(const std::string& path) { return ::access(path.c_str(), X_OK) == 0; }

// A raw RESP exchange: sends `req`, reads until `expect_bytes` bytes arrived.
std::string Raw(uint16_t port, const std::string& req, size_t expect_bytes) {
  auto fd = ConnectTcp("127.0.0.1", port, std::chrono::steady_clock::now() + 2s);
  REQUIRE(fd.ok());
  REQUIRE(WriteAll(fd->get(), req.data(), req.size(), std::chrono::steady_clock::now() + 2s).ok());
  std::string out(expect_bytes, '\0');
  REQUIRE(ReadFull(fd->get(), out.data(), out.size(), 2000, {}).ok());
  return out;
}

struct Node {
  Process p;
  uint16_t resp = 0;
  Node() {
    REQUIRE(p.Start({KVMESH_BIN, "node", "--config", kConfig, "--id", "n0"}));
    auto j = p.WaitEvent("listening", 10s);
    REQUIRE(j);
    resp = (*j)["ports"]["resp"].get<uint16_t>();
  }
};

}  // namespace

TEST_CASE("RESP: binary-safe SET/GET/MSET/MGET/EXISTS/DEL over raw sockets", "[resp]") {
  Node n;
  std::mt19937_64 rng(3);
  std::string value(70000, '\0');
  for (auto& c : value) c = static_cast<char>(rng());  // includes \r\n and NUL bytes
  std::string key = std::string("bin\0key\r\n", 9);
  auto bulk = [](const std::string& s) { return "$" + std::to_string(s.size()) + "\r\n" + s + "\r\n"; };
  std::string set = "*3\r\n" + bulk("SET") + bulk(key) + bulk(value);
  std::string get = "*2\r\n" + bulk("GET") + bulk(key);
  // Pipelined: SET then GET in one write.
  std::string expect = "+OK\r\n" + bulk(value);
  CHECK(Raw(n.resp, set + get, expect.size()) == expect);
  std::string mset = "*5\r\n" + bulk("MSET") + bulk("a") + bulk("1") + bulk("b") + bulk("22");
  std::string mget = "*4\r\n" + bulk("MGET") + bulk("a") + bulk("missing") + bulk("b");
  std::string ex = "*4\r\n" + bulk("EXISTS") + bulk("a") + bulk("b") + bulk("nope");
  std::string del = "*3\r\n" + bulk("DEL") + bulk("a") + bulk("nope");
  std::string want = "+OK\r\n*3\r\n$1\r\n1\r\n$-1\r\n$2\r\n22\r\n:2\r\n:1\r\n";
  CHECK(Raw(n.resp, mset + mget + ex + del, want.size()) == want);
  // A protocol error closes only that connection.
  std::string bad = "*1\r\n$999999999999\r\n";
  std::string err = Raw(n.resp, bad, 5);
  CHECK(err == "-ERR ");
  CHECK(Raw(n.resp, "PING\r\n", 7) == "+PONG\r\n");
}

TEST_CASE("RESP: redis-cli and redis-benchmark work unchanged", "[resp][redis]") {
  const std::string cli = KVMESH_REDIS_CLI, bench = KVMESH_REDIS_BENCHMARK;
  if (!Have(cli)) {
    WARN("SKIP: redis-cli not installed");
    return;
  }
  Node n;
  const std::string port = std::to_string(n.resp);
  CHECK(Run({cli, "-p", port, "set", "k", "v"}) == "OK\n");
  CHECK(Run({cli, "-p", port, "get", "k"}) == "v\n");
  CHECK(Run({cli, "-p", port, "set", "k", "v2"}) == "OK\n");  // SET replaces, as in Redis
  CHECK(Run({cli, "-p", port, "get", "k"}) == "v2\n");
  CHECK(Run({cli, "-p", port, "set", "k", "v"}) == "OK\n");
  CHECK(Run({cli, "-p", port, "exists", "k", "nope"}) == "1\n");
  CHECK(Run({cli, "-p", port, "ping"}) == "PONG\n");
  CHECK_THAT(Run({cli, "-p", port, "info"}), Catch::Contains("node_id:n0"));
  CHECK(Run({cli, "-p", port, "del", "k"}) == "1\n");
  CHECK(Run({cli, "-p", port, "get", "k"}) == "\n");
  if (!Have(bench)) {
    WARN("SKIP: redis-benchmark not installed");
    return;
  }
  std::string out = Run({bench, "-p", port, "-t", "set,get", "-d", "65536", "-n", "400", "-c", "4", "-q"}, 60s);
  CHECK_THAT(out, Catch::Contains("SET:") && Catch::Contains("GET:") && Catch::Contains("requests per second"));
  CHECK_THAT(Run({cli, "-p", port, "dbsize"}), !Catch::Equals("0\n"));
}

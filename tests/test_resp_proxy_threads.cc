// The RESP proxy in process (RespProxy over a Router of TCP channels to data
// servers on 127.0.0.1): connections on threads of their own and, past
// connection_threads, on the Asio + worker path, both answering pipelined
// commands in order; a stalled node's keys read nil within the router timeout
// and Stop() does not hang on a router call in flight; a malformed frame
// closes only its own connection. tests/test_resp_proxy.cc drives the real
// `kvmesh proxy` process; this file reaches the options the CLI does not.
#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "kvmesh/router.h"
#include "router/shard_map.h"
#include "shard_node/server/data_server.h"
#include "transport/resp/resp_protocol.h"
#include "router/proxy/resp_proxy.h"
#include "shard_node/shard_node.h"
#include "transport/protocol.h"
#include "transport/socket_util.h"
#include "transport/tcp_channel.h"
#include "tests/stalled_node.h"

using namespace kvmesh;
using namespace std::chrono_literals;
using SteadyClock = std::chrono::steady_clock;

namespace {

ClusterConfig Config(int nodes) {
  std::string j = R"({"model": {"model_id": "rp", "num_layers": 2, "num_kv_heads": 2, "head_dim": 16,
                                 "block_tokens": 4}, "store": {"slot_bytes": "64KiB"}, "nodes": [)";
  for (int i = 0; i < nodes; ++i)
    j += std::string(i ? "," : "") + R"({"id": "n)" + std::to_string(i) + R"(", "memory": {"host": "8MiB"}})";
  j += "]}";
  auto c = ParseConfig(j);
  REQUIRE(c.ok());
  return *c;
}

using testing::StalledNode;

// Shard nodes behind TCP data servers (node `stalled`, if >= 0, is a
// StalledNode instead), a router over TCP channels to them, and a proxy.
struct ProxyRig {
  ProxyRig(int n, RespProxyOptions po, int stalled = -1, int64_t timeout_ms = 2000) {
    cfg = Config(n);
    std::vector<std::shared_ptr<ShardChannel>> channels;
    for (int i = 0; i < n; ++i) {
      TcpChannelOptions o;
      o.timeout_ms = timeout_ms;
      o.connect_timeout_ms = timeout_ms;
      if (i == stalled) {
        stall = std::make_unique<StalledNode>();
        o.port = stall->port();
      } else {
        auto node = ShardNode::Create(cfg, cfg.nodes[i].id);
        REQUIRE(node.ok());
        auto s = DataServer::Start(node->get(), {}, &epoch);
        REQUIRE(s.ok());
        o.port = (*s)->port();
        nodes.push_back(std::move(*node));
        servers.push_back(std::move(*s));
      }
      channels.push_back(TcpChannel::Create(o));
    }
    map = ShardMap::FromConfig(cfg).value();
    RouterOptions ro;
    ro.timeout_ms = timeout_ms;
    router = Router::Create(cfg.model, map, channels, ro).value();
    po.timeout_ms = timeout_ms;
    auto p = RespProxy::Start(router.get(), po);
    REQUIRE(p.ok());
    proxy = std::move(*p);
  }
  ~ProxyRig() {
    if (proxy) proxy->Stop();
  }
  // The first key "<prefix><i>" whose owner is node `node`.
  std::string KeyOn(int node, const std::string& prefix) const {
    for (int i = 0;; ++i) {
      std::string k = prefix + std::to_string(i);
      if (map->Primary(RespKey(k), {}) == node) return k;
    }
  }

  ClusterConfig cfg;
  std::atomic<uint64_t> epoch{0};
  std::unique_ptr<StalledNode> stall;
  std::vector<std::unique_ptr<ShardNode>> nodes;
  std::vector<std::unique_ptr<DataServer>> servers;
  std::shared_ptr<const ShardMap> map;
  std::unique_ptr<Router> router;
  std::unique_ptr<RespProxy> proxy;
};

UniqueFd Dial(uint16_t port) {
  auto fd = ConnectTcp("127.0.0.1", port, SteadyClock::now() + 2s);
  REQUIRE(fd.ok());
  return std::move(*fd);
}

std::string Cmd(std::initializer_list<std::string> args) {
  std::string s = "*" + std::to_string(args.size()) + "\r\n";
  for (const std::string& a : args) s += "$" + std::to_string(a.size()) + "\r\n" + a + "\r\n";
  return s;
}
std::string Bulk(const std::string& v) { return "$" + std::to_string(v.size()) + "\r\n" + v + "\r\n"; }

void Send(int fd, const std::string& s) { REQUIRE(WriteAll(fd, s.data(), s.size(), SteadyClock::now() + 5s).ok()); }
std::string Recv(int fd, size_t n) {
  std::string s(n, '\0');
  REQUIRE(ReadFull(fd, s.data(), n, 5000, {}).ok());
  return s;
}
// True when the peer closed the connection within `wait`.
bool ClosedWithin(int fd, std::chrono::milliseconds wait) {
  const auto end = SteadyClock::now() + wait;
  char buf[4096];
  while (SteadyClock::now() < end) {
    pollfd pf{fd, POLLIN, 0};
    if (::poll(&pf, 1, 20) <= 0) continue;
    ssize_t r = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) return true;
  }
  return false;
}

// A pipelined SET/GET mix for client `c` and the exact answer it must get.
std::pair<std::string, std::string> Script(int c, int n) {
  std::string req, want;
  for (int i = 0; i < n; ++i) {
    const std::string k = "k" + std::to_string(c) + ":" + std::to_string(i);
    const std::string v = std::string(1 + (i * 37) % 3000, static_cast<char>('a' + (c + i) % 26)) + std::string("\r\n\0x", 5);
    req += Cmd({"SET", k, v}) + Cmd({"GET", k}) + Cmd({"GET", k + ":none"});
    want += "+OK\r\n" + Bulk(v) + "$-1\r\n";
  }
  return {req, want};
}

}  // namespace

TEST_CASE("RESP proxy: connections on their own threads and past connection_threads answer pipelined runs in order",
          "[resp][proxy]") {
  RespProxyOptions po;
  po.connection_threads = 2;  // connections 0 and 1 get threads, 2 and 3 the Asio path
  po.max_value_bytes = 64 << 10;
  ProxyRig rig(3, po);
  const uint16_t port = rig.proxy->port();
  std::vector<UniqueFd> conns;
  for (int c = 0; c < 4; ++c) conns.push_back(Dial(port));
  // Each client writes its whole script at once (runs of pipelined commands)
  // while another thread reads the answers. No Catch assertions off the main thread.
  std::vector<std::thread> io;
  std::atomic<int> sent{0}, good{0};
  for (int c = 0; c < 4; ++c) {
    auto script = std::make_shared<std::pair<std::string, std::string>>(Script(c, 60));
    const int fd = conns[c].get();
    io.emplace_back([&sent, script, fd] {
      if (WriteAll(fd, script->first.data(), script->first.size(), SteadyClock::now() + 10s).ok()) sent.fetch_add(1);
    });
    io.emplace_back([&good, script, fd] {
      std::string got(script->second.size(), '\0');
      if (ReadFull(fd, got.data(), got.size(), 10000, {}).ok() && got == script->second) good.fetch_add(1);
    });
  }
  for (auto& t : io) t.join();
  CHECK(sent.load() == 4);
  CHECK(good.load() == 4);

  // A closed connection gives its thread back: a new one is served (on a thread again).
  conns[0].reset();
  UniqueFd again = Dial(port);
  auto [req, want] = Script(9, 5);
  Send(again.get(), req);
  CHECK(Recv(again.get(), want.size()) == want);
  Send(again.get(), Cmd({"QUIT"}));
  CHECK(Recv(again.get(), 5) == "+OK\r\n");
  CHECK(ClosedWithin(again.get(), 2s));
  CHECK(rig.proxy->commands() == 4 * 180 + 15 + 1);

  // Stop ends the threaded connections at once; the Asio ones go with the proxy.
  const auto t0 = SteadyClock::now();
  rig.proxy->Stop();
  CHECK(SteadyClock::now() - t0 < 2s);
  CHECK(ClosedWithin(conns[1].get(), 2s));
  rig.proxy.reset();
  for (int c = 2; c < 4; ++c) CHECK(ClosedWithin(conns[c].get(), 2s));
}

TEST_CASE("RESP proxy: a stalled node's keys read nil within the timeout and Stop does not hang on them",
          "[resp][proxy][faults]") {
  constexpr int64_t kTimeout = 400;
  RespProxyOptions po;
  po.max_value_bytes = 64 << 10;
  ProxyRig rig(2, po, /*stalled=*/1, kTimeout);
  UniqueFd a = Dial(rig.proxy->port());
  const std::string live = rig.KeyOn(0, "live"), dead = rig.KeyOn(1, "dead");
  Send(a.get(), Cmd({"SET", live, "v1"}) + Cmd({"GET", live}));
  CHECK(Recv(a.get(), 5 + 8) == "+OK\r\n$2\r\nv1\r\n");

  auto t0 = SteadyClock::now();
  Send(a.get(), Cmd({"GET", dead}));
  CHECK(Recv(a.get(), 5) == "$-1\r\n");
  CHECK(SteadyClock::now() - t0 < std::chrono::milliseconds(kTimeout + 1000));
  Send(a.get(), Cmd({"SET", dead, "v2"}));
  std::string err = Recv(a.get(), 5);
  CHECK(err == "-ERR ");  // "-ERR DeadlineExceeded: ..." (the rest is not read)

  // A connection blocked in a router call to the stalled node when Stop comes.
  UniqueFd b = Dial(rig.proxy->port());
  Send(b.get(), Cmd({"GET", dead}));
  std::this_thread::sleep_for(50ms);
  t0 = SteadyClock::now();
  rig.proxy->Stop();
  CHECK(SteadyClock::now() - t0 < std::chrono::milliseconds(kTimeout + 1000));
  CHECK(ClosedWithin(b.get(), 2s));
}

TEST_CASE("RESP proxy: a malformed or oversize frame closes only its own connection", "[resp][proxy][faults]") {
  RespProxyOptions po;
  po.max_value_bytes = 4096;
  po.max_bulk_bytes = 8192;
  ProxyRig rig(2, po);
  UniqueFd good = Dial(rig.proxy->port()), bad = Dial(rig.proxy->port()), big = Dial(rig.proxy->port());
  Send(good.get(), Cmd({"SET", "x", "1"}));
  CHECK(Recv(good.get(), 5) == "+OK\r\n");

  Send(bad.get(), Cmd({"PING"}) + "*1\r\n$-7\r\n");
  CHECK(Recv(bad.get(), 7) == "+PONG\r\n");
  CHECK(Recv(bad.get(), 20) == "-ERR Protocol error:");
  CHECK(ClosedWithin(bad.get(), 2s));

  Send(big.get(), "*3\r\n$3\r\nSET\r\n$1\r\ny\r\n$100000\r\n");  // over max_bulk_bytes
  CHECK(Recv(big.get(), 20) == "-ERR Protocol error:");
  CHECK(ClosedWithin(big.get(), 2s));

  // Over the slot size but within the parser bound: an error answer, the connection stays.
  Send(good.get(), Cmd({"SET", "z", std::string(5000, 'z')}) + Cmd({"GET", "x"}));
  std::string e = Recv(good.get(), 5);
  CHECK(e == "-ERR ");
  char c = 0;
  std::string line;
  while (c != '\n') {
    REQUIRE(ReadFull(good.get(), &c, 1, 5000, {}).ok());
    line += c;
  }
  CHECK(line.find("ResourceExhausted") != std::string::npos);
  CHECK(Recv(good.get(), 7) == "$1\r\n1\r\n");
}

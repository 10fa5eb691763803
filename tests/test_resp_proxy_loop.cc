// The RESP proxy in process (RespProxy over a shard map of TCP data servers
// on 127.0.0.1): its event loop answers many connections' pipelined commands
// byte-exact and in order, batching each connection's run per node; values
// of many blocks cross it whole, and a key group lands on one node; a
// stalled node's keys read nil within the timeout and Stop() does not hang
// on them; malformed or oversize input closes only its own connection.
// tests/test_resp_proxy.cc drives the real `kvmesh proxy` process; this file
// reaches what the CLI does not.
#include <catch2/catch.hpp>

#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "router/proxy/resp_proxy.h"
#include "router/shard_map.h"
#include "shard_node/server/data_server.h"
#include "shard_node/shard_node.h"
#include "tests/resp_client.h"
#include "tests/resp_tenant_fronts.h"
#include "tests/stalled_node.h"
#include "tests/test_data.h"
#include "transport/resp/resp_commands.h"
#include "transport/resp/resp_value.h"

using namespace kvmesh;
using namespace std::chrono_literals;
using kvmesh::testing::RespCmd;
using kvmesh::testing::RespTestClient;
using kvmesh::testing::RespValue;
using SteadyClock = std::chrono::steady_clock;

namespace {

constexpr uint64_t kSlot = 64 << 10;

ClusterConfig Config(int nodes) {
  return testing::NodesConfig(R"("model": {"model_id": "rp", "num_layers": 2, "num_kv_heads": 2, "head_dim": 16,
                                          "block_tokens": 4}, "store": {"slot_bytes": "64KiB", "size_classes": 8})",
                              nodes, "16MiB");
}

using testing::StalledNode;

// Shard nodes behind TCP data servers (node `stalled`, if >= 0, is a
// StalledNode instead), a shard map with their ports, and a proxy over it.
struct ProxyRig {
  ProxyRig(int n, RespProxyOptions po, int stalled = -1, int64_t timeout_ms = 2000) {
    cfg = Config(n);
    std::vector<ShardInfo> infos;
    for (int i = 0; i < n; ++i) {
      ShardInfo s;
      s.id = cfg.nodes[i].id;
      s.host = "127.0.0.1";
      if (i == stalled) {
        stall = std::make_unique<StalledNode>();
        s.ports.data = stall->port();
        nodes.push_back(nullptr);
      } else {
        auto node = ShardNode::Create(cfg, cfg.nodes[i].id);
        REQUIRE(node.ok());
        auto srv = DataServer::Start(node->get(), {}, &epoch);
        REQUIRE(srv.ok());
        s.ports.data = (*srv)->port();
        nodes.push_back(std::move(*node));
        servers.push_back(std::move(*srv));
      }
      infos.push_back(s);
    }
    this->infos = infos;
    map = ShardMap::Build(1, infos, {}, {}, 1).value();
    published = map;
    po.timeout_ms = timeout_ms;
    po.connect_timeout_ms = timeout_ms;
    po.block_bytes = kSlot;
    po.map = [this] {
      std::lock_guard<std::mutex> lock(map_mu);
      return published;
    };
    auto p = RespProxy::Start(po);
    REQUIRE(p.ok());
    proxy = std::move(*p);
  }
  ~ProxyRig() {
    if (proxy) proxy->Stop();
  }
  // The first key "<prefix><i><suffix>" whose owner is node `node`.
  std::string KeyOn(int node, const std::string& prefix, const std::string& suffix = "") const {
    for (int i = 0;; ++i) {
      std::string k = prefix + std::to_string(i) + suffix;
      if (map->Primary(RespKey(k), {}) == node) return k;
    }
  }
  // The coordinator publishes the same nodes under a new epoch: the map the
  // proxy places with from its next flush on.
  void Publish(uint64_t e) {
    auto m = ShardMap::Build(e, infos, {}, {}, 1).value();
    std::lock_guard<std::mutex> lock(map_mu);
    published = std::move(m);
  }
  uint64_t Frames() {
    RespTestClient c(proxy->port());
    const std::string info = c.Call({"INFO"}).str;
    const size_t at = info.find("frames_sent:");
    REQUIRE(at != std::string::npos);
    return std::stoull(info.substr(at + 12));
  }

  ClusterConfig cfg;
  std::atomic<uint64_t> epoch{0};
  std::unique_ptr<StalledNode> stall;
  std::vector<std::unique_ptr<ShardNode>> nodes;
  std::vector<std::unique_ptr<DataServer>> servers;
  std::shared_ptr<const ShardMap> map;  // epoch 1
  std::vector<ShardInfo> infos;
  std::mutex map_mu;
  std::shared_ptr<const ShardMap> published;  // what po.map answers; guarded by map_mu
  std::unique_ptr<RespProxy> proxy;
};

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

std::string Bulk(const std::string& v) { return "$" + std::to_string(v.size()) + "\r\n" + v + "\r\n"; }

// A pipelined SET/GET mix for client `c` and the exact answer it must get.
std::pair<std::string, std::string> Script(int c, int n) {
  std::string req, want;
  for (int i = 0; i < n; ++i) {
    const std::string k = "k" + std::to_string(c) + ":" + std::to_string(i);
    const std::string v = std::string(1 + (i * 37) % 3000, static_cast<char>('a' + (c + i) % 26)) + std::string("\r\n\0x", 5);
    req += RespCmd({"SET", k, v}) + RespCmd({"GET", k}) + RespCmd({"GET", k + ":none"});
    want += "+OK\r\n" + Bulk(v) + "$-1\r\n";
  }
  return {req, want};
}

}  // namespace

TEST_CASE("RESP proxy loop: many connections' pipelined runs are answered in order, a run batched per node",
          "[resp][proxy]") {
  ProxyRig rig(3, {});
  const uint16_t port = rig.proxy->port();
  std::vector<std::unique_ptr<RespTestClient>> conns;
  for (int c = 0; c < 8; ++c) conns.push_back(std::make_unique<RespTestClient>(port));
  // Each client writes its whole script at once while another thread reads
  // the answers. No Catch assertions off the main thread.
  std::vector<std::thread> io;
  std::atomic<int> sent{0}, good{0};
  for (int c = 0; c < 8; ++c) {
    auto script = std::make_shared<std::pair<std::string, std::string>>(Script(c, 60));
    const int fd = conns[c]->fd();
    io.emplace_back([&sent, script, fd] {
      if (WriteAll(fd, script->first.data(), script->first.size(), SteadyClock::now() + 20s).ok()) sent.fetch_add(1);
    });
    io.emplace_back([&good, script, fd] {
      std::string got(script->second.size(), '\0');
      if (ReadFull(fd, got.data(), got.size(), 20000, {}).ok() && got == script->second) good.fetch_add(1);
    });
  }
  for (auto& t : io) t.join();
  CHECK(sent.load() == 8);
  CHECK(good.load() == 8);
  CHECK(rig.proxy->commands() == 8 * 180);

  // One run of 90 GETs over three nodes: one GET frame per node (plus INFO's none).
  RespTestClient a(port);
  std::string req, want;
  for (int i = 0; i < 90; ++i) {
    req += RespCmd({"GET", "k1:" + std::to_string(i % 60)});
    const int j = i % 60;
    want += Bulk(std::string(1 + (j * 37) % 3000, static_cast<char>('a' + (1 + j) % 26)) + std::string("\r\n\0x", 5));
  }
  const uint64_t f0 = rig.Frames();
  a.Send(req);
  std::string got(want.size(), '\0');
  REQUIRE(ReadFull(a.fd(), got.data(), got.size(), 10000, {}).ok());
  CHECK(got == want);
  CHECK(rig.Frames() - f0 <= 3);

  // QUIT answers and closes.
  a.Send(RespCmd({"QUIT"}));
  CHECK(a.Read().ok());
  CHECK(ClosedWithin(a.fd(), 2s));

  // Stop closes every connection at once.
  const auto t0 = SteadyClock::now();
  rig.proxy->Stop();
  CHECK(SteadyClock::now() - t0 < 2s);
  for (auto& c : conns) CHECK(ClosedWithin(c->fd(), 2s));
}

TEST_CASE("RESP proxy loop: pipelined writes and reads of one key keep their order", "[resp][proxy]") {
  ProxyRig rig(2, {});
  RespTestClient c(rig.proxy->port());
  const std::string big(200 << 10, 'b');  // four parts of 64 KiB
  // Blind SETs of one key share a step (the last one wins); a read or a
  // conditional write after them waits for them.
  c.Send(RespCmd({"SET", "same", "1"}) + RespCmd({"SET", "same", big}) + RespCmd({"SET", "same", "3"}) +
         RespCmd({"SET", "same", big + "4"}) + RespCmd({"GET", "same"}) + RespCmd({"SET", "same", "5", "NX"}) +
         RespCmd({"SET", "same", "6", "XX"}) + RespCmd({"GET", "same"}) + RespCmd({"MSET", "same", "7", "o", "x"}) +
         RespCmd({"GET", "same"}) + RespCmd({"DEL", "same"}) + RespCmd({"GET", "same"}) + RespCmd({"SETNX", "same", "8"}) +
         RespCmd({"GET", "same"}));
  for (int i = 0; i < 4; ++i) CHECK(c.Read().ok());
  CHECK(c.Read().str == big + "4");
  CHECK(c.Read().nil);
  CHECK(c.Read().ok());
  CHECK(c.Read().str == "6");
  CHECK(c.Read().ok());
  CHECK(c.Read().str == "7");
  CHECK(c.Read().num == 1);
  CHECK(c.Read().nil);
  CHECK(c.Read().num == 1);
  CHECK(c.Read().str == "8");
}

TEST_CASE("RESP proxy loop: values of many blocks cross whole, a key group lands on one node", "[resp][proxy]") {
  ProxyRig rig(3, {});
  RespTestClient c(rig.proxy->port());
  std::string big(3u << 20, '\0');  // 48 parts of 64 KiB
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 + i / 7);
  CHECK(c.Call({"SET", "chunk9kv_bytes", big}).ok());
  CHECK(c.Call({"SET", "chunk9metadata", "m"}).ok());
  CHECK(c.Call({"GET", "chunk9kv_bytes"}).str == big);
  CHECK(c.Call({"EXISTS", "chunk9kv_bytes", "chunk9metadata", "nope"}).num == 2);
  // Both keys (and every part) on the node that owns the group.
  const int home = rig.map->Primary(RespKey("chunk9metadata"), {});
  CHECK(home == rig.map->Primary(RespKey("chunk9kv_bytes"), {}));
  for (int n = 0; n < 3; ++n) {
    INFO("node " << n);
    CHECK(rig.nodes[n]->Exists(RespKey("chunk9kv_bytes"), false) == (n == home));
    CHECK(rig.nodes[n]->Exists(RespKey("chunk9metadata"), false) == (n == home));
    CHECK((rig.nodes[n]->Stats().store.blocks >= 50) == (n == home));
  }
  // Pipelined large SETs and GETs, and a replacement that frees the old parts.
  std::string small(100, 's');
  c.Send(RespCmd({"SET", "{t}a", big}) + RespCmd({"SET", "{t}b", small}) + RespCmd({"GET", "{t}a"}) +
         RespCmd({"GET", "{t}b"}));
  CHECK(c.Read().ok());
  CHECK(c.Read().ok());
  CHECK(c.Read().str == big);
  CHECK(c.Read().str == small);
  const int t_home = rig.map->Primary(RespKey("{t}a"), {});
  const uint64_t before = rig.nodes[t_home]->Stats().store.blocks;
  CHECK(c.Call({"SET", "{t}a", small}).ok());
  CHECK(c.Call({"GET", "{t}a"}).str == small);
  for (int i = 0; i < 50 && rig.nodes[t_home]->Stats().store.blocks + 40 > before; ++i) std::this_thread::sleep_for(10ms);
  CHECK(rig.nodes[t_home]->Stats().store.blocks + 40 <= before);  // the 48 old parts were erased
  CHECK(c.Call({"DEL", "{t}a", "{t}b", "chunk9kv_bytes"}).num == 3);
  CHECK(c.Call({"GET", "chunk9kv_bytes"}).nil);
  CHECK(c.Call({"GET", "chunk9metadata"}).nil);  // a metadata key reads as absent without its chunk
}

TEST_CASE("RESP proxy loop: a stalled node's keys read nil within the timeout and Stop does not hang on them",
          "[resp][proxy][faults]") {
  constexpr int64_t kTimeout = 400;
  ProxyRig rig(2, {}, /*stalled=*/1, kTimeout);
  RespTestClient a(rig.proxy->port());
  const std::string live = rig.KeyOn(0, "live"), dead = rig.KeyOn(1, "dead");
  CHECK(a.Call({"SET", live, "v1"}).ok());
  CHECK(a.Call({"GET", live}).str == "v1");

  auto t0 = SteadyClock::now();
  CHECK(a.Call({"GET", dead}).nil);
  CHECK(SteadyClock::now() - t0 < std::chrono::milliseconds(kTimeout + 1000));
  RespValue e = a.Call({"SET", dead, "v2"});
  CHECK(e.is_error());
  CHECK_THAT(e.str, Catch::Contains("DeadlineExceeded") || Catch::Contains("Unavailable"));
  // The live node still answers while the stalled one holds requests.
  RespTestClient b(rig.proxy->port());
  b.Send(RespCmd({"GET", dead}));
  t0 = SteadyClock::now();
  CHECK(a.Call({"GET", live}).str == "v1");
  CHECK(SteadyClock::now() - t0 < std::chrono::milliseconds(kTimeout));
  // A connection waiting on the stalled node when Stop comes.
  std::this_thread::sleep_for(50ms);
  t0 = SteadyClock::now();
  rig.proxy->Stop();
  CHECK(SteadyClock::now() - t0 < std::chrono::milliseconds(kTimeout + 1000));
  CHECK(ClosedWithin(b.fd(), 2s));
}

TEST_CASE("RESP proxy loop: a malformed or oversize frame closes only its own connection", "[resp][proxy][faults]") {
  RespProxyOptions po;
  po.max_value_bytes = 4096;
  ProxyRig rig(2, po);
  RespTestClient good(rig.proxy->port()), bad(rig.proxy->port()), big(rig.proxy->port());
  CHECK(good.Call({"SET", "x", "1"}).ok());

  bad.Send(RespCmd({"PING"}) + "*1\r\n$-7\r\n");
  CHECK(bad.Read().str == "PONG");
  CHECK_THAT(bad.Read().str, Catch::StartsWith("ERR Protocol error:"));
  CHECK(ClosedWithin(bad.fd(), 2s));

  big.Send("*3\r\n$3\r\nSET\r\n$1\r\ny\r\n$100000\r\n");  // over the parser bound (max value + 64 KiB)
  CHECK_THAT(big.Read().str, Catch::StartsWith("ERR Protocol error:"));
  CHECK(ClosedWithin(big.fd(), 2s));

  // Over the maximum value but within the parser bound: an error answer, the connection stays.
  good.Send(RespCmd({"SET", "z", std::string(5000, 'z')}) + RespCmd({"GET", "x"}));
  RespValue e = good.Read();
  CHECK(e.is_error());
  CHECK_THAT(e.str, Catch::Contains("ResourceExhausted") && Catch::Contains("exceeds the maximum of 4096 bytes"));
  CHECK(good.Read().str == "1");
}

TEST_CASE("RESP proxy loop: AUTH guards every data command", "[resp][proxy][auth]") {
  RespProxyOptions po;
  po.auth = MakeTokenAuth("pw");
  ProxyRig rig(2, po);
  RespTestClient c(rig.proxy->port());
  CHECK(c.Call({"SET", "k", "v"}).str == "NOAUTH Authentication required.");
  CHECK(c.Call({"INFO"}).str == "NOAUTH Authentication required.");
  // A pipelined AUTH applies to the commands after it, in order.
  c.Send(RespCmd({"GET", "k"}) + RespCmd({"AUTH", "pw"}) + RespCmd({"SET", "k", "v"}) + RespCmd({"GET", "k"}));
  CHECK(c.Read().str == "NOAUTH Authentication required.");
  CHECK(c.Read().ok());
  CHECK(c.Read().ok());
  CHECK(c.Read().str == "v");
}

TEST_CASE("RESP proxy loop: a node's StaleEpoch makes the proxy refresh its map once, then SET and GET land",
          "[resp][proxy][faults]") {
  // The proxy's engine executes the replica plan (router/replica_plan.h):
  // the first StaleEpoch answer of an I/O refreshes the map once and places
  // it again; a second is the answer.
  std::atomic<int> refreshes{0};
  std::atomic<uint64_t> publish{0};  // the epoch a refresh publishes
  ProxyRig* rig_ptr = nullptr;
  RespProxyOptions po;
  po.refresh = [&] {
    ++refreshes;
    rig_ptr->Publish(publish.load());
    return Status::Ok();
  };
  ProxyRig rig(2, po);
  rig_ptr = &rig;
  RespTestClient c(rig.proxy->port());
  CHECK(c.Call({"SET", "before", "v0"}).ok());  // the nodes hold no epoch yet (0: unversioned)
  CHECK(refreshes == 0);

  // The coordinator moved on: both nodes refuse the proxy's epoch-1 map.
  // A small SET is one I/O (its head, value inline): one refresh.
  rig.epoch = 2;
  publish = 2;
  CHECK(c.Call({"SET", "after", "v1"}).ok());
  CHECK(refreshes == 1);
  CHECK(c.Call({"GET", "after"}).str == "v1");
  CHECK(c.Call({"GET", "before"}).str == "v0");
  const std::string value(3 * kSlot + 123, 'x');  // parts and a head, on both nodes
  CHECK(c.Call({"SET", "big", value}).ok());
  CHECK(c.Call({"GET", "big"}).str == value);
  CHECK(refreshes == 1);  // the new map is current: no more StaleEpoch

  // A refresh that brings no newer map: one refresh per I/O, not two, and it fails.
  rig.epoch = 3;
  RespValue set = c.Call({"SET", "stale", "v"});
  CHECK(set.is_error());
  CHECK(refreshes == 2);
  CHECK(c.Call({"GET", "after"}).nil);  // the read missed
  CHECK(refreshes == 3);

  // The next refresh brings epoch 3: the same commands land.
  publish = 3;
  CHECK(c.Call({"SET", "stale", "v"}).ok());
  CHECK(refreshes == 4);
  CHECK(c.Call({"GET", "stale"}).str == "v");
  CHECK(c.Call({"GET", "after"}).str == "v1");
  CHECK(refreshes == 4);
}

// Redis Cluster mode ($.resp.cluster, docs/resp.md "Redis Cluster mode").
// Unit: the hash slot function against Redis's own values, slotted keys
// placed by their slot, the command table cluster clients read. End to end:
// a real `kvmesh coordinator` and three `kvmesh node`s in cluster mode on
// 127.0.0.1 (ports chosen at run time), driven by raw RESP and redis-cli -c:
// the nodes agree on one slot map covering all 16384 slots, every key is
// answered by its slot's owner and redirected (-MOVED) by the others,
// `kvmesh proxy` on the same config places keys where the owners answer
// them, and a killed node's slots move to the survivors (its keys read nil).
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "cluster_process.h"
#include "kvmesh/block_key.h"
#include "resp_client.h"
#include "router/shard_map.h"
#include "test_time.h"
#include "transport/resp/resp_commands.h"
#include "transport/resp/resp_value.h"

using namespace kvmesh;
using kvmesh::testing::Process;
using kvmesh::testing::RespTestClient;
using kvmesh::testing::RespValue;
using kvmesh::testing::TimeBound;
using namespace std::chrono_literals;
using SteadyClock = std::chrono::steady_clock;

namespace {

const std::string kBin = KVMESH_BIN;
const std::string kCli = KVMESH_REDIS_CLI;
const std::vector<std::string> kNodes = {"n0", "n1", "n2"};

// The text of an op answered at compile time (no block I/O); false otherwise.
bool AnsweredText(RespOp& op, const RespOpEnv& env, std::string* out) {
  if (!op.Step(env)) return false;
  RespReply r;
  op.Answer(&r);
  out->clear();
  for (auto p : r.pieces()) out->append(p.data(), p.size());
  return true;
}

}  // namespace

TEST_CASE("Cluster mode: hash slots are Redis Cluster's (CRC16 XModem, hash tags)", "[unit][resp][cluster]") {
  // Values from the Redis Cluster specification and `CLUSTER KEYSLOT` of redis-server 7.
  CHECK(RespKeySlot("123456789") == (0x31C3u & 16383));
  CHECK(RespKeySlot("foo") == 12182);
  CHECK(RespKeySlot("bar") == 5061);
  CHECK(RespKeySlot("{user1000}.following") == RespKeySlot("user1000"));
  CHECK(RespKeySlot("{user1000}.followers") == RespKeySlot("user1000"));
  CHECK(RespKeySlot("foo{}{bar}") == RespKeySlot("foo{}{bar}"));  // empty tag: the whole key
  CHECK(RespKeySlot("foo{}{bar}") != RespKeySlot("bar"));
  CHECK(RespKeySlot("foo{{bar}}zap") == RespKeySlot("{bar"));
  CHECK(RespKeySlot("foo{bar}{zap}") == RespKeySlot("bar"));
  CHECK(RespKeySlot("") == 0);
}

TEST_CASE("Cluster mode: a key's blocks are placed by its slot; the suffix rule is off", "[unit][resp][cluster]") {
  RespKeyRules rules;
  rules.cluster_slots = true;
  // Every block of a key (head, parts) carries the key's slot and is placed as the slot.
  for (const std::string key : {"foo", "bar", "{t}a", "session:42kv_bytes"}) {
    const BlockKey head = RespKey(key, rules);
    CHECK(IsGroupedKey(head));
    CHECK(IsSlottedKey(head));
    CHECK(GroupSlot(head) == RespKeySlot(key));
    const BlockKey part = RespPartKey(key, RespGroupOf(key, rules), 99, 3);
    CHECK(PlacementKey(part) == PlacementKey(head));
    CHECK(PlacementKey(head) == SlotPlacementKey(RespKeySlot(key)));
    CHECK(PlacementKey(PlacementKey(part)) == PlacementKey(part));  // idempotent
  }
  // Idempotent for grouped and content keys too.
  const BlockKey grouped = RespKey("foo"), content{0x1234, 0x5678};
  CHECK(PlacementKey(PlacementKey(grouped)) == PlacementKey(grouped));
  CHECK(PlacementKey(PlacementKey(content)) == PlacementKey(content));
  // Different keys of one slot share the placement, not the group (not co-evicted together).
  const BlockKey a = RespKey("{t}a", rules), b = RespKey("{t}b", rules);
  CHECK(PlacementKey(a) == PlacementKey(b));
  CHECK(a.hi == b.hi);  // one hash tag: one group
  CHECK(IsCoEvictedKey(a));
  const BlockKey foo = RespKey("foo", rules);
  CHECK_FALSE(IsCoEvictedKey(foo));
  // The suffix rule does not apply: a chunk and its metadata are separate keys (each its own slot).
  std::string primary;
  CHECK_FALSE(RespPrimaryKey("x:1metadata", rules, &primary));
  CHECK(RespGroupOf("x:1metadata", rules).hash != RespGroupOf("x:1kv_bytes", rules).hash);
  // Without cluster mode nothing changes: not slotted.
  CHECK_FALSE(IsSlottedKey(RespKey("foo")));
  CHECK(IsGroupedKey(RespKey("foo")));
  // The placement spreads the slots over the nodes (rendezvous on the slot).
  std::vector<ShardInfo> nodes(3);
  for (int i = 0; i < 3; ++i) nodes[i].id = "n" + std::to_string(i);
  auto map = ShardMap::Build(1, nodes, {}, {}, 1);
  REQUIRE(map.ok());
  std::map<uint32_t, int> per_node;
  uint32_t out[ShardMap::kMaxReplicas];
  for (uint32_t s = 0; s < kRespClusterSlots; ++s) {
    REQUIRE((*map)->Place(SlotPlacementKey(s), Affinity{}, out, 1) == 1);
    per_node[out[0]]++;
  }
  REQUIRE(per_node.size() == 3);
  for (const auto& [n, count] : per_node) CHECK(count > 4800);  // 5461 each on average
}

TEST_CASE("Cluster mode: COMMAND lists the key positions; CLUSTER answers from the view", "[unit][resp][cluster]") {
  auto view = std::make_shared<RespClusterView>();
  view->epoch = 7;
  view->nodes = {{RespClusterNodeId("a"), "127.0.0.1", 7001, 8001}, {RespClusterNodeId("b"), "127.0.0.1", 7002, 8002}};
  view->self = 0;
  view->owner.assign(kRespClusterSlots, 0);
  for (uint32_t s = 8192; s < kRespClusterSlots; ++s) view->owner[s] = 1;
  view->owner[100] = -1;  // not served
  struct Fixed : RespCluster {
    std::shared_ptr<const RespClusterView> v;
    std::shared_ptr<const RespClusterView> View() const override { return v; }
  };
  auto cluster = std::make_shared<Fixed>();
  cluster->v = view;
  RespFrontOptions o;
  o.rules.cluster_slots = true;
  o.cluster = cluster;
  RespCommands commands(o);
  RespSessionState st;
  // Answers of commands answered at once (no block I/O).
  auto answer = [&](std::vector<std::string> args) {
    std::vector<std::string_view> v(args.begin(), args.end());
    bool quit = false;
    std::unique_ptr<RespOp> op = commands.Compile(RespCommand(v), &st, &quit);
    REQUIRE(op);
    std::string out;
    REQUIRE(AnsweredText(*op, commands.Env(), &out));
    return out;
  };
  CHECK(RespClusterNodeId("a").size() == 40);
  CHECK(RespClusterNodeId("a") != RespClusterNodeId("b"));
  // "foo" is slot 12182 (node b), "bar" 5061 (node a: this front).
  CHECK(answer({"GET", "foo"}) == "-MOVED 12182 127.0.0.1:7002\r\n");
  CHECK(answer({"SET", "foo", "v"}) == "-MOVED 12182 127.0.0.1:7002\r\n");
  CHECK(answer({"MGET", "{bar}1", "foo"}) == "-CROSSSLOT Keys in request don't hash to the same slot\r\n");
  CHECK(answer({"MSET", "{foo}1", "x", "{foo}2", "y"}) == "-MOVED 12182 127.0.0.1:7002\r\n");
  std::string k100;  // a key of the unserved slot
  for (int i = 0; k100.empty(); ++i)
    if (RespKeySlot("k" + std::to_string(i)) == 100) k100 = "k" + std::to_string(i);
  CHECK(answer({"GET", k100}) == "-CLUSTERDOWN Hash slot not served\r\n");
  CHECK(answer({"CLUSTER", "KEYSLOT", "foo"}) == ":12182\r\n");
  CHECK(answer({"CLUSTER", "MYID"}) == "$40\r\n" + RespClusterNodeId("a") + "\r\n");
  const std::string slots = answer({"CLUSTER", "SLOTS"});
  CHECK(slots.rfind("*3\r\n*3\r\n:0\r\n:99\r\n*3\r\n$9\r\n127.0.0.1\r\n:7001\r\n", 0) ==
        0);  // 0-99, 101-8191, 8192-16383
  CHECK(slots.find(":101\r\n:8191\r\n") != std::string::npos);
  CHECK(slots.find(":8192\r\n:16383\r\n*3\r\n$9\r\n127.0.0.1\r\n:7002\r\n") != std::string::npos);
  const std::string nodes = answer({"CLUSTER", "NODES"});
  CHECK(nodes.find(RespClusterNodeId("a") + " 127.0.0.1:7001@8001 myself,master - 0 0 7 connected 0-99 101-8191\n") !=
        std::string::npos);
  CHECK(nodes.find(RespClusterNodeId("b") + " 127.0.0.1:7002@8002 master - 0 0 7 connected 8192-16383\n") !=
        std::string::npos);
  // CLUSTER SHARDS in redis-server 7's RESP2 shape: per node its ranges, then itself as key/value pairs.
  CHECK(answer({"CLUSTER", "SHARDS"}) ==
        "*2\r\n*4\r\n$5\r\nslots\r\n*4\r\n:0\r\n:99\r\n:101\r\n:8191\r\n$5\r\nnodes\r\n*1\r\n*14\r\n$2\r\nid\r\n$40\r\n" +
            RespClusterNodeId("a") +
            "\r\n$4\r\nport\r\n:7001\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n$8\r\nendpoint\r\n$9\r\n127.0.0.1\r\n$4\r\nrole\r\n$"
            "6\r\nmaster\r\n$18\r\nreplication-offset\r\n:0\r\n$6\r\nhealth\r\n$6\r\nonline\r\n*4\r\n$5\r\nslots\r\n*2\r\n:"
            "8192\r\n:16383\r\n$5\r\nnodes\r\n*1\r\n*14\r\n$2\r\nid\r\n$40\r\n" +
            RespClusterNodeId("b") +
            "\r\n$4\r\nport\r\n:7002\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n$8\r\nendpoint\r\n$9\r\n127.0.0.1\r\n$4\r\nrole\r\n$"
            "6\r\nmaster\r\n$18\r\nreplication-offset\r\n:0\r\n$6\r\nhealth\r\n$6\r\nonline\r\n");
  CHECK(answer({"CLUSTER", "INFO"}).find("cluster_state:fail\r\ncluster_slots_assigned:16383\r\n") !=
        std::string::npos);
  CHECK(answer({"READONLY"}) == "+OK\r\n");
  CHECK(answer({"CLUSTER", "RESET"}).rfind("-ERR unknown subcommand 'RESET'", 0) == 0);
  // COMMAND: what redis-py's cluster client reads the key positions from.
  const std::string table = answer({"COMMAND"});
  CHECK(table.find("*6\r\n$4\r\nmget\r\n:-2\r\n*2\r\n+readonly\r\n+fast\r\n:1\r\n:-1\r\n:1\r\n") != std::string::npos);
  CHECK(table.find("*6\r\n$4\r\nmset\r\n:-3\r\n*2\r\n+write\r\n+denyoom\r\n:1\r\n:-1\r\n:2\r\n") != std::string::npos);
  CHECK(answer({"COMMAND", "INFO", "get", "nosuch"}) ==
        "*2\r\n*6\r\n$3\r\nget\r\n:2\r\n*2\r\n+readonly\r\n+fast\r\n:1\r\n:1\r\n:1\r\n*-1\r\n");
  // Without cluster mode CLUSTER is refused as Redis refuses it.
  RespCommands plain(RespFrontOptions{});
  std::vector<std::string_view> c = {"CLUSTER", "SLOTS"};
  bool quit = false;
  auto op = plain.Compile(RespCommand(c), &st, &quit);
  std::string out;
  REQUIRE(AnsweredText(*op, plain.Env(), &out));
  CHECK(out == "-ERR This instance has cluster support disabled\r\n");
}

namespace {

// A coordinator and three nodes with $.resp.cluster (and, on demand, a proxy).
struct ClusterMode {
  std::string config;
  Process coord;
  std::map<std::string, std::unique_ptr<Process>> nodes;
  std::map<std::string, uint16_t> resp;  // node id -> RESP port
  uint16_t coord_port = 0;

  ClusterMode() {
    config = "/tmp/kvmesh-resp-cluster-" + std::to_string(::getpid()) + ".json";
    nlohmann::json c;
    {
      std::ifstream in(std::string(KVMESH_SOURCE_DIR) + "/cluster_configs/daemons-local.json");
      c = nlohmann::json::parse(in);
    }
    c["resp"] = {{"cluster", true}};
    std::ofstream(config) << c.dump();
    REQUIRE(coord.Start({kBin, "coordinator", "--config", config, "--port", "0"}));
    auto j = coord.WaitEvent("listening", TimeBound(10s));
    REQUIRE(j);
    coord_port = (*j)["ports"]["http"].get<uint16_t>();
    for (const auto& id : kNodes) {
      auto p = std::make_unique<Process>();
      REQUIRE(p->Start({kBin, "node", "--config", config, "--id", id, "--coordinator", addr()}));
      auto l = p->WaitEvent("listening", TimeBound(10s));
      REQUIRE(l);
      resp[id] = (*l)["ports"]["resp"].get<uint16_t>();
      nodes[id] = std::move(p);
    }
  }
  ~ClusterMode() { ::unlink(config.c_str()); }
  std::string addr() const { return "127.0.0.1:" + std::to_string(coord_port); }

  // CLUSTER NODES of the node at `port`: "host:port" of each node -> its slots.
  static std::map<std::string, std::set<uint32_t>> Slots(uint16_t port, std::string* myself = nullptr) {
    RespTestClient c(port);
    RespValue v = c.Call({"CLUSTER", "NODES"});
    REQUIRE(v.type == '$');
    std::map<std::string, std::set<uint32_t>> out;
    std::istringstream in(v.str);
    for (std::string line; std::getline(in, line);) {
      std::istringstream f(line);
      std::string id, addr, flags, master, ping, pong, epoch, state;
      f >> id >> addr >> flags >> master >> ping >> pong >> epoch >> state;
      const std::string hostport = addr.substr(0, addr.find('@'));
      if (myself && flags.find("myself") != std::string::npos) *myself = hostport;
      auto& s = out[hostport];
      for (std::string r; f >> r;) {
        const size_t dash = r.find('-');
        const uint32_t a = std::stoul(r.substr(0, dash)),
                       b = dash == std::string::npos ? a : std::stoul(r.substr(dash + 1));
        for (uint32_t x = a; x <= b; ++x) s.insert(x);
      }
    }
    return out;
  }

  // Waits until every live node reports the same map of `n` nodes covering all slots once.
  std::map<std::string, std::set<uint32_t>> WaitAgreed(size_t n) {
    const auto end = SteadyClock::now() + TimeBound(10s);
    std::map<std::string, std::set<uint32_t>> first;
    while (SteadyClock::now() < end) {
      bool agreed = true;
      first.clear();
      for (const auto& [id, port] : resp) {
        if (!nodes.at(id)->running()) continue;
        auto m = Slots(port);
        if (first.empty()) first = m;
        agreed = agreed && m == first && m.size() == n;
      }
      size_t covered = 0;
      for (const auto& [hp, s] : first) covered += s.size();
      if (agreed && covered == kRespClusterSlots) return first;
      std::this_thread::sleep_for(50ms);
    }
    FAIL("the nodes did not agree on a map of " << n << " nodes covering every slot");
    return {};
  }
};

uint16_t PortOf(const std::string& hostport) {
  return static_cast<uint16_t>(std::stoi(hostport.substr(hostport.find(':') + 1)));
}

// Runs a command to its end (bounded) and returns its stdout.
std::string Run(const std::vector<std::string>& argv) {
  auto out = kvmesh::testing::RunToEnd(argv, TimeBound(10s));
  REQUIRE(out);
  return *out;
}

}  // namespace

TEST_CASE("Cluster mode: the nodes agree on the slots, owners answer and the others redirect", "[cluster][resp]") {
  ClusterMode cm;
  auto slots = cm.WaitAgreed(3);
  std::map<uint32_t, uint16_t> owner;  // slot -> RESP port
  for (const auto& [hp, s] : slots) {
    CHECK(s.size() > 4800);  // rendezvous spreads the 16384 slots (5461 each on average)
    for (uint32_t x : s) owner[x] = PortOf(hp);
  }
  REQUIRE(owner.size() == kRespClusterSlots);
  for (const auto& [id, port] : cm.resp) {  // each node marks itself
    std::string me;
    ClusterMode::Slots(port, &me);
    CHECK(PortOf(me) == port);
  }
  // CLUSTER SLOTS says the same as CLUSTER NODES.
  {
    RespTestClient c(cm.resp.at("n1"));
    RespValue v = c.Call({"CLUSTER", "SLOTS"});
    REQUIRE(v.type == '*');
    size_t n = 0;
    for (const RespValue& r : v.arr) {
      REQUIRE(r.arr.size() == 3);
      for (int64_t x = r.arr[0].num; x <= r.arr[1].num; ++x, ++n) CHECK(owner.at(x) == r.arr[2].arr[1].num);
    }
    CHECK(n == kRespClusterSlots);
  }
  // Every key: its owner stores and answers it, every other node redirects to the owner.
  std::map<uint16_t, std::unique_ptr<RespTestClient>> conn;
  for (const auto& [id, port] : cm.resp) conn[port] = std::make_unique<RespTestClient>(port);
  for (int i = 0; i < 120; ++i) {
    const std::string key = "key:" + std::to_string(i), value(100 + 997 * i, static_cast<char>('a' + i % 26));
    const uint32_t slot = RespKeySlot(key);
    const uint16_t own = owner.at(slot);
    for (auto& [port, c] : conn) {
      if (port == own) continue;
      RespValue m = c->Call({"SET", key, value});
      REQUIRE(m.is_error());
      CHECK(m.str == "MOVED " + std::to_string(slot) + " 127.0.0.1:" + std::to_string(own));
    }
    REQUIRE(conn.at(own)->Call({"SET", key, value}).ok());
    RespValue g = conn.at(own)->Call({"GET", key});
    CHECK(g.str == value);
  }
  // Keys of one hash tag go to one node together; two slots in one command are refused.
  const uint16_t tag_owner = owner.at(RespKeySlot("user7"));
  CHECK(conn.at(tag_owner)->Call({"MSET", "{user7}.a", "1", "{user7}.b", "2"}).ok());
  RespValue both = conn.at(tag_owner)->Call({"MGET", "{user7}.a", "{user7}.b"});
  REQUIRE(both.arr.size() == 2);
  CHECK(both.arr[0].str == "1");
  CHECK(both.arr[1].str == "2");
  CHECK(conn.at(tag_owner)->Call({"MGET", "{user7}.a", "other"}).str.rfind("CROSSSLOT", 0) == 0);
  // A cluster-aware client (redis-cli -c) follows the redirects from any node.
  if (::access(kCli.c_str(), X_OK) == 0) {
    const uint16_t entry = cm.resp.at("n0");
    for (int i = 0; i < 12; ++i) {
      const std::string k = "cli:" + std::to_string(i);
      CHECK(Run({kCli, "-c", "-p", std::to_string(entry), "set", k, "v" + std::to_string(i)}) == "OK\n");
      CHECK(Run({kCli, "-c", "-p", std::to_string(entry), "get", k}) == "v" + std::to_string(i) + "\n");
    }
  }
  // INFO and HELLO say cluster mode.
  RespValue info = conn.begin()->second->Call({"INFO"});
  CHECK(info.str.find("cluster_enabled:1\r\n") != std::string::npos);

  // `kvmesh proxy` with the same config places keys on the slot's owner.
  Process proxy;
  REQUIRE(proxy.Start({kBin, "proxy", "--config", cm.config, "--coordinator", cm.addr(), "--resp-port", "0"}));
  auto pj = proxy.WaitEvent("listening", TimeBound(10s));
  REQUIRE(pj);
  RespTestClient pc((*pj)["ports"]["resp"].get<uint16_t>());
  for (int i = 0; i < 30; ++i) {
    const std::string key = "via-proxy:" + std::to_string(i);
    REQUIRE(pc.Call({"SET", key, "p" + std::to_string(i)}).ok());
    CHECK(conn.at(owner.at(RespKeySlot(key)))->Call({"GET", key}).str == "p" + std::to_string(i));
  }
  CHECK(pc.Call({"GET", "key:5"}).str == std::string(100 + 997 * 5, 'f'));
  CHECK(pc.Call({"CLUSTER", "SLOTS"}).str == "ERR This instance has cluster support disabled");

  // A killed node's slots go to the survivors; its keys read nil there, the others' keys stay.
  const uint16_t dead = cm.resp.at("n2");
  cm.nodes.at("n2")->Kill(SIGKILL);
  REQUIRE(cm.nodes.at("n2")->Wait(TimeBound(5s)));
  conn.erase(dead);
  auto after = cm.WaitAgreed(2);
  std::map<uint32_t, uint16_t> owner2;
  for (const auto& [hp, s] : after)
    for (uint32_t x : s) owner2[x] = PortOf(hp);
  size_t lost = 0, kept = 0;
  for (int i = 0; i < 120; ++i) {
    const std::string key = "key:" + std::to_string(i);
    const uint32_t slot = RespKeySlot(key);
    RespValue g = conn.at(owner2.at(slot))->Call({"GET", key});
    REQUIRE_FALSE(g.is_error());
    if (owner.at(slot) == dead) {
      CHECK(g.nil);
      ++lost;
    } else {
      CHECK(owner2.at(slot) == owner.at(slot));  // rendezvous: only the dead node's slots move
      CHECK(g.str == std::string(100 + 997 * i, static_cast<char>('a' + i % 26)));
      ++kept;
    }
  }
  CHECK(lost > 10);
  CHECK(kept > 50);
}

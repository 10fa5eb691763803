// RESP values over blocks (transport/resp/resp_value.h, resp_ops.h) and key
// groups (shard_node/key_groups.h), through a real ShardNode and the
// node-local RESP front in process, driven over sockets: values of many
// blocks read back whole, never torn or mixed under concurrent SETs and
// eviction; SET NX/XX/EX/PX/KEEPTTL and TTL; AUTH/NOAUTH/HELLO/CLIENT; hash
// tags and the suffix rule place a group on one node and a node evicts a
// co-evicted group as a whole.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <random>
#include <set>
#include <thread>

#include "kernels/codec.h"
#include "kvmesh/block_key.h"
#include "router/shard_map.h"
#include "shard_node/server/resp_server.h"
#include "shard_node/shard_node.h"
#include "tests/resp_client.h"
#include "tests/test_data.h"
#include "tests/test_time.h"
#include "transport/resp/resp_commands.h"
#include "transport/resp/resp_value.h"

using namespace kvmesh;
using kvmesh::testing::RespTestClient;
using kvmesh::testing::RespValue;
using namespace std::chrono_literals;

namespace {

constexpr uint64_t kSlot = 64 << 10;

// With `codec`, the node encodes raw KV blocks on put ($.codec.codec).
ClusterConfig Config(const std::string& memory, int nodes = 1, uint32_t stripes = 2, const std::string& codec = "") {
  return testing::NodesConfig(R"("model": {"model_id": "rv", "num_layers": 2, "num_kv_heads": 2, "head_dim": 16,
                                          "block_tokens": 4}, "store": {"slot_bytes": "64KiB", "size_classes": 8, "stripes": )" +
                                  std::to_string(stripes) + "}" +
                                  (codec.empty() ? "" : R"(, "codec": {"codec": ")" + codec + R"("})"),
                              nodes, memory);
}

// One ShardNode and its node-local RESP front, in process.
struct LocalFront {
  explicit LocalFront(const std::string& memory, std::string token = "") : LocalFront(Config(memory), std::move(token)) {}
  LocalFront(ClusterConfig config, std::string token) {
    cfg = std::move(config);
    auto n = ShardNode::Create(cfg, "n0");
    REQUIRE(n.ok());
    node = std::move(*n);
    RespServerOptions o;
    o.max_value_bytes = 8u << 20;
    o.auth = MakeTokenAuth(std::move(token));
    auto s = RespServer::Start(node.get(), o);
    REQUIRE(s.ok());
    server = std::move(*s);
  }
  uint16_t port() const { return server->port(); }
  ClusterConfig cfg;
  std::unique_ptr<ShardNode> node;
  std::unique_ptr<RespServer> server;
};

std::string Pattern(size_t n, uint64_t seed) {
  std::string s(n, '\0');
  std::mt19937_64 rng(seed);
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

}  // namespace

TEST_CASE("RESP value layout: groups, head format, placement by group", "[resp][value]") {
  RespKeyRules rules;
  // Hash tags: the first {...} with something inside.
  CHECK(RespGroupOf("user:{42}:a", rules).hash == RespGroupOf("{42}b", rules).hash);
  CHECK(RespGroupOf("user:{42}:a", rules).co_evict);
  CHECK(RespGroupOf("a{}b", rules).hash == RespGroupOf("a{}b", rules).hash);
  CHECK_FALSE(RespGroupOf("a{}b", rules).co_evict);  // empty tag: the whole key
  // The suffix rule pairs <stem>kv_bytes with <stem>metadata.
  CHECK(RespGroupOf("chunk7kv_bytes", rules).hash == RespGroupOf("chunk7metadata", rules).hash);
  CHECK(RespGroupOf("chunk7metadata", rules).co_evict);
  CHECK(RespGroupOf("chunk7metadata", rules).hash != RespGroupOf("chunk8metadata", rules).hash);
  CHECK_FALSE(RespGroupOf("plain", rules).co_evict);
  CHECK_FALSE(RespGroupOf("metadata", rules).co_evict);  // the suffix alone is no stem
  // A "<stem>metadata" key depends on "<stem>kv_bytes"; nothing else depends.
  std::string primary;
  CHECK(RespPrimaryKey("chunk7metadata", rules, &primary));
  CHECK(primary == "chunk7kv_bytes");
  CHECK_FALSE(RespPrimaryKey("chunk7kv_bytes", rules, &primary));
  CHECK_FALSE(RespPrimaryKey("{t}metadata", rules, &primary));
  CHECK_FALSE(RespPrimaryKey("plain", rules, &primary));
  RespKeyRules none;
  none.group_suffixes.clear();
  CHECK_FALSE(RespPrimaryKey("chunk7metadata", none, &primary));
  CHECK(RespGroupOf("chunk7kv_bytes", none).hash != RespGroupOf("chunk7metadata", none).hash);
  // Head and part keys are grouped keys of the group; distinct keys stay distinct.
  const BlockKey h = RespKey("chunk7kv_bytes", rules);
  CHECK(IsGroupedKey(h));
  CHECK(IsCoEvictedKey(h));
  CHECK(h.hi == RespGroupOf("chunk7kv_bytes", rules).hash);
  CHECK(RespKey("chunk7kv_bytes", rules) != RespKey("chunk7metadata", rules));
  const RespKeyGroup g = RespGroupOf("k", rules);
  CHECK(RespPartKey("k", g, 1, 0) != RespPartKey("k", g, 1, 1));
  CHECK(RespPartKey("k", g, 1, 0) != RespPartKey("k", g, 2, 0));
  CHECK_FALSE(IsCoEvictedKey(RespPartKey("k", g, 1, 0)));
  // Placement ranks nodes by the group: every block of a group on one node.
  const ClusterConfig cfg = Config("8MiB", 5);
  auto map = ShardMap::FromConfig(cfg).value();
  std::set<int> homes;
  for (int i = 0; i < 40; ++i) {
    const std::string stem = "s" + std::to_string(i);
    const int a = map->Primary(RespKey(stem + "kv_bytes", rules), {});
    CHECK(a == map->Primary(RespKey(stem + "metadata", rules), {}));
    CHECK(a == map->Primary(RespPartKey(stem + "kv_bytes", RespGroupOf(stem + "kv_bytes", rules), 99, 3), {}));
    CHECK(map->Primary(RespKey("{" + stem + "}x", rules), {}) == map->Primary(RespKey("y{" + stem + "}", rules), {}));
    homes.insert(a);
  }
  CHECK(homes.size() == 5);  // groups still spread over every node

  // The head: inline or parted, and refused when it is not one.
  RespHead hd;
  LayoutRespValue(100, kSlot, &hd);
  CHECK(hd.is_inline());
  LayoutRespValue(kSlot - kRespHeadBytes, kSlot, &hd);
  CHECK(hd.is_inline());
  LayoutRespValue(kSlot - kRespHeadBytes + 1, kSlot, &hd);
  CHECK(hd.parts == 1);
  LayoutRespValue(5 * kSlot + 1, kSlot, &hd);
  CHECK(hd.parts == 6);
  CHECK(hd.PartSize(5) == 1);
  hd.nonce = 77;
  hd.expire_at_ms = 123;
  char buf[kRespHeadBytes];
  EncodeRespHead(hd, buf);
  RespHead back;
  REQUIRE(DecodeRespHead(std::span<const char>(buf, kRespHeadBytes), &back).ok());
  CHECK(back.nonce == 77);
  CHECK(back.expire_at_ms == 123);
  CHECK(back.parts == 6);
  CHECK(back.value_bytes == 5 * kSlot + 1);
  buf[0] ^= 1;
  CHECK_FALSE(DecodeRespHead(std::span<const char>(buf, kRespHeadBytes), &back).ok());
  buf[0] ^= 1;
  std::string withtail(buf, kRespHeadBytes);
  withtail += "x";  // a parted head carries no inline bytes
  CHECK_FALSE(DecodeRespHead(withtail, &back).ok());
}

TEST_CASE("RESP node-local: values of many blocks read back whole, SET options and TTL", "[resp][value]") {
  LocalFront f("16MiB");
  RespTestClient c(f.port());
  // Sizes around the block boundary and far past it (a 64 KiB slot).
  for (size_t n : {size_t{0}, size_t{1}, size_t(kSlot - kRespHeadBytes), size_t(kSlot - kRespHeadBytes + 1),
                   size_t(kSlot), size_t(3 * kSlot + 17), size_t(2u << 20)}) {
    INFO("value of " << n << " bytes");
    const std::string v = Pattern(n, n);
    CHECK(c.Call({"SET", "big", v}).ok());
    RespValue got = c.Call({"GET", "big"});
    CHECK_FALSE(got.nil);
    CHECK(got.str == v);
    CHECK(c.Call({"EXISTS", "big"}).num == 1);
  }
  // Replacing a parted value erases the old parts: with a parted value, or
  // with any value for a co-evicted key (a plain key's small value leaves
  // them to eviction).
  uint64_t before = f.node->Stats().store.blocks;
  CHECK(c.Call({"SET", "big", Pattern(3 * kSlot, 3)}).ok());
  CHECK(f.node->Stats().store.blocks <= before - 32 + 4);  // 33 blocks of 2 MiB gone, 4 new
  CHECK(c.Call({"SET", "{g}big", Pattern(3 * kSlot, 4)}).ok());
  before = f.node->Stats().store.blocks;
  CHECK(c.Call({"SET", "{g}big", "tiny"}).ok());
  CHECK(c.Call({"GET", "{g}big"}).str == "tiny");
  CHECK(f.node->Stats().store.blocks == before - 3);
  // Over the configured maximum: an error, the connection stays.
  RespValue e = c.Call({"SET", "huge", std::string((8u << 20) + 1, 'h')});
  CHECK(e.is_error());
  CHECK_THAT(e.str, Catch::Contains("exceeds the maximum of 8388608 bytes"));
  CHECK(c.Call({"PING"}).str == "PONG");

  // NX / XX.
  CHECK(c.Call({"SET", "nx", "1", "NX"}).ok());
  CHECK(c.Call({"SET", "nx", "2", "NX"}).nil);
  CHECK(c.Call({"GET", "nx"}).str == "1");
  CHECK(c.Call({"SET", "xx", "1", "XX"}).nil);
  CHECK(c.Call({"GET", "xx"}).nil);
  CHECK(c.Call({"SET", "nx", "3", "XX"}).ok());
  CHECK(c.Call({"GET", "nx"}).str == "3");
  CHECK(c.Call({"SETNX", "nx", "4"}).num == 0);
  CHECK(c.Call({"SETNX", "nx2", "4"}).num == 1);
  // EX / PX / KEEPTTL / TTL, expiry enforced on read.
  CHECK(c.Call({"SET", "e", "v", "EX", "100"}).ok());
  const int64_t ttl = c.Call({"TTL", "e"}).num;
  CHECK((ttl >= 99 && ttl <= 100));
  CHECK(c.Call({"SET", "e", "w", "XX", "KEEPTTL"}).ok());
  CHECK(c.Call({"GET", "e"}).str == "w");
  CHECK(c.Call({"PTTL", "e"}).num > 90000);
  CHECK(c.Call({"TTL", "nx"}).num == -1);
  CHECK(c.Call({"TTL", "absent"}).num == -2);
  CHECK(c.Call({"SET", "p", Pattern(3 * kSlot, 5), "PX", "150"}).ok());
  CHECK(c.Call({"GET", "p"}).str.size() == 3 * kSlot);
  std::this_thread::sleep_for(250ms);
  CHECK(c.Call({"GET", "p"}).nil);
  CHECK(c.Call({"EXISTS", "p"}).num == 0);
  CHECK(c.Call({"TTL", "p"}).num == -2);
  CHECK(c.Call({"SET", "p", "again", "NX"}).ok());  // an expired value does not block NX
  CHECK(c.Call({"GET", "p"}).str == "again");
  CHECK(c.Call({"PSETEX", "ps", "100", "x"}).ok());
  CHECK(c.Call({"SETEX", "se", "10", "x"}).ok());
  CHECK(c.Call({"TTL", "se"}).num == 10);
  CHECK(c.Call({"SET", "bad", "x", "EX", "0"}).is_error());
  CHECK(c.Call({"SET", "bad", "x", "EX", "ten"}).is_error());
  CHECK(c.Call({"SET", "bad", "x", "NX", "XX"}).is_error());
  CHECK(c.Call({"SET", "bad", "x", "EX", "1", "PX", "1"}).is_error());
  // DEL counts what existed; MSET with a key twice keeps the last value.
  CHECK(c.Call({"MSET", "m", "1", "m", "2", "n", Pattern(2 * kSlot, 9)}).ok());
  CHECK(c.Call({"GET", "m"}).str == "2");
  CHECK(c.Call({"DEL", "m", "n", "absent"}).num == 2);
  CHECK(c.Call({"MGET", "m", "n"}).arr.size() == 2);
}

TEST_CASE("RESP values are never run through the node's KV codec, whatever their size", "[resp][value][codec]") {
  // A lossy codec (int8) encodes blocks of exactly the model's raw block size
  // on put. RESP values are opaque bytes: one whose block (head + value) has
  // that size must read back equal, through the RESP front and as a grouped
  // key put straight into the node (the path of the proxy's PUT frames).
  LocalFront f(Config("16MiB", 1, 2, "int8"), "");
  const size_t raw = kernels::BlockShape::FromLayout(BlockLayout::Full(f.cfg.model)).bytes();
  REQUIRE(raw > kRespHeadBytes);
  RespTestClient c(f.port());
  for (size_t n : {raw - kRespHeadBytes, raw, raw - kRespHeadBytes - 1}) {
    INFO("value of " << n << " bytes, raw KV block " << raw);
    const std::string v = Pattern(n, n + 5);
    CHECK(c.Call({"SET", "opaque", v}).ok());
    CHECK(c.Call({"GET", "opaque"}).str == v);
  }
  const BlockKey grouped = RespKey("direct");
  const std::string payload = Pattern(raw, 77);
  REQUIRE(f.node->Put(grouped, std::as_bytes(std::span<const char>(payload)), PutOptions{}).ok());
  std::string back(raw, '\0');
  auto got = f.node->GetInto(grouped, std::as_writable_bytes(std::span<char>(back)));
  REQUIRE(got.ok());
  CHECK(*got == raw);
  CHECK(back == payload);
  // A content-addressed KV block of that size is still encoded (stored smaller).
  const BlockKey kv{0x1234, 0x5678};
  const std::string block = Pattern(raw, 78);
  REQUIRE(f.node->Put(kv, std::as_bytes(std::span<const char>(block)), PutOptions{}).ok());
  auto ref = f.node->Get(kv);
  REQUIRE(ref.ok());
  CHECK(ref->meta().codec != 0);
}

TEST_CASE("RESP node-local: AUTH, NOAUTH, HELLO 2/3, CLIENT SETINFO", "[resp][auth]") {
  LocalFront f("8MiB", "pw-1");
  RespTestClient c(f.port());
  CHECK(c.Call({"GET", "k"}).str == "NOAUTH Authentication required.");
  CHECK(c.Call({"PING"}).str == "NOAUTH Authentication required.");
  CHECK(c.Call({"CLIENT", "SETINFO", "LIB-NAME", "x"}).is_error());
  CHECK_THAT(c.Call({"HELLO", "3"}).str, Catch::StartsWith("NOPROTO"));
  CHECK_THAT(c.Call({"HELLO", "2"}).str, Catch::StartsWith("NOAUTH"));
  CHECK_THAT(c.Call({"AUTH", "wrong"}).str, Catch::StartsWith("WRONGPASS"));
  CHECK_THAT(c.Call({"AUTH", "other", "pw-1"}).str, Catch::StartsWith("WRONGPASS"));
  CHECK(c.Call({"SET", "k", "v"}).is_error());
  CHECK(c.Call({"AUTH", "pw-1"}).ok());
  CHECK(c.Call({"SET", "k", "v"}).ok());
  CHECK(c.Call({"GET", "k"}).str == "v");
  // Another connection: HELLO 2 AUTH default <pw> SETNAME.
  RespTestClient d(f.port());
  RespValue h = d.Call({"HELLO", "2", "AUTH", "default", "pw-1", "SETNAME", "conn-d"});
  REQUIRE(h.type == '*');
  REQUIRE(h.arr.size() == 14);
  CHECK(h.arr[0].str == "server");
  CHECK(h.arr[5].num == 2);  // proto
  CHECK(d.Call({"CLIENT", "GETNAME"}).str == "conn-d");
  CHECK(d.Call({"CLIENT", "SETINFO", "LIB-NAME", "redis-py"}).ok());
  CHECK(d.Call({"CLIENT", "SETINFO", "LIB-VER", "5.0.0"}).ok());
  CHECK(d.Call({"GET", "k"}).str == "v");
  CHECK(d.Call({"AUTH", "default", "pw-1"}).ok());
  // Without a password configured, AUTH is an error, as in Redis.
  LocalFront open("8MiB");
  RespTestClient o(open.port());
  CHECK(o.Call({"AUTH", "x"}).is_error());
  CHECK(o.Call({"SET", "k", "v"}).ok());
  CHECK(o.Call({"HELLO"}).arr.size() == 14);
}

TEST_CASE("RESP node-local: concurrent SETs of one key and eviction never give a torn or mixed value",
          "[resp][value]") {
  // 4 MiB in two stripes; each version of the key is 5 blocks of one byte value.
  LocalFront f("4MiB");
  constexpr size_t kValue = 4 * kSlot + 123;
  std::atomic<bool> stop{false};
  std::atomic<int> bad{0}, reads{0}, hits{0}, sets{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < 2; ++w)
    threads.emplace_back([&, w] {
      RespTestClient c(f.port());
      for (int i = 0; !stop.load(); ++i) {
        const char fill = static_cast<char>('a' + (w * 13 + i) % 26);
        c.Send(kvmesh::testing::RespCmd({"SET", "hot", std::string(kValue, fill)}));
        if (c.Read().ok()) sets.fetch_add(1);
        // Pressure: other values push the store into eviction.
        c.Send(kvmesh::testing::RespCmd({"SET", "fill" + std::to_string(w) + ":" + std::to_string(i % 64),
                                         std::string(2 * kSlot, fill)}));
        (void)c.Read();
      }
    });
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&] {
      RespTestClient c(f.port());
      while (!stop.load()) {
        c.Send(kvmesh::testing::RespCmd({"GET", "hot"}));
        RespValue v = c.Read();
        reads.fetch_add(1);
        if (v.nil) continue;
        hits.fetch_add(1);
        // One version: the right length, every byte the same.
        if (v.str.size() != kValue || v.str.find_first_not_of(v.str[0]) != std::string::npos) bad.fetch_add(1);
      }
    });
  // At least 1.5 s, and until the store has evicted and the readers have
  // raced enough SETs (a slow build beside other load may take longer);
  // bounded by a time bound that grows with the build.
  const auto start = std::chrono::steady_clock::now();
  const auto bound = start + kvmesh::testing::TimeBound(20000ms);
  while (std::chrono::steady_clock::now() < bound &&
         (std::chrono::steady_clock::now() - start < 1500ms || sets.load() <= 40 || hits.load() == 0 ||
          f.node->Stats().store.evictions == 0))
    std::this_thread::sleep_for(50ms);
  stop = true;
  for (auto& t : threads) t.join();
  INFO(reads.load() << " reads, " << hits.load() << " hits, " << sets.load() << " sets");
  CHECK(bad.load() == 0);
  CHECK(hits.load() > 0);
  CHECK(sets.load() > 40);
  CHECK(f.node->Stats().store.evictions > 0);
}

TEST_CASE("RESP node-local: a co-evicted group leaves no metadata without its chunk after overfilling",
          "[resp][value][groups]") {
  LocalFront f("4MiB");  // 64 slots
  RespTestClient c(f.port());
  constexpr int kPairs = 60;  // 3 blocks each: about 3x the store
  std::vector<std::string> chunks;
  for (int i = 0; i < kPairs; ++i) {
    const std::string stem = "model@" + std::to_string(i) + "@";
    chunks.push_back(Pattern(2 * kSlot + 100, i));
    REQUIRE(c.Call({"SET", stem + "kv_bytes", chunks.back()}).ok());
    REQUIRE(c.Call({"SET", stem + "metadata", "md" + std::to_string(i)}).ok());
  }
  int present = 0, without = 0;
  for (int i = 0; i < kPairs; ++i) {
    const std::string stem = "model@" + std::to_string(i) + "@";
    if (c.Call({"EXISTS", stem + "metadata"}).num == 0) continue;
    ++present;
    RespValue v = c.Call({"GET", stem + "kv_bytes"});
    if (v.nil) ++without;
    else CHECK(v.str == chunks[i]);
  }
  INFO(present << " of " << kPairs << " pairs left");
  CHECK(without == 0);
  CHECK(present > 0);
  CHECK(present < kPairs);
  const std::string stats = f.node->StatsJson();
  CHECK_THAT(stats, Catch::Contains("\"key_groups\""));
  // DEL of the metadata leaves the chunk; DEL of the chunk hides its metadata.
  int deleted = 0;
  for (int i = kPairs - 1; i >= 0 && deleted < 2; --i) {
    const std::string stem = "model@" + std::to_string(i) + "@";
    if (c.Call({"EXISTS", stem + "metadata"}).num == 0) continue;
    if (deleted++ == 0) {
      CHECK(c.Call({"DEL", stem + "metadata"}).num == 1);
      CHECK(c.Call({"GET", stem + "kv_bytes"}).str == chunks[i]);
    } else {
      CHECK(c.Call({"DEL", stem + "kv_bytes"}).num == 1);
      CHECK(c.Call({"EXISTS", stem + "metadata"}).num == 0);
      CHECK(c.Call({"GET", stem + "metadata"}).nil);
      CHECK(c.Call({"SET", stem + "kv_bytes", "back"}).ok());  // the chunk again: the metadata with it
      CHECK(c.Call({"GET", stem + "metadata"}).str == "md" + std::to_string(i));
    }
  }
  CHECK(deleted == 2);
  // Written in the other order, the metadata shows once its chunk is there.
  CHECK(c.Call({"SET", "late@metadata", "m"}).ok());
  CHECK(c.Call({"EXISTS", "late@metadata"}).num == 0);
  CHECK(c.Call({"SET", "late@kv_bytes", Pattern(3 * kSlot, 1)}).ok());
  CHECK(c.Call({"EXISTS", "late@metadata"}).num == 1);
  CHECK(c.Call({"TTL", "late@metadata"}).num == -1);
}

TEST_CASE("ShardNode: a co-evicted group is dropped as a whole once a member is gone", "[store][groups]") {
  const ClusterConfig cfg = Config("1MiB", 1, 1);  // 16 slots, one stripe
  auto n = ShardNode::Create(cfg, "n0");
  REQUIRE(n.ok());
  ShardNode& node = **n;
  const std::string block(kSlot, 'x');
  auto bytes = std::as_bytes(std::span<const char>(block));
  const BlockKey a = GroupedKey(7, 1, true), b = GroupedKey(7, 2, true), plain = GroupedKey(8, 1, false);
  REQUIRE(node.Put(a, bytes, {}).ok());
  REQUIRE(node.Put(b, bytes, {}).ok());
  REQUIRE(node.Put(plain, bytes, {}).ok());
  CHECK(node.Exists(a, false));
  // Erasing one member explicitly keeps the other.
  REQUIRE(node.Erase(a).ok());
  CHECK(node.Exists(b, false));
  REQUIRE(node.Put(a, bytes, {}).ok());
  // Fill one block past the 16 slots: a is the oldest, so eviction takes it
  // (LRU) and only it; b, still stored, then reads as a miss.
  (void)node.Exists(b, true), (void)node.Exists(plain, true);
  for (uint64_t i = 0; i < 14; ++i) REQUIRE(node.Put(BlockKey{100 + i, i}, bytes, {}).ok());
  CHECK(node.Stats().store.evictions > 0);
  CHECK_FALSE(node.Exists(a, false));
  CHECK_FALSE(node.Get(b).ok());
  CHECK_FALSE(node.Exists(b, false));  // erased with its group
  CHECK_THAT(node.StatsJson(), Catch::Contains("\"dropped_groups\":1"));
}

TEST_CASE("Config: $.resp is read strictly and names the bad field", "[resp][config]") {
  const std::string base = R"({"model": {"model_id": "m", "num_layers": 1, "num_kv_heads": 1, "head_dim": 8,
                                         "block_tokens": 4}, "nodes": [{"id": "a", "memory": {"host": "8MiB"}}])";
  auto with = [&](const std::string& resp) { return ParseConfig(base + R"(, "resp": )" + resp + "}"); };
  auto d = ParseConfig(base + "}");
  REQUIRE(d.ok());
  CHECK(d->resp.max_value_bytes == (64u << 20));
  CHECK(d->resp.hash_tags);
  CHECK(d->resp.group_suffixes == std::vector<std::string>{"kv_bytes", "metadata"});
  CHECK(d->resp.tls);  // follows $.tls
  CHECK_FALSE(with(R"({"tls": false})")->resp.tls);
  auto c = with(R"({"max_value_bytes": "256MiB", "hash_tags": false, "group_suffixes": ["_kv", "_meta"]})");
  REQUIRE(c.ok());
  CHECK(c->resp.max_value_bytes == (256u << 20));
  CHECK_FALSE(c->resp.hash_tags);
  CHECK(c->resp.group_suffixes == std::vector<std::string>{"_kv", "_meta"});
  CHECK(with(R"({"group_suffixes": []})")->resp.group_suffixes.empty());
  auto err = [&](const std::string& resp) { return with(resp).status().message(); };
  CHECK_THAT(err(R"({"max_value_bytes": "2GiB"})"), Catch::StartsWith("$.resp.max_value_bytes: at most 1GiB"));
  CHECK_THAT(err(R"({"max_value_bytes": 0})"), Catch::Contains("$.resp.max_value_bytes"));
  CHECK_THAT(err(R"({"group_suffixes": "kv_bytes"})"), Catch::StartsWith("$.resp.group_suffixes: expected an array"));
  CHECK_THAT(err(R"({"group_suffixes": ["a", ""]})"), Catch::StartsWith("$.resp.group_suffixes[1]: must be 1..64 bytes"));
  CHECK_THAT(err(R"({"group_suffixes": [3]})"), Catch::StartsWith("$.resp.group_suffixes[0]: expected a string"));
  CHECK_THAT(err(R"({"hash_tag": true})"), Catch::Contains("$.resp") && Catch::Contains("hash_tag"));
  CHECK_THAT(err(R"({"tls": "yes"})"), Catch::StartsWith("$.resp.tls"));
  // Redis Cluster mode: off by default; clients place keys by hash tags, so those stay on.
  CHECK_FALSE(d->resp.cluster);
  CHECK(with(R"({"cluster": true})")->resp.cluster);
  CHECK(RespRulesFromConfig(with(R"({"cluster": true})")->resp).cluster_slots);
  CHECK_THAT(err(R"({"cluster": "on"})"), Catch::StartsWith("$.resp.cluster"));
  CHECK_THAT(err(R"({"cluster": true, "hash_tags": false})"), Catch::StartsWith("$.resp.hash_tags: must stay true"));
}

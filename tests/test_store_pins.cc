// Pins that always come back (issue 39, finding 1): a pinned block that
// leaves the index (an erase, a replacing put, a tenant's quota eviction) is
// freed at its last unpin, and an explicit pin over the binary protocol
// belongs to its connection: released by UNPIN on that connection or when
// the connection closes, and bounded per connection (kMaxPinsPerConnection)
// and per tenant (its quota's worth of chunk bytes).
//
// The store and node cases run in process; the protocol cases reach a node's
// data server over loopback TCP with tenant credentials, as the issue's
// reproduction did (alice: 8 MiB quota, bob: 64 MiB, a 128 MiB node of 1 MiB
// blocks).
#include <catch2/catch.hpp>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <random>
#include <thread>

#include "cluster_process.h"
#include "test_time.h"
#include "kvmesh/build_config.h"
#include "kvmesh/config.h"
#include "shard_node/block_store.h"
#include "shard_node/server/data_server.h"
#include "shard_node/shard_node.h"
#include "tests/tenant_node.h"
#include "transport/tcp_channel.h"
#if defined(KVMESH_HAVE_UCX)
#include "shard_node/server/ucx_server.h"
#include "transport/ucx_channel.h"
#endif

using namespace kvmesh;
using kvmesh::testing::Has;
using kvmesh::testing::PutOne;
using kvmesh::testing::TenantMetric;

namespace {

constexpr size_t kMiB = 1 << 20;
// kMaxPinsPerConnection (shard_node/server/frame_handler.h), written out so
// this file also builds against a tree without it (the check that these
// tests fail on the code before the fix).
constexpr size_t kPinBound = 256;

std::vector<std::byte> Payload(uint64_t seed, size_t n) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t r = rng();
    for (size_t j = 0; j < 8 && i + j < n; ++j) v[i + j] = static_cast<std::byte>(r >> (8 * j));
  }
  return v;
}

BlockKey Key(uint64_t i) { return BlockKey{0x5157A11Cull * (i + 1), i}; }

std::unique_ptr<BlockStore> SmallStore() {
  StoreOptions o;
  o.capacity_bytes = 64 << 10;
  o.slot_bytes = 4096;
  o.size_classes = 1;
  o.stripes = 1;
  auto s = BlockStore::Create(std::move(o));
  REQUIRE(s.ok());
  return std::move(s).value();
}

// The issue's node: 128 MiB of 1 MiB blocks, alice (8 MiB quota), bob (64 MiB).
ClusterConfig Config() {
  return testing::MiBBlockNodeConfig(R"([{"name": "alice", "token": "alice-pass", "quota": "8MiB"},
                                         {"name": "bob", "token": "bob-pass", "quota": "64MiB"}])");
}

// As() opens one connection as a tenant: a pin belongs to the connection that made it.
struct Node : testing::TenantNode {
  Node() : TenantNode(Config(), {.max_block_bytes = kMiB}) {}
  StoreStats Stats() const { return node->Stats().store; }
  // Waits (a connection closes asynchronously on the server) until pred holds.
  template <typename Pred>
  bool Eventually(Pred pred) const {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!pred()) {
      if (std::chrono::steady_clock::now() > end) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return true;
  }
};

// One per-key op (ERASE, PIN, UNPIN) of one key: the key's status.
template <typename Op>
Status One(Op op, const BlockKey& k) {
  Status st;
  KVMESH_RETURN_IF_ERROR(op(std::span<const BlockKey>(&k, 1), std::span<Status>(&st, 1)));
  return st;
}
Status PinOne(ShardChannel& ch, const BlockKey& k) {
  return One([&](auto keys, auto st) { return ch.Pin(keys, st); }, k);
}
Status UnpinOne(ShardChannel& ch, const BlockKey& k) {
  return One([&](auto keys, auto st) { return ch.Unpin(keys, st); }, k);
}
Status EraseOne(ShardChannel& ch, const BlockKey& k) {
  return One([&](auto keys, auto st) { return ch.Erase(keys, st); }, k);
}

// A figure of the node's STATS frame (cluster identity): pinned_blocks, blocks, ...
uint64_t StatOverTheWire(ShardChannel& cluster, const char* name) {
  auto j = cluster.StatsJson();
  REQUIRE(j.ok());
  const nlohmann::json s = nlohmann::json::parse(*j);
  return s.at(name).get<uint64_t>();
}
uint64_t PinnedOverTheWire(ShardChannel& cluster) { return StatOverTheWire(cluster, "pinned_blocks"); }

}  // namespace

TEST_CASE("Pins: an erased pinned block is freed at its last explicit unpin (BlockStore)", "[store][pins]") {
  auto s = SmallStore();
  const auto data = Payload(1, 4096);
  REQUIRE(s->Put(Key(1), data).ok());
  REQUIRE(s->Pin(Key(1)).ok());
  REQUIRE(s->Pin(Key(1)).ok());
  REQUIRE(s->Erase(Key(1)).ok());
  CHECK_FALSE(s->Exists(Key(1)));
  CHECK(s->Stats().pinned_blocks == 1);
  CHECK(s->Stats().bytes_held == 4096);  // still held: pinned
  // Both pins come back though the index no longer names the block.
  CHECK(s->Unpin(Key(1)).ok());
  CHECK(s->Stats().bytes_held == 4096);
  CHECK(s->Unpin(Key(1)).ok());
  CHECK(s->Stats().pinned_blocks == 0);
  CHECK(s->Stats().bytes_held == 0);
  CHECK(s->Unpin(Key(1)).code() == StatusCode::kNotFound);

  // Erased while pinned, then stored again and pinned again: the doomed
  // chunk's pin comes back first, then the live block's.
  REQUIRE(s->Put(Key(2), data).ok());
  REQUIRE(s->Pin(Key(2)).ok());
  REQUIRE(s->Erase(Key(2)).ok());
  REQUIRE(s->Put(Key(2), Payload(2, 4096)).ok());
  REQUIRE(s->Pin(Key(2)).ok());
  CHECK(s->Stats().pinned_blocks == 2);
  CHECK(s->Unpin(Key(2)).ok());
  CHECK(s->Stats().pinned_blocks == 1);
  CHECK(s->Stats().bytes_held == 4096);  // the live block only
  CHECK(s->Unpin(Key(2)).ok());
  CHECK(s->Stats().pinned_blocks == 0);
  CHECK(s->Unpin(Key(2)).code() == StatusCode::kFailedPrecondition);
  CHECK(s->Exists(Key(2)));
}

TEST_CASE("Pins: a block pinned, then replaced by a put with replace, is freed at its unpin (ShardNode)", "[store][pins]") {
  Node n;
  ShardNode& node = *n.node;
  const auto a = Payload(1, kMiB), b = Payload(2, kMiB);
  const uint64_t held0 = n.Stats().bytes_held;
  for (int i = 0; i < 130; ++i) {
    REQUIRE(node.Put(Key(7), a, {}).ok());
    REQUIRE(node.Pin(Key(7)).ok());
    PutOptions replace;
    replace.replace = true;
    REQUIRE(node.Put(Key(7), b, replace).ok());
    CHECK(node.Unpin(Key(7)).ok());
  }
  CHECK(n.Stats().pinned_blocks == 0);
  CHECK(n.Stats().blocks == 1);
  CHECK(n.Stats().bytes_held == held0 + kMiB);
}

TEST_CASE("Pins: 130 x PUT, PIN, ERASE, UNPIN over the binary protocol leave pinned_blocks where they started",
          "[store][pins][tenants]") {
  Node n;
  auto alice = n.As("alice", "alice-pass");
  auto bob = n.As("bob", "bob-pass");
  auto cluster = n.As("", "cluster-secret");
  const auto data = Payload(7, kMiB);
  for (uint64_t i = 0; i < 20; ++i) REQUIRE(PutOne(*bob, Key(1000 + i), data).ok());
  const StoreStats before = n.Stats();
  const uint64_t pinned0 = PinnedOverTheWire(*cluster);
  CHECK(pinned0 == before.pinned_blocks);
  int unpinned = 0, puts_ok = 0;
  for (uint64_t i = 0; i < 130; ++i) {
    puts_ok += PutOne(*alice, Key(i), data).ok();
    CHECK(PinOne(*alice, Key(i)).ok());
    CHECK(EraseOne(*alice, Key(i)).ok());
    const Status u = UnpinOne(*alice, Key(i));
    unpinned += u.ok();
    if (!u.ok()) INFO("UNPIN " << i << ": " << u.ToString());
  }
  CHECK(puts_ok == 130);
  CHECK(unpinned == 130);
  const StoreStats after = n.Stats();
  CHECK(after.pinned_blocks == before.pinned_blocks);
  CHECK(PinnedOverTheWire(*cluster) == pinned0);
  CHECK(after.blocks == before.blocks);
  CHECK(after.bytes_held == before.bytes_held);
  // Nobody else paid: bob's blocks are all there and his next 20 PUTs go in.
  for (uint64_t i = 0; i < 20; ++i) CHECK(Has(*bob, Key(1000 + i)));
  int bob_ok = 0;
  for (uint64_t i = 0; i < 20; ++i) bob_ok += PutOne(*bob, Key(2000 + i), data).ok();
  CHECK(bob_ok == 20);
}

TEST_CASE("Pins: PIN, then PUT with REPLACE, then UNPIN over the binary protocol frees the replaced block",
          "[store][pins][tenants]") {
  Node n;
  auto alice = n.As("alice", "alice-pass");
  const StoreStats before = n.Stats();
  const auto a = Payload(1, kMiB), b = Payload(2, kMiB);
  REQUIRE(PutOne(*alice, Key(1), a).ok());
  int unpinned = 0;
  for (int i = 0; i < 130; ++i) {
    CHECK(PinOne(*alice, Key(1)).ok());
    CHECK(PutOne(*alice, Key(1), i % 2 ? a : b, /*replace=*/true).ok());
    unpinned += UnpinOne(*alice, Key(1)).ok();
  }
  CHECK(unpinned == 130);
  const StoreStats after = n.Stats();
  CHECK(after.pinned_blocks == before.pinned_blocks);
  CHECK(after.blocks == before.blocks + 1);
  CHECK(after.bytes_held == before.bytes_held + kMiB);
}

TEST_CASE("Pins: a pinned block the tenant's quota evicts is freed at its UNPIN", "[store][pins][tenants]") {
  Node n;
  auto alice = n.As("alice", "alice-pass");  // 8 MiB: eight 1 MiB blocks
  const StoreStats before = n.Stats();
  const auto data = Payload(3, kMiB);
  int unpinned = 0;
  for (uint64_t i = 0; i < 20; ++i) {
    const BlockKey k = Key(100 * (i + 1));
    REQUIRE(PutOne(*alice, k, data).ok());
    REQUIRE(PinOne(*alice, k).ok());
    // Eight more of alice's blocks push k out of her quota (it is her least recent).
    for (uint64_t j = 1; j <= 8; ++j) REQUIRE(PutOne(*alice, Key(100 * (i + 1) + j), data).ok());
    CHECK_FALSE(Has(*alice, k));
    unpinned += UnpinOne(*alice, k).ok();
  }
  CHECK(unpinned == 20);
  const StoreStats after = n.Stats();
  CHECK(after.pinned_blocks == before.pinned_blocks);
  CHECK(n.node->tenants().Stats(1).bytes <= 8 * kMiB);
  CHECK(after.bytes_held <= before.bytes_held + 8 * kMiB);  // alice's quota, nothing pinned beside it
}

TEST_CASE("Pins: a connection that closes releases its pins, erased blocks included", "[store][pins][tenants]") {
  Node n;
  auto bob = n.As("bob", "bob-pass");
  const StoreStats before = n.Stats();
  const auto data = Payload(4, kMiB);
  {
    auto alice = n.As("alice", "alice-pass");
    for (uint64_t i = 0; i < 6; ++i) {
      REQUIRE(PutOne(*alice, Key(i), data).ok());
      REQUIRE(PinOne(*alice, Key(i)).ok());
    }
    REQUIRE(PinOne(*alice, Key(0)).ok());  // twice
    for (uint64_t i = 0; i < 3; ++i) REQUIRE(EraseOne(*alice, Key(i)).ok());
    CHECK(n.Stats().pinned_blocks == before.pinned_blocks + 6);
    CHECK(n.Stats().bytes_held == before.bytes_held + 6 * kMiB);
    CHECK(TenantMetric(*n.node, "kvmesh_tenant_pinned_bytes", "alice") == int64_t{7 * kMiB});
  }  // the connection closes without an UNPIN
  CHECK(n.Eventually([&] { return n.Stats().pinned_blocks == before.pinned_blocks; }));
  CHECK(n.Stats().bytes_held == before.bytes_held + 3 * kMiB);  // the three blocks still stored, evictable
  CHECK(TenantMetric(*n.node, "kvmesh_tenant_pinned_bytes", "alice") == 0);
  // Another connection of the same tenant cannot release a pin it did not make.
  auto a1 = n.As("alice", "alice-pass");
  auto a2 = n.As("alice", "alice-pass");
  REQUIRE(PinOne(*a1, Key(4)).ok());
  CHECK(UnpinOne(*a2, Key(4)).code() == StatusCode::kFailedPrecondition);
  CHECK(n.Stats().pinned_blocks == before.pinned_blocks + 1);
  CHECK(UnpinOne(*a1, Key(4)).ok());
  CHECK(UnpinOne(*a1, Key(4)).code() == StatusCode::kFailedPrecondition);
  CHECK(UnpinOne(*a1, Key(999)).code() == StatusCode::kNotFound);
  CHECK(n.Stats().pinned_blocks == before.pinned_blocks);
  (void)bob;
}

TEST_CASE("Pins: a connection holds at most 256 pins (kMaxPinsPerConnection), a tenant at most its quota's worth",
          "[store][pins][tenants]") {
  Node n;
  auto cluster = n.As("", "cluster-secret");
  const auto data = Payload(5, 4096);
  REQUIRE(PutOne(*cluster, Key(1), data).ok());
  // One frame pinning the same block kPinBound + 1 times.
  std::vector<BlockKey> keys(kPinBound + 1, Key(1));
  std::vector<Status> st(keys.size());
  REQUIRE(cluster->Pin(keys, st).ok());
  size_t pinned = 0;
  for (size_t i = 0; i < kPinBound; ++i) pinned += st[i].ok();
  CHECK(pinned == kPinBound);
  CHECK(st.back().code() == StatusCode::kResourceExhausted);
  // Unpinning one makes room for one.
  CHECK(UnpinOne(*cluster, Key(1)).ok());
  CHECK(PinOne(*cluster, Key(1)).ok());
  CHECK(PinOne(*cluster, Key(1)).code() == StatusCode::kResourceExhausted);

  // alice (8 MiB) pins eight 1 MiB blocks; her ninth pin is refused, even
  // after her quota evicted a pinned block (it still holds its chunk).
  auto alice = n.As("alice", "alice-pass");
  const auto mib = Payload(6, kMiB);
  for (uint64_t i = 0; i < 8; ++i) {
    REQUIRE(PutOne(*alice, Key(10 + i), mib).ok());
    REQUIRE(PinOne(*alice, Key(10 + i)).ok());
  }
  REQUIRE(PutOne(*alice, Key(20), mib).ok());  // evicts Key(10), pinned
  CHECK(PinOne(*alice, Key(20)).code() == StatusCode::kResourceExhausted);
  CHECK(TenantMetric(*n.node, "kvmesh_tenant_pin_refused_total", "alice") == 1);
  CHECK(UnpinOne(*alice, Key(10)).ok());
  CHECK(PinOne(*alice, Key(20)).ok());
}

#if defined(KVMESH_HAVE_UCX)
TEST_CASE("Pins: a UCX session that closes releases its pins, erased blocks included", "[store][pins][ucx]") {
  const ClusterConfig cfg = Config();
  auto made = ShardNode::Create(cfg, "n0");
  REQUIRE(made.ok());
  std::unique_ptr<ShardNode> node = std::move(*made);
  std::atomic<uint64_t> epoch{0};
  UcxServerOptions o;
  o.token = cfg.auth.token;
  o.limits.max_block_bytes = kMiB;
  auto server = UcxServer::Start(node.get(), o, &epoch);
  REQUIRE(server.ok());
  const StoreStats before = node->Stats().store;
  const auto data = Payload(8, kMiB);
  {
    UcxChannelOptions u;
    u.node_address = (*server)->address();
    u.tenant = "alice";
    u.token = "alice-pass";
    u.timeout_ms = 5000;
    auto alice = UcxChannel::Connect(u);
    REQUIRE(alice.ok());
    for (uint64_t i = 0; i < 4; ++i) {
      REQUIRE(PutOne(**alice, Key(i), data).ok());
      REQUIRE(PinOne(**alice, Key(i)).ok());
    }
    REQUIRE(EraseOne(**alice, Key(0)).ok());
    CHECK(UnpinOne(**alice, Key(1)).ok());
    CHECK(node->Stats().store.pinned_blocks == before.pinned_blocks + 3);
  }  // the session closes with three pins held, one on an erased block
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (node->Stats().store.pinned_blocks != before.pinned_blocks && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(node->Stats().store.pinned_blocks == before.pinned_blocks);
  CHECK(node->Stats().store.bytes_held == before.bytes_held + 3 * kMiB);
  (*server)->Stop();
}
#endif

TEST_CASE("Pins: the issue's reproduction against a `kvmesh node` daemon leaves pinned_blocks where it started",
          "[store][pins][tenants][daemon]") {
  // cluster_configs/daemons-local.json's model and store, one node of 128 MiB,
  // alice (8 MiB) and bob (64 MiB); standalone (no coordinator).
  auto cfg = nlohmann::json::parse(std::ifstream(std::string(KVMESH_SOURCE_DIR) + "/cluster_configs/daemons-local.json"));
  cfg.erase("coordinator");
  cfg["nodes"] = nlohmann::json::array({cfg["nodes"][0]});
  cfg["nodes"][0]["memory"]["host"] = "128MiB";
  cfg["auth"] = nlohmann::json::parse(R"({"token": "cluster-secret", "tenants": [
      {"name": "alice", "token": "alice-pass", "quota": "8MiB"},
      {"name": "bob", "token": "bob-pass", "quota": "64MiB"}]})");
  const std::string path = "/tmp/kvmesh-pins-test-" + std::to_string(::getpid()) + ".json";
  std::ofstream(path) << cfg.dump();
  kvmesh::testing::Process node;
  REQUIRE(node.Start({KVMESH_BIN, "node", "--config", path, "--id", "n0", "--no-resp"}, /*merge_stderr=*/true));
  auto listening = node.WaitEvent("listening", kvmesh::testing::TimeBound(std::chrono::seconds(10)));
  ::unlink(path.c_str());
  REQUIRE(listening);
  auto as = [&](const std::string& tenant, const std::string& token) {
    TcpChannelOptions o;
    o.port = (*listening)["ports"]["data"].get<uint16_t>();
    o.tenant = tenant;
    o.token = token;
    o.connections = 1;
    return TcpChannel::Create(o);
  };
  auto alice = as("alice", "alice-pass");
  auto bob = as("bob", "bob-pass");
  auto cluster = as("", "cluster-secret");
  const auto data = Payload(11, kMiB);
  for (uint64_t i = 0; i < 20; ++i) REQUIRE(PutOne(*bob, Key(1000 + i), data).ok());
  const uint64_t pinned0 = PinnedOverTheWire(*cluster), blocks0 = StatOverTheWire(*cluster, "blocks");
  int unpinned = 0;
  for (uint64_t i = 0; i < 130; ++i) {
    CHECK(PutOne(*alice, Key(i), data).ok());
    CHECK(PinOne(*alice, Key(i)).ok());
    CHECK(EraseOne(*alice, Key(i)).ok());
    unpinned += UnpinOne(*alice, Key(i)).ok();
  }
  CHECK(unpinned == 130);
  CHECK(PinnedOverTheWire(*cluster) == pinned0);
  CHECK(StatOverTheWire(*cluster, "blocks") == blocks0);
  int bob_ok = 0;
  for (uint64_t i = 0; i < 20; ++i) bob_ok += PutOne(*bob, Key(2000 + i), data).ok();
  CHECK(bob_ok == 20);
  // alice pins and goes away without unpinning: her connection's pins go with it.
  for (uint64_t i = 0; i < 5; ++i) {
    REQUIRE(PutOne(*alice, Key(500 + i), data).ok());
    REQUIRE(PinOne(*alice, Key(500 + i)).ok());
  }
  CHECK(PinnedOverTheWire(*cluster) == pinned0 + 5);
  alice.reset();
  const auto end = std::chrono::steady_clock::now() + kvmesh::testing::TimeBound(std::chrono::seconds(10));
  while (PinnedOverTheWire(*cluster) != pinned0 && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(PinnedOverTheWire(*cluster) == pinned0);
  node.Signal(SIGTERM);
  CHECK(node.Wait(kvmesh::testing::TimeBound(std::chrono::seconds(10))).has_value());
}

// The node's one door (shard_node/server/frame_handler.h): every path a
// frame takes into a node — a TCP frame (a PUT read straight into pool
// chunks included), a UCX active-message frame, UCX one-sided GET_INTO and
// PUT_FROM — is admitted by FrameHandler, so a stale shard-map epoch is
// refused the same way on each (TLS: tests/test_tls.cc), and a one-sided
// transfer runs only once FrameHandler admitted it. Then the PUT ladder
// every PUT path runs (TenantView::StartPut / FinishPut), on its own.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/checksum.h"
#include "kvmesh/build_config.h"
#include "kvmesh/config.h"
#include "shard_node/server/data_server.h"
#include "shard_node/shard_node.h"
#include "shard_node/tenant_view.h"
#include "tests/stale_epoch_answer.h"
#include "transport/tcp_channel.h"
#if defined(KVMESH_HAVE_UCX)
#include "shard_node/server/ucx_server.h"
#include "transport/ucx_channel.h"
#endif

using namespace kvmesh;
using kvmesh::testing::CheckStaleAnswer;

namespace {

BlockKey Key(uint64_t i) { return BlockKey{i * 0x9E3779B97F4A7C15ull + 3, i}; }

// `n` bytes drawn from `seed`.
std::vector<std::byte> Bytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> v(n);
  std::generate(v.begin(), v.end(), [&] { return std::byte(rng() & 0xFF); });
  return v;
}

uint64_t Sum(std::span<const std::byte> b) { return Checksum64(b.data(), b.size()); }

// Node "d0": 16 MiB of host memory in chunks of up to 2 MiB; `extra` adds config keys.
std::unique_ptr<ShardNode> Node(const std::string& extra = "") {
  const std::string json = R"({"model": {"model_id": "m", "num_layers": 2, "num_kv_heads": 2, "head_dim": 64,)"
                           R"( "block_tokens": 16}, "nodes": [{"id": "d0", "memory": {"host": "16MiB"}}],)"
                           R"( "store": {"slot_bytes": "2MiB", "stripes": 1})" + extra + "}";
  return ShardNode::Create(ParseConfig(json).value(), "d0").value();
}

// The bytes stored under `key`, empty when it is not stored.
std::vector<std::byte> Stored(ShardNode& node, const BlockKey& key) {
  std::vector<std::byte> out(2 << 20);
  auto n = node.GetInto(key, out);
  if (!n.ok()) return {};
  out.resize(*n);
  return out;
}

// One node at epoch 4 behind a TCP data server and (built with UCX) a UCX server.
struct Door {
  static constexpr uint64_t kEpoch = 4;
  Door() : node(Node()) {
    DataServerOptions d;
    d.limits.max_block_bytes = 2 << 20;
    tcp = DataServer::Start(node.get(), d, &epoch).value();
#if defined(KVMESH_HAVE_UCX)
    UcxServerOptions u;
    u.limits.max_block_bytes = 2 << 20;
    ucx = UcxServer::Start(node.get(), u, &epoch).value();
#endif
  }
  std::unique_ptr<TcpChannel> Tcp() {
    TcpChannelOptions o;
    o.port = tcp->port();
    o.connections = 1;
    o.timeout_ms = 5000;
    o.limits.max_block_bytes = 2 << 20;
    return TcpChannel::Create(o);
  }
  // The node's count of stale-epoch refusals on its TCP port.
  int TcpStale() const {
    const std::string m = tcp->MetricsText();
    const std::string line = "kvmesh_frames_rejected_total{reason=\"stale_epoch\"} ";
    const size_t at = m.find(line);
    REQUIRE(at != std::string::npos);
    return std::stoi(m.substr(at + line.size()));
  }
#if defined(KVMESH_HAVE_UCX)
  std::unique_ptr<UcxChannel> Ucx() {
    UcxChannelOptions o;
    o.node_address = ucx->address();
    o.timeout_ms = 5000;
    o.limits.max_block_bytes = 2 << 20;
    o.local_reads = false;  // the frames through the door are under test (local reads skip it)
    return UcxChannel::Connect(o).value();
  }
#endif
  std::atomic<uint64_t> epoch{kEpoch};
  std::unique_ptr<ShardNode> node;
  std::unique_ptr<DataServer> tcp;
#if defined(KVMESH_HAVE_UCX)
  std::unique_ptr<UcxServer> ucx;
#endif
};

}  // namespace

TEST_CASE("Node door: a stale epoch is refused the same way on a TCP frame and a TCP PUT read into pool chunks",
          "[cluster][door]") {
  Door d;
  auto ch = d.Tcp();
  const auto data = Bytes(5000, 1);
  PutItem p{Key(1), data, {}};
  std::vector<BlockKey> keys = {Key(1)};
  std::vector<uint8_t> found(1);
  ch->set_epoch(2);
  CheckStaleAnswer(ch->Exists(keys, found, false, {}), 2, "d0", Door::kEpoch);
  CheckStaleAnswer(ch->Put(std::span(&p, 1), {}), 2, "d0", Door::kEpoch);
  CHECK(d.TcpStale() == 2);
  CHECK(!d.node->Exists(Key(1), false));  // the stale PUT stored nothing
  ch->set_epoch(Door::kEpoch);
  REQUIRE(ch->Put(std::span(&p, 1), {}).ok());
  CHECK(p.status.ok());
  CHECK(Stored(*d.node, Key(1)) == data);
}

#if defined(KVMESH_HAVE_UCX)
TEST_CASE("Node door: a stale epoch is refused the same way on a UCX frame, GET_INTO and PUT_FROM; one-sided "
          "transfers run only once FrameHandler admitted them",
          "[cluster][ucx][door]") {
  using proto::Opcode;
  Door d;
  auto ch = d.Ucx();
  std::vector<std::byte> mem(1 << 20);
  MemoryRegion reg{7, mem.data(), mem.size(), MemoryKind::kHost};
  REQUIRE(ch->RegisterMemory(reg).ok());
  const auto data = Bytes(65536, 2);
  std::memcpy(mem.data(), data.data(), data.size());
  PutItem from{Key(2), {mem.data(), data.size()}, {}};               // registered: PUT_FROM
  GetItem into{Key(2), {mem.data() + (512 << 10), 65536}, 0, {}};  // registered: GET_INTO
  std::vector<BlockKey> keys = {Key(2)};
  std::vector<uint8_t> found(1);

  ch->set_epoch(3);
  CheckStaleAnswer(ch->Exists(keys, found, false, {}), 3, "d0", Door::kEpoch);  // an active-message frame
  CheckStaleAnswer(ch->Put(std::span(&from, 1), {}), 3, "d0", Door::kEpoch);
  CheckStaleAnswer(ch->Get(std::span(&into, 1), {}), 3, "d0", Door::kEpoch);
  CHECK(d.ucx->stale_refused() == 3);
  CHECK(d.ucx->admitted(Opcode::kPutFrom) == 0);
  CHECK(d.ucx->admitted(Opcode::kGetInto) == 0);
  CHECK(d.ucx->one_sided_bytes() == 0);
  CHECK(!d.node->Exists(Key(2), false));  // the stale PUT_FROM moved and stored nothing

  ch->set_epoch(Door::kEpoch);
  REQUIRE(ch->Put(std::span(&from, 1), {}).ok());
  REQUIRE(from.status.ok());
  REQUIRE(ch->Get(std::span(&into, 1), {}).ok());
  REQUIRE(into.status.ok());
  CHECK(std::memcmp(mem.data() + (512 << 10), data.data(), data.size()) == 0);
  // Both went one-sided, each through FrameHandler's admission.
  CHECK(d.ucx->one_sided_bytes() == 2 * data.size());
  CHECK(d.ucx->admitted(Opcode::kPutFrom) == 1);
  CHECK(d.ucx->admitted(Opcode::kGetInto) == 1);
  CHECK(d.ucx->stale_refused() == 3);

  // The node's epoch moves on under a client that still holds the old map.
  d.epoch = 9;
  CheckStaleAnswer(ch->Get(std::span(&into, 1), {}), Door::kEpoch, "d0", 9);
  CHECK(d.ucx->admitted(Opcode::kGetInto) == 1);
}
#endif

TEST_CASE("PUT ladder: reserve, land, verify, commit; a stored key is OK and keeps its bytes", "[node][door]") {
  auto node = Node();
  TenantView v(node.get(), kClusterTenant);
  const auto a = Bytes(65536, 3), b = Bytes(65536, 4);
  TenantView::PutLanding p = v.StartPut(Key(3), a.size(), Sum(a), {});
  REQUIRE(p.reserved());
  CHECK(!p.staged());
  REQUIRE(p.chunk().size() == a.size());
  std::memcpy(p.chunk().data(), a.data(), a.size());
  CHECK(!node->Exists(Key(3), false));  // not stored until committed
  REQUIRE(v.FinishPut(p).ok());
  CHECK(Stored(*node, Key(3)) == a);
  // Stored already: OK, nothing to land, and the first bytes stay (keys name their content).
  TenantView::PutLanding again = v.StartPut(Key(3), b.size(), Sum(b), {});
  CHECK(!again.reserved());
  CHECK(!again.staged());
  CHECK(v.FinishPut(again).ok());
  CHECK(Stored(*node, Key(3)) == a);
}

TEST_CASE("PUT ladder: bytes that fail verification are refused, store nothing and free their chunk", "[node][door]") {
  auto node = Node();
  TenantView v(node.get(), kClusterTenant);
  const auto good = Bytes(1 << 20, 5);
  // Far more than the pool holds (16 MiB): a chunk kept by a refused put would run it out.
  for (int i = 0; i < 40; ++i) {
    TenantView::PutLanding p = v.StartPut(Key(10), good.size(), Sum(good), {});
    REQUIRE(p.reserved());
    std::memcpy(p.chunk().data(), good.data(), good.size());
    p.chunk()[i * 1000] ^= std::byte{0x10};  // corrupted on the way
    CHECK(v.FinishPut(p).code() == StatusCode::kDataLoss);
    CHECK(!node->Exists(Key(10), false));
  }
  TenantView::PutLanding p = v.StartPut(Key(10), good.size(), Sum(good), {});
  REQUIRE(p.reserved());
  std::memcpy(p.chunk().data(), good.data(), good.size());
  REQUIRE(v.FinishPut(p).ok());
  CHECK(Stored(*node, Key(10)) == good);
  // A landing dropped before FinishPut (a connection cut mid-payload) frees its chunk too.
  for (int i = 0; i < 40; ++i) {
    TenantView::PutLanding cut = v.StartPut(Key(100 + i), good.size(), Sum(good), {});
    REQUIRE(cut.reserved());
  }
  CHECK(!node->Exists(Key(100), false));
}

TEST_CASE("PUT ladder: a node that encodes on put has the bytes staged, verified, then put", "[node][door]") {
  auto node = Node(R"(, "codec": {"codec": "int8"})");
  TenantView v(node.get(), kClusterTenant);
  const auto data = Bytes(4096, 6);
  TenantView::PutLanding bad = v.StartPut(Key(20), data.size(), Sum(data) ^ 1, {});
  REQUIRE(bad.staged());
  CHECK(!bad.reserved());
  CHECK(v.FinishPut(bad, data).code() == StatusCode::kDataLoss);
  CHECK(!node->Exists(Key(20), false));
  TenantView::PutLanding p = v.StartPut(Key(20), data.size(), Sum(data), {});
  REQUIRE(p.staged());
  REQUIRE(v.FinishPut(p, data).ok());
  CHECK(node->Exists(Key(20), false));
  CHECK(Stored(*node, Key(20)) == data);  // not a full raw block: stored as it came
}

TEST_CASE("PUT ladder: a tenant's put lands in its namespace and counts against its quota", "[node][door][tenants]") {
  auto node = Node(R"(, "auth": {"token": "s", "tenants": [{"name": "t1", "token": "t1-token", "quota": "8MiB"}]})");
  auto who = node->tenants().Authenticate("t1", "t1-token");
  REQUIRE(who.ok());
  TenantView t(node.get(), *who);
  const auto data = Bytes(60000, 7);
  TenantView::PutLanding p = t.StartPut(Key(30), data.size(), Sum(data), {});
  REQUIRE(p.reserved());
  std::memcpy(p.chunk().data(), data.data(), data.size());
  REQUIRE(t.FinishPut(p).ok());
  CHECK(!node->Exists(Key(30), false));  // not in the cluster's namespace
  CHECK(Stored(*node, t.Key(Key(30))) == data);
  CHECK(node->tenants().Stats(*who).bytes >= data.size());
  // Larger than the whole quota: refused before anything lands.
  TenantView::PutLanding big = t.StartPut(Key(31), 9 << 20, 0, {});
  CHECK(!big.reserved());
  CHECK(!big.staged());
  CHECK(t.FinishPut(big).code() == StatusCode::kResourceExhausted);
}

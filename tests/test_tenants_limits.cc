// Quotas on what is held (issue 39, findings 6, 7 and 10): a tenant's live
// sequences count against its quota and each tenant holds a share of the
// node's sequences and slices; a quota counts what the store holds for a
// block (its chunk), not its payload; a RESP SET whose value cannot fit the
// quota is refused instead of answering OK and reading nil; RESP INFO shows a
// tenant its own command count only.
//
// Sequences run over the binary protocol (SEQ_* frames) against a node's data
// server; the RESP cases against the node-local front and the proxy, in
// process.
#include <catch2/catch.hpp>

#include <random>
#include <string>
#include <vector>

#include "kvmesh/config.h"
#include "router/proxy/resp_proxy.h"
#include "router/shard_map.h"
#include "shard_node/server/data_server.h"
#include "shard_node/server/resp_server.h"
#include "shard_node/shard_node.h"
#include "shard_node/tenants.h"
#include "tests/resp_client.h"
#include "tests/resp_tenant_fronts.h"
#include "tests/tenant_node.h"
#include "transport/resp/resp_commands.h"
#include "transport/resp/resp_value.h"
#include "transport/tcp_channel.h"

using namespace kvmesh;
using kvmesh::testing::Has;
using kvmesh::testing::PutOne;
using kvmesh::testing::Pattern;
using kvmesh::testing::TenantMetric;
using kvmesh::testing::RespTestClient;
using kvmesh::testing::RespValue;

namespace {

constexpr uint64_t kMiB = 1 << 20;

std::vector<std::byte> Payload(uint64_t seed, size_t n) { return testing::RandomBytes(seed, n); }

BlockKey Key(uint64_t i) { return BlockKey{0xB10C5EEDull * (i + 1), i}; }

// A node with tenants behind a data server (the issue's: 128 MiB, alice 8 MiB, bob 64 MiB).
struct DataNode : testing::TenantNode {
  explicit DataNode(ClusterConfig c, std::optional<SequenceServiceOptions> seq = std::nullopt)
      : TenantNode(std::move(c), {.sequences = std::move(seq)}) {}
};

// Blocks of 16 tokens x 2 layers x 8 heads x 64 dims, fp16: 64 KiB.
ClusterConfig SeqConfig() {
  auto c = ParseConfig(R"({
    "model": {"model_id": "seqm", "num_layers": 2, "num_kv_heads": 8, "head_dim": 64, "block_tokens": 16},
    "nodes": [{"id": "n0", "memory": {"host": "128MiB"}}],
    "auth": {"token": "cluster-secret", "tenants": [
      {"name": "alice", "token": "alice-pass", "quota": "8MiB"},
      {"name": "bob", "token": "bob-pass", "quota": "64MiB"}]}
  })");
  REQUIRE(c.ok());
  return *c;
}

}  // namespace

TEST_CASE("Sequence quota: alice (8 MiB) appending 40 x 1024 tokens is refused past her quota, nobody else pays",
          "[tenants][sequences][limits]") {
  DataNode n(SeqConfig());
  const ModelSpec& m = n.cfg.model;
  REQUIRE(m.FullBlockBytes() == 64 << 10);
  auto alice = n.As("alice", "alice-pass");
  auto bob = n.As("bob", "bob-pass");
  const auto block = Payload(1, m.FullBlockBytes());
  for (uint64_t i = 0; i < 20; ++i) REQUIRE(PutOne(*bob, Key(i), block).ok());

  SeqCreateArgs args;
  Result<SeqCreated> made = alice->SeqCreate(args, {});
  REQUIRE(made.ok());
  constexpr uint32_t kTokens = 1024;
  const size_t side = BlockLayout::Full(m).side_bytes(kTokens);
  const auto k = Payload(2, side), v = Payload(3, side);
  int appended = 0, refused = 0;
  for (int round = 0; round < 40; ++round) {
    std::vector<TokenId> toks(kTokens);
    for (uint32_t t = 0; t < kTokens; ++t) toks[t] = round * kTokens + t;
    Result<uint32_t> pos = alice->SeqAppend(made->id, toks, k, v, m.num_layers, {});
    if (pos.ok()) ++appended;
    else if (pos.status().code() == StatusCode::kResourceExhausted) ++refused;
  }
  CHECK(refused > 0);
  Result<SequenceState> st = alice->SeqInfo(made->id, {});
  REQUIRE(st.ok());
  // What the sequence holds stays within alice's quota ...
  CHECK(uint64_t{st->length} / m.block_tokens * m.FullBlockBytes() <= 8 * kMiB);
  CHECK(n.node->Stats().store.pinned_blocks <= 8 * kMiB / m.FullBlockBytes());
  CHECK(TenantMetric(*n.node, "kvmesh_tenant_sequence_bytes", "alice") > 0);
  CHECK(TenantMetric(*n.node, "kvmesh_tenant_sequence_bytes", "alice") <= int64_t{8 * kMiB});
  // ... so bob's blocks were never evicted and his PUTs still go in.
  for (uint64_t i = 0; i < 20; ++i) CHECK(Has(*bob, Key(i)));
  int bob_ok = 0;
  for (uint64_t i = 100; i < 120; ++i) bob_ok += PutOne(*bob, Key(i), block).ok();
  CHECK(bob_ok == 20);
  // Released, the sequence gives its quota back.
  REQUIRE(alice->SeqRelease(made->id, {}).ok());
  CHECK(n.node->Stats().store.pinned_blocks == 0);
  CHECK(TenantMetric(*n.node, "kvmesh_tenant_sequence_bytes", "alice") == 0);
  Result<SeqCreated> again = alice->SeqCreate(args, {});
  REQUIRE(again.ok());
  std::vector<TokenId> toks(kTokens, 7);
  CHECK(alice->SeqAppend(again->id, toks, k, v, m.num_layers, {}).ok());
}

TEST_CASE("Sequence quota: a tenant's sequences and its blocks share its quota", "[tenants][sequences][limits]") {
  DataNode n(SeqConfig());
  const ModelSpec& m = n.cfg.model;
  auto alice = n.As("alice", "alice-pass");
  const auto block = Payload(1, m.FullBlockBytes());
  // alice fills her quota with blocks, then grows a sequence: her least
  // recently used blocks make room (her sequence is live state, her blocks a cache).
  for (uint64_t i = 0; i < 128; ++i) REQUIRE(PutOne(*alice, Key(i), block).ok());
  CHECK(Has(*alice, Key(0)));
  Result<SeqCreated> made = alice->SeqCreate(SeqCreateArgs{}, {});
  REQUIRE(made.ok());
  const uint32_t n_tok = 512;  // 32 blocks: 2 MiB
  const size_t side = BlockLayout::Full(m).side_bytes(n_tok);
  std::vector<TokenId> toks(n_tok, 3);
  REQUIRE(alice->SeqAppend(made->id, toks, Payload(2, side), Payload(3, side), m.num_layers, {}).ok());
  CHECK_FALSE(Has(*alice, Key(0)));
  CHECK(Has(*alice, Key(127)));
  const int64_t blocks = TenantMetric(*n.node, "kvmesh_tenant_bytes", "alice");
  const int64_t seqs = TenantMetric(*n.node, "kvmesh_tenant_sequence_bytes", "alice");
  CHECK(seqs > 0);
  CHECK(blocks + seqs <= int64_t{8 * kMiB});
}

TEST_CASE("Sequence limits: one tenant cannot take all of a node's sequences or slices", "[tenants][sequences][limits]") {
  SequenceServiceOptions so;
  so.max_sequences = 8;
  so.max_slices = 4;
  DataNode n(SeqConfig(), so);
  SequenceService& seqs = n.node->sequences();
  const SeqCaller alice{1, n.node->tenants().Namespace(1)}, bob{2, n.node->tenants().Namespace(2)};
  // Sequences: alice asks for all eight; she gets her share (8 / 2 tenants).
  int alice_got = 0;
  for (int i = 0; i < 8; ++i) alice_got += seqs.Create(SeqCreateArgs{}, alice).ok();
  CHECK(alice_got == 4);
  Result<SeqCreated> refused = seqs.Create(SeqCreateArgs{}, alice);
  CHECK(refused.status().code() == StatusCode::kResourceExhausted);
  int bob_got = 0;
  for (int i = 0; i < 4; ++i) bob_got += seqs.Create(SeqCreateArgs{}, bob).ok();
  CHECK(bob_got == 4);
  // The cluster identity is bound by the node-wide limit only.
  CHECK(seqs.Create(SeqCreateArgs{}, SeqCaller{}).status().code() == StatusCode::kResourceExhausted);

  // Slices: a fresh node; alice asks for four slices (four salts), gets two.
  SequenceServiceOptions so2;
  so2.max_sequences = 100;
  so2.max_slices = 4;
  DataNode n2(SeqConfig(), so2);
  SequenceService& s2 = n2.node->sequences();
  const SeqCaller alice2{1, n2.node->tenants().Namespace(1)}, bob2{2, n2.node->tenants().Namespace(2)};
  int slices = 0;
  for (int i = 0; i < 4; ++i) {
    SeqCreateArgs a;
    a.tenant_salt = "salt" + std::to_string(i);
    slices += s2.Create(a, alice2).ok();
  }
  CHECK(slices == 2);
  int bob_slices = 0;
  for (int i = 0; i < 2; ++i) {
    SeqCreateArgs a;
    a.tenant_salt = "bob" + std::to_string(i);
    bob_slices += s2.Create(a, bob2).ok();
  }
  CHECK(bob_slices == 2);
}

namespace {

// A node of 1 MiB blocks (its smallest chunk: 146 KiB) with its RESP front:
// bob (16 MiB quota) and carol (none).
struct SmallValuesFront : testing::LocalFront {
  SmallValuesFront()
      : LocalFront(testing::MiBBlockNodeConfig(R"([{"name": "bob", "token": "bob-pass", "quota": "16MiB"},
                                                  {"name": "carol", "token": "carol-pass"}])")) {}
};

}  // namespace

TEST_CASE("Chunk-byte quotas: 2,000 small RESP values count what their chunks hold; other tenants keep their data",
          "[tenants][resp][limits]") {
  SmallValuesFront f;
  RespTestClient bob(f.server->port()), carol(f.server->port());
  REQUIRE(bob.Call({"AUTH", "bob", "bob-pass"}).ok());
  REQUIRE(carol.Call({"AUTH", "carol", "carol-pass"}).ok());
  std::vector<std::string> carols;
  for (int i = 0; i < 20; ++i) {
    carols.push_back(Pattern(256 << 10, 100 + i));
    REQUIRE(carol.Call({"SET", "c" + std::to_string(i), carols.back()}).ok());
  }
  const uint64_t carol_held = f.node->Stats().store.bytes_held;
  std::mt19937_64 rng(9);
  constexpr int kValues = 2000;
  for (int i = 0; i < kValues; ++i) {
    const std::string v = Pattern(8 + rng() % 53, 1000 + i);
    REQUIRE(bob.Call({"SET", "b" + std::to_string(i), v}).ok());
  }
  // Every one of carol's values is still there, byte for byte.
  int carol_kept = 0;
  for (int i = 0; i < 20; ++i) carol_kept += carol.Call({"GET", "c" + std::to_string(i)}).str == carols[i];
  CHECK(carol_kept == 20);
  CHECK(f.node->Stats().store.evictions == 0);
  // bob's quota counts his chunks: at most 16 MiB of them (and the 1/8 of
  // size-class rounding it leaves uncharged).
  const TenantStats b = f.node->tenants().Stats(1);
  CHECK(b.bytes <= 16 * kMiB);
  CHECK(b.quota_evictions > 0);
  const uint64_t bob_held = f.node->Stats().store.bytes_held - carol_held;
  CHECK(bob_held <= 16 * kMiB + 16 * kMiB / 7);
  CHECK(bob.Call({"GET", "b" + std::to_string(kValues - 1)}).type == '$');
  CHECK_FALSE(bob.Call({"GET", "b" + std::to_string(kValues - 1)}).nil);
}

namespace {

constexpr uint64_t kSlot = testing::kRespSlot;
constexpr uint64_t kQuota = testing::kRespQuota;
using testing::LocalFront;
using testing::ProxyFront;

template <typename Front>
void SetOverQuotaRefused(Front& f) {
  RespTestClient a(f.port());
  REQUIRE(a.Call({"AUTH", "alpha", "alpha-pw"}).ok());
  REQUIRE(a.Call({"SET", "k", "v0"}).ok());
  // 300 KiB cannot fit 256 KiB: refused like one block over the quota, and
  // the value it would have replaced is still there.
  const RespValue r = a.Call({"SET", "k", Pattern(300 << 10, 1)});
  CHECK(r.is_error());
  CHECK(r.str.find("ResourceExhausted") != std::string::npos);
  CHECK(a.Call({"GET", "k"}).str == "v0");
  CHECK(a.Call({"SETEX", "k", "100", Pattern(kQuota + 1, 2)}).is_error());
  const RespValue m = a.Call({"MSET", "k", "v1", "k2", Pattern(300 << 10, 3)});
  CHECK(m.is_error());
  CHECK(a.Call({"GET", "k"}).str == "v0");
  CHECK(a.Call({"GET", "k2"}).nil);
  // A value of four blocks that fits is stored and read back whole.
  const std::string fits = Pattern(3 * kSlot + 100, 4);
  REQUIRE(a.Call({"SET", "k3", fits}).ok());
  CHECK(a.Call({"GET", "k3"}).str == fits);
  // beta has no quota: the same 300 KiB is stored.
  RespTestClient b(f.port());
  REQUIRE(b.Call({"AUTH", "beta", "beta-pw"}).ok());
  const std::string big = Pattern(300 << 10, 5);
  REQUIRE(b.Call({"SET", "k", big}).ok());
  CHECK(b.Call({"GET", "k"}).str == big);
}

template <typename Front>
void InfoShowsOwnCommands(Front& f) {
  RespTestClient a(f.port()), b(f.port()), admin(f.port());
  REQUIRE(b.Call({"AUTH", "beta", "beta-pw"}).ok());
  for (int i = 0; i < 50; ++i) REQUIRE(b.Call({"PING"}).str == "PONG");
  REQUIRE(a.Call({"AUTH", "alpha", "alpha-pw"}).ok());
  REQUIRE(a.Call({"PING"}).str == "PONG");
  const std::string info = a.Call({"INFO"}).str;
  // alpha's own two commands since its AUTH (PING and this INFO), nothing of beta's.
  CHECK(info.find("resp_commands_processed:2\r\n") != std::string::npos);
  REQUIRE(admin.Call({"AUTH", "cluster-secret"}).ok());
  const std::string all = admin.Call({"INFO"}).str;
  const std::string key = "resp_commands_processed:";
  const size_t at = all.find(key);
  REQUIRE(at != std::string::npos);
  CHECK(std::stoull(all.substr(at + key.size())) >= 56);  // the operator sees the front's total
}

}  // namespace

TEST_CASE("RESP SET over the quota: refused on the node-local front", "[tenants][resp][limits]") {
  LocalFront f;
  SetOverQuotaRefused(f);
  CHECK(f.node->tenants().Stats(1).bytes <= kQuota);
}

TEST_CASE("RESP SET over the quota: refused through the proxy", "[tenants][resp][limits][proxy]") {
  ProxyFront f;
  SetOverQuotaRefused(f);
}

TEST_CASE("RESP INFO shows a tenant its own command count only (node-local front)", "[tenants][resp][limits]") {
  LocalFront f;
  InfoShowsOwnCommands(f);
}

TEST_CASE("RESP INFO shows a tenant its own command count only (proxy)", "[tenants][resp][limits][proxy]") {
  ProxyFront f;
  InfoShowsOwnCommands(f);
}

// Tenants on a node ($.auth.tenants, shard_node/tenants.h): a node's data
// server in process, reached over loopback TCP (and UCX where built) with
// each tenant's credentials. The namespace comes from the identity a
// connection proved, never from the key bytes it sends: a tenant cannot read,
// detect or erase another's block under the same key, its quota evicts only
// its own blocks, and live sequences answer only their tenant.
#include <catch2/catch.hpp>

#include <random>

#include "kvmesh/block_key.h"
#include "kvmesh/build_config.h"
#include "kvmesh/config.h"
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

namespace {

constexpr size_t kBlock = 4096;

// alpha: 4 blocks of quota; beta: none; gamma and delta share a namespace.
ClusterConfig Config() {
  auto c = ParseConfig(R"({
    "model": {"model_id": "m", "num_layers": 2, "num_kv_heads": 2, "head_dim": 16, "block_tokens": 16},
    "nodes": [{"id": "n0", "memory": {"host": "4MiB"}}],
    "store": {"slot_bytes": "8KiB", "stripes": 1},
    "auth": {"token": "cluster-secret", "tenants": [
      {"name": "alpha", "token": "alpha-pass", "quota": "16KiB"},
      {"name": "beta", "password": "beta-pass"},
      {"name": "gamma", "token": "gamma-pass", "namespace": "shared"},
      {"name": "delta", "token": "delta-pass", "namespace": "shared"}]}
  })");
  REQUIRE(c.ok());
  return *c;
}

struct Node : testing::TenantNode {
  Node() : TenantNode(Config(), {.max_block_bytes = 8 << 10}) {}
};

std::vector<std::byte> Payload(uint64_t seed, size_t n = kBlock) { return testing::RandomBytes(seed, n); }

BlockKey Key(uint64_t i) { return BlockKey{0xA5A5A5A5ull * (i + 1), i}; }

// The block under k as `ch` sees it: its bytes, or the miss.
Result<std::vector<std::byte>> GetOne(ShardChannel& ch, const BlockKey& k) {
  std::vector<std::byte> dst(8 << 10);
  GetItem g{k, dst, 0, {}};
  KVMESH_RETURN_IF_ERROR(ch.Get(std::span<GetItem>(&g, 1), {}));
  KVMESH_RETURN_IF_ERROR(g.status);
  dst.resize(g.size);
  return dst;
}

Status EraseOne(ShardChannel& ch, const BlockKey& k) {
  Status st;
  KVMESH_RETURN_IF_ERROR(ch.Erase(std::span<const BlockKey>(&k, 1), std::span<Status>(&st, 1)));
  return st;
}

}  // namespace

TEST_CASE("Tenants: A cannot read, detect or evict a block B put under the same key bytes (TCP)",
          "[tenants][security]") {
  Node n;
  auto a = n.As("alpha", "alpha-pass");
  auto b = n.As("beta", "beta-pass");
  auto cluster = n.As("", "cluster-secret");
  const BlockKey k = Key(1);
  const auto mine = Payload(1), theirs = Payload(2);
  REQUIRE(PutOne(*b, k, theirs).ok());

  // Read, test for (EXISTS, MATCH_PREFIX), pin or erase: all miss in A's namespace.
  CHECK(GetOne(*a, k).status().code() == StatusCode::kNotFound);
  CHECK_FALSE(Has(*a, k));
  uint32_t matched = 99;
  REQUIRE(a->MatchPrefix(std::span<const BlockKey>(&k, 1), &matched, {}).ok());
  CHECK(matched == 0);
  Status pin;
  REQUIRE(a->Pin(std::span<const BlockKey>(&k, 1), std::span<Status>(&pin, 1)).ok());
  CHECK(pin.code() == StatusCode::kNotFound);
  CHECK(EraseOne(*a, k).code() == StatusCode::kNotFound);
  // A put of A's own bytes under the same key (even a replacing one) is A's block only.
  REQUIRE(PutOne(*a, k, mine).ok());
  REQUIRE(PutOne(*a, k, mine, /*replace=*/true).ok());
  CHECK(GetOne(*a, k).value() == mine);
  CHECK(GetOne(*b, k).value() == theirs);
  // A erases its block: B's stays.
  CHECK(EraseOne(*a, k).ok());
  CHECK_FALSE(Has(*a, k));
  CHECK(GetOne(*b, k).value() == theirs);
  // The cluster identity sees neither (its namespace is the unscoped one).
  CHECK_FALSE(Has(*cluster, k));
  CHECK(GetOne(*cluster, k).status().code() == StatusCode::kNotFound);
  // Tenants that share a namespace on purpose share blocks.
  auto g = n.As("gamma", "gamma-pass");
  auto d = n.As("delta", "delta-pass");
  REQUIRE(PutOne(*g, Key(2), mine).ok());
  CHECK(GetOne(*d, Key(2)).value() == mine);
  CHECK_FALSE(Has(*a, Key(2)));
  CHECK_FALSE(Has(*b, Key(2)));
  // STATS shows a tenant its own figures only.
  auto st = b->StatsJson();
  REQUIRE(st.ok());
  CHECK_THAT(*st, Catch::Contains("\"name\":\"beta\""));
  CHECK_THAT(*st, !Catch::Contains("alpha"));
}

TEST_CASE("Tenants: a HELLO with a wrong tenant token, an unknown tenant or no secret is refused", "[tenants][security]") {
  Node n;
  const std::pair<std::string, std::string> bad[] = {
      {"alpha", "beta-pass"}, {"alpha", ""}, {"nobody", "alpha-pass"}, {"alpha", "cluster-secret"}, {"", ""},
      {"", "alpha-pass"}};
  for (const auto& [tenant, token] : bad) {
    INFO(tenant << " / " << token);
    Status s = n.As(tenant, token)->Connect();
    CHECK(s.code() == StatusCode::kPermissionDenied);
  }
  // The same words whether the name or the token was wrong.
  Status unknown = n.As("nobody", "x")->Connect(), wrong = n.As("alpha", "x")->Connect();
  CHECK_THAT(unknown.message(), Catch::Contains("unknown tenant or wrong token"));
  CHECK_THAT(wrong.message(), Catch::Contains("unknown tenant or wrong token"));
  CHECK(n.As("alpha", "alpha-pass")->Connect().ok());
  CHECK(n.As("", "cluster-secret")->Connect().ok());
}

TEST_CASE("Tenants: a put past the quota evicts the tenant's own least recently used blocks only",
          "[tenants][security]") {
  Node n;
  auto a = n.As("alpha", "alpha-pass");  // quota 16 KiB = 4 blocks
  auto b = n.As("beta", "beta-pass");    // no quota
  for (uint64_t i = 0; i < 10; ++i) REQUIRE(PutOne(*b, Key(100 + i), Payload(100 + i)).ok());
  for (uint64_t i = 0; i < 6; ++i) REQUIRE(PutOne(*a, Key(i), Payload(i)).ok());
  // A holds its last four; the first two went to make room.
  for (uint64_t i = 0; i < 6; ++i) CHECK(Has(*a, Key(i)) == (i >= 2));
  // A read refreshes recency: block 2 survives the next two puts, 3 and 4 go.
  REQUIRE(GetOne(*a, Key(2)).ok());
  REQUIRE(PutOne(*a, Key(6), Payload(6)).ok());
  REQUIRE(PutOne(*a, Key(7), Payload(7)).ok());
  for (uint64_t i : {2, 5, 6, 7}) CHECK(Has(*a, Key(i)));
  for (uint64_t i : {0, 1, 3, 4}) CHECK_FALSE(Has(*a, Key(i)));
  // B was never touched: all ten still there, byte for byte.
  for (uint64_t i = 0; i < 10; ++i) CHECK(GetOne(*b, Key(100 + i)).value() == Payload(100 + i));
  // Bigger blocks make room by bytes: 8000 bytes evict 2 and 5, 8192 then evict 6 and 7.
  REQUIRE(PutOne(*a, Key(50), Payload(50, 8000)).ok());
  REQUIRE(PutOne(*a, Key(51), Payload(51, 8 << 10)).ok());
  for (uint64_t i : {2, 5, 6, 7}) CHECK_FALSE(Has(*a, Key(i)));
  CHECK(Has(*a, Key(50)));
  CHECK(Has(*a, Key(51)));
  const TenantStats s = n.node->tenants().Stats(1);
  CHECK(s.name == "alpha");
  CHECK(s.bytes == 8000 + (8 << 10));
  CHECK(s.blocks == 2);
  CHECK(s.quota_evictions == 8);
  CHECK(n.node->tenants().Stats(2).quota_evictions == 0);
  CHECK(n.node->tenants().Stats(2).bytes == 10 * kBlock);
  // Per-tenant metrics.
  const std::string prom = n.node->tenants().PrometheusText();
  CHECK_THAT(prom, Catch::Contains("kvmesh_tenant_quota_bytes{tenant=\"alpha\"} 16384"));
  CHECK_THAT(prom, Catch::Contains("kvmesh_tenant_bytes{tenant=\"beta\"} 40960"));
  CHECK_THAT(prom, Catch::Contains("kvmesh_tenant_quota_evictions_total{tenant=\"alpha\"} " +
                                   std::to_string(s.quota_evictions)));
}

TEST_CASE("Tenants: a block larger than the whole quota is refused", "[tenants][security]") {
  auto c = Config();
  c.auth.tenants[0].quota_bytes = 6000;
  auto node = ShardNode::Create(c, "n0");
  REQUIRE(node.ok());
  std::atomic<uint64_t> epoch{0};
  DataServerOptions o;
  o.token = c.auth.token;
  auto s = DataServer::Start(node->get(), o, &epoch);
  REQUIRE(s.ok());
  TcpChannelOptions t;
  t.port = (*s)->port();
  t.tenant = "alpha";
  t.token = "alpha-pass";
  auto a = TcpChannel::Create(t);
  REQUIRE(PutOne(*a, Key(1), Payload(1)).ok());
  CHECK(PutOne(*a, Key(2), Payload(2, 7000)).code() == StatusCode::kResourceExhausted);
  CHECK(Has(*a, Key(1)));
  CHECK((*node)->tenants().Stats(1).quota_refused == 1);
}

TEST_CASE("Tenants: live sequences answer only their tenant and seal into its namespace", "[tenants][security]") {
  Node n;
  auto a = n.As("alpha", "alpha-pass");
  auto b = n.As("beta", "beta-pass");
  const ModelSpec& m = n.cfg.model;
  SeqCreateArgs args;
  args.tenant_salt = "same-salt";
  auto made = a->SeqCreate(args, {});
  REQUIRE(made.ok());
  const SeqId id = made->id;
  // One full block of tokens with its K and V: sealed into the store.
  std::vector<TokenId> toks(m.block_tokens);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<TokenId>(7 + i);
  const size_t side = BlockLayout::Full(m).side_bytes(toks.size());
  const auto k = Payload(11, side), v = Payload(12, side);
  REQUIRE(a->SeqAppend(id, toks, k, v, m.num_layers, {}).ok());
  // B cannot reach A's sequence by its id, whatever it does.
  CHECK(b->SeqInfo(id, {}).status().code() == StatusCode::kNotFound);
  std::vector<std::byte> ko, vo;
  CHECK(b->SeqRead(id, 0, 1, &ko, &vo, {}).code() == StatusCode::kNotFound);
  CHECK(b->SeqTruncate(id, 0, {}).code() == StatusCode::kNotFound);
  CHECK(b->SeqFork(id, {}).status().code() == StatusCode::kNotFound);
  CHECK(b->SeqRelease(id, {}).code() == StatusCode::kNotFound);
  CHECK(a->SeqInfo(id, {}).value().length == m.block_tokens);
  // The sealed block is in A's namespace: A's prefix match finds it, B's (same salt, same tokens) does not.
  const BlockKey sealed = KeyDeriver(m.model_id, "same-salt", m.block_tokens)
                              .Keys(toks, {0, m.num_layers}, {0, m.num_kv_heads})
                              .at(0);
  uint32_t matched = 0;
  REQUIRE(a->MatchPrefix(std::span<const BlockKey>(&sealed, 1), &matched, {}).ok());
  CHECK(matched == 1);
  REQUIRE(b->MatchPrefix(std::span<const BlockKey>(&sealed, 1), &matched, {}).ok());
  CHECK(matched == 0);
  // B's own sequence over the same prompt attaches nothing of A's.
  SeqCreateArgs bargs = args;
  bargs.prefix = toks;
  auto bs = b->SeqCreate(bargs, {});
  REQUIRE(bs.ok());
  CHECK(bs->attached_blocks == 0);
  SeqCreateArgs aargs = bargs;
  auto as = a->SeqCreate(aargs, {});
  REQUIRE(as.ok());
  CHECK(as->attached_blocks == 1);
  CHECK(a->SeqRelease(id, {}).ok());
}

#if defined(KVMESH_HAVE_UCX)
TEST_CASE("Tenants: the same isolation over UCX", "[tenants][security][ucx]") {
  auto cfg = Config();
  auto node = ShardNode::Create(cfg, "n0");
  REQUIRE(node.ok());
  std::atomic<uint64_t> epoch{0};
  UcxServerOptions o;
  o.token = cfg.auth.token;
  o.limits.max_block_bytes = 8 << 10;
  auto server = UcxServer::Start(node->get(), o, &epoch);
  REQUIRE(server.ok());
  auto as = [&](const std::string& tenant, const std::string& token) {
    UcxChannelOptions u;
    u.node_address = (*server)->address();
    u.tenant = tenant;
    u.token = token;
    u.timeout_ms = 5000;
    return UcxChannel::Connect(u);
  };
  auto bad = as("alpha", "beta-pass");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == StatusCode::kPermissionDenied);
  auto a = as("alpha", "alpha-pass");
  auto b = as("beta", "beta-pass");
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  // Local reads would map the whole pool, every namespace: not for tenants.
  CHECK((*a)->local_reads_status().code() == StatusCode::kFailedPrecondition);
  const BlockKey k = Key(9);
  const auto theirs = Payload(9);
  REQUIRE(PutOne(**b, k, theirs).ok());
  CHECK(GetOne(**a, k).status().code() == StatusCode::kNotFound);
  CHECK_FALSE(Has(**a, k));
  CHECK(EraseOne(**a, k).code() == StatusCode::kNotFound);
  CHECK(GetOne(**b, k).value() == theirs);
  // One-sided reads go through the tenant's namespace too.
  std::vector<std::byte> pool(64 << 10);
  MemoryRegion r{1, pool.data(), pool.size(), MemoryKind::kHost};
  REQUIRE((*a)->RegisterMemory(r).ok());
  GetItem g{k, std::span<std::byte>(pool.data(), kBlock), 0, {}};
  REQUIRE((*a)->Get(std::span<GetItem>(&g, 1), {}).ok());
  CHECK(g.status.code() == StatusCode::kNotFound);
  REQUIRE((*b)->RegisterMemory(r).ok());
  GetItem gb{k, std::span<std::byte>(pool.data(), kBlock), 0, {}};
  REQUIRE((*b)->Get(std::span<GetItem>(&gb, 1), {}).ok());
  REQUIRE(gb.status.ok());
  CHECK(std::equal(theirs.begin(), theirs.end(), pool.begin()));
  (*server)->Stop();
}
#endif

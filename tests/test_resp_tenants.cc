// Tenants on the RESP fronts, in process: `AUTH user password` (and HELLO 2
// AUTH) proves a tenant of $.auth.tenants, and every block I/O of that
// connection runs as the tenant, on the node-local front (a TenantView) and
// through the proxy (node links saying HELLO as the tenant, so the node
// scopes the keys). Two tenants sending the same key bytes never read, test
// for or delete each other's values; a tenant's quota evicts only its own
// keys, and an LMCache-style kv_bytes/metadata pair leaves together; grouped
// keys stay grouped (same kind, same member bits) when scoped.
#include <catch2/catch.hpp>

#include <random>
#include <string>
#include <vector>

#include "kvmesh/block_key.h"
#include "router/proxy/resp_proxy.h"
#include "router/shard_map.h"
#include "shard_node/server/data_server.h"
#include "shard_node/server/resp_server.h"
#include "shard_node/shard_node.h"
#include "shard_node/tenant_view.h"
#include "shard_node/tenants.h"
#include "tests/resp_client.h"
#include "tests/resp_tenant_fronts.h"
#include "transport/resp/resp_commands.h"
#include "transport/resp/resp_value.h"

using namespace kvmesh;
using kvmesh::testing::RespCmd;
using kvmesh::testing::RespTestClient;
using kvmesh::testing::RespValue;

namespace {

constexpr uint64_t kSlot = testing::kRespSlot;
constexpr uint64_t kQuota = testing::kRespQuota;
using testing::LocalFront;
using testing::Pattern;
using testing::ProxyFront;

void Login(RespTestClient& c, const std::string& user, const std::string& pw) {
  const RespValue v = c.Call({"AUTH", user, pw});
  REQUIRE(v.ok());
}

// The same key bytes, two tenants, either front.
template <typename Front>
void SeparateTenants(Front& f) {
  RespTestClient anon(f.port()), a(f.port()), b(f.port()), admin(f.port());
  // Nothing before AUTH; a wrong password is refused and changes nothing.
  CHECK(anon.Call({"GET", "shared"}).str.rfind("NOAUTH", 0) == 0);
  CHECK(anon.Call({"AUTH", "alpha", "beta-pw"}).str.rfind("WRONGPASS", 0) == 0);
  CHECK(anon.Call({"AUTH", "nobody", "alpha-pw"}).str.rfind("WRONGPASS", 0) == 0);
  CHECK(anon.Call({"GET", "shared"}).str.rfind("NOAUTH", 0) == 0);

  Login(a, "alpha", "alpha-pw");
  const RespValue hello = b.Call({"HELLO", "2", "AUTH", "beta", "beta-pw"});
  REQUIRE(hello.type == '*');
  Login(admin, "default", "cluster-secret");

  const std::string big = Pattern(3 * kSlot + 123, 7);  // a value of four blocks
  REQUIRE(a.Call({"SET", "shared", "alpha's"}).ok());
  REQUIRE(a.Call({"SET", "big", big}).ok());
  // B sends the same key bytes: nothing there, nothing to delete.
  CHECK(b.Call({"GET", "shared"}).nil);
  CHECK(b.Call({"GET", "big"}).nil);
  CHECK(b.Call({"EXISTS", "shared", "big"}).num == 0);
  CHECK(b.Call({"DEL", "shared", "big"}).num == 0);
  CHECK(b.Call({"TTL", "shared"}).num == -2);
  // ... nor does the cluster identity see a tenant's keys.
  CHECK(admin.Call({"GET", "shared"}).nil);
  CHECK(admin.Call({"EXISTS", "shared"}).num == 0);
  // A's values survived B's DEL, whole.
  CHECK(a.Call({"GET", "shared"}).str == "alpha's");
  CHECK(a.Call({"GET", "big"}).str == big);
  // B writes the same key: two values side by side.
  REQUIRE(b.Call({"SET", "shared", "beta's"}).ok());
  REQUIRE(admin.Call({"SET", "shared", "cluster's"}).ok());
  CHECK(a.Call({"GET", "shared"}).str == "alpha's");
  CHECK(b.Call({"GET", "shared"}).str == "beta's");
  CHECK(admin.Call({"GET", "shared"}).str == "cluster's");
  CHECK(a.Call({"DEL", "shared"}).num == 1);
  CHECK(b.Call({"GET", "shared"}).str == "beta's");

  // The node holds them under different stored keys: A's only in A's namespace.
  ShardNode* n = f.node_of("big");
  CHECK(TenantView(n, 1).Exists(RespKey("big"), false));
  CHECK_FALSE(TenantView(n, 2).Exists(RespKey("big"), false));
  CHECK_FALSE(n->Exists(RespKey("big"), false));

  // AUTH switches the identity mid-pipeline, command by command.
  RespTestClient c(f.port());
  c.Send(RespCmd({"AUTH", "alpha", "alpha-pw"}) + RespCmd({"GET", "big"}) + RespCmd({"AUTH", "beta", "beta-pw"}) +
         RespCmd({"GET", "shared"}) + RespCmd({"GET", "big"}) + RespCmd({"AUTH", "beta", "wrong"}) +
         RespCmd({"GET", "shared"}));
  CHECK(c.Read().ok());
  CHECK(c.Read().str == big);
  CHECK(c.Read().ok());
  CHECK(c.Read().str == "beta's");
  CHECK(c.Read().nil);
  CHECK(c.Read().str.rfind("WRONGPASS", 0) == 0);
  CHECK(c.Read().str == "beta's");  // still beta
}

// A's writes past its quota evict only A's keys (B has no quota), and each
// kv_bytes/metadata pair of A leaves whole.
template <typename Front>
void QuotaEvictsOnlyItsOwn(Front& f) {
  RespTestClient a(f.port()), b(f.port());
  Login(a, "alpha", "alpha-pw");
  Login(b, "beta", "beta-pw");
  const std::string v = Pattern(20 << 10, 3);
  constexpr int kB = 20, kA = 60;  // A writes about 5x its quota per node
  for (int i = 0; i < kB; ++i) REQUIRE(b.Call({"SET", "key" + std::to_string(i), v}).ok());
  for (int i = 0; i < kA; ++i) {
    const std::string k = "key" + std::to_string(i);
    REQUIRE(a.Call({"SET", k + "kv_bytes", v}).ok());
    REQUIRE(a.Call({"SET", k + "metadata", "meta" + std::to_string(i)}).ok());
  }
  for (int i = 0; i < kB; ++i) CHECK(b.Call({"GET", "key" + std::to_string(i)}).str == v);
  int survived = 0;
  for (int i = 0; i < kA; ++i) {
    const std::string k = "key" + std::to_string(i);
    const RespValue chunk = a.Call({"GET", k + "kv_bytes"});
    if (!chunk.nil) {
      CHECK(chunk.str == v);
      ++survived;
    }
    // The node-level truth: A's metadata block is stored exactly when its chunk is.
    ShardNode* n = f.node_of(k + "kv_bytes");
    const RespKeyRules rules;
    CHECK(TenantView(n, 1).Exists(RespKey(k + "metadata", rules), false) == !chunk.nil);
  }
  CHECK(survived > 0);
  CHECK(survived < kA);
  // The most recent pair is still there, the first is gone.
  CHECK(a.Call({"GET", "key" + std::to_string(kA - 1) + "metadata"}).str == "meta" + std::to_string(kA - 1));
  CHECK(a.Call({"GET", "key0kv_bytes"}).nil);
  uint64_t quota_evictions = 0;
  for (const auto& n : {f.node_of("key0kv_bytes")}) {
    const TenantStats s = n->tenants().Stats(1);
    CHECK(s.bytes <= kQuota);
    quota_evictions += s.quota_evictions;
  }
  CHECK(quota_evictions > 0);
  CHECK(f.node_of("key0kv_bytes")->tenants().Stats(2).quota_evictions == 0);
}

}  // namespace

TEST_CASE("Tenants: a grouped key stays a grouped key of its kind and members when scoped", "[tenants][groups]") {
  const BlockKey ns_a{0x1111, 0x2222}, ns_b{0x3333, 0x4444};
  for (const bool co_evict : {true, false}) {
    const BlockKey m1 = GroupedKey(0xABCDEF, 1, co_evict), m2 = GroupedKey(0xABCDEF, 2, co_evict);
    const BlockKey a1 = ScopeKey(ns_a, m1), a2 = ScopeKey(ns_a, m2), b1 = ScopeKey(ns_b, m1);
    CHECK(IsGroupedKey(a1));
    CHECK(IsCoEvictedKey(a1) == co_evict);
    CHECK(a1.lo == m1.lo);  // tag, kind and member bits unchanged
    CHECK(a2.lo == m2.lo);
    CHECK(a1.hi == a2.hi);  // one group in the namespace ...
    CHECK(a1.hi != m1.hi);  // ... not the client's group ...
    CHECK(b1.hi != a1.hi);  // ... nor another namespace's
    CHECK(ScopeKey(BlockKey{}, m1) == m1);
  }
  // A plain key is hashed whole, as before.
  const BlockKey plain{0x1234, 0x5678};
  CHECK(ScopeKey(ns_a, plain) != plain);
  CHECK(ScopeKey(ns_a, plain) != ScopeKey(ns_b, plain));
}

TEST_CASE("Tenants: a quota eviction of a co-evicted member drops its whole group", "[tenants][groups]") {
  const ClusterConfig cfg = testing::RespTenantConfig(1);
  auto n = ShardNode::Create(cfg, "n0");
  REQUIRE(n.ok());
  ShardNode* node = n->get();
  TenantView a(node, 1);
  const std::string v(60 << 10, 'x');
  const auto bytes = std::as_bytes(std::span<const char>(v));
  // Pair 0 first, then enough of A's other blocks to push it past the quota.
  const BlockKey chunk = GroupedKey(77, 1, true), meta = GroupedKey(77, 2, true);
  REQUIRE(a.Put(chunk, bytes.first(v.size()), {}).ok());
  REQUIRE(a.Put(meta, bytes.first(28), {}).ok());
  CHECK(a.Exists(meta, false));
  for (uint64_t i = 0; i < 5; ++i) REQUIRE(a.Put(BlockKey{1000 + i, i}, bytes, {}).ok());
  CHECK_FALSE(a.Exists(chunk, false));
  // The metadata block went with its chunk (not merely unreadable), and left A's ledger.
  CHECK_FALSE(node->Exists(a.Key(meta), false));
  const TenantStats s = node->tenants().Stats(1);
  CHECK(s.quota_evictions >= 2);
  CHECK(s.bytes <= kQuota);
}

TEST_CASE("RESP tenants, node-local front: the same key bytes are two tenants' separate values", "[resp][tenants]") {
  LocalFront f;
  SeparateTenants(f);
}

TEST_CASE("RESP tenants, node-local front: a quota evicts only its tenant's keys, pairs whole", "[resp][tenants]") {
  LocalFront f;
  QuotaEvictsOnlyItsOwn(f);
  // INFO and DBSIZE show a tenant its own figures.
  RespTestClient a(f.port());
  Login(a, "alpha", "alpha-pw");
  const std::string info = a.Call({"INFO"}).str;
  CHECK(info.find("tenant:alpha") != std::string::npos);
  CHECK(info.find("maxmemory:" + std::to_string(kQuota)) != std::string::npos);
  CHECK(a.Call({"DBSIZE"}).num == static_cast<int64_t>(f.node->tenants().Stats(1).blocks));
}

TEST_CASE("RESP tenants, proxy: the same key bytes are two tenants' separate values", "[resp][tenants][proxy]") {
  ProxyFront f;
  SeparateTenants(f);
}

TEST_CASE("RESP tenants, proxy: a quota evicts only its tenant's keys, pairs whole", "[resp][tenants][proxy]") {
  ProxyFront f;
  QuotaEvictsOnlyItsOwn(f);
  // A tenant's DBSIZE is not the cluster's.
  RespTestClient a(f.port());
  Login(a, "alpha", "alpha-pw");
  CHECK(a.Call({"DBSIZE"}).num == 0);
}

TEST_CASE("RESP tenants, proxy: a tenant the nodes do not know reads nil and cannot write", "[resp][tenants][proxy]") {
  ProxyFront f;
  // The proxy's config knows "gamma"; the nodes' does not, so their HELLO refuses it.
  f.proxy->Stop();
  RespProxyOptions po;
  po.block_bytes = kSlot;
  po.token = f.cfg.auth.token;
  AuthConfig auth = f.cfg.auth;
  TenantConfig g;
  g.name = "gamma";
  g.token = "gamma-pw";
  auth.tenants.push_back(g);
  po.auth = MakeClusterAuth(auth);
  po.tenants = auth.tenants;
  po.map = [m = f.map] { return m; };
  po.timeout_ms = 1000;
  po.connect_timeout_ms = 1000;
  auto p = RespProxy::Start(po);
  REQUIRE(p.ok());
  RespTestClient c((*p)->port());
  Login(c, "gamma", "gamma-pw");
  CHECK(c.Call({"SET", "k", "v"}).is_error());
  CHECK(c.Call({"GET", "k"}).nil);
  RespTestClient a((*p)->port());
  Login(a, "alpha", "alpha-pw");
  CHECK(a.Call({"SET", "k", "v"}).ok());
  CHECK(a.Call({"GET", "k"}).str == "v");
  (*p)->Stop();
}

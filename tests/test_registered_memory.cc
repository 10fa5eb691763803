// Zero-copy transfers: the block store's two-phase put (Reserve / Commit),
// the node's transfer API, and Router::RegisterMemory with GetInto / PutFrom
// over UCX (one-sided puts and gets into registered memory), over TCP
// (payloads straight into pool chunks) and in process. Every byte compared;
// corruption is a miss, never wrong bytes.
#include <catch2/catch.hpp>

#include <chrono>

#include <algorithm>

#include <thread>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <random>

#include "common/checksum.h"
#include "coordinator/embedded/inproc_channel.h"
#include "kvmesh/build_config.h"
#include "kvmesh/config.h"
#include "kvmesh/router.h"
#include "router/shard_map.h"
#include "shard_node/block_store.h"
#include "shard_node/server/data_server.h"
#include "shard_node/shard_node.h"
#include "transport/tcp_channel.h"
#if defined(KVMESH_HAVE_UCX)
#include "shard_node/server/ucx_server.h"
#include "transport/ucx_channel.h"
#endif

using namespace kvmesh;

namespace {

BlockKey Key(uint64_t i) { return BlockKey{i * 0x9E3779B97F4A7C15ull + 1, i}; }

std::vector<std::byte> Bytes(size_t n, uint64_t seed) {
  std::vector<std::byte> v(n);
  std::mt19937_64 rng(seed);
  for (auto& b : v) b = static_cast<std::byte>(rng());
  return v;
}

std::unique_ptr<BlockStore> Store(uint64_t capacity = 8 << 20, uint64_t slot = 1 << 20) {
  StoreOptions o;
  o.capacity_bytes = capacity;
  o.slot_bytes = slot;
  o.stripes = 1;
  auto s = BlockStore::Create(std::move(o));
  REQUIRE(s.ok());
  return std::move(*s);
}

ClusterConfig Config(const std::string& extra = "") {
  auto c = ParseConfig(R"({
    "model": {"model_id": "m", "num_layers": 2, "num_kv_heads": 2, "head_dim": 64, "block_tokens": 16},
    "nodes": [{"id": "z0", "memory": {"host": "64MiB"}}],
    "store": {"slot_bytes": "2MiB", "stripes": 2})" + extra + "}");
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  return *c;
}

}  // namespace

TEST_CASE("Reserve/Commit: readers miss the block until it is committed, then read its bytes", "[store][zerocopy]") {
  auto s = Store();
  const auto data = Bytes(300000, 1);
  auto r = s->Reserve(Key(1), data.size());
  REQUIRE(r.ok());
  REQUIRE(r->data().size() == data.size());
  std::memcpy(r->data().data(), data.data(), data.size());
  CHECK(!s->Exists(Key(1)));
  CHECK(s->Get(Key(1)).status().code() == StatusCode::kNotFound);
  CHECK(s->Put(Key(1), data).ok());  // a put of a key being written returns at once
  REQUIRE(s->Commit(*r, Checksum64(data.data(), data.size()), /*verify=*/true).ok());
  CHECK(!r->valid());
  std::vector<std::byte> out(data.size());
  auto n = s->GetInto(Key(1), out);
  REQUIRE(n.ok());
  CHECK(*n == data.size());
  CHECK(out == data);
}

TEST_CASE("Reserve/Commit: a wrong checksum stores nothing and frees the chunk", "[store][zerocopy]") {
  auto s = Store(2 << 20, 1 << 20);  // two slots
  const auto data = Bytes(1 << 20, 2);
  for (int round = 0; round < 4; ++round) {  // chunks come back: never runs out
    auto r = s->Reserve(Key(2), data.size());
    REQUIRE(r.ok());
    std::memcpy(r->data().data(), data.data(), data.size());
    r->data()[1000] ^= std::byte{1};  // torn in transit
    Status c = s->Commit(*r, Checksum64(data.data(), data.size()), /*verify=*/true);
    CHECK(c.code() == StatusCode::kDataLoss);
    CHECK(!s->Exists(Key(2)));
  }
  CHECK(s->Stats().blocks == 0);
  CHECK(s->Stats().bytes_held == 0);
}

TEST_CASE("Reserve: a stored key answers AlreadyExists; an abandoned reservation frees its chunk", "[store][zerocopy]") {
  auto s = Store(2 << 20, 1 << 20);
  const auto data = Bytes(1 << 20, 3);
  REQUIRE(s->Put(Key(3), data).ok());
  CHECK(s->Reserve(Key(3), data.size()).status().code() == StatusCode::kAlreadyExists);
  {
    auto r = s->Reserve(Key(4), data.size());
    REQUIRE(r.ok());
  }  // dropped unfilled
  CHECK(!s->Exists(Key(4)));
  CHECK(s->Stats().blocks == 1);
  auto r = s->Reserve(Key(5), data.size());  // the freed chunk is there again, Key(3) stays
  REQUIRE(r.ok());
  r->Abort();
  CHECK(s->Exists(Key(3)));
}

TEST_CASE("Reserve/Commit: a block erased while being written is not stored", "[store][zerocopy]") {
  auto s = Store();
  const auto data = Bytes(4096, 4);
  auto r = s->Reserve(Key(6), data.size());
  REQUIRE(r.ok());
  std::memcpy(r->data().data(), data.data(), data.size());
  REQUIRE(s->Erase(Key(6)).ok());
  CHECK(s->Commit(*r, Checksum64(data.data(), data.size()), true).ok());
  CHECK(!s->Exists(Key(6)));
  CHECK(s->Stats().bytes_held == 0);
}

TEST_CASE("ShardNode: ReservePut goes through the tiers and refuses to bypass a codec", "[node][zerocopy]") {
  SECTION("tiers: committed blocks are readable and exclusive") {
    auto c = Config(R"(, "eviction": {"tiers": {"interval_ms": 60000}})");
    c.nodes[0].memory.device = 4 << 20;
    c.nodes[0].memory.host = 8 << 20;
    auto n = ShardNode::Create(c, "z0");
    REQUIRE(n.ok());
    REQUIRE((*n)->tiers() != nullptr);
    const auto data = Bytes(65536, 5);
    auto r = (*n)->ReservePut(Key(7), data.size(), {});
    REQUIRE(r.ok());
    std::memcpy(r->data().data(), data.data(), data.size());
    REQUIRE((*n)->CommitPut(*r, Checksum64(data.data(), data.size())).ok());
    auto ref = (*n)->GetForTransfer(Key(7));
    REQUIRE(ref.ok());
    CHECK(std::memcmp(ref->data().data(), data.data(), data.size()) == 0);
    CHECK((*n)->PoolMemory().size() == 2);
  }
  SECTION("codec: the node encodes on put, so the bytes must be staged") {
    auto n = ShardNode::Create(Config(R"(, "codec": {"codec": "int8"})"), "z0");
    REQUIRE(n.ok());
    CHECK((*n)->ReservePut(Key(8), 65536, {}).status().code() == StatusCode::kFailedPrecondition);
  }
}

namespace {

// One node behind a TCP data server and a UCX server, a router over one channel to it.
struct Served {
  explicit Served(const std::string& extra = "", int ucx_workers = 1) {
    config = Config(extra);
    auto n = ShardNode::Create(config, "z0");
    REQUIRE(n.ok());
    node = std::move(*n);
    DataServerOptions d;
    d.host = "127.0.0.1";
    d.limits.max_block_bytes = 2 << 20;
    auto ds = DataServer::Start(node.get(), d, &epoch);
    REQUIRE(ds.ok());
    tcp = std::move(*ds);
#if defined(KVMESH_HAVE_UCX)
    UcxServerOptions u;
    u.limits.max_block_bytes = 2 << 20;
    u.workers = ucx_workers;
    auto us = UcxServer::Start(node.get(), u, &epoch);
    REQUIRE(us.ok());
    ucx = std::move(*us);
#endif
  }
  std::unique_ptr<Router> RouterOver(std::shared_ptr<ShardChannel> ch, RouterOptions ro = {}) {
    auto map = ShardMap::FromConfig(config);
    REQUIRE(map.ok());
    auto r = Router::Create(config.model, std::move(*map), {std::move(ch)}, std::move(ro));
    REQUIRE(r.ok());
    return std::move(*r);
  }
  std::shared_ptr<TcpChannel> Tcp() {
    TcpChannelOptions o;
    o.port = tcp->port();
    o.limits.max_block_bytes = 2 << 20;
    return TcpChannel::Create(o);
  }
#if defined(KVMESH_HAVE_UCX)
  std::shared_ptr<UcxChannel> Ucx(std::shared_ptr<UcxContext> ctx = nullptr) {
    UcxChannelOptions o;
    o.node_address = ucx->address();
    o.timeout_ms = 5000;
    o.limits.max_block_bytes = 2 << 20;
    o.context = std::move(ctx);
    o.local_reads = false;  // GET_INTO is under test, not local reads
    auto c = UcxChannel::Connect(o);
    REQUIRE(c.ok());
    return std::shared_ptr<UcxChannel>(std::move(*c));
  }
#endif
  std::atomic<uint64_t> epoch{0};
  ClusterConfig config;
  std::unique_ptr<ShardNode> node;
  std::unique_ptr<DataServer> tcp;
#if defined(KVMESH_HAVE_UCX)
  std::unique_ptr<UcxServer> ucx;
#endif
};

// Puts `n` blocks of assorted sizes from a registered pool, reads them back
// into another part of it (and into unregistered memory), compares every byte.
// The pool is heap memory the caller registers, or (allocate) memory from
// Router::AllocateMemory.
void RegisteredRoundTrip(Router& r, ShardNode& node, bool allocate = false) {
  constexpr size_t kSlot = 2 << 20;
  const size_t sizes[] = {64, 4096, 65536, 262144, 1 << 20, kSlot};
  const size_t n = std::size(sizes);
  std::vector<std::byte> heap(allocate ? 0 : 2 * n * kSlot);
  auto region = allocate ? r.AllocateMemory(2 * n * kSlot) : r.RegisterMemory(heap.data(), heap.size());
  REQUIRE(region.ok());
  std::span<std::byte> pool(region->base, region->bytes);
  REQUIRE(pool.size() == 2 * n * kSlot);
  CHECK(r.RegisterMemory(pool.data() + 10, 100).status().code() == StatusCode::kInvalidArgument);  // overlaps
  std::vector<PutItem> puts;
  for (size_t i = 0; i < n; ++i) {
    auto b = Bytes(sizes[i], 100 + i);
    std::memcpy(pool.data() + i * kSlot, b.data(), b.size());
    puts.push_back(PutItem{Key(100 + i), {pool.data() + i * kSlot, sizes[i]}, {}});
  }
  REQUIRE(r.PutFrom(puts).ok());
  for (auto& p : puts) CHECK(p.status.ok());
  std::vector<GetItem> gets;
  for (size_t i = 0; i < n; ++i) gets.push_back(GetItem{Key(100 + i), {pool.data() + (n + i) * kSlot, kSlot}, 0, {}});
  gets.push_back(GetItem{Key(999), {pool.data() + (2 * n - 1) * kSlot, 16}, 0, {}});  // a miss
  REQUIRE(r.GetInto(gets).ok());
  for (size_t i = 0; i < n; ++i) {
    INFO("block " << i << ": " << gets[i].status.ToString());
    REQUIRE(gets[i].status.ok());
    CHECK(gets[i].size == sizes[i]);
    CHECK(std::memcmp(pool.data() + (n + i) * kSlot, pool.data() + i * kSlot, sizes[i]) == 0);
  }
  CHECK(gets.back().status.code() == StatusCode::kNotFound);
  // Too small a destination: the size needed, nothing written past it.
  std::memset(pool.data() + n * kSlot, 0xAB, 65536 + 16);
  GetItem small{Key(100 + 3), {pool.data() + n * kSlot, 65536}, 0, {}};
  REQUIRE(r.GetInto(std::span(&small, 1)).ok());
  CHECK(small.status.code() == StatusCode::kResourceExhausted);
  CHECK(small.size == 262144);
  CHECK(pool[n * kSlot + 65536] == std::byte{0xAB});
  // Unregistered destinations and sources work too (the bounce path).
  std::vector<std::byte> loose(kSlot);
  GetItem g{Key(100 + 4), loose, 0, {}};
  REQUIRE(r.GetInto(std::span(&g, 1)).ok());
  REQUIRE(g.status.ok());
  CHECK(std::memcmp(loose.data(), pool.data() + 4 * kSlot, sizes[4]) == 0);
  auto lb = Bytes(5000, 7);
  PutItem lp{Key(200), lb, {}};
  REQUIRE(r.PutFrom(std::span(&lp, 1)).ok());
  CHECK(r.Get(Key(200)).value() == lb);
  // A block corrupted in the node's pool reads as a miss, never as bytes.
  auto ref = node.GetForTransfer(Key(100 + 2));
  REQUIRE(ref.ok());
  const_cast<std::byte*>(ref->data().data())[77] ^= std::byte{0x40};
  ref->Release();
  GetItem bad{Key(100 + 2), {pool.data() + n * kSlot, kSlot}, 0, {}};
  REQUIRE(r.GetInto(std::span(&bad, 1)).ok());
  CHECK(bad.status.code() == StatusCode::kDataLoss);
  CHECK(r.UnregisterMemory(region->id).ok());
  CHECK(r.UnregisterMemory(region->id).code() == StatusCode::kNotFound);
}

// The Router executes the replica plan's stale-epoch rule
// (router/replica_plan.h) over channel `ch` (whose shard-map epoch
// set_epoch sets): a PutFrom and a GetInto of registered memory answered
// StaleEpoch refresh the map once and land; a refresh that brings no newer
// map is tried once per call, not twice, and the call fails StaleEpoch.
template <typename Channel>
void StaleEpochRoundTrip(Served& s, std::shared_ptr<Channel> ch) {
  ch->set_epoch(1);
  int refreshes = 0;
  uint64_t publish = 1;  // the epoch a refresh brings
  RouterOptions ro;
  ro.refresh = [&](Router&) {
    ++refreshes;
    ch->set_epoch(publish);
    return Status::Ok();
  };
  auto r = s.RouterOver(ch, ro);
  constexpr size_t kBlock = 65536;
  std::vector<std::byte> heap(4 * kBlock);
  auto region = r->RegisterMemory(heap.data(), heap.size());
  REQUIRE(region.ok());
  auto block = [&](size_t slot) { return std::span<std::byte>(heap.data() + slot * kBlock, kBlock); };
  const auto data = Bytes(kBlock, 77);
  std::memcpy(block(0).data(), data.data(), kBlock);

  s.epoch = 2;  // the coordinator moved on: the node refuses epoch 1
  publish = 2;
  PutItem p{Key(500), block(0), {}};
  REQUIRE(r->PutFrom(std::span(&p, 1)).ok());
  CHECK(p.status.ok());
  CHECK(refreshes == 1);
  GetItem g{Key(500), block(1), 0, {}};
  REQUIRE(r->GetInto(std::span(&g, 1)).ok());
  REQUIRE(g.status.ok());
  CHECK(std::memcmp(block(1).data(), data.data(), kBlock) == 0);
  CHECK(refreshes == 1);

  s.epoch = 3;  // a refresh that brings no newer map
  GetItem stale{Key(500), block(2), 0, {}};
  REQUIRE(r->GetInto(std::span(&stale, 1)).ok());
  CHECK(stale.status.code() == StatusCode::kStaleEpoch);
  CHECK(refreshes == 2);
  PutItem p2{Key(501), block(0), {}};
  CHECK(r->PutFrom(std::span(&p2, 1)).code() == StatusCode::kStaleEpoch);
  CHECK(refreshes == 3);

  publish = 3;
  GetItem again{Key(500), block(3), 0, {}};
  REQUIRE(r->GetInto(std::span(&again, 1)).ok());
  REQUIRE(again.status.ok());
  CHECK(std::memcmp(block(3).data(), data.data(), kBlock) == 0);
  CHECK(refreshes == 4);
}

}  // namespace

TEST_CASE("Registered memory over TCP: a StaleEpoch answer refreshes the router's map once and the call lands",
          "[cluster][zerocopy][faults]") {
  Served s;
  StaleEpochRoundTrip(s, s.Tcp());
}

TEST_CASE("Registered memory in process: GetInto/PutFrom byte for byte, misses, corruption", "[router][zerocopy]") {
  Served s;
  auto r = s.RouterOver(std::shared_ptr<ShardChannel>(MakeInProcessChannel(s.node.get())));
  RegisteredRoundTrip(*r, *s.node);
}

TEST_CASE("Registered memory over TCP: PUT payloads land in pool chunks, GetInto byte for byte", "[cluster][zerocopy]") {
  Served s;
  auto r = s.RouterOver(s.Tcp());
  RegisteredRoundTrip(*r, *s.node);
}

#if defined(KVMESH_HAVE_UCX)
TEST_CASE("Registered memory over UCX: one-sided GET_INTO / PUT_FROM byte for byte (default UCX_TLS)",
          "[cluster][ucx][zerocopy]") {
  Served s;
  auto ctx = UcxContext::Create(true);
  REQUIRE(ctx.ok());
  auto r = s.RouterOver(s.Ucx(*ctx));
  RegisteredRoundTrip(*r, *s.node);
  // Both directions of every registered block went one-sided: 2 x (64 + 4 KiB + 64 KiB + 256 KiB + 1 MiB + 2 MiB).
  CHECK(s.ucx->one_sided_bytes() >= 2 * (64 + 4096 + 65536 + 262144 + (1 << 20) + (2 << 20)));
}

TEST_CASE("Registered memory over UCX: two workers of one node share one pool mapping; a block put one-sided "
          "through one is read one-sided through the other", "[cluster][ucx][zerocopy]") {
  Served s("", /*ucx_workers=*/2);
  REQUIRE(UnpackWorkerAddresses(s.ucx->address()).size() == 2);
  // The pool is mapped once for the node (on RDMA: pinned and registered
  // once), not once per worker.
  CHECK(s.ucx->pool_mappings() == s.node->PoolMemory().size());
  auto ctx = UcxContext::Create(true);
  REQUIRE(ctx.ok());
  // Consecutive channels go to consecutive workers: one router on each.
  // The two routers share one client context and each numbers its regions
  // from 1: each must still get its own mapping (not the bounce path).
  auto a = s.RouterOver(s.Ucx(*ctx));
  auto b = s.RouterOver(s.Ucx(*ctx));
  constexpr size_t kBlock = 262144, kBlocks = 8;
  std::vector<std::byte> ma(2 * kBlocks * kBlock), mb(2 * kBlocks * kBlock);
  REQUIRE(a->RegisterMemory(ma.data(), ma.size()).ok());
  REQUIRE(b->RegisterMemory(mb.data(), mb.size()).ok());
  for (int round = 0; round < 2; ++round) {
    Router& writer = round == 0 ? *a : *b;
    Router& reader = round == 0 ? *b : *a;
    std::vector<std::byte>& src = round == 0 ? ma : mb;
    std::vector<std::byte>& dst = round == 0 ? mb : ma;
    std::vector<PutItem> puts;
    std::vector<GetItem> gets;
    for (size_t i = 0; i < kBlocks; ++i) {
      auto bytes = Bytes(kBlock, 700 + round * 100 + i);
      std::memcpy(src.data() + i * kBlock, bytes.data(), kBlock);
      puts.push_back(PutItem{Key(700 + round * 100 + i), {src.data() + i * kBlock, kBlock}, {}});
      gets.push_back(GetItem{Key(700 + round * 100 + i), {dst.data() + (kBlocks + i) * kBlock, kBlock}, 0, {}});
    }
    const uint64_t before_put = s.ucx->one_sided_bytes();
    REQUIRE(writer.PutFrom(puts).ok());
    CHECK(s.ucx->one_sided_bytes() - before_put == kBlocks * kBlock);
    for (auto& p : puts) CHECK(p.status.ok());
    const uint64_t before_get = s.ucx->one_sided_bytes();
    REQUIRE(reader.GetInto(gets).ok());
    CHECK(s.ucx->one_sided_bytes() - before_get == kBlocks * kBlock);
    for (size_t i = 0; i < kBlocks; ++i) {
      INFO("round " << round << " block " << i << ": " << gets[i].status.ToString());
      REQUIRE(gets[i].status.ok());
      CHECK(gets[i].size == kBlock);
      CHECK(std::memcmp(dst.data() + (kBlocks + i) * kBlock, src.data() + i * kBlock, kBlock) == 0);
    }
  }
  const std::vector<uint64_t> per_worker = s.ucx->worker_requests();
  REQUIRE(per_worker.size() == 2);
  CHECK(per_worker[0] >= 3);  // HELLO, a PUT_FROM and a GET_INTO each (and the memory registration)
  CHECK(per_worker[1] >= 3);
  CHECK(s.ucx->one_sided_bytes() >= 2 * 2 * kBlocks * kBlock);
}

// Router options whose AllocateMemory takes UCX-allocated (shared) memory of
// `c`, as NetworkClient's over UCX do; counts the allocations.
static RouterOptions UcxAllocating(std::shared_ptr<UcxContext> c, int* allocations) {
  RouterOptions ro;
  ro.allocate_memory = [c, allocations](size_t bytes) -> Result<std::shared_ptr<std::byte>> {
    KVMESH_ASSIGN_OR_RETURN(std::shared_ptr<UcxMemory> m, c->Allocate(bytes));
    ++*allocations;
    std::byte* base = m->base();
    return std::shared_ptr<std::byte>(std::move(m), base);
  };
  return ro;
}

TEST_CASE("Registered memory over UCX: Router::AllocateMemory gives shared memory the node writes and reads one-sided",
          "[cluster][ucx][zerocopy]") {
  Served s;
  auto ctx = UcxContext::Create(true);
  REQUIRE(ctx.ok());
  std::shared_ptr<UcxContext> c = *ctx;
  int allocations = 0;
  auto r = s.RouterOver(s.Ucx(c), UcxAllocating(c, &allocations));
  RegisteredRoundTrip(*r, *s.node, /*allocate=*/true);
  CHECK(allocations == 1);
  CHECK(s.ucx->one_sided_bytes() >= 2 * (64 + 4096 + 65536 + 262144 + (1 << 20) + (2 << 20)));
}

TEST_CASE("Registered memory over UCX: the node warms its mapping of a same-host client's shared memory with its "
          "contents unchanged (plain memory is not warmed and unregistering mid-warm is safe)",
          "[cluster][ucx][zerocopy]") {
  // The node writes a same-host client's AllocateMemory region through its
  // own mapping; the first write to each page of it costs a page-table fill
  // (docs/serving.md "The slow first get"), so PageWarmer reads every page
  // after MEM_REGISTER, off the loop thread.
  Served s;
  int allocations = 0;
  auto ctx = UcxContext::Create(true);
  REQUIRE(ctx.ok());
  auto r = s.RouterOver(s.Ucx(*ctx), UcxAllocating(*ctx, &allocations));
  auto settled = [&] {
    for (int i = 0; i < 600 && s.ucx->warm_pending_bytes() > 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    return s.ucx->warm_pending_bytes() == 0;
  };
  // Plain memory: not mapped by the node, nothing to warm.
  std::vector<std::byte> plain(8 << 20);
  auto pr = r->RegisterMemory(plain.data(), plain.size());
  REQUIRE(pr.ok());
  REQUIRE(settled());
  CHECK(s.ucx->warmed_bytes() == 0);
  // Shared memory of this host: every page read, its contents as written.
  const size_t bytes = 16 << 20;
  auto region = r->AllocateMemory(bytes);
  REQUIRE(region.ok());
  for (size_t i = 0; i < bytes; ++i) region->base[i] = std::byte(i * 7 + 1);
  REQUIRE(settled());
  CHECK(s.ucx->warmed_bytes() == bytes);
  bool same = true;
  for (size_t i = 0; i < bytes; ++i) same = same && region->base[i] == std::byte(i * 7 + 1);
  CHECK(same);
  // Unregistered while (likely) still warming: the warm stops, the node serves on.
  auto big = r->AllocateMemory(size_t{256} << 20);
  REQUIRE(big.ok());
  REQUIRE(r->UnregisterMemory(big->id).ok());
  REQUIRE(settled());
  CHECK(s.ucx->warmed_bytes() <= bytes + (size_t{256} << 20));
  auto b = Bytes(65536, 9);
  std::memcpy(region->base, b.data(), b.size());
  PutItem p{Key(900), {region->base, b.size()}, {}};
  REQUIRE(r->PutFrom(std::span(&p, 1)).ok());
  REQUIRE(p.status.ok());
  GetItem g{Key(900), {region->base + 65536, 65536}, 0, {}};
  REQUIRE(r->GetInto(std::span(&g, 1)).ok());
  REQUIRE(g.status.ok());
  CHECK(std::memcmp(region->base + 65536, b.data(), b.size()) == 0);
  CHECK(allocations == 2);
}

TEST_CASE("Registered memory over UCX: a node on the client's host writes nothing once the call's deadline passed",
          "[cluster][ucx][zerocopy]") {
  // GET_INTO carries the call's deadline; a node sharing the client's clock
  // (same boot id) refuses to write into memory the client may have reused.
  Served s;
  auto ctx = UcxContext::Create(true);
  REQUIRE(ctx.ok());
  auto r = s.RouterOver(s.Ucx(*ctx));
  std::vector<std::byte> pool(1 << 20);
  auto region = r->RegisterMemory(pool.data(), pool.size());
  REQUIRE(region.ok());
  auto b = Bytes(65536, 5);
  PutItem p{Key(500), b, {}};
  REQUIRE(r->PutFrom(std::span(&p, 1)).ok());
  REQUIRE(p.status.ok());
  const uint64_t moved = s.ucx->one_sided_bytes();
  std::memset(pool.data(), 0xEE, 65536);
  RequestOptions hurry;
  hurry.timeout_ms = 1;  // inside the node's margin: the write would race the client's give-up
  GetItem g{Key(500), {pool.data(), 65536}, 0, {}};
  (void)r->GetInto(std::span(&g, 1), hurry);
  CHECK_FALSE(g.status.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // anything late would have landed by now
  CHECK(s.ucx->one_sided_bytes() == moved);
  CHECK(std::all_of(pool.begin(), pool.begin() + 65536, [](std::byte x) { return x == std::byte{0xEE}; }));
  // With time to spare the same read lands.
  GetItem ok{Key(500), {pool.data(), 65536}, 0, {}};
  REQUIRE(r->GetInto(std::span(&ok, 1)).ok());
  REQUIRE(ok.status.ok());
  CHECK(std::memcmp(pool.data(), b.data(), b.size()) == 0);
}

TEST_CASE("Router::AllocateMemory without a transport allocator: page-aligned registered memory, freed on unregister",
          "[router][zerocopy]") {
  Served s;
  auto r = s.RouterOver(std::shared_ptr<ShardChannel>(MakeInProcessChannel(s.node.get())));
  CHECK(r->AllocateMemory(0).status().code() == StatusCode::kInvalidArgument);
  RegisteredRoundTrip(*r, *s.node, /*allocate=*/true);
  auto region = r->AllocateMemory(3 << 20);
  REQUIRE(region.ok());
  CHECK(reinterpret_cast<uintptr_t>(region->base) % 4096 == 0);
  std::memset(region->base, 0x5A, region->bytes);  // all of it is writable
}

TEST_CASE("Router::AllocateMemory with an owner: the memory outlives UnregisterMemory and the router",
          "[router][zerocopy]") {
  Served s;
  auto r = s.RouterOver(std::shared_ptr<ShardChannel>(MakeInProcessChannel(s.node.get())));
  std::shared_ptr<std::byte> owner;
  auto region = r->AllocateMemory(1 << 20, &owner);
  REQUIRE(region.ok());
  CHECK(owner.get() == region->base);
  auto b = Bytes(65536, 9);
  PutItem p{Key(700), b, {}};
  REQUIRE(r->PutFrom(std::span(&p, 1)).ok());
  GetItem g{Key(700), {region->base + 4096, 65536}, 0, {}};
  REQUIRE(r->GetInto(std::span(&g, 1)).ok());
  REQUIRE(g.status.ok());
  REQUIRE(r->UnregisterMemory(region->id).ok());
  r.reset();  // the router is gone; the caller's owner still holds the memory
  CHECK(std::memcmp(owner.get() + 4096, b.data(), b.size()) == 0);
  std::memset(owner.get(), 0x11, 1 << 20);
  // Without an unregister, the router's end leaves the memory to the owner too.
  auto r2 = s.RouterOver(std::shared_ptr<ShardChannel>(MakeInProcessChannel(s.node.get())));
  std::shared_ptr<std::byte> owner2;
  auto region2 = r2->AllocateMemory(4096, &owner2);
  REQUIRE(region2.ok());
  r2.reset();
  std::memset(owner2.get(), 0x22, 4096);
  CHECK(owner2.get()[4095] == std::byte{0x22});
}

TEST_CASE("Registered memory over UCX_TLS=tcp: byte for byte, two-sided (no software RMA)", "[cluster][ucx][zerocopy]") {
  const char* old = std::getenv("UCX_TLS");
  std::string saved = old ? old : "";
  ::setenv("UCX_TLS", "tcp", 1);
  {
    Served s;
    auto r = s.RouterOver(s.Ucx());
    RegisteredRoundTrip(*r, *s.node);
    // Over tcp alone UCX would emulate gets and puts with messages, which
    // UCX 1.13 cannot survive a cut link with (UcxContext::software_rma_only).
    CHECK(s.ucx->one_sided_bytes() == 0);
  }
  if (old) ::setenv("UCX_TLS", saved.c_str(), 1);
  else ::unsetenv("UCX_TLS");
}

TEST_CASE("Registered memory over UCX to a node that encodes on put: staged, stored encoded, read decoded",
          "[cluster][ucx][zerocopy]") {
  Served s(R"(, "codec": {"codec": "fp16"})");
  auto r = s.RouterOver(s.Ucx());
  // fp16 of fp16 data is lossless: full raw blocks (layers x heads x tokens x dim x 2 x 2 bytes).
  const size_t block = s.config.model.FullBlockBytes();
  std::vector<std::byte> pool(4 * block);
  auto region = r->RegisterMemory(pool.data(), pool.size());
  REQUIRE(region.ok());
  std::mt19937 rng(3);
  auto* h = reinterpret_cast<uint16_t*>(pool.data());
  for (size_t i = 0; i < block / 2; ++i) h[i] = static_cast<uint16_t>(0x3C00 | (rng() & 0x3FF));  // finite fp16
  PutItem p{Key(300), {pool.data(), block}, {}};
  REQUIRE(r->PutFrom(std::span(&p, 1)).ok());
  REQUIRE(p.status.ok());
  GetItem g{Key(300), {pool.data() + 2 * block, block}, 0, {}};
  REQUIRE(r->GetInto(std::span(&g, 1)).ok());
  INFO(g.status.ToString());
  REQUIRE(g.status.ok());
  CHECK(g.size == block);
  CHECK(std::memcmp(pool.data(), pool.data() + 2 * block, block) == 0);
}

TEST_CASE("Registered memory over UCX: a StaleEpoch answer to GET_INTO / PUT_FROM refreshes the router's map once "
          "and the call lands", "[cluster][ucx][zerocopy][faults]") {
  Served s;
  auto ctx = UcxContext::Create(true);
  REQUIRE(ctx.ok());
  const uint64_t before = s.ucx->one_sided_bytes();
  StaleEpochRoundTrip(s, s.Ucx(*ctx));
  // The blocks that landed went one-sided: a PUT_FROM and two GET_INTOs of 64 KiB.
  CHECK(s.ucx->one_sided_bytes() - before >= 3 * 65536);
}

TEST_CASE("Registered memory over UCX: after UnregisterMemory the same memory works through the bounce path",
          "[cluster][ucx][zerocopy]") {
  Served s;
  auto ch = s.Ucx();
  std::vector<std::byte> mem(1 << 20);
  MemoryRegion reg{42, mem.data(), mem.size(), MemoryKind::kHost};
  REQUIRE(ch->RegisterMemory(reg).ok());
  auto data = Bytes(4096, 9);
  std::memcpy(mem.data(), data.data(), data.size());
  PutItem p{Key(400), {mem.data(), data.size()}, {}};
  REQUIRE(ch->Put(std::span(&p, 1), {}).ok());
  REQUIRE(p.status.ok());
  ch->UnregisterMemory(42);  // the node forgets it too; the next calls take the bounce path
  GetItem g{Key(400), {mem.data() + 8192, 8192}, 0, {}};
  REQUIRE(ch->Get(std::span(&g, 1), {}).ok());
  REQUIRE(g.status.ok());
  CHECK(std::memcmp(mem.data() + 8192, data.data(), data.size()) == 0);
}
#endif

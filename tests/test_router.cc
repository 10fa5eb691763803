#include <catch2/catch.hpp>

#include <cstring>
#include <atomic>
#include <numeric>

#include "cli/demo.h"
#include "coordinator/embedded/inproc_channel.h"
#include "kvmesh/embedded.h"
#include "router/shard_map.h"
#include "shard_node/shard_node.h"
#include "tests/test_data.h"
#include "transport/shard_channel.h"

using namespace kvmesh;

namespace {
ClusterConfig Config(int nodes, const char* host_budget = "8MiB") {
  return testing::NodesConfig(R"("model": {"model_id": "m", "num_layers": 2, "num_kv_heads": 2, "head_dim": 32,
                                          "block_tokens": 8, "num_experts": 4})",
                              nodes, host_budget);
}
std::vector<TokenId> Tokens(size_t n, TokenId base) {
  std::vector<TokenId> t(n);
  std::iota(t.begin(), t.end(), base);
  return t;
}
std::vector<ShardInfo> Nodes(int n) {
  std::vector<ShardInfo> v;
  for (int i = 0; i < n; ++i) v.push_back(ShardInfo{"node-" + std::to_string(i), 1.0, 0, "", {}});
  return v;
}
}  // namespace

TEST_CASE("Rendezvous placement: adding or removing one of N nodes moves ~1/N of keys and no others",
          "[placement]") {
  const int N = 8;
  const int K = 40000;
  auto before = ShardMap::Build(1, Nodes(N), {}, {}, 1).value();
  auto added = ShardMap::Build(2, Nodes(N + 1), {}, {}, 1).value();
  auto nodes = Nodes(N);
  nodes.erase(nodes.begin() + 3);
  auto removed = ShardMap::Build(3, nodes, {}, {}, 1).value();
  int moved_add = 0, moved_remove = 0, wrong = 0;
  std::vector<int> load(N, 0);
  for (int i = 0; i < K; ++i) {
    BlockKey k{static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull, static_cast<uint64_t>(i) ^ 0xabcdef};
    const std::string& b = before->nodes()[before->Primary(k, {})].id;
    const std::string& a = added->nodes()[added->Primary(k, {})].id;
    const std::string& r = removed->nodes()[removed->Primary(k, {})].id;
    ++load[before->Primary(k, {})];
    if (a != b) {
      ++moved_add;
      if (a != "node-8") ++wrong;  // a key may only move to the new node
    }
    if (r != b) {
      ++moved_remove;
      if (b != "node-3") ++wrong;  // only keys of the removed node may move
    }
  }
  CHECK(wrong == 0);
  CHECK(moved_add == Approx(K / (N + 1.0)).epsilon(0.08));
  CHECK(moved_remove == Approx(K / double(N)).epsilon(0.08));
  for (int l : load) CHECK(l == Approx(K / double(N)).epsilon(0.08));
}

TEST_CASE("Weighted rendezvous gives keys in proportion to weight", "[placement]") {
  auto nodes = Nodes(3);
  nodes[2].weight = 2.0;
  auto m = ShardMap::Build(1, nodes, {}, {}, 1).value();
  std::vector<int> load(3, 0);
  for (uint64_t i = 0; i < 40000; ++i) ++load[m->Primary(BlockKey{i * 7919, i}, {})];
  CHECK(load[2] == Approx(20000).epsilon(0.05));
  CHECK(load[0] == Approx(10000).epsilon(0.08));
}

TEST_CASE("Replicas are distinct nodes, best first", "[placement]") {
  auto m = ShardMap::Build(1, Nodes(5), {}, {}, 3).value();
  for (uint64_t i = 0; i < 1000; ++i) {
    BlockKey k{i, i * 31};
    uint32_t out[ShardMap::kMaxReplicas];
    REQUIRE(m->Place(k, {}, out) == 3);
    CHECK(out[0] == static_cast<uint32_t>(m->Primary(k, {})));
    CHECK(out[0] != out[1]);
    CHECK(out[1] != out[2]);
    CHECK(out[0] != out[2]);
  }
}

TEST_CASE("Expert-aware placement keeps a hinted block inside its group", "[placement]") {
  std::map<std::string, std::vector<std::string>> groups{{"a", {"node-0", "node-1"}}, {"b", {"node-2", "node-3"}}};
  std::vector<AffinityRule> rules{{Affinity::Kind::kExpert, {0, 4}, "a"}, {Affinity::Kind::kExpert, {4, 8}, "b"}};
  auto m = ShardMap::Build(1, Nodes(4), groups, rules, 1).value();
  for (uint64_t i = 0; i < 2000; ++i) {
    BlockKey k{i, ~i};
    int a = m->Primary(k, Affinity::Expert(2));
    int b = m->Primary(k, Affinity::Expert(6));
    CHECK((a == 0 || a == 1));
    CHECK((b == 2 || b == 3));
  }
  // An expert with no rule uses the whole cluster; a group whose nodes all died falls back too.
  CHECK(m->GroupFor(Affinity::Expert(100)).size() == 4);
  {
    auto alive = Nodes(4);
    alive.erase(alive.begin(), alive.begin() + 2);  // node-0 and node-1 died
    auto m2 = ShardMap::Build(2, alive, groups, rules, 1).value();
    CHECK(m2->GroupFor(Affinity::Expert(1)).size() == 2);
  }
}

TEST_CASE("Router on an embedded cluster: put, match_prefix, get, erase", "[router]") {
  auto cluster = EmbeddedCluster::Start(Config(4)).value();
  Router& r = cluster->router();
  const size_t bb = r.model().FullBlockBytes();
  auto prompt = Tokens(8 * 10 + 3, 100);  // 10 full blocks and a partial one
  auto keys = r.Keys(prompt);
  REQUIRE(keys.size() == 10);
  CHECK(*r.MatchPrefix(prompt) == 0);

  std::vector<std::vector<std::byte>> data(6, std::vector<std::byte>(bb));
  std::vector<std::span<const std::byte>> spans;
  for (size_t i = 0; i < 6; ++i) {
    FillBlock(keys[i], data[i]);
    spans.emplace_back(data[i]);
  }
  REQUIRE(r.Put(prompt, spans).ok());
  CHECK(*r.MatchPrefix(prompt) == 6);
  // A prompt that shares the first 3 blocks then diverges matches 3.
  auto other = prompt;
  other[8 * 3 + 1] = -5;
  CHECK(*r.MatchPrefix(other) == 3);

  std::vector<std::vector<std::byte>> out(7, std::vector<std::byte>(bb));
  std::vector<GetItem> items;
  for (size_t i = 0; i < 7; ++i) items.push_back(GetItem{keys[i], out[i], 0, {}});
  REQUIRE(r.GetBatch(items).ok());
  for (size_t i = 0; i < 6; ++i) {
    REQUIRE(items[i].status.ok());
    CHECK(out[i] == data[i]);
  }
  CHECK(items[6].status.code() == StatusCode::kNotFound);

  // Blocks spread over the nodes.
  size_t nodes_used = 0;
  for (size_t i = 0; i < cluster->num_nodes(); ++i) nodes_used += cluster->node(i).Stats().store.blocks > 0;
  CHECK(nodes_used >= 2);

  REQUIRE(r.Erase(std::span(keys).subspan(2, 1)).ok());
  CHECK(*r.MatchPrefix(prompt) == 2);
  // Release is a hint: every stored key is released on its node, nothing leaves.
  REQUIRE(r.Release(keys).ok());
  uint64_t released = 0;
  for (size_t i = 0; i < cluster->num_nodes(); ++i) released += cluster->node(i).Stats().store.releases;
  CHECK(released == 5);  // 0, 1, 3, 4, 5 (2 was erased, 6 never stored)
  CHECK(*r.MatchPrefix(prompt) == 2);
  CHECK(r.Get(keys[2]).status().code() == StatusCode::kNotFound);
  CHECK(*r.Get(keys[0]) == data[0]);

  auto st = r.Stats();
  CHECK(st.match_calls == 5);
  CHECK(st.put_blocks == 6);
}

TEST_CASE("Router: tenants with different salts never see each other's blocks", "[router]") {
  ClusterConfig c = Config(2);
  auto cluster = EmbeddedCluster::Start(c, RouterOptions{"tenant-a", 1000, {}}).value();
  RouterOptions ob{"tenant-b", 1000, {}};
  auto map = ShardMap::FromConfig(c).value();
  std::vector<std::shared_ptr<ShardChannel>> ch;
  for (size_t i = 0; i < cluster->num_nodes(); ++i) ch.push_back(MakeInProcessChannel(&cluster->node(i)));
  auto rb = Router::Create(c.model, map, ch, ob).value();
  auto prompt = Tokens(32, 1);
  std::vector<std::byte> blk(c.model.FullBlockBytes(), std::byte{7});
  std::vector<std::span<const std::byte>> spans(4, std::span<const std::byte>(blk));
  REQUIRE(cluster->router().Put(prompt, spans).ok());
  CHECK(*cluster->router().MatchPrefix(prompt) == 4);
  CHECK(*rb->MatchPrefix(prompt) == 0);
}

TEST_CASE("Router: a full embedded cluster evicts instead of failing, and reads stay byte-exact",
          "[router]") {
  auto cluster = EmbeddedCluster::Start(Config(2, "256KiB")).value();  // 2 x 16 blocks of 16 KiB... tiny
  DemoOptions o;
  o.workload.conversations = 40;
  o.workload.system_tokens_min = 64;
  o.workload.system_tokens_max = 128;
  o.progress = false;
  auto rep = RunDemo(cluster->router(), o);
  REQUIRE(rep.ok());
  CHECK(rep->mismatches == 0);
  CHECK(rep->put_errors == 0);
  CHECK(rep->matched_blocks > 0);
  uint64_t evictions = 0;
  for (size_t i = 0; i < cluster->num_nodes(); ++i) evictions += cluster->node(i).Stats().store.evictions;
  CHECK(evictions > 0);
}

TEST_CASE("Router: Put beyond the tokens' full blocks is an error", "[router]") {
  auto cluster = EmbeddedCluster::Start(Config(1)).value();
  std::vector<std::byte> blk(64);
  std::vector<std::span<const std::byte>> spans(3, std::span<const std::byte>(blk));
  CHECK(cluster->router().Put(Tokens(17, 0), spans).code() == StatusCode::kInvalidArgument);
}

namespace {
// Wraps a real channel; can play a dead node or a node on a newer epoch.
class FaultyChannel final : public ShardChannel {
 public:
  explicit FaultyChannel(std::unique_ptr<ShardChannel> inner) : inner_(std::move(inner)) {}
  std::atomic<bool> down{false};
  std::atomic<int> stale_answers{0};  // answer StaleEpoch this many times
  std::string_view transport() const override { return "faulty"; }
  Status Fail() {
    if (down) return Unavailable("node down");
    if (stale_answers > 0) {
      --stale_answers;
      return StaleEpoch("map is old");
    }
    return Status::Ok();
  }
  Status Put(std::span<PutItem> i, const RequestOptions& o) override { auto s = Fail(); return s.ok() ? inner_->Put(i, o) : s; }
  Status Get(std::span<GetItem> i, const RequestOptions& o) override { auto s = Fail(); return s.ok() ? inner_->Get(i, o) : s; }
  Status Exists(std::span<const BlockKey> k, std::span<uint8_t> f, bool t, const RequestOptions& o) override {
    auto s = Fail();
    return s.ok() ? inner_->Exists(k, f, t, o) : s;
  }
  Status Erase(std::span<const BlockKey> k, std::span<Status> st) override { auto s = Fail(); return s.ok() ? inner_->Erase(k, st) : s; }
  Status Pin(std::span<const BlockKey> k, std::span<Status> st) override { return inner_->Pin(k, st); }
  Status Unpin(std::span<const BlockKey> k, std::span<Status> st) override { return inner_->Unpin(k, st); }
  Status Release(std::span<const BlockKey> k, std::span<Status> st) override { return inner_->Release(k, st); }
  Result<std::string> StatsJson() override { return inner_->StatsJson(); }

 private:
  std::unique_ptr<ShardChannel> inner_;
};

struct FaultyCluster {
  std::vector<std::unique_ptr<ShardNode>> nodes;
  std::vector<std::shared_ptr<FaultyChannel>> faulty;
  std::unique_ptr<Router> router;
  FaultyCluster(int n, uint32_t replicas, RouterOptions ro = {}) {
    ClusterConfig c = Config(n);
    c.placement.replicas = replicas;
    std::vector<std::shared_ptr<ShardChannel>> ch;
    for (const NodeConfig& nc : c.nodes) {
      nodes.push_back(ShardNode::Create(c, nc.id).value());
      faulty.push_back(std::make_shared<FaultyChannel>(MakeInProcessChannel(nodes.back().get())));
      ch.push_back(faulty.back());
    }
    router = Router::Create(c.model, ShardMap::FromConfig(c).value(), ch, std::move(ro)).value();
  }
};
}  // namespace

TEST_CASE("Router: a dead node turns its keys into misses, never an error or a crash", "[router][faults]") {
  FaultyCluster fc(3, 1);
  Router& r = *fc.router;
  auto prompt = Tokens(8 * 30, 7);
  std::vector<std::byte> blk(r.model().FullBlockBytes(), std::byte{9});
  std::vector<std::span<const std::byte>> spans(30, std::span<const std::byte>(blk));
  REQUIRE(r.Put(prompt, spans).ok());
  REQUIRE(*r.MatchPrefix(prompt) == 30);
  fc.faulty[1]->down = true;
  auto keys = r.Keys(prompt);
  size_t first_dead = 0;
  auto map = ShardMap::FromConfig(Config(3)).value();
  while (map->Primary(keys[first_dead], {}) != 1) ++first_dead;
  auto m = r.MatchPrefix(prompt);
  REQUIRE(m.ok());
  CHECK(*m == first_dead);  // the prefix stops at the first block on the dead node
  std::vector<std::byte> out(blk.size());
  auto g = r.Get(keys[first_dead]);
  CHECK(IsMiss(g.status()));
  CHECK(r.Stats().node_errors > 0);
  fc.faulty[1]->down = false;
  CHECK(*r.MatchPrefix(prompt) == 30);  // the node is back with its blocks
}

TEST_CASE("Router: with replicas a dead primary is read from the next replica", "[router][faults]") {
  FaultyCluster fc(3, 2);
  Router& r = *fc.router;
  auto prompt = Tokens(8 * 20, 3);
  std::vector<std::vector<std::byte>> data(20, std::vector<std::byte>(r.model().FullBlockBytes()));
  std::vector<std::span<const std::byte>> spans;
  auto keys = r.Keys(prompt);
  for (size_t i = 0; i < 20; ++i) {
    FillBlock(keys[i], data[i]);
    spans.emplace_back(data[i]);
  }
  REQUIRE(r.Put(prompt, spans).ok());
  uint64_t stored = 0;
  for (auto& n : fc.nodes) stored += n->Stats().store.blocks;
  CHECK(stored == 40);  // two copies of each block
  fc.faulty[0]->down = true;
  CHECK(*r.MatchPrefix(prompt) == 20);
  for (size_t i = 0; i < 20; ++i) {
    auto g = r.Get(keys[i]);
    REQUIRE(g.ok());
    CHECK(*g == data[i]);
  }
}

TEST_CASE("Router: a StaleEpoch answer triggers one refresh and a retry", "[router][faults]") {
  int refreshes = 0;
  RouterOptions ro;
  ro.refresh = [&](Router&) {
    ++refreshes;
    return Status::Ok();
  };
  FaultyCluster fc(2, 1, ro);
  Router& r = *fc.router;
  auto prompt = Tokens(8 * 4, 1);
  std::vector<std::byte> blk(r.model().FullBlockBytes(), std::byte{1});
  std::vector<std::span<const std::byte>> spans(4, std::span<const std::byte>(blk));
  REQUIRE(r.Put(prompt, spans).ok());
  for (auto& f : fc.faulty) f->stale_answers = 1;
  CHECK(*r.MatchPrefix(prompt) == 4);  // first pass refused, refreshed, retried
  CHECK(refreshes == 1);
}

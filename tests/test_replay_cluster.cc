// `kvmesh replay --through-cluster` (cli/replay_cluster.h): a trace replayed
// through an embedded cluster's nodes, checked against the replay of the
// policy object alone where the two must agree, and the router's
// deepest-first order that makes a chain's deepest block leave first.
#include <catch2/catch.hpp>

#include <filesystem>
#include <list>
#include <numeric>
#include <sstream>
#include <unordered_map>

#include "cli/replay_cluster.h"
#include "kvmesh/embedded.h"
#include "shard_node/shard_node.h"

using namespace kvmesh;

namespace {

ClusterConfig OneNode(int stripes, const std::string& policy, const std::string& host = "8MiB") {
  auto c = ParseConfig(R"({"model": {"model_id": "m", "num_layers": 2, "num_kv_heads": 2, "head_dim": 32,
                                     "block_tokens": 8},
                          "nodes": [{"id": "n0", "memory": {"host": ")" + host + R"("}}],
                          "store": {"stripes": )" + std::to_string(stripes) + R"(, "size_classes": 1},
                          "eviction": {"policy": ")" + policy + R"("}})");
  REQUIRE(c.ok());
  return *c;
}

Trace Parse(const std::string& jsonl) {
  std::istringstream in(jsonl);
  auto t = ParseMooncakeTrace(in, "inline");
  REQUIRE(t.ok());
  return *t;
}

}  // namespace

// What one node with one LRU stripe must do with a trace, written out: per
// request, the router's MatchPrefix refreshes the cached blocks deepest first
// and counts the leading run; Put then stores the blocks from the first miss
// on, deepest first (a block already there is refreshed).
uint64_t LruThroughRouter(const Trace& t, size_t capacity) {
  std::list<uint32_t> lru;  // front: next to leave
  std::unordered_map<uint32_t, std::list<uint32_t>::iterator> at;
  auto touch = [&](uint32_t b) { lru.splice(lru.end(), lru, at[b]); };
  uint64_t prefix_hits = 0;
  for (size_t r = 0; r < t.requests(); ++r) {
    const size_t first = t.begin[r], n = t.begin[r + 1] - first;
    for (size_t i = n; i-- > 0;)
      if (at.count(t.blocks[first + i])) touch(t.blocks[first + i]);
    size_t h = 0;
    while (h < n && at.count(t.blocks[first + h])) ++h;
    prefix_hits += h;
    for (size_t i = n; i-- > h;) {
      const uint32_t b = t.blocks[first + i];
      if (at.count(b)) {
        touch(b);
        continue;
      }
      if (lru.size() == capacity) {
        at.erase(lru.front());
        lru.pop_front();
      }
      at[b] = lru.insert(lru.end(), b);
    }
  }
  return prefix_hits;
}

TEST_CASE("Through one node with one stripe, lru hits exactly where an LRU driven as the router drives it does",
          "[replay][cluster]") {
  // The held-out chat trace (tests/data/traces): the cluster path (router,
  // in-process channel, node, block store, policy) adds nothing and loses
  // nothing against the same LRU written out above.
  auto t = LoadMooncakeTrace(std::string(KVMESH_TRACE_DIR) + "/heldout-chat-s102.jsonl");
  REQUIRE(t.ok());
  ReplayOptions o;
  o.derive_hints = false;
  for (size_t cap : {77, 387}) {
    INFO("capacity " << cap);
    auto node = cli::ReplayThroughCluster(*t, "lru", cap, OneNode(1, "lru"), o);
    REQUIRE(node.ok());
    CHECK(node->lookups == t->lookups());
    CHECK(node->prefix_hits == LruThroughRouter(*t, cap));
    CHECK(node->evictions > 0);
    // Deepest first is leaf-first: it never does worse here than the
    // replay's LRU, which refreshes and inserts in chain order.
    auto alone = ReplayPolicy(*t, "lru", cap, o);
    REQUIRE(alone.ok());
    CHECK(node->prefix_hits >= alone->prefix_hits);
  }
  // Stripes split the capacity between independent policies: still a cache.
  auto striped = cli::ReplayThroughCluster(*t, "lru", 387, OneNode(8, "adaptive"), o);
  REQUIRE(striped.ok());
  CHECK(striped->prefix_hits > 0);
}

TEST_CASE("Through a cluster, a closed session's private blocks are released on the nodes and leave first",
          "[replay][cluster]") {
  // Capacity 4. Session 1 reads blocks 3, 4 and stays open; session 2 reads
  // 1, 2 and closes at once; request 3 (session 3) needs two slots; session 1
  // comes back. Told of the close, the nodes evict session 2's blocks, so
  // session 1 finds its prefix; without it, LRU evicts session 1's older ones.
  const Trace t = Parse(R"({"timestamp": 0, "input_length": 1024, "output_length": 0, "hash_ids": [3, 4], "session": 1}
{"timestamp": 1000, "input_length": 1024, "output_length": 0, "hash_ids": [1, 2], "session": 2, "closes": true}
{"timestamp": 2000, "input_length": 1024, "output_length": 0, "hash_ids": [5, 6], "session": 3, "closes": true}
{"timestamp": 3000, "input_length": 1536, "output_length": 0, "hash_ids": [3, 4, 7], "session": 1, "closes": true}
)");
  ReplayOptions o;
  o.derive_hints = false;
  auto plain = cli::ReplayThroughCluster(t, "lru", 4, OneNode(1, "lru"), o);
  o.session_closes = true;
  auto told = cli::ReplayThroughCluster(t, "lru", 4, OneNode(1, "lru"), o);
  auto alone = ReplayPolicy(t, "lru", 4, o);
  REQUIRE(plain.ok());
  REQUIRE(told.ok());
  REQUIRE(alone.ok());
  CHECK(plain->prefix_hits == 0);
  CHECK(plain->released == 0);
  CHECK(told->prefix_hits == 2);
  CHECK(told->released == 4);  // the nodes' count: 1 and 2 (session 2), then 5 and 6 (session 3)
  CHECK(alone->prefix_hits == 2);
}

TEST_CASE("Through four nodes, adaptive's stripes follow one expert over the whole cluster", "[replay][cluster]") {
  // Four nodes of one stripe each, the held-out RAG trace at 1% and 2% of
  // its blocks. Each node's adaptive alone (before the nodes shared their
  // policy groups) chose its own expert and hit less than lru: 8.63 against
  // 9.31% and 18.01 against 19.41%. Deciding on the cluster's summed scores,
  // it is at least lru (docs/eviction.md "Through the nodes").
  auto t = LoadMooncakeTrace(std::string(KVMESH_TRACE_DIR) + "/heldout-rag-s104.jsonl");
  REQUIRE(t.ok());
  auto c = ParseConfig(R"({"model": {"model_id": "m", "num_layers": 1, "num_kv_heads": 1, "head_dim": 32,
                                     "block_tokens": 2},
                          "nodes": [{"id": "a", "memory": {"host": "1MiB"}}, {"id": "b", "memory": {"host": "1MiB"}},
                                    {"id": "c", "memory": {"host": "1MiB"}}, {"id": "d", "memory": {"host": "1MiB"}}],
                          "store": {"stripes": 1, "size_classes": 1}})");
  REQUIRE(c.ok());
  ReplayOptions o;
  o.derive_hints = false;
  for (double f : {0.01, 0.02}) {
    const size_t cap = static_cast<size_t>(f * static_cast<double>(t->distinct));
    INFO("capacity " << cap);
    auto lru = cli::ReplayThroughCluster(*t, "lru", cap, *c, o);
    auto adaptive = cli::ReplayThroughCluster(*t, "adaptive", cap, *c, o);
    REQUIRE(lru.ok());
    REQUIRE(adaptive.ok());
    CHECK(adaptive->prefix_hits >= lru->prefix_hits);
  }
  // One process: the nodes share one set of groups, one group per class.
  auto cluster = EmbeddedCluster::Start(*c).value();
  CHECK(&cluster->node(0).policy_groups() == &cluster->node(3).policy_groups());
}

TEST_CASE("The router refreshes and stores a chain deepest block first, so LRU evicts it first",
          "[router][eviction]") {
  // Three blocks of room, one stripe, LRU: a two-block chain, then two
  // one-block requests. The chain's deepest block is the oldest, so it leaves
  // first and the chain keeps its first block (evicting the first block
  // would have stranded the second: a miss at block 0 voids it).
  auto cluster = EmbeddedCluster::Start(OneNode(1, "lru", "12KiB")).value();  // 3 blocks of 4 KiB
  Router& r = cluster->router();
  const size_t bb = r.model().FullBlockBytes();
  REQUIRE(bb == 4096);
  std::vector<std::byte> data(bb, std::byte{1});
  auto tokens = [](TokenId base, size_t blocks) {
    std::vector<TokenId> v(blocks * 8);
    std::iota(v.begin(), v.end(), base);
    return v;
  };
  const auto chain = tokens(100, 2), x = tokens(500, 1), y = tokens(900, 1);
  std::vector<std::span<const std::byte>> two{data, data}, one{data};
  REQUIRE(r.Put(chain, two).ok());
  REQUIRE(r.Put(x, one).ok());
  CHECK(r.MatchPrefix(chain).value() == 2);  // refreshed: block 0 the most recent of all
  REQUIRE(r.Put(y, one).ok());                // evicts the oldest: x
  CHECK(r.MatchPrefix(x).value() == 0);
  CHECK(r.MatchPrefix(chain).value() == 2);
  REQUIRE(r.Put(x, one).ok());                // evicts the oldest: y
  REQUIRE(r.Put(y, one).ok());                // evicts the chain's deepest block, not its first
  CHECK(r.MatchPrefix(x).value() == 1);
  CHECK(r.MatchPrefix(chain).value() == 1);
}

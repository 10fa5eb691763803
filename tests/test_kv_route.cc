// KV-aware routing end to end in one process: four shard nodes, each the
// node beside one engine instance, publish their KV events ($.events); a
// KvEventSubscriber feeds a KvIndex; Route picks the instance with the
// longest cached prefix of a request and, when prefixes tie, the one with
// less load. Sessions overlap (a shared system prompt, then each session's
// own turns), blocks move down the tiers and are erased, and the index
// follows.
#include <catch2/catch.hpp>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "coordinator/kv_subscriber.h"
#include "kvmesh/block_key.h"
#include "kvmesh/config.h"
#include "kvmesh/kv_route.h"
#include "kvmesh/kvmesh.h"
#include "shard_node/shard_node.h"
#include "tests/test_time.h"

using namespace kvmesh;

namespace {

// 128-byte blocks of 4 tokens; each node 1 MiB of device budget (host memory here).
constexpr const char* kConfig = R"({
  "model": {"model_id": "route", "num_layers": 1, "num_kv_heads": 1, "head_dim": 8, "dtype": "fp16", "block_tokens": 4},
  "nodes": [{"id": "e0", "memory": {"host": "1MiB"}}, {"id": "e1", "memory": {"host": "1MiB"}},
            {"id": "e2", "memory": {"host": "1MiB"}}, {"id": "e3", "memory": {"host": "1MiB"}}],
  "store": {"stripes": 1, "slot_bytes": 128, "size_classes": 1},
  "events": {"enabled": true, "max_batch_events": 8}
})";

std::vector<TokenId> Tokens(uint32_t first, size_t n) {
  std::vector<TokenId> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = first + static_cast<TokenId>(i);
  return t;
}

std::vector<TokenId> Concat(std::vector<TokenId> a, const std::vector<TokenId>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

struct Fleet {
  ClusterConfig config;
  std::vector<std::unique_ptr<ShardNode>> nodes;
  std::vector<std::string> names{"e0", "e1", "e2", "e3"};
  KvIndex index;
  std::unique_ptr<KvEventSubscriber> sub;
  KeyDeriver keys{"route", "", 4};

  Fleet() {
    auto c = ParseConfig(kConfig);
    REQUIRE(c.ok());
    config = *c;
    std::vector<KvEventSource> sources;
    for (const std::string& n : names) {
      auto node = ShardNode::Create(config, n);
      REQUIRE(node.ok());
      KvEventPublisher* ev = (*node)->events();
      REQUIRE(ev != nullptr);
      sources.push_back({n, "tcp://127.0.0.1:" + std::to_string(ev->port()),
                         "tcp://127.0.0.1:" + std::to_string(ev->replay_port()), ""});
      nodes.push_back(std::move(node).value());
    }
    auto s = KvEventSubscriber::Start(&index, sources);
    REQUIRE(s.ok());
    sub = std::move(s).value();
  }
  std::vector<BlockKey> KeysOf(const std::vector<TokenId>& tokens) const {
    std::vector<BlockKey> k;
    keys.ChainKeys(tokens, &k);
    return k;
  }
  // Engine i has computed (and stored in its node) the first `blocks` blocks of `tokens`.
  void Store(size_t i, const std::vector<TokenId>& tokens, size_t blocks) {
    std::vector<std::byte> payload(128, std::byte{7});
    std::vector<BlockKey> k = KeysOf(tokens);
    REQUIRE(blocks <= k.size());
    for (size_t b = 0; b < blocks; ++b) REQUIRE(nodes[i]->Put(k[b], payload, {}).ok());
  }
  // Waits until the subscriber has applied every batch each node numbered.
  void Sync() {
    const auto end = std::chrono::steady_clock::now() + testing::TimeBound(std::chrono::seconds(10));
    while (std::chrono::steady_clock::now() < end) {
      bool all = true;
      for (size_t i = 0; i < nodes.size(); ++i) {
        const KvEventStats s = nodes[i]->events()->Stats();
        // The publisher drains every 2 ms: wait until it has nothing queued
        // (two equal reads) and the subscriber has its last batch.
        if (sub->last_seq(names[i]) != static_cast<int64_t>(s.batches + s.gaps) - 1) all = false;
      }
      if (all) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        bool still = true;
        for (size_t i = 0; i < nodes.size(); ++i) {
          const KvEventStats s = nodes[i]->events()->Stats();
          if (sub->last_seq(names[i]) != static_cast<int64_t>(s.batches + s.gaps) - 1) still = false;
        }
        if (still) return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    FAIL("the subscriber did not catch up with the nodes");
  }
  std::vector<PrefixMatch> Route(const std::vector<TokenId>& tokens) {
    std::vector<BlockKey> k = KeysOf(tokens);
    return index.Route(k, names);
  }
};

const PrefixMatch& Of(const std::vector<PrefixMatch>& r, const std::string& name) {
  for (const PrefixMatch& m : r)
    if (m.instance == name) return m;
  FAIL("no match for " << name);
  return r.front();
}

}  // namespace

TEST_CASE("route picks the engine with the longest cached prefix, then the least loaded", "[kv_route]") {
  Fleet f;
  const std::vector<TokenId> system = Tokens(1000, 16);                  // 4 blocks every session shares
  const std::vector<TokenId> a = Concat(system, Tokens(2000, 24));       // session A: 10 blocks
  const std::vector<TokenId> b = Concat(system, Tokens(3000, 24));       // session B: 10 blocks
  const std::vector<TokenId> c = Concat(system, Tokens(4000, 24));       // session C: new
  f.Store(0, a, 10);  // e0 served session A's whole history
  f.Store(1, a, 6);   // e1 served its first turn
  f.Store(1, b, 8);   // ... and most of B
  f.Store(2, b, 8);   // e2 as much of B as e1
  f.Store(3, system, 4);  // e3 only the system prompt
  f.Sync();

  SECTION("longest prefix wins") {
    std::vector<PrefixMatch> r = f.Route(a);
    REQUIRE(r.size() == 4);
    CHECK(r[0].instance == "e0");
    CHECK(r[0].blocks == 10);
    CHECK(Of(r, "e1").blocks == 6);
    CHECK(Of(r, "e2").blocks == 4);  // B's blocks share only the system prompt with A
    CHECK(Of(r, "e3").blocks == 4);
    CHECK(r[0].gpu_blocks == 10);
  }
  SECTION("a tie on prefix falls back to load") {
    REQUIRE(f.index.SetLoad("e1", 0.3).ok());
    REQUIRE(f.index.SetLoad("e2", 0.1).ok());
    std::vector<PrefixMatch> r = f.Route(b);
    CHECK(r[0].instance == "e2");
    CHECK(r[1].instance == "e1");
    CHECK(r[0].blocks == 8);
    CHECK(r[1].blocks == 8);
    REQUIRE(f.index.SetLoad("e1", 0.0).ok());
    REQUIRE(f.index.SetLoad("e2", 0.3).ok());
    r = f.Route(b);
    CHECK(r[0].instance == "e1");
    // A new session: every engine has the system prompt but e0..e2 are busier than e3.
    REQUIRE(f.index.SetLoad("e0", 0.5).ok());
    REQUIRE(f.index.SetLoad("e1", 0.4).ok());
    r = f.Route(c);
    CHECK(r[0].instance == "e3");
    CHECK(r[0].blocks == 4);
  }
  SECTION("removed blocks leave the index") {
    std::vector<BlockKey> k = f.KeysOf(a);
    REQUIRE(f.nodes[0]->Erase(k[5]).ok());  // e0's prefix of A now ends after 5 blocks
    f.Sync();
    std::vector<PrefixMatch> r = f.Route(a);
    CHECK(r[0].instance == "e1");
    CHECK(r[0].blocks == 6);
    CHECK(Of(r, "e0").blocks == 5);
  }
  f.sub->Stop();
}

TEST_CASE("a subscriber that missed batches catches up by replay and by snapshot", "[kv_route]") {
  auto c = ParseConfig(kConfig);
  REQUIRE(c.ok());
  ClusterConfig cfg = *c;
  cfg.events.replay_buffer = 4;
  // One block a batch: a snapshot answer lists at most 64 blocks
  // (KvEventPublisher::kSnapshotBatchesPerAnswer batches), so the snapshot
  // of 149 blocks takes three answers, two of them continuations.
  cfg.events.max_batch_events = 1;
  auto node = ShardNode::Create(cfg, "e0");
  REQUIRE(node.ok());
  KvEventPublisher* ev = (*node)->events();
  KeyDeriver keys("route", "", 4);
  std::vector<BlockKey> k;
  keys.ChainKeys(Tokens(1, 4 * 150), &k);
  std::vector<std::byte> payload(128, std::byte{1});
  // Stored before anyone subscribed: 150 blocks in 150 batches, more than
  // the replay buffer keeps, so the subscriber must take a snapshot.
  for (const BlockKey& key : k) REQUIRE((*node)->Put(key, payload, {}).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  KvIndex index;
  auto sub = KvEventSubscriber::Start(
      &index, {{"e0", "tcp://127.0.0.1:" + std::to_string(ev->port()),
                "tcp://127.0.0.1:" + std::to_string(ev->replay_port()), ""}});
  REQUIRE(sub.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the SUB connection is up
  REQUIRE((*node)->Erase(k[10]).ok());  // a live batch reveals the gap
  const auto end = std::chrono::steady_clock::now() + testing::TimeBound(std::chrono::seconds(10));
  const std::vector<std::string> names{"e0"};
  while (std::chrono::steady_clock::now() < end && index.Route(k, names)[0].blocks != 10)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::vector<PrefixMatch> r = index.Route(k, names);
  CHECK(r[0].blocks == 10);
  CHECK((*sub)->Stats().snapshots >= 1);
  CHECK((*sub)->Stats().snapshot_continuations >= 2);
  CHECK(index.blocks() == 149);
  (*sub)->Stop();
}

TEST_CASE("the C ABI applies a batch in vLLM's format and routes", "[kv_route]") {
  kvmesh_kv_index* x = nullptr;
  REQUIRE(kvmesh_kv_index_create(&x) == KVMESH_OK);
  KeyDeriver keys("route", "", 4);
  std::vector<BlockKey> k;
  keys.ChainKeys(Tokens(5000, 32), &k);  // 8 blocks
  // A payload packed by hand from the documented format: e1 holds 5 blocks in GPU.
  std::string payload;
  auto put = [&](unsigned char b) { payload.push_back(static_cast<char>(b)); };
  put(0x92);  // [ts, events]
  put(0xcb);  // float64 ts
  for (int i = 0; i < 8; ++i) put(0);
  put(0x91);  // one event
  put(0x98);  // BlockStored: 8 fields
  put(0xab);  // str of 11
  payload += "BlockStored";
  put(0x95);  // five hashes
  for (int b = 0; b < 5; ++b) {
    put(0xc4);  // bin 8
    put(16);
    for (int s = 56; s >= 0; s -= 8) put(static_cast<unsigned char>(k[b].hi >> s));
    for (int s = 56; s >= 0; s -= 8) put(static_cast<unsigned char>(k[b].lo >> s));
  }
  put(0xc0);  // parent
  put(0x90);  // token_ids []
  put(4);     // block_size
  put(0xc0);  // lora_id
  put(0xa3);
  payload += "GPU";
  put(0xc0);  // lora_name
  REQUIRE(kvmesh_kv_index_apply_batch(x, "e1", payload.data(), payload.size()) == KVMESH_OK);
  CHECK(kvmesh_kv_index_apply_batch(x, "e1", "\xc1", 1) == KVMESH_INVALID_ARGUMENT);
  std::vector<kvmesh_key> ck;
  for (const BlockKey& b : k) ck.push_back({b.hi, b.lo});
  const char* cands[] = {"e0", "e1"};
  kvmesh_prefix_match out[2];
  REQUIRE(kvmesh_kv_index_route(x, ck.data(), ck.size(), cands, 2, out) == KVMESH_OK);
  CHECK(out[0].candidate == 1);
  CHECK(out[0].blocks == 5);
  CHECK(out[1].blocks == 0);
  REQUIRE(kvmesh_kv_index_set_load(x, "e1", 2.0) == KVMESH_OK);  // clamped to 1
  REQUIRE(kvmesh_kv_index_route(x, ck.data(), ck.size(), cands, 2, out) == KVMESH_OK);
  CHECK(out[0].candidate == 1);
  CHECK(out[0].load == 1.0);
  kvmesh_kv_index_free(x);
}

TEST_CASE("approximate mode infers residency from routing history with a TTL", "[kv_route]") {
  RouteWeights w;
  w.approx_ttl_s = 10;
  KvIndex index(w);
  KeyDeriver keys("route", "", 4);
  std::vector<BlockKey> system, turn1, turn2;
  const std::vector<TokenId> t1 = Concat(Tokens(7000, 16), Tokens(9100, 12));
  keys.ChainKeys(Tokens(7000, 16), &system);  // 4 blocks
  keys.ChainKeys(t1, &turn1);                 // 7 blocks, the system prompt first
  keys.ChainKeys(Concat(t1, Tokens(9300, 8)), &turn2);  // 9 blocks, turn 1 first
  const std::vector<std::string> names = {"e0", "e1", "e2", "e3"};
  std::vector<PrefixMatch> r;
  index.Route(turn2, names, &r, 100.0);
  CHECK(r[0].blocks == 0);  // nothing routed yet
  REQUIRE(index.Routed("e2", turn1, 100.0).ok());
  REQUIRE(index.Routed("e1", system, 101.0).ok());
  REQUIRE(index.SetLoad("e3", 0.5).ok());
  index.Route(turn2, names, &r, 105.0);
  REQUIRE(r.size() == 4);
  CHECK(r[0].instance == "e2");
  CHECK(r[0].blocks == 7);
  CHECK(r[0].gpu_blocks == 7);  // approximate residency is the device tier
  CHECK(r[1].instance == "e1");
  CHECK(r[1].blocks == 4);
  CHECK(r[2].instance == "e0");  // idle e0 before loaded e3: both hold nothing
  CHECK(r[3].instance == "e3");
  // Past e2's TTL (routed at 100, ttl 10), before e1's (101): e1 leads.
  index.Route(turn2, names, &r, 110.5);
  CHECK(r[0].instance == "e1");
  CHECK(r[0].blocks == 4);
  CHECK(r[1].blocks == 0);
  // Routing again refreshes: turn 2 to e2 at 111.
  REQUIRE(index.Routed("e2", turn2, 111.0).ok());
  index.Route(turn2, names, &r, 120.0);
  CHECK(r[0].instance == "e2");
  CHECK(r[0].blocks == 9);
  // Events and routing history combine: e3's node reports the system prompt
  // in CPU; at 125 every routed block has expired.
  REQUIRE(index.Stored("e3", KvTier::kCpu, system).ok());
  REQUIRE(index.SetLoad("e3", 0).ok());
  index.Route(turn2, names, &r, 115.0);
  CHECK(r[0].instance == "e2");  // 9 routed (GPU) blocks beat e3's 4 CPU blocks
  CHECK(r[1].instance == "e3");
  index.Route(turn2, names, &r, 125.0);
  CHECK(r[0].instance == "e3");
  CHECK(r[0].cpu_blocks == 4);
  CHECK(r[0].gpu_blocks == 0);
  CHECK(r[1].blocks == 0);
  CHECK(index.approx_entries() == 4 + 9);  // e1's system prompt, e2's turn 2 (turn 1's keys refreshed in place)
  // Without a TTL, approximate mode is off.
  KvIndex exact;
  CHECK(exact.Routed("e0", system).code() == StatusCode::kFailedPrecondition);
  // The C ABI.
  kvmesh_kv_index* x = nullptr;
  REQUIRE(kvmesh_kv_index_create_approximate(&x, 30.0) == KVMESH_OK);
  std::vector<kvmesh_key> ck;
  for (const BlockKey& b : turn1) ck.push_back({b.hi, b.lo});
  REQUIRE(kvmesh_kv_index_routed(x, "e1", ck.data(), 5) == KVMESH_OK);
  const char* cands[] = {"e0", "e1"};
  kvmesh_prefix_match out[2];
  REQUIRE(kvmesh_kv_index_route(x, ck.data(), ck.size(), cands, 2, out) == KVMESH_OK);
  CHECK(out[0].candidate == 1);
  CHECK(out[0].gpu_blocks == 5);
  CHECK(kvmesh_kv_index_create_approximate(&x, 0) == KVMESH_INVALID_ARGUMENT);
  kvmesh_kv_index_free(x);
}

TEST_CASE("events dropped by a full ring show as a gap that a snapshot fills", "[kv_route]") {
  auto c = ParseConfig(kConfig);
  REQUIRE(c.ok());
  ClusterConfig cfg = *c;
  cfg.events.queue_events = 16;  // the store path outruns the publisher at once
  auto node = ShardNode::Create(cfg, "e0");
  REQUIRE(node.ok());
  KvEventPublisher* ev = (*node)->events();
  KvIndex index;
  auto sub = KvEventSubscriber::Start(
      &index, {{"e0", "tcp://127.0.0.1:" + std::to_string(ev->port()),
                "tcp://127.0.0.1:" + std::to_string(ev->replay_port()), ""}});
  REQUIRE(sub.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  KeyDeriver keys("route", "", 4);
  std::vector<BlockKey> k;
  std::vector<std::byte> payload(128, std::byte{3});
  // Bursts of puts until the ring has overflowed (the publisher drains every
  // 2 ms; a burst of 2000 puts usually outruns it at once).
  for (uint32_t round = 0; round < 20 && ev->Stats().dropped == 0; ++round) {
    keys.ChainKeys(Tokens(100000 * round + 9, 4 * 2000), &k);
    for (const BlockKey& key : k) REQUIRE((*node)->Put(key, payload, {}).ok());
  }
  for (size_t i = 0; i < k.size(); i += 3) REQUIRE((*node)->Erase(k[i]).ok());
  REQUIRE(ev->Stats().dropped > 0);
  const size_t held = (*node)->store().Stats().blocks;
  const auto end = std::chrono::steady_clock::now() + testing::TimeBound(std::chrono::seconds(10));
  while (std::chrono::steady_clock::now() < end && index.blocks() != held)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  CHECK(index.blocks() == held);
  CHECK(ev->Stats().gaps > 0);
  CHECK((*sub)->Stats().snapshots >= 1);
  const std::vector<std::string> names{"e0"};
  CHECK(index.Route(k, names)[0].blocks == 0);  // k[0] was erased
  std::vector<BlockKey> from1(k.begin() + 1, k.end());
  CHECK(index.Route(from1, names)[0].blocks == 2);  // k[1], k[2], then k[3] erased
  (*sub)->Stop();
}

// ShardNode's per-block operations (Exists, Pin, Unpin, Erase, Put with and
// without replace, GetInto) answer the same whether the node serves from one
// block store or from its tiers, and with tiers for blocks in any tier.
#include <catch2/catch.hpp>

#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kvmesh/config.h"
#include "shard_node/shard_node.h"
#include "shard_node/tiered_store.h"
#include "tests/test_data.h"

using namespace kvmesh;

namespace {

using testing::TempDir;

// 16 KiB blocks (2 layers x K,V x 2 heads x 16 tokens x 64 dims, fp16). With
// tiers: device 8 blocks, host 8, SSD the rest; without: 32 blocks of host
// memory. The background worker offloads above the high watermark, so an
// unpinned block may change tiers at any time: the checks hold in any tier.
std::string Config(const std::string& memory) {
  return R"({"model": {"model_id": "ops", "num_layers": 2, "num_kv_heads": 2, "head_dim": 64, "dtype": "fp16",
                       "block_tokens": 16},
             "nodes": [{"id": "n0", "memory": )" +
         memory + R"(}],
             "store": {"stripes": 1},
             "eviction": {"tiers": {"interval_ms": 5}}})";
}

BlockKey Key(uint64_t i) { return BlockKey{0x2000 + i, i * 0x9E3779B97F4A7C15ull + 3}; }

std::vector<std::byte> Payload(uint64_t seed, size_t n) { return testing::RandomBytes(seed, n); }

// The operations on block `i` (stored with Payload(100 + i)), which the node
// holds unpinned; Key(999) is stored nowhere.
void CheckOperations(ShardNode& n, uint64_t i, size_t block) {
  INFO("block " << i);
  std::vector<std::byte> buf(block);
  CHECK(n.Exists(Key(i), false));
  CHECK_FALSE(n.Exists(Key(999), false));

  // Pinned, the block stays where it is (the primary tier, with tiers): a
  // put of its key keeps the stored bytes.
  REQUIRE(n.Pin(Key(i)).ok());
  REQUIRE(n.Put(Key(i), Payload(7, block), PutOptions{}).ok());
  REQUIRE(n.GetInto(Key(i), buf).value() == block);
  CHECK(buf == Payload(100 + i, block));
  CHECK(n.Unpin(Key(i)).ok());
  CHECK(n.Unpin(Key(i)).code() == StatusCode::kFailedPrecondition);
  CHECK(n.Pin(Key(999)).code() == StatusCode::kNotFound);

  // Replace overwrites the stored bytes.
  PutOptions replace;
  replace.replace = true;
  REQUIRE(n.Put(Key(i), Payload(7, block), replace).ok());
  REQUIRE(n.GetInto(Key(i), buf).value() == block);
  CHECK(buf == Payload(7, block));

  CHECK(n.Erase(Key(i)).ok());
  CHECK_FALSE(n.Exists(Key(i), false));
  CHECK(n.Erase(Key(i)).code() == StatusCode::kNotFound);
  CHECK(n.GetInto(Key(i), buf).status().code() == StatusCode::kNotFound);
}

}  // namespace

TEST_CASE("A shard node without tiers answers the block operations from its store", "[node]") {
  auto c = ParseConfig(Config(R"({"host": "512KiB"})"));
  REQUIRE(c.ok());
  auto node = ShardNode::Create(*c, "n0");
  REQUIRE(node.ok());
  ShardNode& n = **node;
  REQUIRE(n.tiers() == nullptr);
  const size_t block = c->model.FullBlockBytes();
  for (uint64_t i = 0; i < 4; ++i) REQUIRE(n.Put(Key(i), Payload(100 + i, block), PutOptions{}).ok());
  for (uint64_t i = 0; i < 4; ++i) CheckOperations(n, i, block);
  CHECK(n.Stats().store.blocks == 0);
}

TEST_CASE("A shard node with tiers answers the block operations for blocks in every tier", "[node][tiers]") {
  TempDir dir;
  auto c = ParseConfig(Config(R"({"device": "128KiB", "host": "128KiB", "ssd": "640KiB", "ssd_path": ")" +
                              dir.path.string() + R"("})"));
  REQUIRE(c.ok());
  auto node = ShardNode::Create(*c, "n0");
  REQUIRE(node.ok());
  ShardNode& n = **node;
  REQUIRE(n.tiers() != nullptr);
  const size_t block = c->model.FullBlockBytes();
  for (uint64_t i = 0; i < 20; ++i) REQUIRE(n.Put(Key(i), Payload(100 + i, block), PutOptions{}).ok());
  // Evicted blocks were demoted: the oldest to SSD, the next ones to host.
  std::optional<uint64_t> on_ssd, on_host, on_primary;
  for (uint64_t i = 0; i < 20; ++i) {
    const std::optional<Tier> t = n.tiers()->Locate(Key(i));
    if (t == Tier::kSsd && !on_ssd) on_ssd = i;
    if (t == Tier::kHost && !on_host) on_host = i;
    if (t == Tier::kPrimary && !on_primary) on_primary = i;
  }
  REQUIRE(on_ssd);
  REQUIRE(on_host);
  REQUIRE(on_primary);
  // A pin promotes a lower block into the primary tier and holds it there.
  REQUIRE(n.Pin(Key(*on_ssd)).ok());
  CHECK(n.tiers()->Locate(Key(*on_ssd)) == Tier::kPrimary);
  REQUIRE(n.Unpin(Key(*on_ssd)).ok());

  for (uint64_t i : {*on_host, *on_ssd, *on_primary}) CheckOperations(n, i, block);
  CHECK(n.tiers()->Stats().promotions > 0);
}

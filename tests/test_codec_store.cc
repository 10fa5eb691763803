// The codec in the cluster config and in the shard node: config parsing with
// path-qualified errors, encode on put / decode on get, slot sizes and stats.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "kernels/codec.h"
#include "cli/codec_bench.h"
#include "kvmesh/config.h"
#include "kvmesh/embedded.h"
#include "kvmesh/router.h"
#include "shard_node/shard_node.h"

using namespace kvmesh;
using nlohmann::json;

namespace {

json Base(json codec) {
  json j = json::parse(R"({
    "model": {"model_id": "m", "num_layers": 4, "num_kv_heads": 4, "head_dim": 128, "block_tokens": 32},
    "nodes": [{"id": "n0", "memory": {"host": "8MiB"}}],
    "store": {"stripes": 1}
  })");
  if (!codec.is_null()) j["codec"] = codec;
  return j;
}

std::string Error(const json& j) {
  auto r = ParseConfig(j.dump());
  return r.ok() ? "" : r.status().message();
}

std::vector<std::byte> Block(const ModelSpec& m, uint64_t seed) {
  const kernels::BlockShape s = kernels::BlockShape::FromLayout(BlockLayout::Full(m));
  std::vector<std::byte> b(s.bytes());
  kernels::GenerateKvBlock(s, seed, b);
  return b;
}

BlockKey Key(uint64_t i) { return BlockKey{i * 7 + 1, i}; }

}  // namespace

TEST_CASE("The codec config section parses and names bad fields by path", "[codec][config]") {
  auto ok = ParseConfig(Base({{"codec", "int4:g64"},
                              {"lossless", "zstd"},
                              {"layers", {{{"layers", "0-1"}, {"codec", "fp16"}}, {{"layers", 3}, {"codec", "int8"}}}}})
                            .dump());
  REQUIRE(ok.ok());
  CHECK(ok->codec.codec == "int4:g64");
  CHECK(ok->codec.lossless == "zstd");
  REQUIRE(ok->codec.layers.size() == 2);
  CHECK(ok->codec.layers[0].layers == Range{0, 2});
  CHECK(ok->codec.layers[1].layers == Range{3, 4});
  CHECK(ParseConfig(Base(nullptr).dump())->codec.enabled() == false);

  CHECK(Error(Base({{"codec", "int9"}})) == "$.codec.codec: unknown codec \"int9\"");
  CHECK(Error(Base({{"codec", "int8:x3"}})) == "$.codec.codec: unknown codec \"int8:x3\"");
  CHECK(Error(Base({{"codec", 8}})).rfind("$.codec.codec: expected a string", 0) == 0);
  CHECK(Error(Base({{"lossless", "gzip"}, {"codec", "int8"}})).rfind("$.codec.lossless:", 0) == 0);
  CHECK(Error(Base({{"codec", "int8"}, {"zstd_level", 0}})) == "$.codec.zstd_level: must be in 1..22");
  CHECK(Error(Base({{"codec", "lowrank"}})) == "$.codec.basis: required by the lowrank codec");
  CHECK(Error(Base({{"codec", "int8"}, {"bogus", 1}})).find("$.codec.bogus") != std::string::npos);
  CHECK(Error(Base({{"codec", "int8"}, {"layers", {{{"layers", "0-2"}, {"codec", "fp16"}}, {{"layers", 2}, {"codec", "int4"}}}}})) ==
        "$.codec.layers[1].layers: overlaps $.codec.layers[0]");
  CHECK(Error(Base({{"codec", "int8"}, {"layers", {{{"layers", "2-9"}, {"codec", "fp16"}}}}})) ==
        "$.codec.layers[0].layers: the model has 4 layers");
  CHECK(Error(Base({{"codec", "int8"}, {"layers", {{{"layers", 1}}}}})).find("$.codec.layers[0].codec") !=
        std::string::npos);
}

TEST_CASE("Codec strings the config accepts are the ones the kernels accept", "[codec][config]") {
  // Syntax the config checks; the node then checks semantics (e.g. rN on int8)
  // and reports them with the same path.
  for (const char* s : {"int8", "int4:g64:kivi", "fp8-e4m3:g32:token", "bf16", "fp16", "fp8-e5m2:channel", "raw"}) {
    INFO(s);
    CHECK(Error(Base({{"codec", s}})).empty());
    CHECK(kernels::ParseCodecSpec(s).ok());
  }
  for (const auto& info : kernels::ListCodecs()) {
    if (info.kind == kernels::kCodecLowRank) continue;  // needs a basis file
    CHECK(Error(Base({{"codec", std::string(info.name)}})).empty());
  }
  auto c = ParseConfig(Base({{"codec", "int8:r4"}}).dump());
  REQUIRE(c.ok());
  auto node = ShardNode::Create(*c, "n0");
  REQUIRE(!node.ok());
  CHECK(node.status().message().find("$.codec.codec: codec \"int8:r4\": bad option") != std::string::npos);
}

TEST_CASE("A node with a codec stores encoded blocks in smaller slots and decodes on get", "[codec][store]") {
  auto raw_cfg = ParseConfig(Base(nullptr).dump());
  auto int8_cfg = ParseConfig(Base({{"codec", "int8"}}).dump());
  REQUIRE(raw_cfg.ok());
  REQUIRE(int8_cfg.ok());
  auto rn = ShardNode::Create(*raw_cfg, "n0");
  auto cn = ShardNode::Create(*int8_cfg, "n0");
  INFO(rn.status().ToString() << " / " << cn.status().ToString());
  REQUIRE(rn.ok());
  REQUIRE(cn.ok());
  auto raw_node = std::move(rn).value();
  auto node = std::move(cn).value();
  const ModelSpec& m = int8_cfg->model;
  const size_t full = m.FullBlockBytes();
  REQUIRE(node->codec() != nullptr);
  CHECK(node->store().slot_bytes() >= node->codec()->encoded_block_bytes());  // the store may round up
  CHECK(node->store().slot_bytes() < node->codec()->encoded_block_bytes() + 4096);
  CHECK(node->store().slot_bytes() * 19 < full * 10);  // ratio >= 1.9
  CHECK(node->Stats().store.slots_total >= 19 * raw_node->Stats().store.slots_total / 10);

  const auto block = Block(m, 5);
  REQUIRE(node->Put(Key(1), block, {}).ok());
  const StoreStats st = node->Stats().store;
  CHECK(st.bytes_logical == full);
  CHECK(st.bytes_stored < full / 1.9);

  std::vector<std::byte> out(full);
  auto n = node->GetInto(Key(1), out);
  REQUIRE(n.ok());
  CHECK(*n == full);
  const auto shape = kernels::BlockShape::FromLayout(BlockLayout::Full(m));
  CHECK(kernels::CompareBlocks(shape, block, out).rel_l2 < 0.01);

  // Get returns the self-describing encoded block.
  auto ref = node->Get(Key(1));
  REQUIRE(ref.ok());
  CHECK(ref->meta().codec == node->codec()->codec_id());
  CHECK(ref->meta().logical_size == full);
  std::vector<std::byte> again(full);
  REQUIRE(kernels::DecodeBlock(ref->data(), again).ok());
  CHECK(again == out);
  ref->Release();

  // A short destination names the size it needs.
  std::vector<std::byte> small(full / 2);
  CHECK(node->GetInto(Key(1), small).status().code() == StatusCode::kResourceExhausted);
  // Payloads that are not full blocks are stored as given.
  std::vector<std::byte> tiny(100, std::byte{7});
  REQUIRE(node->Put(Key(2), tiny, {}).ok());
  std::vector<std::byte> got(full);
  auto tn = node->GetInto(Key(2), got);
  REQUIRE(tn.ok());
  CHECK(*tn == 100);
  CHECK(std::equal(tiny.begin(), tiny.end(), got.begin()));
  CHECK(node->Get(Key(2))->meta().codec == 0);
  CHECK(node->StatsJson().find("\"codec\":\"int8:g128:kivi\"") != std::string::npos);
}

TEST_CASE("A node with a codec encodes the blocks of every derived key, those whose hash met a group tag too",
          "[codec][store]") {
  auto cfg = ParseConfig(Base({{"codec", "int4"}}).dump());
  REQUIRE(cfg.ok());
  auto cn = ShardNode::Create(*cfg, "n0");
  REQUIRE(cn.ok());
  auto node = std::move(cn).value();
  const ModelSpec& m = cfg->model;
  // Blocks whose keys' hashes had a tag (1 in 2^11): before ContentKey they
  // were stored raw and refused ("exceeds the slot size").
  KeyDeriver d(m.model_id, "salt", m.block_tokens);
  std::vector<TokenId> tokens(m.block_tokens);
  const auto block = Block(m, 9);
  int stored = 0;
  for (TokenId t = 0; t < 30000 && stored < 3; ++t) {
    tokens[0] = t;
    const BlockKey key = d.Keys(tokens, {0, m.num_layers}, {0, m.num_kv_heads})[0];
    const BlockKey chain = KeyDeriver::Chain(d.root(), tokens);
    if (chain.lo >> 52 != 0x25C && chain.lo >> 52 != 0x25D && key.lo >> 52 != 0x25C && key.lo >> 52 != 0x25D)
      continue;  // (cleared tags: the hashes that met one)
    INFO("token " << t << " key " << key.ToHex());
    REQUIRE(node->Put(key, block, {}).ok());
    auto ref = node->Get(key);
    REQUIRE(ref.ok());
    CHECK(ref->meta().codec == node->codec()->codec_id());
    ref->Release();
    ++stored;
  }
  CHECK(stored >= 1);
}

TEST_CASE("A node with int4 and a mixed layer policy holds more blocks in the same budget", "[codec][store]") {
  auto cfg = ParseConfig(
      Base({{"codec", "int4"}, {"layers", {{{"layers", 0}, {"codec", "fp16"}}}}}).dump());
  auto raw_cfg = ParseConfig(Base(nullptr).dump());
  REQUIRE(cfg.ok());
  auto cn = ShardNode::Create(*cfg, "n0");
  auto rn = ShardNode::Create(*raw_cfg, "n0");
  INFO(rn.status().ToString() << " / " << cn.status().ToString());
  REQUIRE(rn.ok());
  REQUIRE(cn.ok());
  auto node = std::move(cn).value();
  auto raw_node = std::move(rn).value();
  const ModelSpec& m = cfg->model;
  const auto block = Block(m, 9);
  uint64_t stored = 0;
  for (uint64_t i = 0; i < 200; ++i) {
    REQUIRE(node->Put(Key(100 + i), block, {}).ok());
    REQUIRE(raw_node->Put(Key(100 + i), block, {}).ok());
  }
  stored = node->Stats().store.blocks;
  const uint64_t raw_stored = raw_node->Stats().store.blocks;
  CHECK(stored >= 2 * raw_stored);  // fp16 layer 0 + int4 layers 1-3: ratio ~2.3
  std::vector<std::byte> out(m.FullBlockBytes());
  REQUIRE(node->GetInto(Key(299), out).ok());
  // Layer 0 (fp16) comes back exactly.
  const size_t layer0 = m.FullBlockBytes() / m.num_layers;
  CHECK(std::memcmp(out.data(), block.data(), layer0) == 0);
}

TEST_CASE("Through the router of an embedded cluster, blocks come back decoded", "[codec][store][router]") {
  for (const char* codec : {"fp16", "int8"}) {
    INFO(codec);
    json j = Base({{"codec", codec}});
    j["nodes"] = json::parse(R"([{"id": "a", "memory": {"host": "8MiB"}}, {"id": "b", "memory": {"host": "8MiB"}}])");
    auto cfg = ParseConfig(j.dump());
    REQUIRE(cfg.ok());
    auto cluster = EmbeddedCluster::Start(*cfg);
    REQUIRE(cluster.ok());
    Router& router = (*cluster)->router();
    const ModelSpec& m = cfg->model;
    std::vector<TokenId> tokens(3 * m.block_tokens);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<TokenId>(i * 7 + 3);
    std::vector<std::vector<std::byte>> blocks;
    std::vector<std::span<const std::byte>> spans;
    for (int i = 0; i < 3; ++i) blocks.push_back(Block(m, 70 + i));
    for (auto& b : blocks) spans.push_back(b);
    REQUIRE(router.Put(tokens, spans).ok());
    const std::vector<BlockKey> keys = router.Keys(tokens);
    REQUIRE(keys.size() == 3);
    const auto shape = kernels::BlockShape::FromLayout(BlockLayout::Full(m));
    for (int i = 0; i < 3; ++i) {
      auto got = router.Get(keys[i]);
      REQUIRE(got.ok());
      REQUIRE(got->size() == m.FullBlockBytes());
      if (std::string(codec) == "fp16") {
        CHECK(*got == blocks[i]);  // fp16 of fp16 data is exact
      } else {
        CHECK(kernels::CompareBlocks(shape, blocks[i], *got).rel_l2 < 0.01);
      }
    }
    uint64_t stored = 0, logical = 0;
    for (size_t n = 0; n < (*cluster)->num_nodes(); ++n) {
      stored += (*cluster)->node(n).Stats().store.bytes_stored;
      logical += (*cluster)->node(n).Stats().store.bytes_logical;
    }
    CHECK(logical == 3 * m.FullBlockBytes());
    if (std::string(codec) == "int8") CHECK(static_cast<double>(logical) / static_cast<double>(stored) > 1.9);
  }
}

// Live sequences (shard_node/sequence_table.h) on the embedded store.
#include <catch2/catch.hpp>

#include <cstring>
#include <numeric>
#include <random>

#include "kvmesh/embedded.h"
#include "kernels/codec.h"
#include "shard_node/sequence_table.h"
#include "shard_node/shard_node.h"
#include "shard_node/tiered_store.h"

using namespace kvmesh;

namespace {

constexpr uint32_t kLayers = 2, kHeads = 2, kDim = 4, kBt = 4;

// Two nodes; rank r's blocks (affinity Rank(r)) live on node r.
ClusterConfig Config(const char* budget = "1MiB") {
  std::string j = R"({"model": {"model_id": "seqtest", "num_layers": 2, "num_kv_heads": 2, "head_dim": 4,
                                 "dtype": "fp32", "block_tokens": 4},
      "nodes": [{"id": "n0", "memory": {"host": ")" + std::string(budget) + R"("}},
                {"id": "n1", "memory": {"host": ")" + std::string(budget) + R"("}}],
      "store": {"stripes": 1},
      "placement": {"groups": {"r0": ["n0"], "r1": ["n1"]},
                    "affinity": [{"rank": "0", "group": "r0"}, {"rank": "1", "group": "r1"}]}})";
  auto c = ParseConfig(j);
  REQUIRE(c.ok());
  return *c;
}

// The K (kv=0) or V (kv=1) value of (layer, head, position, dim) for a token:
// a function of the token and its position, so a test can recompute it.
float Val(uint32_t layer, uint32_t kv, uint32_t head, uint32_t pos, uint32_t d, TokenId tok) {
  return static_cast<float>(tok) * 1000.0f + static_cast<float>(pos) + layer * 0.5f + kv * 0.25f + head * 0.125f +
         d * 0.0625f;
}

// Appends tokens [pos0, pos0+n) of `toks` with KV from Val().
void AppendTokens(SequenceTable& t, SeqId s, std::span<const TokenId> toks, uint32_t pos0) {
  const size_t n = toks.size();
  std::vector<float> k(kLayers * n * kHeads * kDim), v(k.size());
  for (uint32_t l = 0; l < kLayers; ++l)
    for (size_t i = 0; i < n; ++i)
      for (uint32_t h = 0; h < kHeads; ++h)
        for (uint32_t d = 0; d < kDim; ++d) {
          size_t idx = ((l * n + i) * kHeads + h) * kDim + d;
          k[idx] = Val(l, 0, h, pos0 + static_cast<uint32_t>(i), d, toks[i]);
          v[idx] = Val(l, 1, h, pos0 + static_cast<uint32_t>(i), d, toks[i]);
        }
  REQUIRE(t.Append(s, toks, std::as_bytes(std::span(k)), std::as_bytes(std::span(v))).ok());
}

// Checks every KV row of the sequence against Val().
void CheckContent(const SequenceTable& t, SeqId s) {
  SequenceView v = t.View(s).value();
  std::vector<TokenId> toks = t.Tokens(s).value();
  REQUIRE(v.length == toks.size());
  for (uint32_t p = 0; p < v.length; ++p)
    for (uint32_t l = 0; l < kLayers; ++l)
      for (uint32_t kv = 0; kv < 2; ++kv)
        for (uint32_t h = 0; h < kHeads; ++h) {
          float row[kDim];
          std::memcpy(row, v.Row(l, kv, h, p), sizeof row);
          for (uint32_t d = 0; d < kDim; ++d) REQUIRE(row[d] == Val(l, kv, h, p, d, toks[p]));
        }
}

std::vector<TokenId> Toks(size_t n, TokenId base) {
  std::vector<TokenId> t(n);
  std::iota(t.begin(), t.end(), base);
  return t;
}

struct Fixture {
  std::unique_ptr<EmbeddedCluster> cluster;
  std::unique_ptr<SequenceTable> table;
  explicit Fixture(const char* budget = "1MiB") {
    cluster = EmbeddedCluster::Start(Config(budget)).value();
    // Rank 1 holds all layers of KV head 1 on node n1.
    table = SequenceTable::Create(&cluster->node(1).store(), cluster->config().model, {0, kLayers}, {1, 2}).value();
  }
  RequestOptions Rank1() const {
    RequestOptions o;
    o.layers = {0, kLayers};
    o.heads = {1, 2};
    o.affinity = Affinity::Rank(1);
    return o;
  }
};

}  // namespace

TEST_CASE("Sequence: full blocks are sealed under their chained key and found by Router::MatchPrefix", "[sequence]") {
  Fixture f;
  SequenceTable& t = *f.table;
  // A one-head slice: rows hold only head 1, but Val() keys on the absolute head.
  SeqId s = t.Create();
  std::vector<TokenId> toks = Toks(10, 100);  // 2 full blocks + 2 tokens
  std::vector<float> k(kLayers * 10 * kDim), v(k.size());
  for (uint32_t l = 0; l < kLayers; ++l)
    for (uint32_t i = 0; i < 10; ++i)
      for (uint32_t d = 0; d < kDim; ++d) {
        k[(l * 10 + i) * kDim + d] = Val(l, 0, 1, i, d, toks[i]);
        v[(l * 10 + i) * kDim + d] = Val(l, 1, 1, i, d, toks[i]);
      }
  REQUIRE(t.Append(s, toks, std::as_bytes(std::span(k)), std::as_bytes(std::span(v))).ok());
  CHECK(t.SealedBlocks(s).value() == 2);
  CHECK(t.Length(s).value() == 10);
  CHECK(f.cluster->node(1).Stats().store.blocks == 2);
  CHECK(f.cluster->node(0).Stats().store.blocks == 0);
  // The router finds exactly the sealed blocks, for this slice only.
  CHECK(f.cluster->router().MatchPrefix(toks, f.Rank1()).value() == 2);
  RequestOptions other = f.Rank1();
  other.heads = {0, 1};
  CHECK(f.cluster->router().MatchPrefix(toks, other).value() == 0);
  // A sequence of the same prompt attaches the sealed blocks and reads the same bytes.
  SeqId s2 = t.CreateFromPrefix(toks);
  CHECK(t.Length(s2).value() == 8);
  SequenceView a = t.View(s).value(), b = t.View(s2).value();
  CHECK(a.blocks[0] == b.blocks[0]);  // the same stored block, not a copy
  CHECK(a.blocks[1] == b.blocks[1]);
  // Released sequences leave their blocks cached (unpinned).
  REQUIRE(t.Release(s).ok());
  REQUIRE(t.Release(s2).ok());
  CHECK(f.cluster->node(1).Stats().store.pinned_blocks == 0);
  CHECK(f.cluster->router().MatchPrefix(toks, f.Rank1()).value() == 2);
  CHECK(t.Release(s).code() == StatusCode::kNotFound);
}

TEST_CASE("Sequence: one-token appends seal each block as it fills; content survives", "[sequence]") {
  Fixture f;
  auto t = SequenceTable::Create(&f.cluster->node(0).store(), f.cluster->config().model, {0, kLayers}, {0, kHeads})
               .value();
  SeqId s = t->Create();
  std::vector<TokenId> toks = Toks(13, 7);
  for (uint32_t i = 0; i < 13; ++i) {
    AppendTokens(*t, s, std::span(toks).subspan(i, 1), i);
    CHECK(t->SealedBlocks(s).value() == (i + 1) / kBt);
  }
  CheckContent(*t, s);
  CHECK(t->MatchPrefix(toks) == 3);
  CHECK(t->Stats().seals == 3);
}

TEST_CASE("Sequence: fork shares sealed blocks by pin and copies only the tail", "[sequence]") {
  Fixture f;
  auto t = SequenceTable::Create(&f.cluster->node(0).store(), f.cluster->config().model, {0, kLayers}, {0, kHeads})
               .value();
  BlockStore& store = f.cluster->node(0).store();
  SeqId s = t->Create();
  std::vector<TokenId> toks = Toks(10, 1);
  AppendTokens(*t, s, toks, 0);
  const uint64_t blocks_before = store.Stats().blocks;
  SeqId c = t->Fork(s).value();
  CHECK(store.Stats().blocks == blocks_before);  // nothing new stored
  SequenceView vs = t->View(s).value(), vc = t->View(c).value();
  REQUIRE(vc.blocks.size() == 3);
  CHECK(vs.blocks[0] == vc.blocks[0]);
  CHECK(vs.blocks[1] == vc.blocks[1]);
  CHECK(vs.blocks[2] != vc.blocks[2]);  // the open tail is a copy
  CHECK(t->Stats().sealed_blocks == 4);  // two per sequence, two distinct stored blocks
  CHECK(store.Stats().pinned_blocks == 2);

  // The branches diverge in their tails without touching each other.
  std::vector<TokenId> a = {500, 501}, b = {900};
  AppendTokens(*t, s, a, 10);
  AppendTokens(*t, c, b, 10);
  CheckContent(*t, s);
  CheckContent(*t, c);
  CHECK(t->SealedBlocks(s).value() == 3);  // 12 tokens: the tail filled and was sealed
  CHECK(t->SealedBlocks(c).value() == 2);

  // After the parent is released the child still pins the shared blocks: a
  // store flooded with other blocks cannot evict them.
  REQUIRE(t->Release(s).ok());
  std::vector<std::byte> junk(t->layout().bytes(), std::byte{1});
  for (uint64_t i = 0; i < 4 * store.Stats().slots_total; ++i)
    (void)store.Put(BlockKey{i + 1, 0xfeed}, junk, {});
  CheckContent(*t, c);
  CHECK(t->MatchPrefix(toks) == 2);
  REQUIRE(t->Release(c).ok());
  CHECK(store.Stats().pinned_blocks == 0);
}

TEST_CASE("Sequence: truncate across a block boundary unseals the new tail and rewrites it", "[sequence]") {
  Fixture f;
  auto t = SequenceTable::Create(&f.cluster->node(0).store(), f.cluster->config().model, {0, kLayers}, {0, kHeads})
               .value();
  BlockStore& store = f.cluster->node(0).store();
  SeqId s = t->Create();
  std::vector<TokenId> toks = Toks(13, 40);
  AppendTokens(*t, s, toks, 0);
  REQUIRE(t->SealedBlocks(s).value() == 3);
  const std::byte* sealed1 = t->View(s).value().blocks[1];

  // 13 -> 6 tokens: block 2 is dropped, block 1 keeps 2 of its 4 tokens.
  REQUIRE(t->Truncate(s, 7).ok());
  CHECK(t->Length(s).value() == 6);
  CHECK(t->SealedBlocks(s).value() == 1);
  CHECK(t->View(s).value().blocks[1] != sealed1);  // now a private copy
  CHECK(t->Stats().unseals == 1);
  CHECK(store.Stats().pinned_blocks == 1);  // only block 0 is still pinned
  CheckContent(*t, s);
  // The old blocks stay cached for their own prefix.
  CHECK(t->MatchPrefix(toks) == 3);

  // Rewrite with different tokens: the new block 1 seals under a new key and
  // the old one is untouched.
  std::vector<TokenId> other = {7, 8, 9};
  AppendTokens(*t, s, other, 6);
  CHECK(t->SealedBlocks(s).value() == 2);
  CheckContent(*t, s);
  std::vector<TokenId> now = t->Tokens(s).value();
  CHECK(t->MatchPrefix(now) == 2);
  CHECK(t->MatchPrefix(toks) == 3);
  // Truncating exactly on a block boundary keeps the block sealed.
  REQUIRE(t->Truncate(s, 1).ok());
  CHECK(t->SealedBlocks(s).value() == 2);
  CHECK(t->Truncate(s, 100).code() == StatusCode::kInvalidArgument);
  REQUIRE(t->Truncate(s, 8).ok());
  CHECK(t->Length(s).value() == 0);
  CHECK(store.Stats().pinned_blocks == 0);
  // Writes into sealed positions are refused.
  SeqId q = t->Create();
  AppendTokens(*t, q, toks, 0);
  std::vector<float> row(kHeads * kDim);
  CHECK(t->Write(q, 0, 2, 1, std::as_bytes(std::span(row)), std::as_bytes(std::span(row))).code() ==
        StatusCode::kFailedPrecondition);
}

TEST_CASE("Sequence: a full block the store refuses stays private and correct", "[sequence]") {
  // One slot per stripe and everything pinned: the second seal is refused.
  auto cfg = Config("1MiB");
  cfg.store.slot_bytes = 2 * kLayers * kHeads * kBt * kDim * 4;
  cfg.nodes[0].memory.host = cfg.store.slot_bytes;  // exactly one slot
  auto cluster = EmbeddedCluster::Start(cfg).value();
  auto t = SequenceTable::Create(&cluster->node(0).store(), cfg.model, {0, kLayers}, {0, kHeads}).value();
  SeqId s = t->Create();
  std::vector<TokenId> toks = Toks(9, 3);
  AppendTokens(*t, s, toks, 0);
  CHECK(t->SealedBlocks(s).value() == 2);
  CHECK(t->Stats().private_blocks == 1);
  CheckContent(*t, s);
  SeqId c = t->Fork(s).value();
  CheckContent(*t, c);
  REQUIRE(t->Truncate(c, 3).ok());  // into the private block
  CheckContent(*t, c);
  CheckContent(*t, s);
}

TEST_CASE("Sequence: a stored block of another size or codec under the same key is not read in place",
          "[sequence]") {
  Fixture f;
  BlockStore& store = f.cluster->node(0).store();
  auto t = SequenceTable::Create(&store, f.cluster->config().model, {0, kLayers}, {0, kHeads}).value();
  std::vector<TokenId> toks = Toks(8, 5);
  // Another writer stored block 0 of this prefix encoded (codec 3, fewer bytes).
  BlockKey chain0 = KeyDeriver::Chain(t->deriver().root(), std::span(toks).subspan(0, kBt));
  std::vector<std::byte> encoded(100, std::byte{7});
  PutOptions po;
  po.codec = 3;
  po.logical_size = static_cast<uint32_t>(t->layout().bytes());
  REQUIRE(store.Put(KeyDeriver::Qualify(chain0, {0, kLayers}, {0, kHeads}), encoded, po).ok());
  CHECK(t->MatchPrefix(toks) == 1);  // present...
  SeqId a = t->CreateFromPrefix(toks);
  CHECK(t->Length(a).value() == 0);  // ...but not attached
  // Sealing the same prefix keeps our raw copy private instead of aliasing the encoded one.
  SeqId s = t->Create();
  AppendTokens(*t, s, toks, 0);
  CHECK(t->SealedBlocks(s).value() == 2);
  CHECK(t->Stats().private_blocks == 1);
  CheckContent(*t, s);
}

// ---- Sequences with a KV codec (SequenceOptions::codec) ----------------------

namespace {

// Seeded near-Gaussian K and V for `n` tokens over the fixture's slice.
struct RandomKv {
  std::vector<float> k, v;
  uint32_t dim;
  RandomKv(size_t n, uint32_t heads, uint64_t seed, uint32_t head_dim = kDim)
      : k(kLayers * n * heads * head_dim), v(k.size()), dim(head_dim) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> g(0.0f, 1.0f);
    for (float& x : k) x = g(rng);
    for (float& x : v) x = g(rng);
  }
  // K (kv=0) or V of (layer, token i, head, d) as appended.
  float At(uint32_t kv, uint32_t l, size_t n, size_t i, uint32_t heads, uint32_t h, uint32_t d) const {
    return (kv == 0 ? k : v)[((l * n + i) * heads + h) * dim + d];
  }
};

SequenceOptions WithCodec(const char* codec) {
  SequenceOptions o;
  o.codec.codec = codec;
  return o;
}

}  // namespace

TEST_CASE("Sequence codec: sealed blocks are stored encoded and read back dequantised, the tail stays exact",
          "[sequence][codec]") {
  // A slice large enough for the codec's scales and header to be small
  // against the payload: 2 layers x 2 heads x 16 tokens x 64 dims, fp32.
  constexpr uint32_t kD = 64, kT = 16;
  auto cfg = ParseConfig(R"({"model": {"model_id": "seqcodec", "num_layers": 2, "num_kv_heads": 2, "head_dim": 64,
                                       "dtype": "fp32", "block_tokens": 16},
                             "nodes": [{"id": "n0", "memory": {"host": "4MiB"}}]})");
  REQUIRE(cfg.ok());
  auto cluster = EmbeddedCluster::Start(*cfg).value();
  BlockStore& store = cluster->node(0).store();
  auto t = SequenceTable::Create(&store, cfg->model, {0, kLayers}, {0, kHeads}, WithCodec("int8")).value();
  const size_t n = 2 * kT + 3;  // two sealed blocks and a 3-token tail
  std::vector<TokenId> toks = Toks(n, 100);
  RandomKv kv(n, kHeads, 1, kD);
  SeqId s = t->Create();
  REQUIRE(t->Append(s, toks, std::as_bytes(std::span(kv.k)), std::as_bytes(std::span(kv.v))).ok());
  REQUIRE(t->SealedBlocks(s).value() == 2);

  SequenceStats st = t->Stats();
  CHECK(st.encoded_seals == 2);
  CHECK(st.encoded_raw_bytes == 2 * t->layout().bytes());
  // fp32 -> int8 plus scales and header: under a third of the raw bytes.
  CHECK(st.encoded_stored_bytes * 3 < st.encoded_raw_bytes);
  CHECK(st.decoded_blocks == 2);
  CHECK(store.Stats().bytes_stored == st.encoded_stored_bytes);

  SequenceView view = t->View(s).value();
  double err = 0, norm = 0;
  size_t exact_in_sealed = 0, rows_in_sealed = 0;
  for (uint32_t p = 0; p < n; ++p)
    for (uint32_t l = 0; l < kLayers; ++l)
      for (uint32_t c = 0; c < 2; ++c)
        for (uint32_t h = 0; h < kHeads; ++h) {
          float row[kD];
          std::memcpy(row, view.Row(l, c, h, p), sizeof row);
          for (uint32_t d = 0; d < kD; ++d) {
            const float want = kv.At(c, l, n, p, kHeads, h, d);
            if (p >= 2 * kT) {
              REQUIRE(row[d] == want);  // open tail: exact
            } else {
              err += double(row[d] - want) * (row[d] - want);
              norm += double(want) * want;
              exact_in_sealed += row[d] == want;
              ++rows_in_sealed;
            }
          }
        }
  INFO("int8 relative L2 over the sealed blocks: " << std::sqrt(err / norm));
  CHECK(std::sqrt(err / norm) < 0.01);
  CHECK(exact_in_sealed < rows_in_sealed);  // really quantised

  // The view's bytes are exactly the stored block decoded.
  const BlockKey key0 = KeyDeriver::Qualify(KeyDeriver::Chain(t->deriver().root(), std::span(toks).subspan(0, kT)),
                                            {0, kLayers}, {0, kHeads});
  std::vector<std::byte> stored(store.slot_bytes()), decoded(t->layout().bytes());
  Result<BlockRef> ref = store.Get(key0);
  REQUIRE(ref.ok());
  CHECK(ref->meta().codec != 0);
  CHECK(ref->meta().logical_size == t->layout().bytes());
  REQUIRE(kernels::DecodeBlock(ref->data(), decoded).ok());
  CHECK(std::memcmp(decoded.data(), view.blocks[0], decoded.size()) == 0);
}

TEST_CASE("Sequence codec: forks and prefix matches share one decoded copy; truncate reopens dequantised values",
          "[sequence][codec]") {
  Fixture f;
  auto t = SequenceTable::Create(&f.cluster->node(0).store(), f.cluster->config().model, {0, kLayers}, {0, kHeads},
                                 WithCodec("int4:g16"))
               .value();
  const size_t n = 10;
  std::vector<TokenId> toks = Toks(n, 300);
  RandomKv kv(n, kHeads, 2);
  SeqId s = t->Create();
  REQUIRE(t->Append(s, toks, std::as_bytes(std::span(kv.k)), std::as_bytes(std::span(kv.v))).ok());
  SeqId fk = t->Fork(s).value();
  SeqId m = t->CreateFromPrefix(toks);
  CHECK(t->Length(m).value() == 8);
  SequenceView vs = t->View(s).value(), vf = t->View(fk).value(), vm = t->View(m).value();
  for (int b = 0; b < 2; ++b) {
    CHECK(vs.blocks[b] == vf.blocks[b]);
    CHECK(vs.blocks[b] == vm.blocks[b]);
  }
  CHECK(vs.blocks[2] != vf.blocks[2]);  // the tail is copied
  CHECK(t->Stats().decoded_blocks == 2);

  // Keep the dequantised block 1 of s, then roll s back into it.
  std::vector<std::byte> block1(vs.blocks[1], vs.blocks[1] + t->layout().bytes());
  REQUIRE(t->Truncate(s, 3).ok());  // 10 -> 7 tokens: block 1 reopens
  CHECK(t->SealedBlocks(s).value() == 1);
  SequenceView after = t->View(s).value();
  for (uint32_t p = 4; p < 7; ++p)
    for (uint32_t l = 0; l < kLayers; ++l)
      for (uint32_t c = 0; c < 2; ++c)
        for (uint32_t h = 0; h < kHeads; ++h)
          CHECK(std::memcmp(after.Row(l, c, h, p), block1.data() + t->layout().Offset(l, c, h, p % kBt),
                            kDim * sizeof(float)) == 0);
  REQUIRE(t->Release(s).ok());
  REQUIRE(t->Release(fk).ok());
  REQUIRE(t->Release(m).ok());
  CHECK(t->Stats().decoded_blocks == 0);
}

TEST_CASE("Sequence codec: raw and encoded tables read each other's blocks; a bad codec is refused",
          "[sequence][codec]") {
  Fixture f;
  BlockStore& store = f.cluster->node(0).store();
  const ModelSpec& model = f.cluster->config().model;
  auto raw = SequenceTable::Create(&store, model, {0, kLayers}, {0, kHeads}).value();
  auto enc = SequenceTable::Create(&store, model, {0, kLayers}, {0, kHeads}, WithCodec("fp8-e4m3")).value();
  std::vector<TokenId> a = Toks(8, 1), b = Toks(8, 500);
  RandomKv kv(8, kHeads, 3);
  SeqId sa = raw->Create(), sb = enc->Create();
  REQUIRE(raw->Append(sa, a, std::as_bytes(std::span(kv.k)), std::as_bytes(std::span(kv.v))).ok());
  REQUIRE(enc->Append(sb, b, std::as_bytes(std::span(kv.k)), std::as_bytes(std::span(kv.v))).ok());
  // The encoded table attaches the raw blocks in place (exact values)...
  SeqId ea = enc->CreateFromPrefix(a);
  REQUIRE(enc->Length(ea).value() == 8);
  CHECK(enc->View(ea).value().blocks[0] == raw->View(sa).value().blocks[0]);
  // ...and the raw table attaches the encoded ones through a decoded copy,
  // the same values the encoding table reads.
  SeqId rb = raw->CreateFromPrefix(b);
  REQUIRE(raw->Length(rb).value() == 8);
  CHECK(std::memcmp(raw->View(rb).value().blocks[1], enc->View(sb).value().blocks[1], raw->layout().bytes()) == 0);
  CHECK(raw->Stats().decoded_blocks == 2);
  CHECK(enc->Length(enc->CreateFromPrefix(b)).value() == 8);

  Result<std::unique_ptr<SequenceTable>> bad =
      SequenceTable::Create(&store, model, {0, kLayers}, {0, kHeads}, WithCodec("int9"));
  REQUIRE(bad.status().code() == StatusCode::kInvalidArgument);
  CHECK(bad.status().message().find("sequence codec.codec") != std::string::npos);
}

TEST_CASE("Sequence with the node's tiers: prefix blocks demoted to the host tier are promoted back and attached",
          "[sequence][tiers]") {
  // 16 KiB blocks (2 layers x K,V x 2 heads x 16 tokens x 64 dims, fp16); the
  // primary tier holds 8 of them, the host tier 32.
  auto cfg = ParseConfig(R"({"model": {"model_id": "seqtier", "num_layers": 2, "num_kv_heads": 2, "head_dim": 64,
                                       "dtype": "fp16", "block_tokens": 16},
                             "nodes": [{"id": "n0", "memory": {"device": "128KiB", "host": "512KiB"}}],
                             "store": {"stripes": 1},
                             "eviction": {"tiers": {"offload_idle_s": 1000, "interval_ms": 5}}})");
  REQUIRE(cfg.ok());
  auto node = ShardNode::Create(*cfg, "n0").value();
  REQUIRE(node->tiers() != nullptr);
  SequenceOptions with_tiers;
  with_tiers.tiers = node->tiers();
  auto t = SequenceTable::Create(&node->store(), cfg->model, {0, 2}, {0, 2}, with_tiers).value();
  auto primary_only = SequenceTable::Create(&node->store(), cfg->model, {0, 2}, {0, 2}).value();
  const size_t row = 64 * 2;  // fp16 head_dim
  auto append = [&](SeqId s, std::span<const TokenId> toks, uint8_t fill) {
    std::vector<std::byte> k(2 * toks.size() * 2 * row), v(k.size());
    for (size_t i = 0; i < k.size(); ++i) {
      k[i] = std::byte(uint8_t(fill + i * 7));
      v[i] = std::byte(uint8_t(fill + i * 13));
    }
    REQUIRE(t->Append(s, toks, k, v).ok());
  };
  std::vector<TokenId> a = Toks(6 * 16, 1), b = Toks(12 * 16, 5000);
  SeqId sa = t->Create();
  append(sa, a, 3);
  SequenceView va = t->View(sa).value();
  std::vector<std::vector<std::byte>> want;
  for (int i = 0; i < 6; ++i) want.emplace_back(va.blocks[i], va.blocks[i] + t->layout().bytes());
  REQUIRE(t->Release(sa).ok());
  // Another conversation fills the primary tier: a's blocks are evicted from it and demoted to the host tier.
  SeqId sb = t->Create();
  for (size_t off = 0; off < b.size(); off += 16) append(sb, std::span(b).subspan(off, 16), 9);
  REQUIRE(t->Release(sb).ok());
  REQUIRE(node->tiers()->Stats().demoted_on_evict + node->tiers()->Stats().demoted_offload > 0);
  size_t on_host = 0;
  BlockKey chain = t->deriver().root();
  for (int i = 0; i < 6; ++i) {
    chain = KeyDeriver::Chain(chain, std::span(a).subspan(i * 16, 16));
    on_host += node->tiers()->Locate(KeyDeriver::Qualify(chain, {0, 2}, {0, 2})) == Tier::kHost;
  }
  REQUIRE(on_host > 0);

  // The primary tier alone has lost the prefix's first demoted block...
  CHECK(primary_only->MatchPrefix(a) < 6);
  // ...the tiers find all six and promote them back, bytes intact.
  CHECK(t->MatchPrefix(a) == 6);
  SeqId back = t->CreateFromPrefix(a);
  REQUIRE(t->Length(back).value() == 6 * 16);
  SequenceView vb = t->View(back).value();
  for (int i = 0; i < 6; ++i) CHECK(std::memcmp(vb.blocks[i], want[i].data(), want[i].size()) == 0);
  CHECK(node->tiers()->Stats().promotions >= on_host);
  REQUIRE(t->Release(back).ok());
}

// kvmesh/types.h — the shared data model (docs/architecture.md, "The data model").
//
// ModelSpec describes the model whose KV is cached; BlockLayout names which
// slice of a block (layer range x head range) a payload holds and where each
// (layer, k|v, head, token) row lives inside it. BlockKey is the 128-bit
// content-addressed name of a block (see kvmesh/block_key.h for derivation).
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "kvmesh/status.h"

namespace kvmesh {

using TokenId = int32_t;

enum class DType : uint8_t { kFp16 = 0, kBf16 = 1, kFp32 = 2 };

std::string_view DTypeName(DType t);
Result<DType> ParseDType(std::string_view name);
constexpr size_t DTypeSize(DType t) { return t == DType::kFp32 ? 4 : 2; }

struct ModelSpec {
  std::string model_id;
  uint32_t num_layers = 0;
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;
  DType dtype = DType::kFp16;
  uint32_t block_tokens = 0;  // tokens per block; > 0
  uint32_t num_experts = 0;   // 0: not a MoE model

  // Uncompressed bytes of a full block (all layers, all KV heads).
  size_t FullBlockBytes() const;
  // OK, or InvalidArgument naming the first bad field.
  Status Validate() const;
};

// Half-open index range [begin, end).
struct Range {
  uint32_t begin = 0;
  uint32_t end = 0;
  uint32_t size() const { return end - begin; }
  bool empty() const { return end <= begin; }
  friend bool operator==(const Range&, const Range&) = default;
};

// Which part of a block a payload holds, and its byte layout.
//
// Layout (fixed, documented in docs/block-layout.md):
//   [layer][k|v][head][token][dim], row-major, elements of ModelSpec::dtype.
// A tensor-parallel rank holding heads [h0,h1) of layers [l0,l1) stores only
// that slice, still in this order.
struct BlockLayout {
  Range layers;
  Range heads;
  uint32_t block_tokens = 0;
  uint32_t head_dim = 0;
  DType dtype = DType::kFp16;

  // The whole block of a model: all layers, all KV heads.
  static BlockLayout Full(const ModelSpec& m);
  // A slice of the model's block. REQUIRES: the ranges lie inside the model.
  static Result<BlockLayout> Slice(const ModelSpec& m, Range layers, Range heads);

  // Bytes of K (or of V) of `tokens` tokens of this slice: a block holds both
  // sides of block_tokens (bytes()); a sequence append or read carries K and V
  // of side_bytes(n) each, as [layer][n][heads][head_dim].
  size_t side_bytes(size_t tokens) const {
    return size_t{layers.size()} * heads.size() * tokens * head_dim * DTypeSize(dtype);
  }
  size_t bytes() const { return 2 * side_bytes(block_tokens); }
  // Bytes of one [token][dim] plane of one head.
  size_t head_plane_bytes() const { return size_t{block_tokens} * head_dim * DTypeSize(dtype); }
  // Byte offset of (layer, kv (0=K, 1=V), head, token) inside the payload.
  // layer and head are absolute model indices inside the slice's ranges.
  size_t Offset(uint32_t layer, uint32_t kv, uint32_t head, uint32_t token) const {
    size_t l = layer - layers.begin, h = head - heads.begin;
    return (((l * 2 + kv) * heads.size() + h) * block_tokens + token) * head_dim * DTypeSize(dtype);
  }
};

// 128-bit block name. Ordered and hashable; hi/lo are the xxHash3-128 halves.
struct BlockKey {
  uint64_t hi = 0;
  uint64_t lo = 0;

  friend bool operator==(const BlockKey&, const BlockKey&) = default;
  friend auto operator<=>(const BlockKey&, const BlockKey&) = default;
  // 32 lowercase hex digits, hi first.
  std::string ToHex() const;
  static Result<BlockKey> FromHex(std::string_view hex);

  template <typename H>
  friend H AbslHashValue(H h, const BlockKey& k) {
    return H::combine(std::move(h), k.hi, k.lo);
  }
};

// Priority classes: 0 is evicted first. kvmesh keeps a small fixed number of
// classes (config eviction.priority_classes, at most kMaxPriorityClasses).
using Priority = uint8_t;
inline constexpr Priority kMaxPriorityClasses = 8;
inline constexpr Priority kDefaultPriority = 1;

// Placement hint carried by a request: put the block in the shard group that
// serves this expert / layer group / tensor-parallel rank (docs/architecture.md, "Placement").
struct Affinity {
  enum class Kind : uint8_t { kNone = 0, kExpert, kLayerGroup, kRank };
  Kind kind = Kind::kNone;
  uint32_t value = 0;

  static Affinity None() { return {}; }
  static Affinity Expert(uint32_t e) { return {Kind::kExpert, e}; }
  static Affinity LayerGroup(uint32_t g) { return {Kind::kLayerGroup, g}; }
  static Affinity Rank(uint32_t r) { return {Kind::kRank, r}; }
  friend bool operator==(const Affinity&, const Affinity&) = default;
};

}  // namespace kvmesh

template <>
struct std::hash<kvmesh::BlockKey> {
  size_t operator()(const kvmesh::BlockKey& k) const noexcept {
    return static_cast<size_t>(k.lo ^ (k.hi * 0x9E3779B97F4A7C15ull));
  }
};

// kvmesh/block_key.h — content-addressed, chained block keys (docs/block-layout.md).
//
//   root    = H("kvmesh-key-v1" | model_id | 0x00 | tenant_salt)
//   chain_i = H(chain_{i-1} | tokens of block i as int32 little-endian)   chain_{-1} = root
//   key_i   = H(chain_i | layers.begin | layers.end | heads.begin | heads.end)  (u32 LE each)
//
// H is xxHash3-128 (seed 0); a 128-bit value is fed as hi then lo, each u64 LE.
// Every chain and key value is then passed through ContentKey (a group tag in
// lo's top 11 bits, 1 in 2^11 hashes, has lo's top bit cleared).
// A key therefore names its whole prefix and its slice; tenants with different
// salts never share a key. These values are a storage format: a golden test
// pins them, and changing them orphans every cached block.
//
// Thread-safety: KeyDeriver is immutable after construction.
#pragma once

#include <span>
#include <string_view>
#include <vector>

#include "kvmesh/types.h"

namespace kvmesh {

// ---- grouped keys ----------------------------------------------------------------
// Blocks that belong together (a RESP value's head and parts, RESP keys that
// share a Redis hash tag or a suffix-rule stem: transport/resp/resp_value.h)
// carry their group in the key: hi is the group's 64-bit hash, lo a member
// hash whose top 12 bits are the tag 0xA5C or 0xA5D and whose next bit marks a
// group that is evicted together. Placement (router/shard_map.h) ranks nodes by
// the group alone, so a group lands on one node (per replica rank); a node
// drops a co-evicted group as a whole once any of its blocks is gone
// (shard_node/key_groups.h).
// Tag 0xA5D is a slotted group (Redis Cluster mode, $.resp.cluster): the top
// 14 bits of hi are the group's Redis Cluster hash slot, and placement ranks
// nodes by the slot alone, so every key of a slot lands on one node and a
// cluster-aware client that computes the slot finds the owner itself.
// A content key never carries a tag: every derivation of one (KeyDeriver,
// the tenant scope ScopeKey, the Python adapters' keys) passes its hash
// through ContentKey below, which clears lo's top bit in the 1 in 2^11 hashes
// that would. Before, such a key was stored raw by a node with a codec (a
// grouped block is opaque bytes) and refused as larger than its slot.
inline constexpr uint64_t kGroupTagMask = 0xFFF0000000000000ull;
inline constexpr uint64_t kGroupTag = 0xA5C0000000000000ull;
inline constexpr uint64_t kGroupSlottedTag = 0xA5D0000000000000ull;
inline constexpr uint64_t kGroupKindMask = 0xFFE0000000000000ull;  // both tags
inline constexpr uint64_t kGroupCoEvictBit = 1ull << 51;
inline constexpr uint64_t kGroupMemberMask = kGroupCoEvictBit - 1;  // 51 bits of member hash
inline constexpr int kGroupSlotShift = 50;                         // hi >> 50: the slot (0..16383)
inline constexpr uint64_t kGroupSlotMask = ~uint64_t{0} << kGroupSlotShift;  // the slot's bits of hi

inline BlockKey GroupedKey(uint64_t group, uint64_t member, bool co_evict, bool slotted = false) {
  return BlockKey{group, (slotted ? kGroupSlottedTag : kGroupTag) | (co_evict ? kGroupCoEvictBit : 0) |
                             (member & kGroupMemberMask)};
}
inline bool IsGroupedKey(const BlockKey& k) { return (k.lo & kGroupKindMask) == kGroupTag; }
// A hash made a content key: lo's top bit cleared when lo's top 11 bits are a
// group tag's (0xA5C or 0xA5D becomes 0x25C or 0x25D), else unchanged.
inline BlockKey ContentKey(BlockKey k) {
  if (IsGroupedKey(k)) k.lo &= ~(uint64_t{1} << 63);
  return k;
}
inline bool IsSlottedKey(const BlockKey& k) { return (k.lo & kGroupTagMask) == kGroupSlottedTag; }
inline bool IsCoEvictedKey(const BlockKey& k) { return IsGroupedKey(k) && (k.lo & kGroupCoEvictBit) != 0; }
// The Redis Cluster slot of a slotted key.
inline uint32_t GroupSlot(const BlockKey& k) { return static_cast<uint32_t>(k.hi >> kGroupSlotShift); }
// The key placement ranks nodes by: the slot for a slotted key, the group for
// another grouped key, else the key. Idempotent: PlacementKey(PlacementKey(k))
// == PlacementKey(k), so a placement key may stand for its keys anywhere.
inline BlockKey PlacementKey(const BlockKey& k) {
  if (IsSlottedKey(k)) return BlockKey{k.hi & kGroupSlotMask, kGroupSlottedTag};
  return IsGroupedKey(k) ? BlockKey{k.hi, kGroupTag} : k;
}
// The placement key of every slotted key of `slot`.
inline BlockKey SlotPlacementKey(uint32_t slot) {
  return BlockKey{uint64_t{slot} << kGroupSlotShift, kGroupSlottedTag};
}

class KeyDeriver {
 public:
  KeyDeriver(std::string_view model_id, std::string_view tenant_salt, uint32_t block_tokens);

  uint32_t block_tokens() const { return block_tokens_; }
  const BlockKey& root() const { return root_; }

  // Number of full blocks in a token sequence (a trailing partial block has no key).
  size_t FullBlocks(size_t num_tokens) const { return num_tokens / block_tokens_; }

  // Chain keys of the full blocks of `tokens` (one per block, prefix order).
  // Appends to *out (which is cleared first).
  void ChainKeys(std::span<const TokenId> tokens, std::vector<BlockKey>* out) const;

  // Next chain key after `prev` for one block of exactly block_tokens tokens.
  static BlockKey Chain(const BlockKey& prev, std::span<const TokenId> block_tokens);

  // The stored key of a chain key for a (layer range, head range) slice.
  static BlockKey Qualify(const BlockKey& chain, Range layers, Range heads);

  // Convenience: qualified keys of the full blocks for one slice.
  std::vector<BlockKey> Keys(std::span<const TokenId> tokens, Range layers, Range heads) const;

 private:
  BlockKey root_;
  uint32_t block_tokens_;
};

}  // namespace kvmesh

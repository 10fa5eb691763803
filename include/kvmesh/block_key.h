// kvmesh/block_key.h — content-addressed, chained block keys (docs/block-layout.md).
//
//   root    = H("kvmesh-key-v1" | model_id | 0x00 | tenant_salt)
//   chain_i = H(chain_{i-1} | tokens of block i as int32 little-endian)   chain_{-1} = root
//   key_i   = H(chain_i | layers.begin | layers.end | heads.begin | heads.end)  (u32 LE each)
//
// H is xxHash3-128 (seed 0); a 128-bit value is fed as hi then lo, each u64 LE.
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

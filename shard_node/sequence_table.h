// shard_node/sequence_table.h — live sequences: the KV of running decodes
// (kvmesh/sequence.h; docs/architecture.md, "Live sequences").
//
// A sequence is the growing KV of one request for one slice (layer range x
// KV-head range) of the model, kept next to one shard's block store:
//
//   - its tokens, cut into blocks of block_tokens;
//   - sealed blocks: full blocks stored in the block store under their
//     chained, slice-qualified key (KeyDeriver) and pinned while the sequence
//     uses them, so prefix match (Router::MatchPrefix, or MatchPrefix below)
//     finds them and other requests share them;
//   - open blocks: the tail (and, during a multi-token append, the blocks
//     being filled), private buffers written in place.
//
//   SequenceTable t(...);
//   SeqId s = t.Create();                       // or CreateFromPrefix(prompt)
//   uint32_t pos = t.Extend(s, tokens).value(); // reserve positions
//   for each layer: t.Write(s, layer, pos, n, k, v);
//   t.Commit(s);                                // seal the full open blocks
//   t.Truncate(s, 3);                           // roll back 3 tokens
//   SeqId f = t.Fork(s).value();                // shares sealed blocks, copies the tail
//   t.Release(s);
//
// Payload layout of every block (sealed or open) is BlockLayout's
// [layer][k|v][head][token][dim] for this table's slice, in the model dtype.
// Sealed blocks are immutable; truncating into one copies it into a new open
// block (the sealed block stays in the store for other prefixes to use).
// A full block the store refuses to take (every slot pinned) stays private to
// the sequence (and its forks): correct, only not shareable. A stored block
// of this slice is attached or shared whatever form it is in: raw blocks are
// read in place, encoded ones (this table's codec, another writer's, or the
// node's pressure re-encoding) through a decoded copy shared by every reader;
// a block that is not this slice's shape, or does not decode, is a miss.
// Sequences pin blocks in the store's own tier (BlockStore); with
// SequenceOptions::tiers, blocks demoted to lower tiers are promoted back when
// a prefix attaches them (else they read as misses).
//
// Thread-safety: methods on different sequences may run concurrently; calls
// on one sequence (and reads through its View) must not overlap a write to
// that same sequence.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvmesh/block_key.h"
#include "kvmesh/sequence.h"
#include "kvmesh/config.h"
#include "kvmesh/status.h"
#include "kvmesh/types.h"

namespace kvmesh {

class BlockStore;
class TieredStore;

struct SequenceOptions {
  std::string tenant_salt;             // must match the router's to share with it
  // The namespace the table's blocks are stored in (shard_node/tenants.h
  // ScopeKey): a tenant's sealed blocks meet only its own puts. All zero:
  // keys as derived.
  BlockKey scope{};
  Priority priority = kDefaultPriority;  // eviction class of the blocks it seals
  // KV codec of sealed blocks, as in the config's "codec" section (e.g.
  // {"codec": "int8"}; layer rules give mixed precision; "none": raw).
  // With a codec, a sealed block is stored encoded (the store holds the
  // compressed bytes, shared by prefix match) and read back dequantised: the
  // attention over sealed blocks sees the codec's rounding, while the open
  // tail stays exact (KIVI's full-precision residual window). Sequences
  // reading the same sealed block share one decoded copy.
  CodecConfig codec;
  // The node's memory hierarchy over `store` (its primary tier), if it has
  // lower tiers: prefix blocks demoted to host or SSD are then found by
  // MatchPrefix and promoted back by CreateFromPrefix instead of missing, and
  // seals go through it (Busy at pressure level 3: the block stays private).
  // nullptr: the primary tier only. REQUIRES: outlives the table.
  TieredStore* tiers = nullptr;
};

// Read-only view of a sequence for attention: block b holds positions
// [b*block_tokens, (b+1)*block_tokens) and lies at blocks[b].
struct SequenceView {
  BlockLayout layout;
  uint32_t length = 0;                   // tokens
  std::vector<const std::byte*> blocks;  // ceil(length / block_tokens) pointers

  // Row of (layer, kv, head, position): head_dim elements of layout.dtype.
  const std::byte* Row(uint32_t layer, uint32_t kv, uint32_t head, uint32_t pos) const {
    const uint32_t bt = layout.block_tokens;
    return blocks[pos / bt] + layout.Offset(layer, kv, head, pos % bt);
  }
};

struct SequenceStats {
  uint64_t sequences = 0;        // live
  uint64_t sealed_blocks = 0;    // sealed blocks referenced (a shared block counts per sequence)
  uint64_t open_blocks = 0;
  uint64_t private_blocks = 0;   // full blocks the store refused
  uint64_t seals = 0;            // blocks sealed into the store (all time)
  uint64_t seal_dedups = 0;      // seals that found the key already stored
  uint64_t attached_blocks = 0;  // blocks attached from the store by CreateFromPrefix
  uint64_t unseals = 0;          // sealed blocks copied back into an open block by Truncate
  uint64_t forks = 0;
  // With a codec: blocks encoded by Seal (all time), their raw and stored
  // bytes, and the decoded copies alive now (one per distinct sealed block).
  uint64_t encoded_seals = 0;
  uint64_t encoded_raw_bytes = 0, encoded_stored_bytes = 0;
  uint64_t decoded_blocks = 0;
};

class SequenceTable {
 public:
  // A table over `store` for the slice (layers, heads) of `model`.
  // REQUIRES: store outlives the table; the slice lies inside the model.
  static Result<std::unique_ptr<SequenceTable>> Create(BlockStore* store, const ModelSpec& model, Range layers,
                                                       Range heads, SequenceOptions options = {});
  ~SequenceTable();  // releases every sequence

  const BlockLayout& layout() const;
  const KeyDeriver& deriver() const;

  // A new empty sequence.
  SeqId Create();
  // A new sequence holding the longest run of leading full blocks of
  // `tokens` that the store has, pinned; at most max_blocks of them. Its
  // length is that many blocks' tokens.
  SeqId CreateFromPrefix(std::span<const TokenId> tokens, size_t max_blocks = SIZE_MAX);
  // Leading full blocks of `tokens` stored in this table's store (touches them).
  size_t MatchPrefix(std::span<const TokenId> tokens);

  // Appends `tokens` and returns the position of the first. Their KV rows are
  // undefined until written. NotFound for an unknown sequence.
  Result<uint32_t> Extend(SeqId seq, std::span<const TokenId> tokens);
  // Writes K and V of `layer` for positions [pos, pos+n): k and v are
  // [n][heads][head_dim] in the model dtype, heads of this slice.
  // REQUIRES: the positions are extended and not yet sealed.
  Status Write(SeqId seq, uint32_t layer, uint32_t pos, uint32_t n, std::span<const std::byte> k,
               std::span<const std::byte> v);
  // Seals every full open block (in order) into the store.
  Status Commit(SeqId seq);
  // Extend + Write for every layer of the slice + Commit. k and v are
  // [layer][n][heads][head_dim] over the slice's layers.
  Status Append(SeqId seq, std::span<const TokenId> tokens, std::span<const std::byte> k,
                std::span<const std::byte> v);

  // Drops the last n tokens (n <= length). A sealed block that keeps some of
  // its tokens becomes an open block again (copied out of the store).
  Status Truncate(SeqId seq, uint32_t n);
  // A new sequence with the same tokens: sealed blocks shared (pinned again),
  // open blocks copied.
  Result<SeqId> Fork(SeqId seq);
  // Unpins and forgets the sequence; its sealed blocks stay cached.
  Status Release(SeqId seq);

  Result<uint32_t> Length(SeqId seq) const;
  Result<std::vector<TokenId>> Tokens(SeqId seq) const;
  // Number of leading sealed blocks (the rest are open).
  Result<uint32_t> SealedBlocks(SeqId seq) const;
  // A view for reading KV. Valid until the next write to the sequence.
  Result<SequenceView> View(SeqId seq) const;

  // Counters, and a walk over live sequences: call it when no write is in flight.
  SequenceStats Stats() const;

 private:
  struct Impl;
  explicit SequenceTable(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvmesh

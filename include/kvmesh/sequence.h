// kvmesh/sequence.h — the values that describe a live sequence, shared by the
// router API, every transport and the node that holds the sequence.
//
// A live sequence is the growing KV of one running decode for one slice
// (layer range x KV-head range) of the model, held by one shard node: tokens
// are appended one (or a speculative batch) at a time, full blocks are sealed
// under their chained key and become shareable by prefix match, `truncate`
// rolls back rejected drafts and `fork` shares the sealed blocks. The calls
// themselves are Router::*Sequence (kvmesh/router.h); these are their values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvmesh/types.h"

namespace kvmesh {

// A node-local sequence id. Ids are never reused while a node process lives,
// and a restarted node starts from a random point, so a stale id answers
// NotFound rather than reaching another client's sequence.
using SeqId = uint64_t;

// What creating a sequence asks for.
struct SeqCreateArgs {
  Range layers;  // empty: all layers of the model
  Range heads;   // empty: all KV heads
  std::string tenant_salt;
  Priority priority = kDefaultPriority;
  std::span<const TokenId> prefix;  // attach its leading full blocks the node has
  size_t max_blocks = SIZE_MAX;     // attach at most this many
};

// What creating a sequence answers.
struct SeqCreated {
  SeqId id = 0;
  uint32_t length = 0;           // tokens attached from the prefix
  uint32_t attached_blocks = 0;  // blocks attached from the store (length / block_tokens)
};

// A sequence's state as its node sees it.
struct SequenceState {
  uint32_t length = 0;         // tokens
  uint32_t sealed_blocks = 0;  // leading full blocks sealed into the node's store
  std::vector<TokenId> tokens;
};

}  // namespace kvmesh

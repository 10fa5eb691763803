// eviction/retention.h — StreamingLLM-style retention for one sequence
// (Xiao et al., "Efficient Streaming Language Models with Attention Sinks").
//
// A streaming decode keeps the first `sink_blocks` blocks (the attention
// sinks) and the most recent `window_blocks` blocks; the model never attends
// to the blocks in between again, so caching them only wastes memory. This is
// a per-request option applied by the client (router user), not a policy:
//
//   StreamingRetention r{.sink_blocks = 1, .window_blocks = 8};
//   // storing block i of the sequence:
//   opts.priority = r.ClassFor(i, /*keep=*/3, /*base=*/opts.priority);
//   // after the sequence grew from n_old to n blocks, erase the blocks that left
//   // the window (they are dead for this sequence):
//   Range d = r.Dropped(n_old, n);
//   for (uint32_t i = d.begin; i < d.end; ++i) erase(keys[i]);
//
// Sinks get the `keep` class, so every policy that honours classes keeps them
// longest; window blocks keep the caller's class (recency keeps them, they are
// the newest). Blocks shared with other sequences are content-addressed, so a
// client should only erase blocks no other live sequence still uses.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kvmesh/types.h"

namespace kvmesh {

struct StreamingRetention {
  uint32_t sink_blocks = 1;    // leading blocks kept for the whole sequence
  uint32_t window_blocks = 8;  // most recent blocks kept; 0 = retention off (keep everything)

  bool enabled() const { return window_blocks > 0; }

  // True when block `index` of a sequence of `seq_blocks` blocks is still attended.
  bool Keeps(uint32_t index, uint32_t seq_blocks) const {
    if (!enabled()) return true;
    return index < sink_blocks || index + window_blocks >= seq_blocks;
  }
  // The class to store block `index` with.
  Priority ClassFor(uint32_t index, Priority keep, Priority base) const {
    return enabled() && index < sink_blocks ? std::max(keep, base) : base;
  }
  // The blocks that leave the window when the sequence grows from `before` to
  // `after` blocks: [begin, end) (empty when none or retention is off).
  Range Dropped(uint32_t before, uint32_t after) const {
    if (!enabled() || after <= before) return {};
    auto first_out = [&](uint32_t n) { return n > window_blocks ? n - window_blocks : 0u; };
    const uint32_t b = std::max(sink_blocks, first_out(before));
    const uint32_t e = std::max(sink_blocks, first_out(after));
    return e > b ? Range{b, e} : Range{};
  }
};

}  // namespace kvmesh

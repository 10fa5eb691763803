// shard_node/block_events.h — what a store tells an observer about its
// blocks: a block became live in a tier (stored) or left it (removed: evicted,
// erased, dropped as corrupt, moved to another tier). The node's KV-event
// publisher (shard_node/kv_events.h) is the observer; docs/kv-events.md.
//
// Each store calls its observer at the one place where a block enters or
// leaves its index as a live block (where its block count changes), under
// the lock that serialises that key, so the observer sees one key's changes
// in one tier in the order they happened. The call must not block and must
// not call back into the store.
#pragma once

#include <cstdint>
#include <string_view>

#include "kvmesh/types.h"

namespace kvmesh {

// The tier a block is in, named as the engines' KV events name media.
enum class BlockMedium : uint8_t { kGpu = 0, kCpu = 1, kDisk = 2 };
inline constexpr int kNumBlockMedia = 3;
inline std::string_view BlockMediumName(BlockMedium m) {
  switch (m) {
    case BlockMedium::kGpu: return "GPU";
    case BlockMedium::kCpu: return "CPU";
    case BlockMedium::kDisk: return "DISK";
  }
  return "?";
}

enum class BlockChange : uint8_t { kStored = 0, kRemoved = 1 };

class BlockObserver {
 public:
  virtual ~BlockObserver() = default;
  virtual void OnBlock(BlockChange change, BlockMedium medium, const BlockKey& key) noexcept = 0;
};

}  // namespace kvmesh

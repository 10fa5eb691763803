// shard_node/key_groups.h — groups of blocks a node evicts together.
//
// A co-evicted key (kvmesh/block_key.h IsCoEvictedKey: the blocks of RESP
// keys that share a hash tag or a suffix-rule stem) names its group in its hi
// half. A node keeps the members of each such group it stores, and treats a
// group with any member gone (evicted from every tier, or lost to a corrupt
// read) as gone entirely: the next read or existence check of any member
// finds the loss, erases the rest and answers a miss, and every put sweeps
// two groups round robin so that broken groups nobody reads are reclaimed
// (and the index stays bounded by the co-evicted blocks stored). So a reader
// never sees one block of a group without the others once eviction has
// touched it, whatever tier policy runs underneath: the check asks the
// serving store, not the eviction path.
//
// An explicit erase or a replacing put of a member takes it out of its group
// first, so deleting one key of a group (RESP DEL) never drops the others.
//
// Thread-safety: thread-safe (sharded by group, one mutex per shard; the
// store calls are made outside the locks).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include <absl/container/flat_hash_map.h>

#include "kvmesh/types.h"

namespace kvmesh {

class KeyGroups {
 public:
  using ExistsFn = std::function<bool(const BlockKey&)>;  // stored in any tier (no touch)
  using EraseFn = std::function<void(const BlockKey&)>;

  // Records a co-evicted key just stored.
  void Added(const BlockKey& k);
  // Forgets k (an explicit erase or a replacing put is about to run).
  void Removed(const BlockKey& k);

  // False when k's group has lost a member: then the whole group has been
  // erased (erase() for each remaining member). True for a key in no group.
  bool Intact(const BlockKey& k, const ExistsFn& exists, const EraseFn& erase);
  // Checks the next `n` groups (round robin) the same way.
  void Sweep(size_t n, const ExistsFn& exists, const EraseFn& erase);

  struct Counts {
    uint64_t groups = 0, keys = 0, dropped_groups = 0, dropped_keys = 0;
  };
  Counts counts() const;

 private:
  struct Group {
    std::vector<BlockKey> members;
    size_t pos = 0;  // index in Shard::order
  };
  struct Shard {
    mutable std::mutex mu;
    absl::flat_hash_map<uint64_t, Group> groups;
    std::vector<uint64_t> order;  // the groups, for the sweep
    size_t cursor = 0;
    uint64_t dropped_groups = 0, dropped_keys = 0;
  };
  static constexpr size_t kShards = 16;
  Shard& ShardOf(uint64_t group) { return shards_[(group * 0x9E3779B97F4A7C15ull) >> 60]; }
  // Checks group g (members copied out under the lock); drops it when broken.
  bool Check(uint64_t g, const ExistsFn& exists, const EraseFn& erase);
  static void Unlink(Shard& s, uint64_t g);  // REQUIRES s.mu

  Shard shards_[kShards];
  std::atomic<size_t> sweep_shard_{0};
};

}  // namespace kvmesh

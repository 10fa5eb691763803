// shard_node/ssd_tier.h — the lowest tier: blocks in fixed-size slots of one
// file on local disk, read and written with pread/pwrite.
//
// Each slot holds a 48-byte header (magic, key, payload size, codec, priority,
// logical size, xxHash3-64 of the payload, header checksum) followed by the
// payload. Read verifies the header, that it names the requested key, and
// the payload checksum: a torn, stale or corrupt slot is a miss (DataLoss, the
// entry is dropped), never returned. The file is a cache: it is created
// empty (truncated) at start and its contents do not survive a restart; a
// file the tier named itself (path is a directory) is removed on destruction.
//
// Eviction inside the tier uses any EvictionPolicy (default "lru"); blocks
// evicted from the SSD are gone.
//
// Thread-safety: all methods are thread-safe. One mutex guards the index and
// policy; file I/O runs outside it (a slot being written is reserved, a slot
// being read is protected by a reader count so it is not reused meanwhile).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include <absl/container/flat_hash_map.h>

#include "eviction/eviction_policy.h"
#include "kvmesh/clock.h"
#include "kvmesh/status.h"
#include "kvmesh/types.h"
#include "shard_node/block_events.h"

namespace kvmesh {

struct SsdTierOptions {
  std::string path;             // a file, or a directory: "kvmesh-<name>.ssd" is made in it
  std::string name = "tier";    // for the directory case (e.g. the node id, so nodes sharing a directory don't collide)
  uint64_t capacity_bytes = 0;  // file size budget (> 0)
  uint64_t slot_bytes = 0;      // largest payload (> 0)
  std::string policy = "lru";
  Clock* clock = nullptr;
  // Called (under the tier's mutex) with the key of each block the tier
  // evicts to make room; must not call back into the tier. May be empty.
  std::function<void(const BlockKey&)> on_evict;
  // Told of every block that enters or leaves the tier's index, as a DISK
  // block (shard_node/block_events.h), under the tier's mutex. May be null.
  BlockObserver* observer = nullptr;
};

struct SsdBlockMeta {
  uint32_t size = 0;
  uint32_t logical_size = 0;
  uint8_t codec = 0;
  Priority priority = kDefaultPriority;
};

struct SsdStats {
  uint64_t capacity_bytes = 0, slots_total = 0, blocks = 0, bytes_stored = 0;
  uint64_t writes = 0, reads = 0, hits = 0, misses = 0, corrupt = 0, evictions = 0, write_errors = 0;
};

class SsdTier {
 public:
  static Result<std::unique_ptr<SsdTier>> Create(const SsdTierOptions& o);
  ~SsdTier();

  // Writes the block, evicting by policy when full. A key already present is
  // refreshed only. Errors: InvalidArgument (too large), IoError.
  Status Put(const BlockKey& key, std::span<const std::byte> payload, const SsdBlockMeta& meta);
  // Reads the block into `dst` (REQUIRES dst.size() >= slot payload size, or at
  // least the block's size). NotFound on a miss, DataLoss when the slot fails
  // verification (the entry is then dropped).
  Result<SsdBlockMeta> Read(const BlockKey& key, std::span<std::byte> dst);
  bool Contains(const BlockKey& key) const;
  // Calls fn(key) for every indexed block under the tier's mutex (a listing
  // for a snapshot; fn must not call back into the tier).
  void ForEachLive(const std::function<void(const BlockKey&)>& fn) const;
  Status Erase(const BlockKey& key);

  SsdStats Stats() const;
  const std::string& file() const { return file_; }
  uint64_t slot_bytes() const { return slot_payload_; }
  // For tests: the byte offset of `key`'s payload in the file (NotFound when absent).
  Result<uint64_t> PayloadOffsetForTest(const BlockKey& key) const;

 private:
  struct Slot {
    BlockKey key;
    SsdBlockMeta meta;
    uint32_t readers = 0;
    bool live = false;
    bool doomed = false;  // dropped while being read: freed by the last reader
  };
  SsdTier() = default;
  void FreeSlotLocked(uint32_t slot);

  int fd_ = -1;
  std::string file_;
  bool owns_file_ = false;  // named by us in a directory: removed on destruction
  uint64_t slot_payload_ = 0;
  uint64_t slot_stride_ = 0;
  Clock* clock_ = nullptr;
  std::function<void(const BlockKey&)> on_evict_;
  BlockObserver* observer_ = nullptr;
  void Notify(BlockChange c, const BlockKey& k) const {
    if (observer_) observer_->OnBlock(c, BlockMedium::kDisk, k);
  }
  mutable std::mutex mu_;
  std::vector<Slot> slots_;                             // guarded by mu_
  std::vector<uint32_t> free_;                          // guarded by mu_
  absl::flat_hash_map<BlockKey, uint32_t> index_;       // guarded by mu_
  std::unique_ptr<EvictionPolicy> policy_;              // guarded by mu_ (EntryId = slot)
  SsdStats stats_;                                      // guarded by mu_
};

}  // namespace kvmesh

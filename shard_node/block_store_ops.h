// shard_node/block_store_ops.h — the block operations a shard node serves
// through, and the types they exchange (BlockMeta, PutOptions, BlockRef).
//
// BlockStoreOps is implemented by BlockStore (one memory region,
// shard_node/block_store.h) and by TieredStore (device -> host -> SSD over a
// BlockStore, shard_node/tiered_store.h); ShardNode holds one BlockStoreOps*
// for whichever its config built. Code that needs one implementation's extra
// operations (stats, policies, tiers) keeps the concrete type: both are
// final, so calls through them are direct.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

#include "kvmesh/status.h"
#include "kvmesh/types.h"

namespace kvmesh {

struct BlockMeta {
  BlockKey key;
  uint32_t size = 0;          // stored payload bytes
  uint32_t logical_size = 0;  // bytes before encoding (== size when not encoded)
  uint8_t codec = 0;          // codec id of the payload (0 = raw)
  Priority priority = kDefaultPriority;
  uint64_t checksum = 0;      // xxHash3-64 of the stored payload
  int64_t last_access_ns = 0;
  uint32_t access_count = 0;
};

struct PutOptions {
  Priority priority = kDefaultPriority;
  uint8_t codec = 0;
  uint32_t logical_size = 0;  // 0: same as the payload size
  float score = 0.0f;         // hint for score-based policies
  // ShardNode::Put only: replace a block already stored under the key (in
  // every tier). Default: the first block stays (keys name their content).
  bool replace = false;
  // BlockStore::Put only. False: ResourceExhausted instead of evicting when
  // the block's class has no free chunk and no page is free (level-2
  // re-encoding waits for the page its erases are emptying).
  bool may_evict = true;
};

class BlockStore;

// A pinned, read-only view of a stored block. Move-only; unpins on destruction.
// REQUIRES: the store outlives every BlockRef.
class BlockRef {
 public:
  BlockRef() = default;
  BlockRef(BlockRef&& o) noexcept { *this = std::move(o); }
  BlockRef& operator=(BlockRef&& o) noexcept;
  BlockRef(const BlockRef&) = delete;
  BlockRef& operator=(const BlockRef&) = delete;
  ~BlockRef() { Release(); }

  bool valid() const { return store_ != nullptr; }
  // Payload bytes in the store's memory (device memory for a device backend).
  std::span<const std::byte> data() const { return {data_, meta_.size}; }
  const BlockMeta& meta() const { return meta_; }
  void Release();

 private:
  friend class BlockStore;
  BlockStore* store_ = nullptr;
  uint32_t stripe_ = 0;
  uint32_t slot_ = 0;
  const std::byte* data_ = nullptr;
  BlockMeta meta_;
};

// The per-block operations of a store. Keys name their content: callers put
// the same bytes under the same key, so a store may keep the copy it has.
//
// Thread-safety: every implementation is thread-safe; any method may run
// concurrently with any other from any thread, except from inside a
// BlockStore eviction listener (which runs under a stripe lock).
//
// Errors are Status codes (kvmesh/status.h); each implementation documents
// the cases it adds (TieredStore: Busy at pressure level 3, DataLoss for a
// corrupt SSD block).
class BlockStoreOps {
 public:
  virtual ~BlockStoreOps() = default;

  // Stores a copy of `payload` under `key` (the caller keeps its buffer). A
  // key already stored in the tier the put goes to keeps its payload and is
  // refreshed (ShardNode's PutOptions::replace erases it first).
  // InvalidArgument: empty or larger than the largest block; ResourceExhausted:
  // no room that can be made (every candidate pinned); Busy: refused for now.
  virtual Status Put(const BlockKey& key, std::span<const std::byte> payload, const PutOptions& o) = 0;

  // A pinned view of the block: the caller owns the BlockRef, and the block
  // cannot be evicted or freed until the ref is released or destroyed (an
  // erase hides it at once). The bytes may be device memory (see
  // BlockRef::data). NotFound on a miss; DataLoss when the block failed its
  // checksum (it is then dropped).
  virtual Result<BlockRef> Get(const BlockKey& key) = 0;

  // Copies the block into `dst` and returns the bytes written; nothing stays
  // pinned. NotFound, DataLoss as Get. A `dst` too small for the block is
  // refused before anything is copied (ResourceExhausted; InvalidArgument
  // from a TieredStore decoding an encoded block).
  virtual Result<size_t> GetInto(const BlockKey& key, std::span<std::byte> dst) = 0;

  // True when stored. With touch, counts as an access (refreshes recency).
  virtual bool Exists(const BlockKey& key, bool touch) = 0;

  // NotFound when absent. A pinned block is hidden at once and freed on its
  // last unpin.
  virtual Status Erase(const BlockKey& key) = 0;

  // Explicit, counted pins held for a client: a pinned block is never
  // evicted. Every Pin must be matched by one Unpin. NotFound when absent
  // (a TieredStore promotes a lower block first and returns the promotion's
  // error); FailedPrecondition on Unpin of an unpinned block.
  virtual Status Pin(const BlockKey& key) = 0;
  virtual Status Unpin(const BlockKey& key) = 0;

  // The client's readers are done with the block (a closed session's
  // private block, docs/eviction.md "Session closes"): it becomes the next
  // to leave its tier (EvictionPolicy::Release) until it is read again.
  // Nothing else changes; a pinned block is not affected. NotFound when absent.
  virtual Status Release(const BlockKey& key) = 0;

 protected:
  BlockStoreOps() = default;
  BlockStoreOps(const BlockStoreOps&) = delete;
  BlockStoreOps& operator=(const BlockStoreOps&) = delete;
};

}  // namespace kvmesh

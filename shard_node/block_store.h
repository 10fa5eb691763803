// shard_node/block_store.h — one node's block store over one memory region.
//
// The budget is allocated once up front and cut into fixed-size slots; a put
// takes a free slot (evicting by policy when none is free) and never
// allocates. Keys map to slots in per-stripe hash maps reserved at start-up.
// Every payload carries an xxHash3-64 checksum computed on put and verified
// on get: a mismatch erases the block and reads as a miss (kDataLoss).
//
// Pins: a pinned block is never evicted. Get() returns a BlockRef that holds a
// pin until it is destroyed; Pin()/Unpin() hold explicit pins for clients.
// Erasing a pinned block hides it at once and frees its slot on the last unpin.
//
// Thread-safety: all methods are thread-safe. The store is split into
// `stripes` independently locked parts by key hash (leveldb ShardedLRUCache);
// payload copies and checksums run outside the stripe lock.
// Lock order: a stripe lock is a leaf, except that the eviction listener runs
// under it (the listener must not call back into this store).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>

#include "eviction/eviction_policy.h"
#include "kvmesh/clock.h"
#include "kvmesh/status.h"
#include "kvmesh/types.h"
#include "shard_node/memory_backend.h"

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

struct StoreOptions {
  uint64_t capacity_bytes = 0;  // pool budget (> 0)
  uint64_t slot_bytes = 0;      // bytes per slot = largest storable block (> 0)
  uint32_t stripes = 8;         // power of two; each gets capacity/stripes
  bool verify_checksums = true;
  std::string policy = "lru-priority";
  PolicyOptions policy_options;
  // nullptr: host memory from MakeHostMemory(capacity_bytes).
  std::unique_ptr<MemoryBackend> backend;
  Clock* clock = nullptr;  // nullptr: SystemClock()
};

struct PutOptions {
  Priority priority = kDefaultPriority;
  uint8_t codec = 0;
  uint32_t logical_size = 0;  // 0: same as the payload size
  float score = 0.0f;         // hint for score-based policies
  // ShardNode::Put only: replace a block already stored under the key (in
  // every tier). Default: the first block stays (keys name their content).
  bool replace = false;
};

struct StoreStats {
  uint64_t capacity_bytes = 0;
  uint64_t slot_bytes = 0;
  uint64_t slots_total = 0;
  uint64_t blocks = 0;
  uint64_t bytes_stored = 0;   // sum of stored payload sizes
  uint64_t bytes_logical = 0;  // sum of logical sizes
  uint64_t pinned_blocks = 0;
  uint64_t puts = 0, put_duplicates = 0, put_rejected = 0;
  uint64_t gets = 0, hits = 0, misses = 0;
  uint64_t erases = 0;
  uint64_t corrupt = 0;  // checksum mismatches (each also counts as a miss)
  uint64_t evictions = 0;
  std::array<uint64_t, kMaxPriorityClasses> evictions_by_class{};  // by effective class

  // Sums another store's (or stripe's) figures into these; slot_bytes takes the max.
  void Add(const StoreStats& o);
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

class BlockStore {
 public:
  // Called under the stripe lock just before an evicted block's slot is
  // reused (demotion to a lower tier copies it out here). Must not call back
  // into this store.
  using EvictionListener = std::function<void(const BlockMeta&, std::span<const std::byte>)>;

  static Result<std::unique_ptr<BlockStore>> Create(StoreOptions options);
  ~BlockStore();

  // Stores `payload` under `key`, evicting unpinned blocks by policy when the
  // stripe is full. A key that is already stored is refreshed (its priority
  // raised to max(old, new)) and keeps its payload: keys are content-addressed.
  // Errors: InvalidArgument (empty or larger than a slot), ResourceExhausted
  // (every block of the stripe is pinned), Busy (the admission filter refused).
  Status Put(const BlockKey& key, std::span<const std::byte> payload, const PutOptions& o = {});

  // A pinned view of the block. NotFound on a miss, DataLoss on a checksum
  // mismatch (the block is then erased).
  Result<BlockRef> Get(const BlockKey& key);
  // Copies the block into `dst` (REQUIRES dst.size() >= block size) and
  // returns its size.
  Result<size_t> GetInto(const BlockKey& key, std::span<std::byte> dst);

  // True when stored. With touch, counts as an access (refreshes recency).
  bool Exists(const BlockKey& key, bool touch = false);
  // NotFound when absent.
  Status Erase(const BlockKey& key);
  // Explicit pins (counted); NotFound when absent, FailedPrecondition on
  // Unpin of an unpinned block.
  Status Pin(const BlockKey& key);
  Status Unpin(const BlockKey& key);

  void SetEvictionListener(EvictionListener l);

  // Switches the eviction policy at run time (e.g. "lru" -> "arc"). Each
  // stripe gets a fresh policy holding its evictable blocks in their recency
  // order (oldest first); pinned blocks join it on their last unpin. Aging
  // restarts. InvalidArgument for an unknown name (nothing changes). `options`
  // nullptr keeps the current options. Thread-safe; requests keep flowing.
  Status SetPolicy(std::string_view name, const PolicyOptions* options = nullptr);

  StoreStats Stats() const;
  std::string policy_name() const;
  uint64_t slot_bytes() const { return slot_bytes_; }
  MemoryBackend& backend() { return *backend_; }

 private:
  struct Stripe;
  friend class BlockRef;
  BlockStore() = default;
  Stripe& StripeOf(const BlockKey& k) const;
  void ReleaseRef(uint32_t stripe, uint32_t slot);
  // Pins a live block; with verify, checks its checksum first.
  Result<BlockRef> Pin(const BlockKey& key, bool verify);
  // Hides a block whose checksum failed and releases `ref`'s pin.
  void DropCorrupt(BlockRef& ref);

  std::unique_ptr<MemoryBackend> backend_;
  std::unique_ptr<Stripe[]> stripes_;
  uint32_t num_stripes_ = 0;
  uint64_t slot_bytes_ = 0;
  uint64_t capacity_bytes_ = 0;
  bool verify_ = true;
  Clock* clock_ = nullptr;
  mutable std::mutex policy_mu_;      // guards policy_name_, policy_options_ (not the stripes)
  std::string policy_name_;
  PolicyOptions policy_options_;
  EvictionListener listener_;
};

}  // namespace kvmesh

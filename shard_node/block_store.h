// shard_node/block_store.h — one node's block store over one memory region.
//
// The budget is allocated once up front and managed as a slab allocator
// (memcached style). It is cut into pages of `page_slots` slots; a slot is
// `slot_bytes`, the largest storable block. Size class 0 has chunks of one
// slot; class k >= 1 cuts a page into 7 * 2^(k-1) chunks (for 4-slot pages:
// 4/7, 2/7, 1/7 of a slot ...), i.e. 7/8 of an exact halving, so that codec
// output (slot / 2^k plus a header and scales: int8 or fp8 of fp16, int4)
// lands in class k rather than k-1. A page is given to a class when the class
// needs a chunk and is cut into chunks; when every chunk of a page is free
// again the page goes back to the stripe's free pages for any class. A put
// takes a chunk of the smallest class that fits, so encoded (smaller) blocks
// hold less memory. `size_classes = 1` is the fixed-slot store (one-slot
// pages, one class). Nothing is allocated per put: chunk metadata, the index
// and the policies are reserved at start-up for the most chunks a stripe can
// hold.
//
// Eviction: each stripe keeps one policy per class. A put that finds no free
// chunk in its class and no free page evicts its own class's victim (one
// eviction frees one usable chunk), except that it takes a whole page of
// another class instead when every block on that page ranks below its own
// victim (lower effective priority class, else idle longer): the policy
// would evict those blocks first anyway, and this moves pages from stale
// classes to busy ones. A class with nothing evictable takes the page that
// evicts the lowest priority classes, then the fewest blocks.
// Every payload carries an xxHash3-64 checksum computed on put and verified
// on get: a mismatch erases the block and reads as a miss (kDataLoss).
//
// Pins: a pinned block is never evicted (nor is its page taken). Get() returns
// a BlockRef that holds a pin until it is destroyed (PinRef() one that counts
// no read); Pin()/Unpin() hold explicit pins by key. Erasing a pinned block
// (an erase, a replacing put, a tenant's quota eviction, a checksum failure)
// hides it at once and frees its chunk on the last unpin, whatever removed it
// from the index: Unpin(key) still finds a doomed chunk that holds explicit
// pins, oldest first.
// The per-block operations are BlockStoreOps (shard_node/block_store_ops.h),
// which TieredStore implements too.
//
// Thread-safety: all methods are thread-safe. The store is split into
// `stripes` independently locked parts by key hash (leveldb ShardedLRUCache),
// each with its own pages; payload copies and checksums run outside the
// stripe lock.
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
#include <vector>

#include "eviction/eviction_policy.h"
#include "kvmesh/clock.h"
#include "kvmesh/status.h"
#include "kvmesh/types.h"
#include "shard_node/block_events.h"
#include "shard_node/block_store_ops.h"
#include "shard_node/memory_backend.h"

namespace kvmesh {

// Size classes of a store: 1 = fixed slots (every block takes a whole slot).
inline constexpr uint32_t kDefaultSizeClasses = 4;
inline constexpr uint32_t kMaxSizeClasses = 8;
// No class has chunks smaller than this (they would cost more metadata than
// they save), so small slots get fewer classes than asked for (one under 7 KiB).
inline constexpr uint64_t kMinChunkBytes = 4096;

struct StoreOptions {
  uint64_t capacity_bytes = 0;  // pool budget (> 0)
  uint64_t slot_bytes = 0;      // bytes per slot = largest storable block (> 0)
  // 1..kMaxSizeClasses. 1: fixed slots (one-slot pages). More: pages of
  // `page_slots` slots cut into chunks per class (see the file comment).
  uint32_t size_classes = kDefaultSizeClasses;
  uint32_t page_slots = 4;      // slots per page when size_classes > 1 (>= 2)
  uint32_t stripes = 8;         // power of two; each gets capacity/stripes
  bool verify_checksums = true;
  std::string policy{kDefaultEvictionPolicy};
  PolicyOptions policy_options;
  // nullptr: host memory from MakeHostMemory(capacity_bytes).
  std::unique_ptr<MemoryBackend> backend;
  Clock* clock = nullptr;  // nullptr: SystemClock()
  // Where a size class's stripes find their PolicyGroup: the group
  // "<group_scope>/<policy>/<chunk bytes>" of `groups`, shared with the other
  // stores that use it (a node's, or an embedded cluster's). nullptr: the
  // store's own groups.
  std::shared_ptr<PolicyGroups> groups;
  std::string group_scope = "primary";
  // Told of every block that becomes live or leaves (shard_node/block_events.h),
  // as a block of `medium`. nullptr: nobody. Must outlive the store.
  BlockObserver* observer = nullptr;
  BlockMedium medium = BlockMedium::kGpu;
  // Local reads (transport/local_index.h): the store publishes its live raw
  // blocks in a shared index that clients on this host read the pool through.
  // Needs shared host memory: with no backend given, the pool is made a memfd;
  // a backend that is not shared memory (shared_fd() < 0) gets no index.
  bool local_reads = false;
};

// One size class of a store (StoreStats::classes).
struct SizeClassStats {
  uint64_t chunk_bytes = 0;  // bytes per chunk (the largest block the class takes)
  uint64_t pages = 0;        // pages assigned to the class now
  uint64_t chunks_used = 0;  // chunks holding a block (live, being written, or erased but pinned)
  uint64_t evictions = 0;    // blocks of this class evicted
};

struct StoreStats {
  uint64_t capacity_bytes = 0;
  uint64_t slot_bytes = 0;     // largest storable block
  uint64_t slots_total = 0;    // capacity in blocks of slot_bytes (capacity_bytes / slot_bytes)
  uint64_t blocks = 0;
  uint64_t bytes_stored = 0;   // sum of stored payload sizes
  // Memory the blocks take: chunk bytes of every used chunk (a whole slot per
  // block with fixed slots). Watermarks and pressure measure this.
  uint64_t bytes_held = 0;
  uint64_t page_bytes = 0;     // max over stripes (the stripe's last page may be shorter)
  uint64_t pages_total = 0, pages_free = 0;
  uint64_t page_reclaims = 0;  // pages taken from one class (their blocks evicted) for another
  uint32_t size_classes = 0;
  std::array<SizeClassStats, kMaxSizeClasses> classes{};
  uint64_t bytes_logical = 0;  // sum of logical sizes
  uint64_t pinned_blocks = 0;
  uint64_t puts = 0, put_duplicates = 0, put_rejected = 0;
  uint64_t gets = 0, hits = 0, misses = 0;
  uint64_t erases = 0;
  uint64_t releases = 0;  // Release() of a stored block (BlockStoreOps::Release)
  uint64_t corrupt = 0;  // checksum mismatches (each also counts as a miss)
  uint64_t evictions = 0;
  std::array<uint64_t, kMaxPriorityClasses> evictions_by_class{};  // by effective class

  // Sums another store's (or stripe's) figures into these; slot_bytes,
  // page_bytes, size_classes and classes[].chunk_bytes take the max.
  void Add(const StoreStats& o);
};

class BlockStore;
class LocalIndexWriter;

// A chunk reserved for one block by BlockStore::Reserve, for a transport
// that lands the payload in pool memory itself (a TCP read straight into the
// chunk, a UCX get from the client's memory). The caller fills data() (on a
// host-accessible backend; otherwise through backend().CopyIn), then
// BlockStore::Commit makes the block live. Readers miss the block until then,
// and a Put of the same key meanwhile returns at once (as for any block being
// written). Destroying an uncommitted reservation frees the chunk.
// Move-only. REQUIRES: the store outlives every reservation.
// Thread-safety: one thread at a time.
class BlockReservation {
 public:
  BlockReservation() = default;
  BlockReservation(BlockReservation&& o) noexcept { *this = std::move(o); }
  BlockReservation& operator=(BlockReservation&& o) noexcept;
  BlockReservation(const BlockReservation&) = delete;
  BlockReservation& operator=(const BlockReservation&) = delete;
  ~BlockReservation() { Abort(); }

  bool valid() const { return store_ != nullptr; }
  // The chunk's pool memory, exactly the reserved size.
  std::span<std::byte> data() const { return {data_, size_}; }
  const BlockKey& key() const { return key_; }
  const PutOptions& options() const { return options_; }
  BlockStore* store() const { return store_; }  // the store it belongs to (a tier)
  // Frees the chunk without storing anything.
  void Abort();

 private:
  friend class BlockStore;
  BlockKey key_;
  BlockStore* store_ = nullptr;
  uint32_t stripe_ = 0;
  uint32_t slot_ = 0;
  uint32_t size_ = 0;
  std::byte* data_ = nullptr;
  PutOptions options_;
};

class BlockStore final : public BlockStoreOps {
 public:
  // Called under the stripe lock just before an evicted block's slot is
  // reused (demotion to a lower tier copies it out here). Must not call back
  // into this store.
  using EvictionListener = std::function<void(const BlockMeta&, std::span<const std::byte>)>;

  static Result<std::unique_ptr<BlockStore>> Create(StoreOptions options);
  ~BlockStore() override;

  // Stores `payload` under `key`, evicting unpinned blocks by policy when the
  // stripe is full. A key that is already stored is refreshed (its priority
  // raised to max(old, new)) and keeps its payload: keys are content-addressed.
  // Errors: InvalidArgument (empty or larger than a slot), ResourceExhausted
  // (every block that could make room is pinned or being written, or
  // o.may_evict is false and there is no room), Busy (the admission filter
  // refused).
  Status Put(const BlockKey& key, std::span<const std::byte> payload, const PutOptions& o = {}) override;

  // The two halves of Put for a transport that writes the payload into pool
  // memory itself (BlockReservation). Reserve takes a chunk for `size` bytes
  // exactly as Put would (admission, eviction, the same errors) and returns it
  // for writing; AlreadyExists when the key is stored (refreshed as Put
  // does: its priority raised) or being written, so the caller drops its bytes.
  Result<BlockReservation> Reserve(const BlockKey& key, size_t size, const PutOptions& o = {});
  // Makes the reserved block live with `checksum` (xxHash3-64 of its bytes).
  // With verify, the chunk's bytes are hashed once first (host-accessible
  // backends) and a mismatch frees the chunk: DataLoss, nothing stored.
  // Without, the caller vouches for the checksum (it hashed while copying).
  // OK also when the block was erased while being written (nothing stored).
  Status Commit(BlockReservation& r, uint64_t checksum, bool verify);

  // A pinned view of the block. NotFound on a miss, DataLoss on a checksum
  // mismatch (the block is then erased).
  Result<BlockRef> Get(const BlockKey& key) override;
  // A pinned view without checksum verification, for a reader that verifies
  // the bytes where they land (a client over the network): one hash pass per
  // direction. NotFound on a miss.
  Result<BlockRef> GetUnverified(const BlockKey& key) { return Pin(key, /*verify=*/false); }
  // Copies the block into `dst` (REQUIRES dst.size() >= block size) and
  // returns its size.
  Result<size_t> GetInto(const BlockKey& key, std::span<std::byte> dst) override;

  // True when stored. With touch, counts as an access (refreshes recency).
  bool Exists(const BlockKey& key, bool touch = false) override;
  // `reads` reads a client made through the local-read index: counted as
  // hits (gets, hits) and as one access, as a Get would; nothing when the
  // block has gone since.
  void TouchLocal(const BlockKey& key, uint32_t reads = 1);
  // The local-read index (StoreOptions::local_reads); nullptr without one.
  LocalIndexWriter* local_index() const { return local_.get(); }
  // NotFound when absent.
  Status Erase(const BlockKey& key) override;
  // Explicit pins (counted); NotFound when absent, FailedPrecondition on
  // Unpin of an unpinned block. Unpin first releases a pin of a block erased
  // (or replaced, or evicted by a quota) while pinned under `key`, the oldest
  // first, then one of the block stored under `key` now.
  Status Pin(const BlockKey& key) override;
  Status Unpin(const BlockKey& key) override;
  // A pin held by a handle: the block stays until the BlockRef is released,
  // however it leaves the index (then its chunk is freed on that release).
  // Counts no read (no hit, no recency) and verifies nothing: for holders of
  // pins that are not reads (a connection's PIN). NotFound when absent.
  Result<BlockRef> PinRef(const BlockKey& key);
  Status Release(const BlockKey& key) override;

  void SetEvictionListener(EvictionListener l);
  // Calls fn(key) for every live block, one stripe at a time under its lock
  // (fn must not call back into the store): a listing for a snapshot of the
  // contents (shard_node/kv_events.h).
  void ForEachLive(const std::function<void(const BlockKey&)>& fn) const;

  // Switches the eviction policy at run time (e.g. "lru" -> "arc"). Each
  // stripe gets a fresh policy holding its evictable blocks in their recency
  // order (oldest first); pinned blocks join it on their last unpin. Aging
  // restarts. InvalidArgument for an unknown name (nothing changes). `options`
  // nullptr keeps the current options. Thread-safe; requests keep flowing.
  Status SetPolicy(std::string_view name, const PolicyOptions* options = nullptr);

  // Where the block's memory is: blocks with equal values share a page, which
  // is freed only when all of them are gone. For ordering bulk rewrites
  // (level-2 re-encoding erases page by page). UINT64_MAX when absent.
  uint64_t PlacementOf(const BlockKey& key) const;

  StoreStats Stats() const;
  std::string policy_name() const;
  uint64_t slot_bytes() const { return slot_bytes_; }
  uint32_t size_classes() const { return static_cast<uint32_t>(classes_.size()); }
  // Chunk bytes a block of `size` bytes would hold (0 when larger than a slot).
  uint64_t ChunkBytesFor(uint64_t size) const;
  MemoryBackend& backend() { return *backend_; }

 private:
  struct Stripe;
  struct ClassSpec {
    uint64_t chunk_bytes;
    uint32_t per_page;  // chunks in a full page
  };
  friend class BlockRef;
  friend class BlockReservation;
  BlockStore() = default;
  void AbortReservation(BlockReservation& r);
  Stripe& StripeOf(const BlockKey& k) const;
  uint32_t StripeNo(const Stripe& s) const;
  // Smallest class whose chunks hold `size` bytes. REQUIRES size <= slot_bytes_.
  uint32_t ClassFor(uint64_t size) const;
  // The chunk allocator; all REQUIRE the stripe lock.
  std::byte* ChunkData(const Stripe& s, uint32_t chunk) const;
  bool TakeChunk(Stripe& s, uint32_t cls, uint32_t* chunk);  // false: no free chunk or page
  void FreeChunk(Stripe& s, uint32_t chunk);
  void EvictChunk(Stripe& s, uint32_t chunk);
  // Evicts until class `cls` has a free chunk or a page is free; see the
  // file comment for the choice. ResourceExhausted when nothing can go.
  Status MakeRoom(Stripe& s, uint32_t cls);
  void ReleaseRef(uint32_t stripe, uint32_t slot);
  // Pins a live block; with verify, checks its checksum first.
  Result<BlockRef> Pin(const BlockKey& key, bool verify);
  // Hides a block whose checksum failed and releases `ref`'s pin.
  void DropCorrupt(BlockRef& ref);
  // Removes chunk's block from the local-read index (REQUIRES the stripe lock).
  void Unpublish(const Stripe& s, uint32_t chunk);
  // `accesses` reads of a live block: recency, access count, and its
  // policy's Touch unless pinned (REQUIRES the stripe lock).
  void TouchLocked(Stripe& s, uint32_t chunk, uint32_t accesses);

  std::unique_ptr<MemoryBackend> backend_;
  std::unique_ptr<LocalIndexWriter> local_;  // StoreOptions::local_reads
  std::unique_ptr<Stripe[]> stripes_;
  uint32_t num_stripes_ = 0;
  uint64_t slot_bytes_ = 0;
  uint64_t page_bytes_ = 0;       // a full page
  uint32_t chunk_stride_ = 1;     // chunk ids per page (the smallest class's per_page)
  std::vector<ClassSpec> classes_;  // largest chunk first
  uint64_t capacity_bytes_ = 0;
  bool verify_ = true;
  Clock* clock_ = nullptr;
  mutable std::mutex policy_mu_;      // guards policy_name_, policy_options_ (not the stripes)
  std::string policy_name_;
  PolicyOptions policy_options_;
  std::shared_ptr<PolicyGroups> groups_;  // StoreOptions::groups (fixed at Create)
  std::string group_scope_;
  // The groups of a policy's size classes (StoreOptions::groups).
  std::vector<std::shared_ptr<PolicyGroup>> GroupsFor(std::string_view policy) const;
  EvictionListener listener_;
  BlockObserver* observer_ = nullptr;
  BlockMedium medium_ = BlockMedium::kGpu;
  void Notify(BlockChange c, const BlockKey& k) const {
    if (observer_) observer_->OnBlock(c, medium_, k);
  }
};

}  // namespace kvmesh

// shard_node/tiered_store.h — a node's memory hierarchy: the primary tier
// (device memory, or host memory without a GPU: the node's BlockStore), an
// optional host tier (a second BlockStore) and an optional SSD tier (SsdTier).
//
// Blocks move down and up:
//  - demotion: a block the primary tier evicts is copied into the host tier
//    (from the store's eviction listener, under its stripe lock), and a block
//    the host tier evicts is written to the SSD tier; only the SSD deletes;
//  - offload (background): above the high watermark (0.80 of the tier's
//    budget) blocks are moved down until the low watermark (0.70), blocks idle
//    for offload_idle_s first (then lower priority, then older);
//  - promotion: a hit in a lower tier moves the block back into the primary
//    tier (promote_on_hit), or serves it in place (promote_on_hit = false, or
//    at pressure level 3, when the primary tier admits nothing new);
//  - prefetch: Prefetch(keys) queues promotions that the background worker
//    runs ahead of use (the router's "these blocks will be read soon").
// SSD reads verify a checksum: a torn or corrupt block is a miss.
//
// Pressure recovery (shard_node/pressure.h) runs in the same maintenance tick
// after offloading: level 1 evicts the oldest 25%, level 2 re-encodes raw
// blocks at lower precision with kernels/codec (int8 by default), level 3
// refuses Put with Busy while reads work; it steps back down under the low
// watermark. Every level change and offload run is counted in Stats() and
// kept in RecentEvents() as a one-line JSON event ({"event": "...", "node":
// ..., "ts_ns": ...}); pressure events also go to the event sink (the log).
//
// Maintenance never runs on the request path: a background thread calls
// RunMaintenance() every `interval_ms`; tests disable the thread and call it
// with a ManualClock.
//
// The per-block operations (BlockStoreOps, shard_node/block_store_ops.h)
// cover the whole hierarchy: a Get or Pin finds a block in any tier.
//
// Thread-safety: all methods are thread-safe. Lock order: primary stripe ->
// host stripe -> SSD mutex -> shadow mutex (a leaf); maintenance holds its own
// mutex outside all of them.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <absl/container/flat_hash_map.h>

#include "kvmesh/clock.h"
#include "kvmesh/status.h"
#include "kvmesh/types.h"
#include "shard_node/block_store.h"
#include "shard_node/block_store_ops.h"
#include "shard_node/pressure.h"
#include "shard_node/ssd_tier.h"

namespace kvmesh {

namespace kernels {
class Codec;
}

enum class Tier : uint8_t { kPrimary = 0, kHost = 1, kSsd = 2 };
std::string_view TierName(Tier t);

struct TieredStoreOptions {
  std::string node_id;
  uint64_t host_bytes = 0;  // 0: no host tier
  uint64_t ssd_bytes = 0;   // 0: no SSD tier
  std::string ssd_path;     // REQUIRED with ssd_bytes
  std::string host_policy = "lru";
  std::string ssd_policy = "lru";
  uint32_t host_stripes = 8;
  std::shared_ptr<PolicyGroups> groups;  // the host tier's groups ("host/<policy>/<class>"); nullptr: its own
  bool pinned_host = false;  // host tier in pinned memory (cudaHostAlloc) when CUDA allows
  double high_watermark = 0.80;
  double low_watermark = 0.70;
  double offload_idle_s = 10.0;
  bool promote_on_hit = true;
  // GetInto returns raw bytes: blocks stored encoded (codec != 0, e.g. by
  // pressure level 2) are decoded with kernels::DecodeBlock. Off: GetInto
  // returns the stored bytes as they are.
  bool decode_on_read = true;
  PressureOptions pressure;          // its watermarks default to the ones above
  double pressure_evict_fraction = 0.25;
  std::string reencode_codec = "int8";  // level 2 target (a kernels/codec spec)
  ModelSpec model;                      // shape of raw blocks, for level 2
  bool background = true;
  int64_t interval_ms = 100;
  Clock* clock = nullptr;
  // Receives each event as one JSON object (no newline). Called from the
  // maintenance thread or a request thread; must be thread-safe. May be empty.
  std::function<void(const std::string&)> event_sink;
  // Told of the blocks that enter and leave the host tier (as CPU blocks) and
  // the SSD tier (DISK); the primary store has its own (StoreOptions). May be null.
  BlockObserver* observer = nullptr;
};

struct TierStats {
  int pressure_level = 0;
  std::array<uint64_t, 4> pressure_entered{};  // times each level was entered
  uint64_t primary_limit_bytes = 0;            // current limit (budget or less)
  uint64_t primary_used_bytes = 0;
  StoreStats host;                             // zero when there is no host tier
  SsdStats ssd;                                // zero when there is no SSD tier
  bool has_host = false, has_ssd = false;
  uint64_t demoted_on_evict = 0;   // primary evictions copied to host, host evictions written to SSD
  uint64_t demoted_offload = 0;    // moved down by the watermark offload
  uint64_t demoted_pressure = 0;   // moved down by pressure level 1
  uint64_t dropped_pressure = 0;   // deleted by level 1 (no lower tier)
  uint64_t demote_failed = 0;      // the lower tier refused (too large, I/O error)
  uint64_t promotions = 0;
  uint64_t served_in_place = 0;    // lower-tier hits not promoted
  uint64_t host_hits = 0, ssd_hits = 0, ssd_corrupt = 0;
  uint64_t prefetch_requested = 0, prefetch_promoted = 0;
  uint64_t offload_runs = 0;
  uint64_t reencoded_blocks = 0, reencode_bytes_saved = 0, reencode_skipped = 0;
  uint64_t busy_refusals = 0;
  uint64_t stored_below = 0;       // Puts stored in the host tier because every primary slot was pinned
  uint64_t maintenance_ticks = 0;
};

class TieredStore final : public BlockStoreOps {
 public:
  // `primary` must outlive the TieredStore; its eviction listener is taken.
  static Result<std::unique_ptr<TieredStore>> Create(BlockStore* primary, TieredStoreOptions o);
  ~TieredStore() override;  // stops the background thread

  // Stores in the primary tier. Busy at pressure level 3.
  Status Put(const BlockKey& key, std::span<const std::byte> payload, const PutOptions& o = {}) override;
  // A pinned view from the primary tier (after promotion) or, served in place,
  // from the host tier (an SSD block is then staged in the host tier; without
  // a host tier it is promoted even at level 3: reads keep working). Busy only
  // when the block cannot be placed anywhere (every slot pinned); GetInto
  // reads such blocks in place.
  Result<BlockRef> Get(const BlockKey& key) override;
  // Get without verifying the checksum of a block already in memory (the
  // reader verifies where the bytes land); promotions still verify.
  Result<BlockRef> GetUnverified(const BlockKey& key) { return GetImpl(key, /*verify=*/false); }
  // Put in two halves for a transport that fills pool memory itself
  // (BlockStore::Reserve / Commit): a chunk in the primary tier, or in the
  // host tier when every primary slot is pinned, as Put places it. Busy at
  // pressure level 3. Commit verifies the bytes against `checksum` (DataLoss:
  // nothing stored; without verify the caller vouches for it, having hashed
  // while it copied) and keeps the tiers exclusive as Put does.
  Result<BlockReservation> Reserve(const BlockKey& key, size_t size, const PutOptions& o = {});
  Status Commit(BlockReservation& r, uint64_t checksum, bool verify = true);
  // Copies the block into `dst` (decoded to raw bytes with decode_on_read) and
  // returns its size. Misses: NotFound, or DataLoss for a corrupt SSD block.
  Result<size_t> GetInto(const BlockKey& key, std::span<std::byte> dst) override;
  bool Exists(const BlockKey& key, bool touch) override;
  Status Erase(const BlockKey& key) override;
  // Pins in the primary tier, promoting the block first when it is lower.
  Status Pin(const BlockKey& key) override;
  Status Unpin(const BlockKey& key) override;
  // BlockStore::PinRef in the primary tier, promoting the block first as Pin does.
  Result<BlockRef> PinRef(const BlockKey& key);
  // Released in every tier above SSD that holds it.
  Status Release(const BlockKey& key) override;
  // Queues promotions of `keys` for the next maintenance tick.
  void Prefetch(std::span<const BlockKey> keys);

  // One maintenance tick: prefetches, offload by watermarks, pressure levels.
  void RunMaintenance();
  // Limits the primary tier to `bytes` (the engine takes memory back); 0
  // restores the full budget. Takes effect at the next tick.
  void SetPrimaryLimit(uint64_t bytes);

  // Where the block is now (nullopt: nowhere).
  std::optional<Tier> Locate(const BlockKey& key) const;
  int pressure_level() const { return level_.load(std::memory_order_acquire); }
  TierStats Stats() const;
  std::string StatsJson() const;
  // Prometheus text exposition of the tier and pressure metrics
  // (kvmesh_tier_*, kvmesh_pressure_*), for a node's /metrics.
  std::string PrometheusText() const;
  // The last events (at most 64), oldest first.
  std::vector<std::string> RecentEvents() const;

  BlockStore& primary() { return *primary_; }
  BlockStore* host() { return host_.get(); }
  SsdTier* ssd() { return ssd_.get(); }

 private:
  Result<BlockRef> GetImpl(const BlockKey& key, bool verify);
  struct Shadow {
    Tier tier = Tier::kPrimary;
    Priority priority = kDefaultPriority;
    int64_t last_ns = 0;
  };
  struct Candidate {
    BlockKey key;
    Shadow s;
  };
  TieredStore() = default;

  void OnPrimaryEvict(const BlockMeta& m, std::span<const std::byte> data);
  void OnHostEvict(const BlockMeta& m, std::span<const std::byte> data);
  // Records where `key` is; `pri` replaces the stored class when given; touch
  // refreshes its last access.
  void SetShadow(const BlockKey& key, Tier tier, std::optional<Priority> pri, bool touch);
  void DropShadow(const BlockKey& key);
  // Moves `key` from the primary tier one level down (to host, else deletes
  // when allow_drop). Returns true when it left the primary tier.
  bool DemoteFromPrimary(const BlockKey& key, bool allow_drop, bool* dropped);
  bool DemoteFromHost(const BlockKey& key);
  // GetInto of the stored bytes (no decoding), promoting as configured.
  Result<size_t> GetIntoStored(const BlockKey& key, std::span<std::byte> dst);
  // Moves `key` into the primary tier from wherever it is. OK when it is there.
  Status Promote(const BlockKey& key);
  // Moves `key` from the SSD tier into the host tier (REQUIRES host_ and ssd_).
  Status PromoteSsdToHost(const BlockKey& key);
  // Reads `key` from the SSD tier (a torn or corrupt block is dropped and
  // returned as DataLoss), stores it in `dst` as tier `tier`, frees its SSD slot.
  Status MoveFromSsd(const BlockKey& key, BlockStore& dst, Tier tier);
  std::vector<Candidate> CandidatesIn(Tier t) const;
  // Moves primary blocks down while above the high watermark of `limit`, to
  // the low one; returns the primary tier's used bytes where it stopped.
  uint64_t OffloadPrimary(uint64_t limit);
  void OffloadHost();
  void EnterLevel(int level, double ratio);
  void ReencodePrimary();
  uint64_t PrimaryLimit() const;
  // Records an event (a JSON object) in RecentEvents, adding node and ts_ns,
  // and passes it to the event sink when to_sink (routine offload runs are
  // only counted and kept in RecentEvents, not logged).
  void Emit(std::string json, bool to_sink = true);
  void Loop();

  TieredStoreOptions o_;
  BlockStore* primary_ = nullptr;
  std::unique_ptr<BlockStore> host_;
  std::unique_ptr<SsdTier> ssd_;
  std::unique_ptr<kernels::Codec> reencoder_;
  Clock* clock_ = nullptr;

  mutable std::mutex shadow_mu_;
  absl::flat_hash_map<BlockKey, Shadow> shadow_;  // guarded by shadow_mu_

  std::mutex maint_mu_;  // serialises RunMaintenance
  PressureController pressure_{PressureOptions{}};  // guarded by maint_mu_
  std::atomic<int> level_{0};
  std::atomic<uint64_t> limit_bytes_{0};  // 0: the full budget

  mutable std::mutex queue_mu_;
  std::deque<BlockKey> prefetch_;  // guarded by queue_mu_

  mutable std::mutex events_mu_;
  std::deque<std::string> events_;  // guarded by events_mu_

  struct Counters {
    std::atomic<uint64_t> demoted_on_evict{0}, demoted_offload{0}, demoted_pressure{0}, dropped_pressure{0},
        demote_failed{0}, promotions{0}, served_in_place{0}, host_hits{0}, ssd_hits{0}, ssd_corrupt{0},
        prefetch_requested{0}, prefetch_promoted{0}, offload_runs{0}, reencoded_blocks{0},
        reencode_bytes_saved{0}, reencode_skipped{0}, busy_refusals{0}, stored_below{0}, ticks{0};
    std::array<std::atomic<uint64_t>, 4> entered{};  // pressure levels entered
  };
  mutable Counters c_;

  std::mutex thread_mu_;
  std::condition_variable thread_cv_;
  bool stop_ = false;  // guarded by thread_mu_
  std::thread thread_;
};

}  // namespace kvmesh

// shard_node/shard_node.h — one shard node: the block store(s) of one GPU (or
// host) and the operations every transport serves (docs/architecture.md).
//
// A node serves its device budget (host memory without a GPU) and, when the
// config gives host and/or SSD budgets, the device -> host -> SSD tiers with
// watermarks and pressure levels (TieredStore). With a codec configured,
// blocks are encoded on put and decoded on GetInto (CodecStage). All of it
// sits behind the same operations, so transports and the router do not change.
//
// Co-evicted keys (kvmesh/block_key.h) are tracked in groups (key_groups.h):
// once any block of a group is gone, reads of the others miss and the group
// is erased.
//
// Thread-safety: all methods are thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>

#include "kvmesh/config.h"
#include "kvmesh/request.h"
#include "shard_node/block_store.h"
#include "shard_node/block_store_ops.h"
#include "shard_node/tiered_store.h"
#include "shard_node/codec_stage.h"
#include "shard_node/key_groups.h"
#include "shard_node/kv_events.h"
#include "shard_node/sequence_service.h"
#include "shard_node/tenants.h"

namespace kvmesh {

struct NodeStats {
  std::string node_id;
  StoreStats store;
};

class ShardNode {
 public:
  // Builds the node `node_id` of `config`. Errors: NotFound for an unknown id,
  // InvalidArgument for budgets too small for one block, ResourceExhausted when
  // the memory cannot be allocated.
  // The live-sequence service (idle timeout, limits) takes config.sequences
  // ($.sequences), unless `sequences` overrides it (tests, embedders).
  // `groups`: the eviction policy groups the node's stores join (an embedded
  // cluster shares one among its nodes); nullptr: the node's own.
  static Result<std::unique_ptr<ShardNode>> Create(const ClusterConfig& config,
                                                   const std::string& node_id,
                                                   Clock* clock = nullptr,
                                                   std::optional<SequenceServiceOptions> sequences = std::nullopt,
                                                   std::shared_ptr<PolicyGroups> groups = nullptr);
  // The sequence-service options $.sequences of `config` asks for.
  static SequenceServiceOptions SequenceOptions(const ClusterConfig& config);
  ~ShardNode();

  // The KV-event publisher ($.events, shard_node/kv_events.h); nullptr when
  // events are off.
  KvEventPublisher* events() { return events_.get(); }

  const std::string& id() const { return id_; }
  const ModelSpec& model() const { return model_; }
  // The eviction policy groups of the node's stores (a node daemon exchanges
  // their scores with its peers through the coordinator's heartbeats).
  PolicyGroups& policy_groups() const { return *policy_groups_; }

  // With a codec configured (config.codec), Put encodes full raw blocks
  // (content-addressed KV blocks: a grouped key, a RESP value's block, is
  // opaque and stored as it is, whatever its size) and GetInto decodes them; Get returns the stored view, which for an encoded
  // block (meta().codec != 0) is the self-describing compressed block
  // (kernels/codec.h DecodeBlock reads it anywhere).
  Status Put(const BlockKey& key, std::span<const std::byte> payload, const PutOptions& o);
  Result<BlockRef> Get(const BlockKey& key);
  Result<size_t> GetInto(const BlockKey& key, std::span<std::byte> dst);
  bool Exists(const BlockKey& key, bool touch);
  // An explicit erase: a co-evicted member leaves its group first, so the
  // other members stay (RESP DEL of one key of a group).
  Status Erase(const BlockKey& key);
  // Drops `key` as eviction does (a tenant's quota): a co-evicted member's
  // whole group goes with it at once, and `dropped` (may be empty) is called
  // with each other member erased. NotFound when `key` was not stored.
  Status Evict(const BlockKey& key, const std::function<void(const BlockKey&)>& dropped);
  Status Pin(const BlockKey& key);
  Status Unpin(const BlockKey& key);
  // A pin held by a handle (BlockStore::PinRef, in the primary tier after a
  // promotion): the block stays until the ref is released, and its chunk is
  // freed then if the block was erased, replaced or evicted by a quota
  // meanwhile. Counts no read. For a connection's PIN frames
  // (shard_node/server/frame_handler.h ConnectionPins).
  Result<BlockRef> PinRef(const BlockKey& key);
  Status Release(const BlockKey& key);  // BlockStoreOps::Release
  // What the node holds for a block of `payload` bytes put under `stored`
  // (null: not known yet): the larger of its stored size (encoded when the
  // codec would encode it) and 7/8 of the chunk the primary tier gives it.
  // What a tenant's quota is charged for the block (shard_node/tenants.h).
  uint64_t HeldBytes(const BlockKey* stored, uint64_t payload) const;
  // Erases tenant t's quota victims (TenantRegistry::Admitted,
  // ReserveSequence) as eviction does: a co-evicted member takes its group,
  // whose other members leave t's ledger as quota evictions too.
  void EvictForQuota(uint32_t t, std::span<const BlockKey> victims);
  // ---- the zero-copy paths of the transports (docs/architecture.md) ----------
  // A pinned view of the block as stored, its checksum not verified: the
  // reader verifies the bytes where they land (one hash pass per direction).
  // An encoded block (meta().codec != 0) comes as stored: DecodeBlock it.
  // FailedPrecondition when the pool is not host memory (use GetInto);
  // otherwise Get's misses.
  Result<BlockRef> GetForTransfer(const BlockKey& key);
  // A chunk for a raw block of `size` bytes that the transport fills itself
  // (a socket read, a one-sided get), then CommitPut. AlreadyExists when the
  // key is stored (drop the bytes); FailedPrecondition when this node changes
  // blocks on the way in (a codec, for a key that is not grouped) or its pool
  // is not host memory: stage the bytes and Put them. Otherwise Put's errors.
  Result<BlockReservation> ReservePut(const BlockKey& key, size_t size, const PutOptions& o);
  // Verifies the reserved bytes against `checksum` (one pass over them) and
  // stores the block: DataLoss, nothing stored, on a mismatch. Without verify
  // the caller vouches for the checksum: it hashed the bytes as it copied them
  // in (GatherWithChecksum64), so they are not read a second time.
  Status CommitPut(BlockReservation& r, uint64_t checksum, bool verify = true);
  // The pool memory of the node's tiers that the CPU addresses, for a
  // transport that registers it once (UCX).
  std::vector<std::span<std::byte>> PoolMemory();

  // Router hint: these blocks will be read soon. With tiers, queues their
  // promotion from lower tiers for the background worker; otherwise a no-op.
  void Prefetch(std::span<const BlockKey> keys);

  // Switches the primary store's eviction policy at run time
  // (BlockStore::SetPolicy). InvalidArgument for an unknown name.
  Status SetEvictionPolicy(const std::string& name) { return store_->SetPolicy(name); }

  NodeStats Stats() const;
  std::string StatsJson() const;
  BlockStore& store() { return *store_; }
  // The primary store's local-read index (transport/local_index.h), with
  // its pool's memfd; nullptr when the node offers no local reads.
  LocalIndexWriter* local_index() const { return store_->local_index(); }
  int local_pool_fd() const { return store_->backend().shared_fd(); }
  // Starts handing local reads to the store (once; the first client that
  // maps the index calls it). False when the node has no index.
  bool StartLocalReads();
  uint64_t local_pool_bytes() const { return store_->backend().size(); }
  // The memory hierarchy (device -> host -> SSD, watermarks, pressure levels);
  // nullptr when the node's memory config has only one tier.
  TieredStore* tiers() { return tiers_.get(); }
  const CodecStage* codec() const { return codec_.get(); }  // nullptr: blocks stored as given
  // Live sequences over the primary store, by node-local id (SEQ_* frames).
  SequenceService& sequences() { return *sequences_; }
  // The tenants of $.auth.tenants on this node: identities, namespaces,
  // quotas (shard_node/tenants.h; TenantView serves one of them).
  TenantRegistry& tenants() { return *tenants_; }
  // Drops ledger entries of blocks the node no longer holds, at most once a
  // second (before tenant figures are read). Probes every ledger entry: call
  // it from the HTTP thread, not from a data I/O thread.
  void ReconcileTenants();
  // Tenant t's figures as JSON (what a tenant's STATS frame gets).
  std::string TenantStatsJson(uint32_t t) const;

 private:
  ShardNode() = default;
  std::string id_;
  ModelSpec model_;
  std::shared_ptr<PolicyGroups> policy_groups_;  // before the stores that join its groups
  std::unique_ptr<KvEventPublisher> events_;     // the stores' observer: declared before them, outlives them
  std::unique_ptr<BlockStore> store_;
  std::unique_ptr<TieredStore> tiers_;  // over store_ (declared after it: destroyed first)
  // What the block operations go through: tiers_ when there are any, else
  // store_. Never null after Create; owned by one of them.
  BlockStoreOps* serving_ = nullptr;
  std::unique_ptr<CodecStage> codec_;
  // Co-eviction (key_groups.h): false when key's group lost a member (the
  // group is then erased); Stored records a co-evicted key and sweeps.
  bool GroupIntact(const BlockKey& key);
  void GroupStored(const BlockKey& key);
  KeyGroups groups_;
  std::unique_ptr<TenantRegistry> tenants_;
  std::atomic<int64_t> next_reconcile_ns_{0};
  // Live sequences of tenant t grow by `bytes` (SequenceServiceOptions::charge).
  Status ChargeSequence(uint32_t t, uint64_t bytes);
  std::unique_ptr<SequenceService> sequences_;  // pins blocks of store_: declared last, destroyed first
  // Local reads (BlockStore::local_index): a thread that hands the reads
  // clients left in the index's ring to the store (TouchLocal), every 5 ms
  // while there are some, every 20 ms otherwise (each wake-up takes a core
  // from a reader: at 1 ms the 8-client GET's p99 grew; the 16 Ki ring holds
  // 5 ms of 3 M reads/s).
  void DrainLocalReads();
  std::once_flag drain_once_;
  std::mutex drain_mu_;
  std::condition_variable drain_cv_;
  bool drain_stop_ = false;  // guarded by drain_mu_
  std::thread drain_;
};

}  // namespace kvmesh

#include "shard_node/shard_node.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvmesh/block_key.h"

#include "shard_node/cuda_memory.h"
#include "transport/local_index.h"

namespace kvmesh {

Result<std::unique_ptr<ShardNode>> ShardNode::Create(const ClusterConfig& config, const std::string& node_id,
                                                     Clock* clock, std::optional<SequenceServiceOptions> sequences,
                                                     std::shared_ptr<PolicyGroups> groups) {
  const NodeConfig* nc = config.FindNode(node_id);
  if (nc == nullptr) return NotFound("node \"" + node_id + "\" is not in the cluster config");
  std::unique_ptr<ShardNode> n(new ShardNode());
  n->id_ = node_id;
  n->model_ = config.model;
  n->policy_groups_ = groups ? std::move(groups) : std::make_shared<PolicyGroups>();

  auto codec = CodecStage::Create(config);
  if (!codec.ok()) return codec.status().WithContext("node " + node_id);
  n->codec_ = std::move(codec).value();
  if (config.events.enabled) {
    auto events = KvEventPublisher::Start(config.events, config.model.block_tokens);
    if (!events.ok()) return events.status().WithContext("node " + node_id);
    n->events_ = std::move(events).value();
  }

  StoreOptions so;
  so.capacity_bytes = nc->primary_budget();
  // With a codec, a slot holds one encoded full block: compression saves memory.
  so.slot_bytes = config.store.slot_bytes ? config.store.slot_bytes
                  : n->codec_         ? n->codec_->encoded_block_bytes()
                                      : config.model.FullBlockBytes();
  so.size_classes = config.store.size_classes;
  so.stripes = config.store.stripes;
  so.verify_checksums = config.store.verify_checksums;
  so.policy = config.eviction.policy;
  so.policy_options.priority_classes = config.eviction.priority_classes;
  so.policy_options.aging_ns = static_cast<int64_t>(config.eviction.aging_s * 1e9);
  so.policy_options.shadow_sample_floor = config.eviction.shadow_sample_floor;
  so.clock = clock;
  so.groups = n->policy_groups_;
  so.observer = n->events_.get();
  so.medium = BlockMedium::kGpu;
  // Local reads need the pool in shared memory (a memfd), which gets no
  // transparent huge pages where shmem's are off (Debian's default), and
  // then costs the node's own copies out of the pool (TCP sends: 41 -> 54 us
  // of kernel time per 256 KiB GET on the 2-core VM). So only a cluster whose
  // routers read over UCX makes one.
  so.local_reads = config.transport.ucx_local_reads && config.transport.backend == "ucx";
  // A GPU node's device budget is one CUDA pool when a GPU is usable;
  // otherwise the store uses host memory (and says so once).
  if (nc->gpu >= 0 && nc->memory.device > 0) {
    auto dev = MakeCudaDeviceMemory(nc->memory.device, nc->gpu);
    if (dev.ok()) {
      so.backend = std::move(dev).value();
    } else {
      std::fprintf(stderr, "%s\n",
                   nlohmann::json{{"event", "device_memory_fallback"}, {"node", node_id}, {"gpu", nc->gpu},
                                  {"reason", dev.status().ToString()}}
                       .dump()
                       .c_str());
    }
  }
  const bool on_device = so.backend != nullptr;
  auto store = BlockStore::Create(std::move(so));
  if (!store.ok()) return store.status().WithContext("node " + node_id);
  n->store_ = std::move(store).value();

  // Tiers: a host and/or SSD budget besides the device budget.
  const uint64_t host_tier = nc->memory.device ? nc->memory.host : 0;
  if (host_tier > 0 || nc->memory.ssd > 0) {
    const EvictionConfig& ev = config.eviction;
    TieredStoreOptions to;
    to.node_id = node_id;
    to.host_bytes = host_tier;
    to.ssd_bytes = nc->memory.ssd;
    to.ssd_path = nc->memory.ssd_path;
    to.host_policy = ev.tiers.host_policy;
    to.ssd_policy = ev.tiers.ssd_policy;
    to.pinned_host = on_device;
    to.high_watermark = ev.tiers.high_watermark;
    to.low_watermark = ev.tiers.low_watermark;
    to.offload_idle_s = ev.tiers.offload_idle_s;
    to.promote_on_hit = ev.tiers.promote_on_hit;
    to.interval_ms = ev.tiers.interval_ms;
    to.pressure.enabled = ev.pressure.enabled;
    to.pressure.max_level = static_cast<int>(ev.pressure.max_level);
    to.pressure_evict_fraction = ev.pressure.evict_fraction;
    to.reencode_codec = ev.pressure.reencode_codec == "none" ? "" : ev.pressure.reencode_codec;
    to.model = config.model;
    to.clock = clock;
    to.groups = n->policy_groups_;
    to.event_sink = [](const std::string& e) { std::fprintf(stderr, "%s\n", e.c_str()); };
    to.observer = n->events_.get();
    auto tiers = TieredStore::Create(n->store_.get(), std::move(to));
    if (!tiers.ok()) return tiers.status().WithContext("node " + node_id);
    n->tiers_ = std::move(tiers).value();
  }
  n->serving_ = n->tiers_ ? static_cast<BlockStoreOps*>(n->tiers_.get()) : n->store_.get();
  if (n->events_) {
    ShardNode* node = n.get();
    n->events_->SetLister([node](const std::function<void(BlockMedium, const BlockKey&)>& add) {
      node->store_->ForEachLive([&](const BlockKey& k) { add(BlockMedium::kGpu, k); });
      if (!node->tiers_) return;
      if (BlockStore* host = node->tiers_->host()) host->ForEachLive([&](const BlockKey& k) { add(BlockMedium::kCpu, k); });
      if (SsdTier* ssd = node->tiers_->ssd()) ssd->ForEachLive([&](const BlockKey& k) { add(BlockMedium::kDisk, k); });
    });
  }
  n->tenants_ = std::make_unique<TenantRegistry>(config.auth);
  ShardNode* self = n.get();
  n->tenants_->SetCharge([self](const BlockKey* stored, uint64_t payload) { return self->HeldBytes(stored, payload); });
  SequenceServiceOptions seq = sequences ? *sequences : SequenceOptions(config);
  seq.tiers = n->tiers_.get();
  // A tenant's live sequences count against its quota, and each tenant holds
  // a share of the node's sequences and slices (sequence_service.h).
  seq.tenants = static_cast<uint32_t>(n->tenants_->size());
  seq.charge = [self](uint32_t t, uint64_t bytes) { return self->ChargeSequence(t, bytes); };
  seq.uncharge = [self](uint32_t t, uint64_t bytes) { self->tenants_->ReleaseSequence(t, bytes); };
  n->sequences_ = std::make_unique<SequenceService>(n->store_.get(), n->model_, std::move(seq), clock);
  return n;
}

bool ShardNode::StartLocalReads() {
  if (store_->local_index() == nullptr) return false;
  std::call_once(drain_once_, [this] { drain_ = std::thread([this] { DrainLocalReads(); }); });
  return true;
}

void ShardNode::DrainLocalReads() {
  LocalIndexWriter* index = store_->local_index();
  // A round's reads, one touch per block (engines read the same blocks again
  // and again): sorted, then counted.
  std::vector<BlockKey> keys;
  keys.reserve(4096);
  std::unique_lock<std::mutex> lock(drain_mu_);
  while (!drain_stop_) {
    lock.unlock();
    keys.clear();
    const size_t n = index->DrainTouches([&](const BlockKey& k) { keys.push_back(k); });
    std::sort(keys.begin(), keys.end());
    for (size_t i = 0; i < keys.size();) {
      size_t j = i + 1;
      while (j < keys.size() && keys[j] == keys[i]) ++j;
      store_->TouchLocal(keys[i], static_cast<uint32_t>(j - i));
      i = j;
    }
    lock.lock();
    drain_cv_.wait_for(lock, std::chrono::milliseconds(n > 0 ? 5 : 20), [this] { return drain_stop_; });
  }
}

ShardNode::~ShardNode() {
  if (drain_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(drain_mu_);
      drain_stop_ = true;
    }
    drain_cv_.notify_all();
    drain_.join();
  }
  if (events_) events_->Stop();  // its snapshot lister reads the stores
}

SequenceServiceOptions ShardNode::SequenceOptions(const ClusterConfig& config) {
  SequenceServiceOptions o;
  o.idle_timeout_ms = config.sequences.idle_timeout_ms;
  o.max_sequences = config.sequences.max_sequences;
  o.max_slices = config.sequences.max_slices;
  o.max_sequence_tokens = config.sequences.max_sequence_tokens;
  o.codec = config.codec;
  return o;
}

void ShardNode::Prefetch(std::span<const BlockKey> keys) {
  if (tiers_) tiers_->Prefetch(keys);
}

Status ShardNode::Put(const BlockKey& key, std::span<const std::byte> payload, const PutOptions& o) {
  // Replace (RESP SET): drop every tier's copy first, so no stale copy can be
  // demoted or promoted later. A pinned old block lives on for its readers.
  if (o.replace) {
    groups_.Removed(key);
    (void)serving_->Erase(key);
  }
  Status s;
  if (codec_ && o.codec == 0 && CodecMayEncode(key) && codec_->Encodes(payload)) {
    KVMESH_ASSIGN_OR_RETURN(std::span<const std::byte> enc, codec_->Encode(payload));
    PutOptions po = o;
    po.codec = codec_->codec_id();
    po.logical_size = static_cast<uint32_t>(payload.size());
    s = serving_->Put(key, enc, po);
  } else {
    s = serving_->Put(key, payload, o);
  }
  if (s.ok() && IsCoEvictedKey(key)) GroupStored(key);
  return s;
}
Result<BlockRef> ShardNode::Get(const BlockKey& key) {
  if (!GroupIntact(key)) return NotFound("not stored (its key group was evicted)");
  return serving_->Get(key);
}
Result<size_t> ShardNode::GetInto(const BlockKey& key, std::span<std::byte> dst) {
  if (!GroupIntact(key)) return NotFound("not stored (its key group was evicted)");
  if (!codec_) return serving_->GetInto(key, dst);
  KVMESH_ASSIGN_OR_RETURN(BlockRef ref, serving_->Get(key));  // verified against its checksum
  std::vector<std::byte> host;
  std::span<const std::byte> data = ref.data();
  if (!store_->backend().host_accessible()) {
    host.resize(data.size());
    store_->backend().CopyOut(host.data(), data.data(), data.size());
    data = host;
  }
  if (ref.meta().codec == 0) {
    if (dst.size() < data.size())
      return ResourceExhausted("destination of " + std::to_string(dst.size()) + " bytes is smaller than the block (" +
                               std::to_string(data.size()) + " bytes)");
    std::memcpy(dst.data(), data.data(), data.size());
    return data.size();
  }
  return codec_->Decode(data, dst);
}
Result<BlockRef> ShardNode::GetForTransfer(const BlockKey& key) {
  if (!store_->backend().host_accessible()) return FailedPrecondition("the pool is device memory: read with GetInto");
  if (!GroupIntact(key)) return NotFound("not stored (its key group was evicted)");
  return tiers_ ? tiers_->GetUnverified(key) : store_->GetUnverified(key);
}

Result<BlockReservation> ShardNode::ReservePut(const BlockKey& key, size_t size, const PutOptions& o) {
  if (codec_ && o.codec == 0 && CodecMayEncode(key))
    return FailedPrecondition("this node encodes blocks on put: stage and Put");
  if (!store_->backend().host_accessible()) return FailedPrecondition("the pool is device memory: stage and Put");
  if (o.replace) {  // as Put: no stale copy left in any tier, the member out of its group
    groups_.Removed(key);
    (void)serving_->Erase(key);
  }
  return tiers_ ? tiers_->Reserve(key, size, o) : store_->Reserve(key, size, o);
}

Status ShardNode::CommitPut(BlockReservation& r, uint64_t checksum, bool verify) {
  const BlockKey key = r.key();
  Status s = tiers_ ? tiers_->Commit(r, checksum, verify) : store_->Commit(r, checksum, verify);
  if (s.ok() && IsCoEvictedKey(key)) GroupStored(key);
  return s;
}

std::vector<std::span<std::byte>> ShardNode::PoolMemory() {
  std::vector<std::span<std::byte>> out;
  if (store_->backend().host_accessible()) out.emplace_back(store_->backend().base(), store_->backend().size());
  if (tiers_ && tiers_->host() && tiers_->host()->backend().host_accessible())
    out.emplace_back(tiers_->host()->backend().base(), tiers_->host()->backend().size());
  return out;
}

bool ShardNode::Exists(const BlockKey& key, bool touch) {
  if (!GroupIntact(key)) return false;
  return serving_->Exists(key, touch);
}
Status ShardNode::Erase(const BlockKey& key) {
  groups_.Removed(key);
  return serving_->Erase(key);
}
Status ShardNode::Evict(const BlockKey& key, const std::function<void(const BlockKey&)>& dropped) {
  Status s = serving_->Erase(key);  // still a member: its group is now broken
  if (IsCoEvictedKey(key))
    (void)groups_.Intact(
        key, [this](const BlockKey& k) { return serving_->Exists(k, false); },
        [&](const BlockKey& k) {
          if (serving_->Erase(k).ok() && k != key && dropped) dropped(k);
        });
  return s;
}
Status ShardNode::Pin(const BlockKey& key) { return serving_->Pin(key); }
Status ShardNode::Unpin(const BlockKey& key) { return serving_->Unpin(key); }
Result<BlockRef> ShardNode::PinRef(const BlockKey& key) { return tiers_ ? tiers_->PinRef(key) : store_->PinRef(key); }

uint64_t ShardNode::HeldBytes(const BlockKey* stored, uint64_t payload) const {
  uint64_t size = payload;
  if (codec_ && (stored == nullptr || CodecMayEncode(*stored)) && payload == codec_->raw_block_bytes())
    size = codec_->encoded_block_bytes();  // stored encoded (at most this)
  const uint64_t chunk = store_->ChunkBytesFor(size);
  if (chunk == 0) return size;  // larger than a slot: never stored
  return std::max(size, chunk - chunk / 8);
}

void ShardNode::EvictForQuota(uint32_t t, std::span<const BlockKey> victims) {
  uint64_t evicted = 0;
  // A victim the node already dropped on its own answers NotFound: it only
  // leaves the ledger.
  auto dropped = [this, t](const BlockKey& k) { tenants_->Dropped(t, k); };
  for (const BlockKey& v : victims) evicted += Evict(v, dropped).ok() ? 1 : 0;
  if (evicted) tenants_->QuotaEvicted(t, evicted);
}

Status ShardNode::ChargeSequence(uint32_t t, uint64_t bytes) {
  std::vector<BlockKey> victims;
  KVMESH_RETURN_IF_ERROR(tenants_->ReserveSequence(t, bytes, &victims));
  EvictForQuota(t, victims);
  return Status::Ok();
}
Status ShardNode::Release(const BlockKey& key) { return serving_->Release(key); }

bool ShardNode::GroupIntact(const BlockKey& key) {
  if (!IsCoEvictedKey(key)) return true;
  return groups_.Intact(
      key, [this](const BlockKey& k) { return serving_->Exists(k, false); },
      [this](const BlockKey& k) { (void)serving_->Erase(k); });
}

void ShardNode::GroupStored(const BlockKey& key) {
  groups_.Added(key);
  groups_.Sweep(
      2, [this](const BlockKey& k) { return serving_->Exists(k, false); },
      [this](const BlockKey& k) { (void)serving_->Erase(k); });
}

NodeStats ShardNode::Stats() const { return NodeStats{id_, store_->Stats()}; }

void ShardNode::ReconcileTenants() {
  if (!tenants_->has_tenants()) return;
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now().time_since_epoch()).count();
  int64_t due = next_reconcile_ns_.load(std::memory_order_relaxed);
  if (now < due || !next_reconcile_ns_.compare_exchange_strong(due, now + 1'000'000'000)) return;
  tenants_->Reconcile([this](const BlockKey& k) { return serving_->Exists(k, /*touch=*/false); });
}

namespace {
nlohmann::json TenantJson(const TenantStats& t) {
  return {{"name", t.name},         {"namespace", t.ns},          {"quota_bytes", t.quota_bytes},
          {"bytes", t.bytes},       {"blocks", t.blocks},         {"puts", t.puts},
          {"put_bytes", t.put_bytes}, {"hits", t.hits},           {"misses", t.misses},
          {"erases", t.erases},     {"quota_evictions", t.quota_evictions}, {"quota_refused", t.quota_refused},
          {"sequence_bytes", t.sequence_bytes}, {"pinned_bytes", t.pinned_bytes},
          {"sequence_refused", t.sequence_refused}, {"pin_refused", t.pin_refused}};
}
}  // namespace

std::string ShardNode::TenantStatsJson(uint32_t t) const {
  return nlohmann::json{{"node_id", id_}, {"tenant", TenantJson(tenants_->Stats(t))}}.dump();
}

std::string ShardNode::StatsJson() const {
  NodeStats st = Stats();
  const StoreStats& s = st.store;
  nlohmann::json by_class = nlohmann::json::array();
  for (uint64_t c : s.evictions_by_class) by_class.push_back(c);
  nlohmann::json j = {
      {"node_id", st.node_id},
      {"policy", store_->policy_name()},
      {"codec", codec_ ? codec_->name() : "none"},
      {"capacity_bytes", s.capacity_bytes},
      {"slot_bytes", s.slot_bytes},
      {"slots_total", s.slots_total},
      {"blocks", s.blocks},
      {"bytes_stored", s.bytes_stored},
      {"bytes_logical", s.bytes_logical},
      {"pinned_blocks", s.pinned_blocks},
      {"puts", s.puts},
      {"put_duplicates", s.put_duplicates},
      {"put_rejected", s.put_rejected},
      {"gets", s.gets},
      {"hits", s.hits},
      {"misses", s.misses},
      {"erases", s.erases},
      {"releases", s.releases},
      {"corrupt", s.corrupt},
      {"evictions", s.evictions},
      {"evictions_by_class", by_class},
  };
  if (tiers_) j["tiers"] = nlohmann::json::parse(tiers_->StatsJson());
  if (events_) {
    const KvEventStats e = events_->Stats();
    j["events"] = {{"port", events_->port()}, {"replay_port", events_->replay_port()}, {"events", e.events},
                   {"batches", e.batches}, {"dropped", e.dropped}, {"gaps", e.gaps}, {"replays", e.replays},
                   {"snapshots", e.snapshots}};
  }
  nlohmann::json eviction = nlohmann::json::object();
  for (const PolicyGroups::Entry& e : policy_groups_->Snapshot())
    eviction[e.key] = {{"following", e.following}, {"scores", e.own}, {"peer_scores", e.peers}};
  j["eviction_groups"] = std::move(eviction);
  const KeyGroups::Counts g = groups_.counts();
  j["key_groups"] = {{"groups", g.groups}, {"keys", g.keys}, {"dropped_groups", g.dropped_groups},
                     {"dropped_keys", g.dropped_keys}};
  const SequenceServiceStats q = sequences_->Stats();
  j["sequences"] = {{"live", q.live},       {"created", q.created}, {"reaped", q.reaped},
                    {"refused", q.refused}, {"tables", q.tables},   {"refused_quota", q.refused_quota}};
  if (tenants_->has_tenants()) {
    nlohmann::json t = nlohmann::json::array();
    for (const TenantStats& s : tenants_->AllStats()) t.push_back(TenantJson(s));
    j["tenants"] = std::move(t);
  }
  return j.dump();
}

}  // namespace kvmesh

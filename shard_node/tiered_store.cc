#include "shard_node/tiered_store.h"

#include <algorithm>
#include <cstring>

#include <nlohmann/json.hpp>

#include "kernels/codec.h"
#include "shard_node/cuda_memory.h"
#include "shard_node/tier_internal.h"

namespace kvmesh {

using namespace tier_internal;

std::string_view TierName(Tier t) {
  switch (t) {
    case Tier::kPrimary: return "primary";
    case Tier::kHost: return "host";
    default: return "ssd";
  }
}

Result<std::unique_ptr<TieredStore>> TieredStore::Create(BlockStore* primary, TieredStoreOptions o) {
  if (primary == nullptr) return InvalidArgument("tiered store: no primary store");
  if (!(o.low_watermark > 0 && o.low_watermark < o.high_watermark && o.high_watermark <= 1))
    return InvalidArgument("tiered store: watermarks must satisfy 0 < low < high <= 1");
  if (o.offload_idle_s < 0) return InvalidArgument("tiered store: offload_idle_s must be >= 0");
  if (!(o.pressure_evict_fraction > 0 && o.pressure_evict_fraction <= 1))
    return InvalidArgument("tiered store: pressure_evict_fraction must be in (0, 1]");
  std::unique_ptr<TieredStore> t(new TieredStore());
  t->primary_ = primary;
  t->clock_ = o.clock ? o.clock : SystemClock();
  if (o.host_bytes > 0) {
    StoreOptions so;
    so.capacity_bytes = o.host_bytes;
    so.slot_bytes = primary->slot_bytes();
    so.size_classes = primary->size_classes();  // demoted encoded blocks stay small
    so.stripes = o.host_stripes;
    so.policy = o.host_policy;
    so.observer = o.observer;
    so.medium = BlockMedium::kCpu;
    so.clock = t->clock_;
    so.groups = o.groups;
    so.group_scope = "host";
    if (o.pinned_host) {
      // Pinned when CUDA is there (DMA to and from the device); plain host memory otherwise.
      auto pinned = MakePinnedHostMemory(o.host_bytes);
      if (pinned.ok()) so.backend = std::move(pinned).value();
    }
    auto host = BlockStore::Create(std::move(so));
    if (!host.ok()) return host.status().WithContext("host tier");
    t->host_ = std::move(host).value();
  }
  if (o.ssd_bytes > 0) {
    SsdTierOptions so;
    so.path = o.ssd_path;
    so.name = o.node_id.empty() ? "tier" : o.node_id;
    so.capacity_bytes = o.ssd_bytes;
    so.slot_bytes = primary->slot_bytes();
    so.policy = o.ssd_policy;
    so.clock = t->clock_;
    TieredStore* self = t.get();
    so.on_evict = [self](const BlockKey& k) { self->DropShadow(k); };  // gone for good
    so.observer = o.observer;
    auto ssd = SsdTier::Create(so);
    if (!ssd.ok()) return ssd.status().WithContext("ssd tier");
    t->ssd_ = std::move(ssd).value();
  }
  if (o.pressure.enabled && !o.reencode_codec.empty()) {
    kernels::CodecPolicy cp;
    auto spec = kernels::ParseCodecSpec(o.reencode_codec);
    if (!spec.ok()) return spec.status().WithContext("pressure reencode codec");
    cp.base = *spec;
    cp.threads = 1;
    auto codec = kernels::MakeCodec(cp);
    if (!codec.ok()) return codec.status().WithContext("pressure reencode codec");
    t->reencoder_ = std::move(codec).value();
  }
  o.pressure.high_watermark = o.high_watermark;
  o.pressure.low_watermark = o.low_watermark;
  t->pressure_ = PressureController(o.pressure);
  t->o_ = std::move(o);

  TieredStore* self = t.get();
  primary->SetEvictionListener(
      [self](const BlockMeta& m, std::span<const std::byte> d) { self->OnPrimaryEvict(m, d); });
  if (t->host_)
    t->host_->SetEvictionListener(
        [self](const BlockMeta& m, std::span<const std::byte> d) { self->OnHostEvict(m, d); });
  if (t->o_.background) t->thread_ = std::thread([self] { self->Loop(); });
  return t;
}

TieredStore::~TieredStore() {
  {
    std::lock_guard<std::mutex> lock(thread_mu_);
    stop_ = true;
  }
  thread_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  primary_->SetEvictionListener(nullptr);
}

void TieredStore::Loop() {
  std::unique_lock<std::mutex> lock(thread_mu_);
  while (!stop_) {
    thread_cv_.wait_for(lock, std::chrono::milliseconds(std::max<int64_t>(o_.interval_ms, 1)));
    if (stop_) break;
    lock.unlock();
    RunMaintenance();
    lock.lock();
  }
}

// ---- Shadow index ----------------------------------------------------------------

void TieredStore::SetShadow(const BlockKey& key, Tier tier, std::optional<Priority> pri, bool touch) {
  const int64_t now = clock_->NowNanos();
  std::lock_guard<std::mutex> lock(shadow_mu_);
  auto [it, fresh] = shadow_.try_emplace(key);
  it->second.tier = tier;
  if (pri) it->second.priority = *pri;
  if (fresh || touch) it->second.last_ns = now;
}

void TieredStore::DropShadow(const BlockKey& key) {
  std::lock_guard<std::mutex> lock(shadow_mu_);
  shadow_.erase(key);
}

std::optional<Tier> TieredStore::Locate(const BlockKey& key) const {
  std::lock_guard<std::mutex> lock(shadow_mu_);
  auto it = shadow_.find(key);
  if (it == shadow_.end()) return std::nullopt;
  return it->second.tier;
}

// ---- Demotion ----------------------------------------------------------------------

// Under the primary stripe lock: copy the victim down (never call back into primary).
void TieredStore::OnPrimaryEvict(const BlockMeta& m, std::span<const std::byte> data) {
  if (host_) {
    if (host_->Put(m.key, HostCopy(*primary_, data), PutOptionsOf(m)).ok()) {
      c_.demoted_on_evict.fetch_add(1, std::memory_order_relaxed);
      SetShadow(m.key, Tier::kHost, m.priority, false);
      return;
    }
    c_.demote_failed.fetch_add(1, std::memory_order_relaxed);
  } else if (ssd_) {
    SsdBlockMeta sm{m.size, m.logical_size, m.codec, m.priority};
    if (ssd_->Put(m.key, HostCopy(*primary_, data), sm).ok()) {
      c_.demoted_on_evict.fetch_add(1, std::memory_order_relaxed);
      SetShadow(m.key, Tier::kSsd, m.priority, false);
      return;
    }
    c_.demote_failed.fetch_add(1, std::memory_order_relaxed);
  }
  DropShadow(m.key);
}

// Under the host stripe lock.
void TieredStore::OnHostEvict(const BlockMeta& m, std::span<const std::byte> data) {
  if (ssd_) {
    SsdBlockMeta sm{m.size, m.logical_size, m.codec, m.priority};
    if (ssd_->Put(m.key, data, sm).ok()) {
      c_.demoted_on_evict.fetch_add(1, std::memory_order_relaxed);
      SetShadow(m.key, Tier::kSsd, m.priority, false);
      return;
    }
    c_.demote_failed.fetch_add(1, std::memory_order_relaxed);
  }
  DropShadow(m.key);
}

bool TieredStore::DemoteFromPrimary(const BlockKey& key, bool allow_drop, bool* dropped) {
  *dropped = false;
  {
    Result<BlockRef> ref = primary_->Get(key);
    if (!ref.ok()) return false;
    const BlockMeta meta = ref->meta();
    Status moved = FailedPrecondition("no lower tier");
    if (host_) {
      moved = host_->Put(key, HostCopy(*primary_, ref->data()), PutOptionsOf(meta));
      if (moved.ok()) SetShadow(key, Tier::kHost, meta.priority, false);
    } else if (ssd_) {
      moved = ssd_->Put(key, HostCopy(*primary_, ref->data()),
                        SsdBlockMeta{meta.size, meta.logical_size, meta.codec, meta.priority});
      if (moved.ok()) SetShadow(key, Tier::kSsd, meta.priority, false);
    }
    if (!moved.ok()) {
      if (host_ || ssd_) c_.demote_failed.fetch_add(1, std::memory_order_relaxed);
      if (!allow_drop) return false;
      *dropped = true;
    }
  }  // the pin is released before erasing
  if (!primary_->Erase(key).ok()) return false;
  if (*dropped) DropShadow(key);
  return true;
}

bool TieredStore::DemoteFromHost(const BlockKey& key) {
  if (!host_ || !ssd_) return false;
  {
    Result<BlockRef> ref = host_->Get(key);
    if (!ref.ok()) return false;
    const BlockMeta m = ref->meta();
    if (!ssd_->Put(key, ref->data(), SsdBlockMeta{m.size, m.logical_size, m.codec, m.priority}).ok()) {
      c_.demote_failed.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    SetShadow(key, Tier::kSsd, m.priority, false);
  }
  return host_->Erase(key).ok();
}

// ---- Promotion ---------------------------------------------------------------------

Status TieredStore::Promote(const BlockKey& key) {
  if (primary_->Exists(key, false)) return Status::Ok();
  if (host_) {
    Result<BlockRef> ref = host_->Get(key);
    if (ref.ok()) {
      const BlockMeta m = ref->meta();
      std::span<std::byte> buf = Staging(m.size, kPromote);
      std::memcpy(buf.data(), ref->data().data(), m.size);
      ref->Release();
      KVMESH_RETURN_IF_ERROR(primary_->Put(key, buf, PutOptionsOf(m)));
      (void)host_->Erase(key);
      SetShadow(key, Tier::kPrimary, m.priority, true);
      c_.promotions.fetch_add(1, std::memory_order_relaxed);
      return Status::Ok();
    }
    if (ref.status().code() != StatusCode::kNotFound) return ref.status();
  }
  if (ssd_) {
    KVMESH_RETURN_IF_ERROR(MoveFromSsd(key, *primary_, Tier::kPrimary));
    c_.promotions.fetch_add(1, std::memory_order_relaxed);
    return Status::Ok();
  }
  return NotFound("block " + key.ToHex() + " is not stored");
}

Status TieredStore::PromoteSsdToHost(const BlockKey& key) { return MoveFromSsd(key, *host_, Tier::kHost); }

Status TieredStore::MoveFromSsd(const BlockKey& key, BlockStore& dst, Tier tier) {
  std::span<std::byte> buf = Staging(ssd_->slot_bytes(), kPromote);
  Result<SsdBlockMeta> m = ssd_->Read(key, buf);
  if (!m.ok()) {
    if (m.status().code() == StatusCode::kDataLoss) {
      c_.ssd_corrupt.fetch_add(1, std::memory_order_relaxed);
      DropShadow(key);
    }
    return m.status();
  }
  PutOptions po;
  po.priority = m->priority;
  po.codec = m->codec;
  po.logical_size = m->logical_size;
  KVMESH_RETURN_IF_ERROR(dst.Put(key, buf.first(m->size), po));
  (void)ssd_->Erase(key);
  SetShadow(key, tier, m->priority, true);
  return Status::Ok();
}

// ---- Request path ------------------------------------------------------------------

Status TieredStore::Put(const BlockKey& key, std::span<const std::byte> payload, const PutOptions& o) {
  if (level_.load(std::memory_order_acquire) >= 3) {
    c_.busy_refusals.fetch_add(1, std::memory_order_relaxed);
    return Busy("node " + o_.node_id + " is under memory pressure (level 3): new blocks are refused, reads still work");
  }
  std::optional<Tier> was = Locate(key);
  Status st = primary_->Put(key, payload, o);
  if (st.code() == StatusCode::kResourceExhausted && host_ && was != Tier::kPrimary) {
    // Every primary slot is pinned (a running batch's working set): store
    // the block one tier down instead of refusing it, so it stays shared and
    // cached; a later Get promotes it (or serves it in place).
    Status h = host_->Put(key, payload, o);
    if (h.ok()) {
      c_.stored_below.fetch_add(1, std::memory_order_relaxed);
      SetShadow(key, Tier::kHost, o.priority, true);
      if (was == Tier::kSsd && ssd_) (void)ssd_->Erase(key);
      return Status::Ok();
    }
  }
  KVMESH_RETURN_IF_ERROR(st);
  SetShadow(key, Tier::kPrimary, o.priority, true);
  // Keep tiers exclusive: a re-put of a demoted block replaces the lower copy.
  if (was == Tier::kHost && host_) (void)host_->Erase(key);
  if (was == Tier::kSsd && ssd_) (void)ssd_->Erase(key);
  return Status::Ok();
}

Result<BlockRef> TieredStore::Get(const BlockKey& key) { return GetImpl(key, /*verify=*/true); }

Result<BlockRef> TieredStore::GetImpl(const BlockKey& key, bool verify) {
  Result<BlockRef> r = verify ? primary_->Get(key) : primary_->GetUnverified(key);
  if (r.ok()) {
    SetShadow(key, Tier::kPrimary, r->meta().priority, true);
    return r;
  }
  if (r.status().code() != StatusCode::kNotFound) return r;
  const bool in_place = !o_.promote_on_hit || pressure_level() >= 3;
  if (host_) {
    if (in_place) {
      Result<BlockRef> h = verify ? host_->Get(key) : host_->GetUnverified(key);
      if (h.ok()) {
        c_.host_hits.fetch_add(1, std::memory_order_relaxed);
        c_.served_in_place.fetch_add(1, std::memory_order_relaxed);
        SetShadow(key, Tier::kHost, h->meta().priority, true);
        return h;
      }
      if (h.status().code() != StatusCode::kNotFound) return h;
    } else if (host_->Exists(key, false)) {
      c_.host_hits.fetch_add(1, std::memory_order_relaxed);
      Status p = Promote(key);
      if (p.ok()) return primary_->Get(key);
      Result<BlockRef> h = host_->Get(key);  // the primary tier refused: serve in place
      if (h.ok()) c_.served_in_place.fetch_add(1, std::memory_order_relaxed);
      return h;
    }
  }
  if (ssd_ && ssd_->Contains(key)) {
    // A pinned view needs memory: serving in place means staging the block in
    // the host tier (when there is one); otherwise it moves up to the primary
    // tier, even at level 3, because reads must keep working.
    const bool to_host = in_place && host_;
    Status p = to_host ? PromoteSsdToHost(key) : Promote(key);
    if (p.ok()) {
      c_.ssd_hits.fetch_add(1, std::memory_order_relaxed);
      if (to_host) c_.served_in_place.fetch_add(1, std::memory_order_relaxed);
      return to_host ? host_->Get(key) : primary_->Get(key);
    }
    if (IsMiss(p)) return p;
    return Busy("block " + key.ToHex() + " is on the ssd tier and cannot be promoted now (" + p.ToString() +
                "); read it with GetInto");
  }
  return r;
}

Result<BlockReservation> TieredStore::Reserve(const BlockKey& key, size_t size, const PutOptions& o) {
  if (level_.load(std::memory_order_acquire) >= 3) {
    c_.busy_refusals.fetch_add(1, std::memory_order_relaxed);
    return Busy("node " + o_.node_id + " is under memory pressure (level 3): new blocks are refused, reads still work");
  }
  const std::optional<Tier> was = Locate(key);
  Result<BlockReservation> r = primary_->Reserve(key, size, o);
  if (!r.ok() && r.status().code() == StatusCode::kResourceExhausted && host_ && was != Tier::kPrimary)
    return host_->Reserve(key, size, o);  // every primary slot pinned: one tier down, as Put does
  return r;
}

Status TieredStore::Commit(BlockReservation& r, uint64_t checksum, bool verify) {
  BlockStore* into = r.store();
  if (into != primary_ && into != host_.get()) return InvalidArgument("not a reservation of these tiers");
  const BlockKey key = r.key();
  const Priority pri = r.options().priority;
  const std::optional<Tier> was = Locate(key);
  KVMESH_RETURN_IF_ERROR(into->Commit(r, checksum, verify));
  if (into == primary_) {
    SetShadow(key, Tier::kPrimary, pri, true);
    // Keep tiers exclusive: a re-put of a demoted block replaces the lower copy.
    if (was == Tier::kHost && host_) (void)host_->Erase(key);
  } else {
    c_.stored_below.fetch_add(1, std::memory_order_relaxed);
    SetShadow(key, Tier::kHost, pri, true);
  }
  if (was == Tier::kSsd && ssd_) (void)ssd_->Erase(key);
  return Status::Ok();
}

Result<size_t> TieredStore::GetInto(const BlockKey& key, std::span<std::byte> dst) {
  if (o_.decode_on_read) {
    Result<BlockRef> ref = Get(key);
    if (ref.ok()) {
      const BlockMeta& m = ref->meta();
      std::span<const std::byte> data = ref->data();
      if (ref->valid() && !primary_->backend().host_accessible()) data = HostCopy(*primary_, data);
      if (m.codec != 0) {
        KVMESH_RETURN_IF_ERROR(kernels::DecodeBlock(data, dst));
        return size_t{m.logical_size};
      }
      if (dst.size() < data.size())
        return ResourceExhausted("destination of " + std::to_string(dst.size()) + " bytes is smaller than the " +
                                 std::to_string(data.size()) + "-byte block");
      std::memcpy(dst.data(), data.data(), data.size());
      return data.size();
    }
    if (ref.status().code() != StatusCode::kBusy) return ref.status();
    // An SSD block that cannot be promoted now: read it in place below.
  }
  return GetIntoStored(key, dst);
}

Result<size_t> TieredStore::GetIntoStored(const BlockKey& key, std::span<std::byte> dst) {
  Result<size_t> r = primary_->GetInto(key, dst);
  if (r.ok() || r.status().code() != StatusCode::kNotFound) {
    if (r.ok()) SetShadow(key, Tier::kPrimary, std::nullopt, true);
    return r;
  }
  const bool in_place = !o_.promote_on_hit || pressure_level() >= 3;
  if (!in_place && (host_ || ssd_)) {
    const bool on_host = host_ && host_->Exists(key, false);
    const bool on_ssd = !on_host && ssd_ && ssd_->Contains(key);
    if (on_host || on_ssd) {
      Status p = Promote(key);
      if (p.ok()) {
        (on_host ? c_.host_hits : c_.ssd_hits).fetch_add(1, std::memory_order_relaxed);
        return primary_->GetInto(key, dst);
      }
      if (p.code() == StatusCode::kDataLoss) return p;
    }
  }
  if (host_) {
    Result<size_t> h = host_->GetInto(key, dst);
    if (h.ok()) {
      c_.host_hits.fetch_add(1, std::memory_order_relaxed);
      c_.served_in_place.fetch_add(1, std::memory_order_relaxed);
      SetShadow(key, Tier::kHost, std::nullopt, true);
      return h;
    }
    if (h.status().code() != StatusCode::kNotFound) return h;
  }
  if (ssd_) {
    std::span<std::byte> buf = o_.decode_on_read ? Staging(ssd_->slot_bytes(), kPromote) : dst;
    Result<SsdBlockMeta> m = ssd_->Read(key, buf);
    if (m.ok()) {
      c_.ssd_hits.fetch_add(1, std::memory_order_relaxed);
      c_.served_in_place.fetch_add(1, std::memory_order_relaxed);
      if (!o_.decode_on_read) return size_t{m->size};
      if (m->codec != 0) {
        KVMESH_RETURN_IF_ERROR(kernels::DecodeBlock(buf.first(m->size), dst));
        return size_t{m->logical_size};
      }
      if (dst.size() < m->size) return ResourceExhausted("destination smaller than the block");
      std::memcpy(dst.data(), buf.data(), m->size);
      return size_t{m->size};
    }
    if (m.status().code() == StatusCode::kDataLoss) {
      c_.ssd_corrupt.fetch_add(1, std::memory_order_relaxed);
      DropShadow(key);
    }
    if (m.status().code() != StatusCode::kNotFound) return m.status();
  }
  return r;
}

bool TieredStore::Exists(const BlockKey& key, bool touch) {
  if (primary_->Exists(key, touch)) return true;
  if (host_ && host_->Exists(key, touch)) return true;
  return ssd_ && ssd_->Contains(key);
}

Status TieredStore::Erase(const BlockKey& key) {
  bool any = primary_->Erase(key).ok();
  if (host_) any = host_->Erase(key).ok() || any;
  if (ssd_) any = ssd_->Erase(key).ok() || any;
  DropShadow(key);
  return any ? Status::Ok() : NotFound("block " + key.ToHex() + " is not stored");
}

Status TieredStore::Pin(const BlockKey& key) {
  if (!primary_->Exists(key, false)) KVMESH_RETURN_IF_ERROR(Promote(key));
  return primary_->Pin(key);
}

Status TieredStore::Unpin(const BlockKey& key) { return primary_->Unpin(key); }

Result<BlockRef> TieredStore::PinRef(const BlockKey& key) {
  if (!primary_->Exists(key, false)) KVMESH_RETURN_IF_ERROR(Promote(key));
  return primary_->PinRef(key);
}

Status TieredStore::Release(const BlockKey& key) {
  bool any = primary_->Release(key).ok();
  if (host_) any = host_->Release(key).ok() || any;
  if (!any && ssd_ && ssd_->Contains(key)) return Status::Ok();  // SSD keeps its own order
  return any ? Status::Ok() : NotFound("block " + key.ToHex() + " is not stored");
}

void TieredStore::Prefetch(std::span<const BlockKey> keys) {
  std::lock_guard<std::mutex> lock(queue_mu_);
  for (const BlockKey& k : keys) prefetch_.push_back(k);
  c_.prefetch_requested.fetch_add(keys.size(), std::memory_order_relaxed);
}

}  // namespace kvmesh

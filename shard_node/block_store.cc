#include "shard_node/block_store.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <vector>

#include <absl/container/flat_hash_map.h>

#include "common/checksum.h"
#include "common/hash.h"

namespace kvmesh {
namespace {

constexpr uint64_t kSlotAlign = 256;  // keeps every slot aligned for SIMD and DMA

enum class SlotState : uint8_t { kFree, kWriting, kLive, kDoomed };

struct Slot {
  BlockMeta meta;
  uint32_t pins = 0;           // all pins: BlockRefs + explicit
  uint32_t explicit_pins = 0;  // Pin()/Unpin() only
  SlotState state = SlotState::kFree;
};

Status DestinationTooSmall(size_t have, size_t need) {
  return ResourceExhausted("destination of " + std::to_string(have) + " bytes is smaller than the block (" +
                           std::to_string(need) + " bytes)");
}

AccessInfo InfoOf(const BlockMeta& m, float score = 0.0f) {
  return AccessInfo{m.priority, m.size, score, m.key.lo ^ m.key.hi};
}

}  // namespace

struct BlockStore::Stripe {
  mutable std::mutex mu;
  std::byte* base = nullptr;
  std::vector<Slot> slots;                          // guarded by mu
  std::vector<uint32_t> free;                       // guarded by mu
  absl::flat_hash_map<BlockKey, uint32_t> index;    // guarded by mu
  std::unique_ptr<EvictionPolicy> policy;           // guarded by mu
  StoreStats stats;                                 // guarded by mu (counters only)
};

BlockRef& BlockRef::operator=(BlockRef&& o) noexcept {
  if (this != &o) {
    Release();
    store_ = o.store_;
    stripe_ = o.stripe_;
    slot_ = o.slot_;
    data_ = o.data_;
    meta_ = o.meta_;
    o.store_ = nullptr;
  }
  return *this;
}

void BlockRef::Release() {
  if (store_ == nullptr) return;
  store_->ReleaseRef(stripe_, slot_);
  store_ = nullptr;
}

Result<std::unique_ptr<BlockStore>> BlockStore::Create(StoreOptions o) {
  if (o.capacity_bytes == 0) return InvalidArgument("store capacity must be > 0");
  if (o.slot_bytes == 0) return InvalidArgument("store slot size must be > 0");
  if (o.stripes == 0 || (o.stripes & (o.stripes - 1)) != 0)
    return InvalidArgument("store stripes must be a power of two");
  const uint64_t slot = (o.slot_bytes + kSlotAlign - 1) / kSlotAlign * kSlotAlign;
  const uint64_t total_slots = o.capacity_bytes / slot;
  if (total_slots == 0) {
    return InvalidArgument("a budget of " + std::to_string(o.capacity_bytes) +
                           " bytes cannot hold one block of " + std::to_string(slot) + " bytes");
  }
  // Fewer stripes for small budgets, so each stripe holds a useful number of
  // blocks (eviction is per stripe).
  uint32_t stripes = o.stripes;
  while (stripes > 1 && total_slots / stripes < 16) stripes /= 2;
  const uint64_t per_stripe = total_slots / stripes;

  std::unique_ptr<BlockStore> s(new BlockStore());
  if (o.backend == nullptr) {
    KVMESH_ASSIGN_OR_RETURN(o.backend, MakeHostMemory(per_stripe * stripes * slot));
  } else if (o.backend->size() < per_stripe * stripes * slot) {
    return InvalidArgument("memory backend smaller than the store budget");
  }
  s->backend_ = std::move(o.backend);
  s->num_stripes_ = stripes;
  s->slot_bytes_ = slot;
  s->capacity_bytes_ = per_stripe * stripes * slot;
  s->verify_ = o.verify_checksums;
  s->clock_ = o.clock ? o.clock : SystemClock();
  s->policy_name_ = o.policy;
  s->stripes_ = std::make_unique<Stripe[]>(stripes);
  PolicyOptions po = o.policy_options;
  po.clock = s->clock_;
  po.capacity_hint = per_stripe;
  s->policy_options_ = po;
  for (uint32_t i = 0; i < stripes; ++i) {
    Stripe& st = s->stripes_[i];
    st.base = s->backend_->base() + i * per_stripe * slot;
    st.slots.resize(per_stripe);
    st.free.reserve(per_stripe);
    for (uint64_t j = per_stripe; j-- > 0;) st.free.push_back(static_cast<uint32_t>(j));
    st.index.reserve(per_stripe);
    KVMESH_ASSIGN_OR_RETURN(st.policy, MakeEvictionPolicy(o.policy, po));
  }
  return s;
}

BlockStore::~BlockStore() = default;

BlockStore::Stripe& BlockStore::StripeOf(const BlockKey& k) const {
  // Mixed, so keys spread over stripes even when they are not hashes (tests, tools).
  return stripes_[Mix64(k.hi ^ (k.lo * 0x9E3779B97F4A7C15ull)) & (num_stripes_ - 1)];
}

std::string BlockStore::policy_name() const {
  std::lock_guard<std::mutex> lock(policy_mu_);
  return policy_name_;
}

Status BlockStore::SetPolicy(std::string_view name, const PolicyOptions* options) {
  std::lock_guard<std::mutex> admin(policy_mu_);  // one switch at a time
  PolicyOptions po = options ? *options : policy_options_;
  po.clock = clock_;
  po.capacity_hint = policy_options_.capacity_hint;
  std::vector<std::unique_ptr<EvictionPolicy>> fresh;
  for (uint32_t i = 0; i < num_stripes_; ++i) {
    auto p = MakeEvictionPolicy(name, po);
    if (!p.ok()) return p.status();  // before any stripe changed
    fresh.push_back(std::move(p).value());
  }
  std::vector<std::pair<int64_t, uint32_t>> order;  // (last access, slot)
  for (uint32_t i = 0; i < num_stripes_; ++i) {
    Stripe& s = stripes_[i];
    std::lock_guard<std::mutex> lock(s.mu);
    order.clear();
    for (uint32_t slot = 0; slot < s.slots.size(); ++slot) {
      const Slot& sl = s.slots[slot];
      if (sl.state == SlotState::kLive && sl.pins == 0) order.emplace_back(sl.meta.last_access_ns, slot);
    }
    std::sort(order.begin(), order.end());
    for (const auto& [ns, slot] : order) fresh[i]->Insert(slot, InfoOf(s.slots[slot].meta));
    s.policy = std::move(fresh[i]);
  }
  policy_name_ = std::string(name);
  policy_options_ = po;
  return Status::Ok();
}

void BlockStore::SetEvictionListener(EvictionListener l) {
  // Taking every stripe lock orders this against in-flight evictions.
  for (uint32_t i = 0; i < num_stripes_; ++i) stripes_[i].mu.lock();
  listener_ = std::move(l);
  for (uint32_t i = num_stripes_; i-- > 0;) stripes_[i].mu.unlock();
}

Status BlockStore::Put(const BlockKey& key, std::span<const std::byte> payload, const PutOptions& o) {
  if (payload.empty()) return InvalidArgument("empty block payload");
  if (payload.size() > slot_bytes_) {
    return InvalidArgument("block of " + std::to_string(payload.size()) + " bytes exceeds the slot size of " +
                           std::to_string(slot_bytes_) + " bytes");
  }
  Stripe& s = StripeOf(key);
  const uint32_t stripe_no = static_cast<uint32_t>(&s - stripes_.get());
  uint32_t slot;
  AccessInfo info{o.priority, static_cast<uint32_t>(payload.size()), o.score, key.lo ^ key.hi};
  {
    std::lock_guard<std::mutex> lock(s.mu);
    ++s.stats.puts;
    if (auto it = s.index.find(key); it != s.index.end()) {
      Slot& sl = s.slots[it->second];
      ++s.stats.put_duplicates;
      if (sl.state == SlotState::kLive) {
        sl.meta.priority = std::max(sl.meta.priority, o.priority);
        sl.meta.last_access_ns = clock_->NowNanos();
        if (sl.pins == 0) s.policy->Touch(it->second, InfoOf(sl.meta, o.score));
      }
      return Status::Ok();
    }
    if (!s.policy->Admit(info.key_hash, info)) {  // no slot yet: the key hash is the id
      ++s.stats.put_rejected;
      return Busy("admission filter declined the block");
    }
    while (s.free.empty()) {
      std::optional<EntryId> v = s.policy->Victim();
      if (!v) {
        ++s.stats.put_rejected;
        return ResourceExhausted("stripe " + std::to_string(stripe_no) + " is full: all " +
                                 std::to_string(s.slots.size()) + " blocks are pinned or being written");
      }
      const uint32_t vs = static_cast<uint32_t>(*v);
      Slot& victim = s.slots[vs];
      const Priority cls = s.policy->EffectiveClass(*v);
      s.policy->Remove(*v, RemoveReason::kEvicted);
      if (listener_) listener_(victim.meta, {s.base + vs * slot_bytes_, victim.meta.size});
      s.index.erase(victim.meta.key);
      ++s.stats.evictions;
      ++s.stats.evictions_by_class[std::min<size_t>(cls, kMaxPriorityClasses - 1)];
      --s.stats.blocks;
      s.stats.bytes_stored -= victim.meta.size;
      s.stats.bytes_logical -= victim.meta.logical_size;
      victim = Slot{};
      s.free.push_back(vs);
    }
    slot = s.free.back();
    s.free.pop_back();
    Slot& sl = s.slots[slot];
    sl.state = SlotState::kWriting;
    sl.meta = BlockMeta{};
    sl.meta.key = key;
    s.index.emplace(key, slot);
  }

  // Copy and checksum outside the lock: the slot is reserved (kWriting), so
  // readers miss it and duplicate puts return early.
  std::byte* dst = s.base + slot * slot_bytes_;
  uint64_t sum;
  if (backend_->host_accessible()) {
    sum = CopyWithChecksum64(dst, payload.data(), payload.size());
  } else {
    backend_->CopyIn(dst, payload.data(), payload.size());
    sum = Checksum64(payload.data(), payload.size());
  }

  std::lock_guard<std::mutex> lock(s.mu);
  Slot& sl = s.slots[slot];
  if (sl.state == SlotState::kDoomed) {  // erased while we were writing
    sl = Slot{};
    s.free.push_back(slot);
    return Status::Ok();
  }
  sl.state = SlotState::kLive;
  BlockMeta& m = sl.meta;
  m.size = static_cast<uint32_t>(payload.size());
  m.logical_size = o.logical_size ? o.logical_size : m.size;
  m.codec = o.codec;
  m.priority = o.priority;
  m.checksum = sum;
  m.last_access_ns = clock_->NowNanos();
  m.access_count = 0;
  s.policy->Insert(slot, info);
  ++s.stats.blocks;
  s.stats.bytes_stored += m.size;
  s.stats.bytes_logical += m.logical_size;
  return Status::Ok();
}

Result<BlockRef> BlockStore::Pin(const BlockKey& key, bool verify) {
  Stripe& s = StripeOf(key);
  BlockRef ref;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    ++s.stats.gets;
    auto it = s.index.find(key);
    if (it == s.index.end() || s.slots[it->second].state != SlotState::kLive) {
      ++s.stats.misses;
      return NotFound("block " + key.ToHex() + " is not stored");
    }
    const uint32_t slot = it->second;
    Slot& sl = s.slots[slot];
    if (sl.pins++ == 0) {
      s.policy->Remove(slot, RemoveReason::kPinned);
      ++s.stats.pinned_blocks;
    }
    sl.meta.last_access_ns = clock_->NowNanos();
    ++sl.meta.access_count;
    ++s.stats.hits;
    ref.store_ = this;
    ref.stripe_ = static_cast<uint32_t>(&s - stripes_.get());
    ref.slot_ = slot;
    ref.data_ = s.base + slot * slot_bytes_;
    ref.meta_ = sl.meta;
  }
  if (verify && Checksum64(ref.data_, ref.meta_.size) != ref.meta_.checksum) {
    DropCorrupt(ref);
    return DataLoss("block " + key.ToHex() + " failed its checksum; dropped");
  }
  return ref;
}

void BlockStore::DropCorrupt(BlockRef& ref) {
  Stripe& s = stripes_[ref.stripe_];
  {
    std::lock_guard<std::mutex> lock(s.mu);
    ++s.stats.corrupt;
    --s.stats.hits;
    ++s.stats.misses;
    Slot& sl = s.slots[ref.slot_];
    if (sl.state == SlotState::kLive) {
      s.index.erase(sl.meta.key);
      sl.state = SlotState::kDoomed;
      --s.stats.blocks;
      s.stats.bytes_stored -= sl.meta.size;
      s.stats.bytes_logical -= sl.meta.logical_size;
    }
  }
  ref.Release();  // frees the slot if this was the last pin
}

Result<BlockRef> BlockStore::Get(const BlockKey& key) {
  return Pin(key, verify_ && backend_->host_accessible());
}

Result<size_t> BlockStore::GetInto(const BlockKey& key, std::span<std::byte> dst) {
  if (!verify_ || !backend_->host_accessible()) {
    KVMESH_ASSIGN_OR_RETURN(BlockRef ref, Get(key));
    const size_t n = ref.meta().size;
    if (dst.size() < n) return DestinationTooSmall(dst.size(), n);
    backend_->CopyOut(dst.data(), ref.data().data(), n);
    return n;
  }
  // Verify while copying (one pass over the payload): pin without verifying,
  // copy + hash, then drop the block if the sum is wrong.
  KVMESH_ASSIGN_OR_RETURN(BlockRef ref, Pin(key, /*verify=*/false));
  const size_t n = ref.meta().size;
  if (dst.size() < n) return DestinationTooSmall(dst.size(), n);
  if (CopyWithChecksum64(dst.data(), ref.data().data(), n) != ref.meta().checksum) {
    DropCorrupt(ref);
    return DataLoss("block " + key.ToHex() + " failed its checksum; dropped");
  }
  return n;
}

void BlockStore::ReleaseRef(uint32_t stripe, uint32_t slot) {
  Stripe& s = stripes_[stripe];
  std::lock_guard<std::mutex> lock(s.mu);
  Slot& sl = s.slots[slot];
  if (--sl.pins != 0) return;
  --s.stats.pinned_blocks;
  if (sl.state == SlotState::kDoomed) {
    sl = Slot{};
    s.free.push_back(slot);
  } else {
    s.policy->Insert(slot, InfoOf(sl.meta));
  }
}

bool BlockStore::Exists(const BlockKey& key, bool touch) {
  Stripe& s = StripeOf(key);
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.index.find(key);
  if (it == s.index.end()) return false;
  Slot& sl = s.slots[it->second];
  if (sl.state != SlotState::kLive) return false;
  if (touch) {
    sl.meta.last_access_ns = clock_->NowNanos();
    ++sl.meta.access_count;
    if (sl.pins == 0) s.policy->Touch(it->second, InfoOf(sl.meta));
  }
  return true;
}

Status BlockStore::Erase(const BlockKey& key) {
  Stripe& s = StripeOf(key);
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.index.find(key);
  if (it == s.index.end()) return NotFound("block " + key.ToHex() + " is not stored");
  const uint32_t slot = it->second;
  Slot& sl = s.slots[slot];
  s.index.erase(it);
  ++s.stats.erases;
  if (sl.state == SlotState::kWriting) {
    sl.state = SlotState::kDoomed;  // the writer frees it
    return Status::Ok();
  }
  --s.stats.blocks;
  s.stats.bytes_stored -= sl.meta.size;
  s.stats.bytes_logical -= sl.meta.logical_size;
  if (sl.pins > 0) {
    sl.state = SlotState::kDoomed;  // the last unpin frees it
  } else {
    s.policy->Remove(slot, RemoveReason::kErased);
    sl = Slot{};
    s.free.push_back(slot);
  }
  return Status::Ok();
}

Status BlockStore::Pin(const BlockKey& key) {
  Stripe& s = StripeOf(key);
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.index.find(key);
  if (it == s.index.end() || s.slots[it->second].state != SlotState::kLive)
    return NotFound("block " + key.ToHex() + " is not stored");
  Slot& sl = s.slots[it->second];
  if (sl.pins++ == 0) {
    s.policy->Remove(it->second, RemoveReason::kPinned);
    ++s.stats.pinned_blocks;
  }
  ++sl.explicit_pins;
  return Status::Ok();
}

Status BlockStore::Unpin(const BlockKey& key) {
  Stripe& s = StripeOf(key);
  uint32_t slot;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.index.find(key);
    if (it == s.index.end()) return NotFound("block " + key.ToHex() + " is not stored");
    slot = it->second;
    Slot& sl = s.slots[slot];
    if (sl.explicit_pins == 0) return FailedPrecondition("block " + key.ToHex() + " is not pinned");
    --sl.explicit_pins;
  }
  ReleaseRef(static_cast<uint32_t>(&s - stripes_.get()), slot);
  return Status::Ok();
}

void StoreStats::Add(const StoreStats& x) {
  capacity_bytes += x.capacity_bytes;
  slot_bytes = std::max(slot_bytes, x.slot_bytes);
  slots_total += x.slots_total;
  blocks += x.blocks;
  bytes_stored += x.bytes_stored;
  bytes_logical += x.bytes_logical;
  pinned_blocks += x.pinned_blocks;
  puts += x.puts;
  put_duplicates += x.put_duplicates;
  put_rejected += x.put_rejected;
  gets += x.gets;
  hits += x.hits;
  misses += x.misses;
  erases += x.erases;
  corrupt += x.corrupt;
  evictions += x.evictions;
  for (size_t c = 0; c < kMaxPriorityClasses; ++c) evictions_by_class[c] += x.evictions_by_class[c];
}

StoreStats BlockStore::Stats() const {
  StoreStats t;
  t.capacity_bytes = capacity_bytes_;
  t.slot_bytes = slot_bytes_;
  for (uint32_t i = 0; i < num_stripes_; ++i) {
    const Stripe& s = stripes_[i];
    std::lock_guard<std::mutex> lock(s.mu);
    t.Add(s.stats);  // stripes keep counters only (no capacity or slot figures)
    t.slots_total += s.slots.size();
  }
  return t;
}

}  // namespace kvmesh

#include "shard_node/block_store.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <vector>

#include <absl/container/flat_hash_map.h>

#include "common/checksum.h"
#include "common/hash.h"
#include "transport/local_index.h"

namespace kvmesh {
namespace {

constexpr uint64_t kSlotAlign = 256;  // keeps every chunk aligned for SIMD and DMA
constexpr uint32_t kNone = UINT32_MAX;
constexpr uint8_t kNoClass = UINT8_MAX;

enum class SlotState : uint8_t { kFree, kWriting, kLive, kDoomed };

struct Slot {  // one chunk
  BlockMeta meta;
  uint32_t pins = 0;           // all pins: BlockRefs + explicit
  uint32_t explicit_pins = 0;  // Pin()/Unpin() only
  uint32_t next_free = kNone;  // the page's free list
  SlotState state = SlotState::kFree;
};

struct Page {
  uint64_t offset = 0;         // from the stripe's base
  uint32_t bytes = 0;          // a full page, or less for a stripe's last page
  uint32_t chunks = 0;         // chunks of the current class
  uint32_t used = 0;           // chunks not free
  uint32_t free_head = kNone;  // free chunk ids of this page
  uint32_t prev = kNone, next = kNone;  // the class's list of pages with a free chunk
  uint8_t cls = kNoClass;
};

Status DestinationTooSmall(size_t have, size_t need) {
  return ResourceExhausted("destination of " + std::to_string(have) + " bytes is smaller than the block (" +
                           std::to_string(need) + " bytes)");
}

AccessInfo InfoOf(const BlockMeta& m, float score = 0.0f) {
  return AccessInfo{m.priority, m.size, score, m.key.lo ^ m.key.hi};
}

// Eviction order across classes: lower effective priority class first, then
// idle longer. Lower ranks go first.
struct Rank {
  Priority cls = 0;
  int64_t last_ns = 0;
  bool operator<(const Rank& o) const { return cls != o.cls ? cls < o.cls : last_ns < o.last_ns; }
};

}  // namespace

struct BlockStore::Stripe {
  struct Class {
    std::unique_ptr<EvictionPolicy> policy;  // the class's evictable blocks
    uint32_t partial_head = kNone, partial_tail = kNone;  // pages with a free chunk
    uint64_t max_chunks = 0;                 // if the class had every page
  };
  mutable std::mutex mu;
  std::byte* base = nullptr;
  std::vector<Slot> slots;                          // guarded by mu; chunk id = page * stride + index
  std::vector<Page> pages;                          // guarded by mu
  std::vector<uint32_t> free_pages;                 // guarded by mu
  std::vector<Class> classes;                       // guarded by mu
  absl::flat_hash_map<BlockKey, uint32_t> index;    // guarded by mu
  // Doomed chunks (erased, replaced, evicted by a quota, dropped as corrupt)
  // that still hold explicit pins, by the key they had: Unpin(key) finds them
  // here once the index no longer names them, and the last unpin frees them.
  absl::flat_hash_map<BlockKey, std::vector<uint32_t>> doomed_pins;  // guarded by mu
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
  if (o.size_classes == 0 || o.size_classes > kMaxSizeClasses)
    return InvalidArgument("store size_classes must be in 1.." + std::to_string(kMaxSizeClasses));
  if (o.size_classes > 1 && o.page_slots < 2) return InvalidArgument("store page_slots must be >= 2");
  const uint64_t slot = (o.slot_bytes + kSlotAlign - 1) / kSlotAlign * kSlotAlign;
  const uint64_t total_slots = o.capacity_bytes / slot;
  if (total_slots == 0) {
    return InvalidArgument("a budget of " + std::to_string(o.capacity_bytes) +
                           " bytes cannot hold one block of " + std::to_string(slot) + " bytes");
  }
  if (slot * std::max<uint32_t>(o.page_slots, 1) > UINT32_MAX)
    return InvalidArgument("store slot size of " + std::to_string(slot) + " bytes is too large for its pages");
  // Fewer stripes for small budgets, so each stripe holds a useful number of
  // blocks (eviction is per stripe).
  uint32_t stripes = o.stripes;
  while (stripes > 1 && total_slots / stripes < 16) stripes /= 2;
  const uint64_t per_stripe = total_slots / stripes;

  std::unique_ptr<BlockStore> s(new BlockStore());
  // The class table: class 0 = one slot; class k cuts a page into
  // 7 * 2^(k-1) * page_slots / 4 chunks (see the header). Only one class
  // left (small slots) is the fixed-slot store.
  uint32_t page_slots = o.size_classes > 1 ? o.page_slots : 1;
  s->classes_.push_back({slot, page_slots});
  for (uint32_t k = 1; k < o.size_classes; ++k) {
    const uint64_t page = page_slots * slot;
    const uint64_t n = page_slots * (uint64_t{7} << k) / 8;
    const uint64_t chunk = page / n / kSlotAlign * kSlotAlign;
    if (chunk < kMinChunkBytes || chunk >= s->classes_.back().chunk_bytes) break;
    s->classes_.push_back({chunk, static_cast<uint32_t>(page / chunk)});
  }
  if (s->classes_.size() == 1) {
    page_slots = 1;
    s->classes_[0].per_page = 1;
  }
  s->page_bytes_ = page_slots * slot;
  s->chunk_stride_ = s->classes_.back().per_page;

  const uint64_t stripe_bytes = per_stripe * slot;
  if (o.backend == nullptr) {
    HostMemoryOptions ho;
    ho.shared = o.local_reads;
    KVMESH_ASSIGN_OR_RETURN(o.backend, MakeHostMemory(stripe_bytes * stripes, ho));
  } else if (o.backend->size() < stripe_bytes * stripes) {
    return InvalidArgument("memory backend smaller than the store budget");
  }
  const uint64_t pages = (per_stripe + page_slots - 1) / page_slots;  // the last may be short
  if (pages * s->chunk_stride_ > UINT32_MAX) return InvalidArgument("store has too many chunks per stripe");
  s->backend_ = std::move(o.backend);
  s->num_stripes_ = stripes;
  s->slot_bytes_ = slot;
  s->capacity_bytes_ = stripe_bytes * stripes;
  s->verify_ = o.verify_checksums;
  s->clock_ = o.clock ? o.clock : SystemClock();
  s->policy_name_ = o.policy;
  s->stripes_ = std::make_unique<Stripe[]>(stripes);
  PolicyOptions po = o.policy_options;
  po.clock = s->clock_;
  s->policy_options_ = po;
  s->groups_ = std::move(o.groups);
  s->group_scope_ = std::move(o.group_scope);
  s->observer_ = o.observer;
  s->medium_ = o.medium;
  const std::vector<std::shared_ptr<PolicyGroup>> groups = s->GroupsFor(o.policy);
  uint64_t all_blocks = 0;
  for (uint32_t i = 0; i < stripes; ++i) {
    Stripe& st = s->stripes_[i];
    st.base = s->backend_->base() + i * stripe_bytes;
    st.pages.resize(pages);
    st.free_pages.reserve(pages);
    for (uint64_t p = 0; p < pages; ++p) {
      st.pages[p].offset = p * s->page_bytes_;
      st.pages[p].bytes = static_cast<uint32_t>(std::min(s->page_bytes_, stripe_bytes - st.pages[p].offset));
    }
    // Taken from the back: page 0 first, a short last page last.
    for (uint64_t p = pages; p-- > 0;) st.free_pages.push_back(static_cast<uint32_t>(p));
    st.slots.resize(pages * s->chunk_stride_);
    uint64_t max_blocks = 0;
    st.classes.resize(s->classes_.size());
    for (size_t c = 0; c < s->classes_.size(); ++c) {
      for (const Page& pg : st.pages) st.classes[c].max_chunks += pg.bytes / s->classes_[c].chunk_bytes;
      max_blocks = std::max(max_blocks, st.classes[c].max_chunks);
      PolicyOptions cpo = po;
      cpo.capacity_hint = st.classes[c].max_chunks;
      cpo.group = groups[c];
      KVMESH_ASSIGN_OR_RETURN(st.classes[c].policy, MakeEvictionPolicy(o.policy, cpo));
    }
    st.index.reserve(max_blocks);
    all_blocks += max_blocks;
  }
  if (o.local_reads && s->backend_->host_accessible() && s->backend_->shared_fd() >= 0) {
    KVMESH_ASSIGN_OR_RETURN(s->local_, LocalIndexWriter::Create(all_blocks, s->backend_->size()));
  }
  return s;
}

BlockStore::~BlockStore() = default;

// One group per size class: a class's stripes decide together (PolicyGroup),
// with every other store of the same registry, scope and policy.
std::vector<std::shared_ptr<PolicyGroup>> BlockStore::GroupsFor(std::string_view policy) const {
  std::vector<std::shared_ptr<PolicyGroup>> groups(classes_.size());
  for (size_t c = 0; c < classes_.size(); ++c)
    groups[c] = groups_ ? groups_->Get(group_scope_ + "/" + std::string(policy) + "/" +
                                       std::to_string(classes_[c].chunk_bytes))
                        : std::make_shared<PolicyGroup>();
  return groups;
}

BlockStore::Stripe& BlockStore::StripeOf(const BlockKey& k) const {
  // Mixed, so keys spread over stripes even when they are not hashes (tests, tools).
  return stripes_[Mix64(k.hi ^ (k.lo * 0x9E3779B97F4A7C15ull)) & (num_stripes_ - 1)];
}

uint32_t BlockStore::StripeNo(const Stripe& s) const { return static_cast<uint32_t>(&s - stripes_.get()); }

uint32_t BlockStore::ClassFor(uint64_t size) const {
  uint32_t c = static_cast<uint32_t>(classes_.size()) - 1;
  while (classes_[c].chunk_bytes < size) --c;  // class 0 holds a slot
  return c;
}

uint64_t BlockStore::ChunkBytesFor(uint64_t size) const {
  if (size > slot_bytes_) return 0;
  return classes_[ClassFor(std::max<uint64_t>(size, 1))].chunk_bytes;
}

std::string BlockStore::policy_name() const {
  std::lock_guard<std::mutex> lock(policy_mu_);
  return policy_name_;
}

// ---- Chunk allocator (stripe lock held) --------------------------------------------

std::byte* BlockStore::ChunkData(const Stripe& s, uint32_t chunk) const {
  const Page& pg = s.pages[chunk / chunk_stride_];
  return s.base + pg.offset + (chunk % chunk_stride_) * classes_[pg.cls].chunk_bytes;
}

bool BlockStore::TakeChunk(Stripe& s, uint32_t cls, uint32_t* chunk) {
  Stripe::Class& c = s.classes[cls];
  if (c.partial_head == kNone) {
    if (s.free_pages.empty()) return false;
    const uint32_t p = s.free_pages.back();
    s.free_pages.pop_back();
    Page& pg = s.pages[p];
    pg.cls = static_cast<uint8_t>(cls);
    pg.chunks = static_cast<uint32_t>(pg.bytes / classes_[cls].chunk_bytes);
    pg.used = 0;
    pg.free_head = kNone;
    for (uint32_t i = pg.chunks; i-- > 0;) {  // chunk 0 first
      const uint32_t id = p * chunk_stride_ + i;
      s.slots[id].next_free = pg.free_head;
      pg.free_head = id;
    }
    pg.prev = pg.next = kNone;
    c.partial_head = c.partial_tail = p;
    ++s.stats.classes[cls].pages;
  }
  const uint32_t p = c.partial_head;
  Page& pg = s.pages[p];
  const uint32_t id = pg.free_head;
  pg.free_head = s.slots[id].next_free;
  s.slots[id].next_free = kNone;
  ++pg.used;
  if (pg.free_head == kNone) {  // full: off the partial list (it is the head)
    c.partial_head = pg.next;
    if (pg.next != kNone) s.pages[pg.next].prev = kNone;
    else c.partial_tail = kNone;
    pg.prev = pg.next = kNone;
  }
  ++s.stats.classes[cls].chunks_used;
  s.stats.bytes_held += classes_[cls].chunk_bytes;
  *chunk = id;
  return true;
}

void BlockStore::Unpublish(const Stripe& s, uint32_t chunk) {
  const Slot& sl = s.slots[chunk];
  if (local_ != nullptr && sl.meta.size != 0)
    local_->Retract(sl.meta.key, static_cast<uint64_t>(ChunkData(s, chunk) - backend_->base()));
}

void BlockStore::FreeChunk(Stripe& s, uint32_t chunk) {
  Unpublish(s, chunk);  // before the chunk can be written again
  const uint32_t p = chunk / chunk_stride_;
  Page& pg = s.pages[p];
  Stripe::Class& c = s.classes[pg.cls];
  s.slots[chunk] = Slot{};
  --s.stats.classes[pg.cls].chunks_used;
  s.stats.bytes_held -= classes_[pg.cls].chunk_bytes;
  const bool was_full = pg.free_head == kNone;
  --pg.used;
  if (pg.used == 0) {  // the page goes back to the stripe for any class
    if (!was_full) {
      (pg.prev != kNone ? s.pages[pg.prev].next : c.partial_head) = pg.next;
      (pg.next != kNone ? s.pages[pg.next].prev : c.partial_tail) = pg.prev;
    }
    --s.stats.classes[pg.cls].pages;
    pg.cls = kNoClass;
    pg.chunks = 0;
    pg.free_head = kNone;
    pg.prev = pg.next = kNone;
    s.free_pages.push_back(p);
    return;
  }
  s.slots[chunk].next_free = pg.free_head;
  pg.free_head = chunk;
  if (was_full) {  // to the tail: allocate from fuller pages first, so others can drain
    pg.prev = c.partial_tail;
    pg.next = kNone;
    (c.partial_tail != kNone ? s.pages[c.partial_tail].next : c.partial_head) = p;
    c.partial_tail = p;
  }
}

// A live, unpinned block: out of its policy, through the listener, freed.
void BlockStore::EvictChunk(Stripe& s, uint32_t chunk) {
  Slot& victim = s.slots[chunk];
  const uint8_t cls = s.pages[chunk / chunk_stride_].cls;
  EvictionPolicy& policy = *s.classes[cls].policy;
  const Priority pri = policy.EffectiveClass(chunk);
  policy.Remove(chunk, RemoveReason::kEvicted);
  Unpublish(s, chunk);
  if (listener_) listener_(victim.meta, {ChunkData(s, chunk), victim.meta.size});
  s.index.erase(victim.meta.key);
  Notify(BlockChange::kRemoved, victim.meta.key);
  ++s.stats.evictions;
  ++s.stats.evictions_by_class[std::min<size_t>(pri, kMaxPriorityClasses - 1)];
  ++s.stats.classes[cls].evictions;
  --s.stats.blocks;
  s.stats.bytes_stored -= victim.meta.size;
  s.stats.bytes_logical -= victim.meta.logical_size;
  FreeChunk(s, chunk);
}

Status BlockStore::MakeRoom(Stripe& s, uint32_t cls) {
  auto rank = [&](uint32_t chunk) {
    const uint8_t c = s.pages[chunk / chunk_stride_].cls;
    return Rank{s.classes[c].policy->EffectiveClass(chunk), s.slots[chunk].meta.last_access_ns};
  };
  // Whether every block on page p can go (live, unpinned, and ranked below
  // `bound` when given); `worst` gets the highest rank among them.
  auto reclaimable = [&](uint32_t p, Rank* worst, const Rank* bound) {
    const Page& pg = s.pages[p];
    bool any = false;
    for (uint32_t i = 0; i < pg.chunks; ++i) {
      const uint32_t id = p * chunk_stride_ + i;
      const Slot& sl = s.slots[id];
      if (sl.state == SlotState::kFree) continue;
      if (sl.state != SlotState::kLive || sl.pins != 0) return false;
      const Rank r = rank(id);
      if (bound && !(r < *bound)) return false;
      if (!any || *worst < r) *worst = r;
      any = true;
    }
    return any;
  };
  while (s.classes[cls].partial_head == kNone && s.free_pages.empty()) {
    std::optional<EntryId> own = s.classes[cls].policy->Victim();
    uint32_t take = kNone;
    if (own) {
      // A page of another class whose every block ranks below our victim.
      const Rank mine = rank(static_cast<uint32_t>(*own));
      uint32_t best_used = UINT32_MAX;
      for (uint32_t k = 0; k < s.classes.size(); ++k) {
        if (k == cls) continue;
        std::optional<EntryId> v = s.classes[k].policy->Victim();
        if (!v) continue;
        const uint32_t p = static_cast<uint32_t>(*v) / chunk_stride_;
        Rank worst;
        if (s.pages[p].used < best_used && reclaimable(p, &worst, &mine)) {
          take = p;
          best_used = s.pages[p].used;
        }
      }
    } else {
      // Nothing of our own to evict: the page whose blocks are of the lowest
      // priority classes, then the one that frees soonest (fewest blocks).
      Rank best_worst;
      uint32_t best_used = UINT32_MAX;
      for (uint32_t p = 0; p < s.pages.size(); ++p) {
        if (s.pages[p].cls == kNoClass || s.pages[p].cls == cls) continue;
        Rank worst;
        if (!reclaimable(p, &worst, nullptr)) continue;
        const uint32_t used = s.pages[p].used;
        if (take == kNone || worst.cls < best_worst.cls ||
            (worst.cls == best_worst.cls && (used < best_used || (used == best_used && worst < best_worst)))) {
          take = p;
          best_worst = worst;
          best_used = used;
        }
      }
    }
    if (take != kNone) {
      ++s.stats.page_reclaims;
      const Page& pg = s.pages[take];
      const uint32_t n = pg.chunks;
      for (uint32_t i = 0; i < n; ++i) {
        const uint32_t id = take * chunk_stride_ + i;
        if (s.slots[id].state == SlotState::kLive) EvictChunk(s, id);  // the last one frees the page
      }
    } else if (own) {
      EvictChunk(s, static_cast<uint32_t>(*own));
    } else {
      return ResourceExhausted("stripe " + std::to_string(StripeNo(s)) +
                               " is full: every block that could make room for a " +
                               std::to_string(classes_[cls].chunk_bytes) + "-byte chunk is pinned or being written");
    }
  }
  return Status::Ok();
}

// ---- Policies and listener ---------------------------------------------------------

Status BlockStore::SetPolicy(std::string_view name, const PolicyOptions* options) {
  std::lock_guard<std::mutex> admin(policy_mu_);  // one switch at a time
  PolicyOptions po = options ? *options : policy_options_;
  po.clock = clock_;
  std::vector<std::vector<std::unique_ptr<EvictionPolicy>>> fresh(num_stripes_);
  const std::vector<std::shared_ptr<PolicyGroup>> groups = GroupsFor(name);
  for (uint32_t i = 0; i < num_stripes_; ++i) {
    for (size_t k = 0; k < stripes_[i].classes.size(); ++k) {
      const Stripe::Class& c = stripes_[i].classes[k];
      PolicyOptions cpo = po;
      cpo.capacity_hint = c.max_chunks;  // fixed at Create: no lock needed
      cpo.group = groups[k];
      auto p = MakeEvictionPolicy(name, cpo);
      if (!p.ok()) return p.status();  // before any stripe changed
      fresh[i].push_back(std::move(p).value());
    }
  }
  std::vector<std::pair<int64_t, uint32_t>> order;  // (last access, chunk)
  for (uint32_t i = 0; i < num_stripes_; ++i) {
    Stripe& s = stripes_[i];
    std::lock_guard<std::mutex> lock(s.mu);
    for (size_t c = 0; c < s.classes.size(); ++c) {
      order.clear();
      for (uint32_t id = 0; id < s.slots.size(); ++id) {
        const Slot& sl = s.slots[id];
        if (sl.state == SlotState::kLive && sl.pins == 0 && s.pages[id / chunk_stride_].cls == c)
          order.emplace_back(sl.meta.last_access_ns, id);
      }
      std::sort(order.begin(), order.end());
      for (const auto& [ns, id] : order) fresh[i][c]->Insert(id, InfoOf(s.slots[id].meta));
      s.classes[c].policy = std::move(fresh[i][c]);
    }
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

// ---- Requests ----------------------------------------------------------------------

Result<BlockReservation> BlockStore::Reserve(const BlockKey& key, size_t size, const PutOptions& o) {
  if (size == 0) return InvalidArgument("empty block payload");
  if (size > slot_bytes_) {
    return InvalidArgument("block of " + std::to_string(size) + " bytes exceeds the slot size of " +
                           std::to_string(slot_bytes_) + " bytes");
  }
  Stripe& s = StripeOf(key);
  const uint32_t cls = ClassFor(size);
  uint32_t slot;
  AccessInfo info{o.priority, static_cast<uint32_t>(size), o.score, key.lo ^ key.hi};
  std::lock_guard<std::mutex> lock(s.mu);
  ++s.stats.puts;
  if (auto it = s.index.find(key); it != s.index.end()) {
    Slot& sl = s.slots[it->second];
    ++s.stats.put_duplicates;
    if (sl.state == SlotState::kLive) {
      sl.meta.priority = std::max(sl.meta.priority, o.priority);
      sl.meta.last_access_ns = clock_->NowNanos();
      if (sl.pins == 0) {
        AccessInfo again = InfoOf(sl.meta, o.score);
        again.refresh = true;  // recomputed by the client: not a hit that saved work
        s.classes[s.pages[it->second / chunk_stride_].cls].policy->Touch(it->second, again);
      }
    }
    return AlreadyExists("block " + key.ToHex() + " is already stored");
  }
  if (!s.classes[cls].policy->Admit(info.key_hash, info)) {  // no chunk yet: the key hash is the id
    ++s.stats.put_rejected;
    return Busy("admission filter declined the block");
  }
  if (!TakeChunk(s, cls, &slot)) {
    Status room = o.may_evict ? MakeRoom(s, cls)
                              : ResourceExhausted("stripe " + std::to_string(StripeNo(s)) +
                                                  " has no free chunk or page and the put may not evict");
    if (!room.ok()) {
      ++s.stats.put_rejected;
      return room;
    }
    TakeChunk(s, cls, &slot);  // MakeRoom left a free chunk or page
  }
  Slot& sl = s.slots[slot];
  sl.state = SlotState::kWriting;
  sl.meta = BlockMeta{};
  sl.meta.key = key;
  s.index.emplace(key, slot);
  BlockReservation r;
  r.key_ = key;
  r.store_ = this;
  r.stripe_ = StripeNo(s);
  r.slot_ = slot;
  r.size_ = static_cast<uint32_t>(size);
  r.data_ = ChunkData(s, slot);  // stable while the chunk is used: its page keeps its class
  r.options_ = o;
  return r;
}

Status BlockStore::Commit(BlockReservation& r, uint64_t checksum, bool verify) {
  if (!r.valid() || r.store_ != this) return InvalidArgument("not a reservation of this store");
  if (verify && backend_->host_accessible() && Checksum64(r.data_, r.size_) != checksum) {
    AbortReservation(r);
    return DataLoss("payload checksum mismatch: block not stored");
  }
  Stripe& s = stripes_[r.stripe_];
  const PutOptions& o = r.options_;
  std::lock_guard<std::mutex> lock(s.mu);
  Slot& sl = s.slots[r.slot_];
  r.store_ = nullptr;  // the chunk is the store's again, live or freed below
  if (sl.state == SlotState::kDoomed) {  // erased while being written
    FreeChunk(s, r.slot_);
    return Status::Ok();
  }
  sl.state = SlotState::kLive;
  BlockMeta& m = sl.meta;
  m.size = r.size_;
  m.logical_size = o.logical_size ? o.logical_size : m.size;
  m.codec = o.codec;
  m.priority = o.priority;
  m.checksum = checksum;
  m.last_access_ns = clock_->NowNanos();
  m.access_count = 0;
  const AccessInfo info{o.priority, m.size, o.score, m.key.lo ^ m.key.hi};
  s.classes[s.pages[r.slot_ / chunk_stride_].cls].policy->Insert(r.slot_, info);
  ++s.stats.blocks;
  // Raw blocks only: an encoded block is decoded by the node on the way out.
  if (local_ != nullptr && m.codec == 0)
    local_->Publish(m.key, static_cast<uint64_t>(r.data_ - backend_->base()), m.size, checksum);
  Notify(BlockChange::kStored, m.key);
  s.stats.bytes_stored += m.size;
  s.stats.bytes_logical += m.logical_size;
  return Status::Ok();
}

void BlockStore::AbortReservation(BlockReservation& r) {
  Stripe& s = stripes_[r.stripe_];
  std::lock_guard<std::mutex> lock(s.mu);
  Slot& sl = s.slots[r.slot_];
  if (sl.state == SlotState::kWriting) s.index.erase(sl.meta.key);  // kDoomed: Erase already unindexed it
  FreeChunk(s, r.slot_);
  r.store_ = nullptr;
}

BlockReservation& BlockReservation::operator=(BlockReservation&& o) noexcept {
  if (this != &o) {
    Abort();
    key_ = o.key_;
    store_ = o.store_;
    stripe_ = o.stripe_;
    slot_ = o.slot_;
    size_ = o.size_;
    data_ = o.data_;
    options_ = o.options_;
    o.store_ = nullptr;
  }
  return *this;
}

void BlockReservation::Abort() {
  if (store_ != nullptr) store_->AbortReservation(*this);
}

Status BlockStore::Put(const BlockKey& key, std::span<const std::byte> payload, const PutOptions& o) {
  Result<BlockReservation> r = Reserve(key, payload.size(), o);
  if (!r.ok()) return r.status().code() == StatusCode::kAlreadyExists ? Status::Ok() : r.status();
  // Copy and checksum outside the lock: the chunk is reserved (kWriting), so
  // readers miss it and duplicate puts return early.
  uint64_t sum;
  std::byte* dst = r->data().data();
  if (backend_->host_accessible()) {
    sum = CopyWithChecksum64(dst, payload.data(), payload.size());
  } else {
    backend_->CopyIn(dst, payload.data(), payload.size());
    sum = Checksum64(payload.data(), payload.size());
  }
  return Commit(*r, sum, /*verify=*/false);
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
      s.classes[s.pages[slot / chunk_stride_].cls].policy->Remove(slot, RemoveReason::kPinned);
      ++s.stats.pinned_blocks;
    }
    sl.meta.last_access_ns = clock_->NowNanos();
    ++sl.meta.access_count;
    ++s.stats.hits;
    ref.store_ = this;
    ref.stripe_ = StripeNo(s);
    ref.slot_ = slot;
    ref.data_ = ChunkData(s, slot);
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
      Unpublish(s, ref.slot_);
      sl.state = SlotState::kDoomed;
      if (sl.explicit_pins > 0) s.doomed_pins[sl.meta.key].push_back(ref.slot_);
      --s.stats.blocks;
      Notify(BlockChange::kRemoved, sl.meta.key);
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
    FreeChunk(s, slot);
  } else {
    s.classes[s.pages[slot / chunk_stride_].cls].policy->Insert(slot, InfoOf(sl.meta));
  }
}

void BlockStore::ForEachLive(const std::function<void(const BlockKey&)>& fn) const {
  for (uint32_t i = 0; i < num_stripes_; ++i) {
    const Stripe& s = stripes_[i];
    std::lock_guard<std::mutex> lock(s.mu);
    for (const auto& [key, slot] : s.index)
      if (s.slots[slot].state == SlotState::kLive) fn(key);
  }
}

bool BlockStore::Exists(const BlockKey& key, bool touch) {
  Stripe& s = StripeOf(key);
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.index.find(key);
  if (it == s.index.end()) return false;
  Slot& sl = s.slots[it->second];
  if (sl.state != SlotState::kLive) return false;
  if (touch) TouchLocked(s, it->second, 1);
  return true;
}

void BlockStore::TouchLocked(Stripe& s, uint32_t chunk, uint32_t accesses) {
  Slot& sl = s.slots[chunk];
  sl.meta.last_access_ns = clock_->NowNanos();
  sl.meta.access_count += accesses;
  if (sl.pins == 0) s.classes[s.pages[chunk / chunk_stride_].cls].policy->Touch(chunk, InfoOf(sl.meta));
}

void BlockStore::TouchLocal(const BlockKey& key, uint32_t reads) {
  Stripe& s = StripeOf(key);
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.index.find(key);
  if (it == s.index.end() || s.slots[it->second].state != SlotState::kLive) return;
  s.stats.gets += reads;
  s.stats.hits += reads;
  TouchLocked(s, it->second, reads);
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
  Unpublish(s, slot);
  Notify(BlockChange::kRemoved, key);
  s.stats.bytes_stored -= sl.meta.size;
  s.stats.bytes_logical -= sl.meta.logical_size;
  if (sl.pins > 0) {
    sl.state = SlotState::kDoomed;  // the last unpin frees it
    // Unpin(key) can no longer find it through the index: it finds it here.
    if (sl.explicit_pins > 0) s.doomed_pins[key].push_back(slot);
  } else {
    s.classes[s.pages[slot / chunk_stride_].cls].policy->Remove(slot, RemoveReason::kErased);
    FreeChunk(s, slot);
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
    s.classes[s.pages[it->second / chunk_stride_].cls].policy->Remove(it->second, RemoveReason::kPinned);
    ++s.stats.pinned_blocks;
  }
  ++sl.explicit_pins;
  return Status::Ok();
}

Status BlockStore::Release(const BlockKey& key) {
  Stripe& s = StripeOf(key);
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.index.find(key);
  if (it == s.index.end() || s.slots[it->second].state != SlotState::kLive)
    return NotFound("block " + key.ToHex() + " is not stored");
  const uint32_t slot = it->second;
  ++s.stats.releases;
  // A pinned block is not in its policy (removed while pinned): nothing to reorder.
  if (s.slots[slot].pins == 0) s.classes[s.pages[slot / chunk_stride_].cls].policy->Release(slot);
  return Status::Ok();
}

Status BlockStore::Unpin(const BlockKey& key) {
  Stripe& s = StripeOf(key);
  uint32_t slot;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    // A doomed chunk the key named first (oldest pin first): it holds memory
    // nothing can read, and its last unpin frees it, whatever removed it from
    // the index (an erase, a replacing put, a quota eviction, a bad checksum).
    if (auto d = s.doomed_pins.find(key); d != s.doomed_pins.end()) {
      std::vector<uint32_t>& slots = d->second;
      slot = slots.front();
      if (--s.slots[slot].explicit_pins == 0) {
        slots.erase(slots.begin());
        if (slots.empty()) s.doomed_pins.erase(d);
      }
    } else {
      auto it = s.index.find(key);
      if (it == s.index.end()) return NotFound("block " + key.ToHex() + " is not stored");
      slot = it->second;
      Slot& sl = s.slots[slot];
      if (sl.explicit_pins == 0) return FailedPrecondition("block " + key.ToHex() + " is not pinned");
      --sl.explicit_pins;
    }
  }
  ReleaseRef(StripeNo(s), slot);
  return Status::Ok();
}

Result<BlockRef> BlockStore::PinRef(const BlockKey& key) {
  Stripe& s = StripeOf(key);
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.index.find(key);
  if (it == s.index.end() || s.slots[it->second].state != SlotState::kLive)
    return NotFound("block " + key.ToHex() + " is not stored");
  const uint32_t slot = it->second;
  Slot& sl = s.slots[slot];
  if (sl.pins++ == 0) {
    s.classes[s.pages[slot / chunk_stride_].cls].policy->Remove(slot, RemoveReason::kPinned);
    ++s.stats.pinned_blocks;
  }
  BlockRef ref;
  ref.store_ = this;
  ref.stripe_ = StripeNo(s);
  ref.slot_ = slot;
  ref.data_ = ChunkData(s, slot);
  ref.meta_ = sl.meta;
  return ref;
}

uint64_t BlockStore::PlacementOf(const BlockKey& key) const {
  const Stripe& s = StripeOf(key);
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.index.find(key);
  if (it == s.index.end()) return UINT64_MAX;
  return (uint64_t{StripeNo(s)} << 32) | (it->second / chunk_stride_);
}

void StoreStats::Add(const StoreStats& x) {
  capacity_bytes += x.capacity_bytes;
  slot_bytes = std::max(slot_bytes, x.slot_bytes);
  slots_total += x.slots_total;
  blocks += x.blocks;
  bytes_stored += x.bytes_stored;
  bytes_held += x.bytes_held;
  page_bytes = std::max(page_bytes, x.page_bytes);
  pages_total += x.pages_total;
  pages_free += x.pages_free;
  page_reclaims += x.page_reclaims;
  size_classes = std::max(size_classes, x.size_classes);
  for (size_t c = 0; c < kMaxSizeClasses; ++c) {
    classes[c].chunk_bytes = std::max(classes[c].chunk_bytes, x.classes[c].chunk_bytes);
    classes[c].pages += x.classes[c].pages;
    classes[c].chunks_used += x.classes[c].chunks_used;
    classes[c].evictions += x.classes[c].evictions;
  }
  bytes_logical += x.bytes_logical;
  pinned_blocks += x.pinned_blocks;
  puts += x.puts;
  put_duplicates += x.put_duplicates;
  put_rejected += x.put_rejected;
  gets += x.gets;
  hits += x.hits;
  misses += x.misses;
  erases += x.erases;
  releases += x.releases;
  corrupt += x.corrupt;
  evictions += x.evictions;
  for (size_t c = 0; c < kMaxPriorityClasses; ++c) evictions_by_class[c] += x.evictions_by_class[c];
}

StoreStats BlockStore::Stats() const {
  StoreStats t;
  t.capacity_bytes = capacity_bytes_;
  t.slot_bytes = slot_bytes_;
  t.slots_total = capacity_bytes_ / slot_bytes_;
  t.page_bytes = page_bytes_;
  t.size_classes = static_cast<uint32_t>(classes_.size());
  for (size_t c = 0; c < classes_.size(); ++c) t.classes[c].chunk_bytes = classes_[c].chunk_bytes;
  for (uint32_t i = 0; i < num_stripes_; ++i) {
    const Stripe& s = stripes_[i];
    std::lock_guard<std::mutex> lock(s.mu);
    t.Add(s.stats);  // stripes keep counters only (no capacity or slot figures)
    t.pages_total += s.pages.size();
    t.pages_free += s.free_pages.size();
  }
  return t;
}

}  // namespace kvmesh

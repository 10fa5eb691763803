// A node's live sequences behind node-local ids (shard_node/sequence_service.h).
#include "shard_node/sequence_service.h"

#include <sys/random.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>

#include "shard_node/block_store.h"

namespace kvmesh {
namespace {

// Which table a sequence lives in.
struct SliceKey {
  uint32_t l0, l1, h0, h1;
  std::string salt;
  Priority priority;
  uint64_t ns_hi, ns_lo;  // the namespace its blocks are stored in
  friend bool operator<(const SliceKey& a, const SliceKey& b) {
    return std::tie(a.l0, a.l1, a.h0, a.h1, a.salt, a.priority, a.ns_hi, a.ns_lo) <
           std::tie(b.l0, b.l1, b.h0, b.h1, b.salt, b.priority, b.ns_hi, b.ns_lo);
  }
};

struct Slot {
  std::unique_ptr<SequenceTable> table;
  size_t live = 0;     // guarded by Impl::mu
  uint32_t owner = 0;  // the tenant whose call made the table (its share of max_slices)
};

// One client-visible sequence. Its calls hold `mu`, so two clients of the
// same id never overlap on the table (SequenceTable's per-sequence contract).
struct Entry {
  std::shared_ptr<Slot> slot;  // keeps the table alive while a call runs
  SeqId local = 0;
  uint32_t tenant = 0;  // who created it: only that tenant's calls reach it
  std::atomic<int64_t> last_used{0};
  std::mutex mu;
  bool released = false;  // guarded by mu
  uint64_t charged = 0;   // guarded by mu: what `tenant`'s quota is charged for it
};

Status Unknown(SeqId id) { return NotFound("sequence " + std::to_string(id) + " does not exist on this node"); }

// Ids count up from a random point per service: a restarted node (same node
// id) would otherwise count from 1 again, and a handle a client kept from
// before the restart would name another client's new sequence (read it,
// truncate it, release it). From a random start in [2^32, 2^62) such a
// handle answers NotFound (a miss) except with negligible probability.
SeqId FirstId() {
  uint64_t r = 0;
  if (::getrandom(&r, sizeof(r), 0) != static_cast<ssize_t>(sizeof(r)))
    r = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) * 0x9E3779B97F4A7C15ull;
  return (r & ((uint64_t{1} << 62) - 1)) | (uint64_t{1} << 32);
}

}  // namespace

struct SequenceService::Impl {
  BlockStore* store;
  ModelSpec model;
  SequenceServiceOptions o;
  Clock* clock;

  mutable std::mutex mu;
  std::map<SliceKey, std::shared_ptr<Slot>> slots;         // guarded by mu
  std::unordered_map<SeqId, std::shared_ptr<Entry>> seqs;  // guarded by mu
  std::unordered_map<uint32_t, uint32_t> live_by_tenant;   // guarded by mu: tenants' live sequences
  SeqId next_id = FirstId();                               // guarded by mu
  SequenceServiceStats stats;                              // counters guarded by mu
  std::atomic<int64_t> next_reap_ns{0};

  int64_t Now() const { return clock->NowNanos(); }
  int64_t IdleNs() const { return o.idle_timeout_ms * 1'000'000; }

  // A pass at most every idle_timeout / 4 (reaping is lazy: no thread).
  void MaybeReap(SequenceService* self) {
    const int64_t now = Now();
    int64_t due = next_reap_ns.load(std::memory_order_relaxed);
    if (now < due) return;
    if (!next_reap_ns.compare_exchange_strong(due, now + std::max<int64_t>(IdleNs() / 4, 1)))
      return;  // another caller is reaping
    self->ReapIdle();
  }

  std::shared_ptr<Entry> Find(SeqId id, uint32_t tenant) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = seqs.find(id);
    if (it == seqs.end() || it->second->tenant != tenant) return nullptr;
    it->second->last_used.store(Now(), std::memory_order_relaxed);
    return it->second;
  }

  // Runs fn(entry) under the entry's lock after a lazy reap; an unknown or
  // released id answers NotFound. fn returns a Status or a Result<T>.
  template <typename Fn>
  auto Locked(SequenceService* self, SeqId id, uint32_t tenant, Fn&& fn) -> decltype(fn(std::declval<Entry&>())) {
    MaybeReap(self);
    std::shared_ptr<Entry> e = Find(id, tenant);
    if (!e) return Unknown(id);
    std::lock_guard<std::mutex> lock(e->mu);
    if (e->released) return Unknown(id);
    return fn(*e);
  }

  // A tenant's share of a node-wide limit (SequenceServiceOptions::tenants).
  bool Shared(uint32_t tenant) const { return tenant != 0 && o.tenants > 0; }
  uint32_t Share(uint32_t limit) const { return std::max<uint32_t>(1, limit / std::max<uint32_t>(2, o.tenants)); }
  // Why `tenant` may not hold one more sequence now, or "". REQUIRES mu.
  std::string SequencesFull(uint32_t tenant) {
    if (seqs.size() >= o.max_sequences)
      return "node holds its limit of " + std::to_string(o.max_sequences) + " live sequences; release some (idle ones go after " +
             std::to_string(o.idle_timeout_ms) + " ms)";
    if (Shared(tenant)) {
      auto it = live_by_tenant.find(tenant);
      if (it != live_by_tenant.end() && it->second >= Share(o.max_sequences))
        return "tenant holds its share of " + std::to_string(Share(o.max_sequences)) + " of the node's " +
               std::to_string(o.max_sequences) + " live sequences; release some";
    }
    return "";
  }
  // Tables `tenant` made. REQUIRES mu.
  uint32_t SlicesOf(uint32_t tenant) const {
    uint32_t n = 0;
    for (const auto& [k, s] : slots) n += s->owner == tenant;
    return n;
  }
  void Forget(const std::shared_ptr<Entry>& e) {  // REQUIRES mu; e leaves seqs
    --e->slot->live;
    auto it = live_by_tenant.find(e->tenant);
    if (it != live_by_tenant.end() && --it->second == 0) live_by_tenant.erase(it);
  }

  // Quota: what tenant's sequences hold grows by `bytes` (refused: nothing changes) or shrinks.
  Status Charge(uint32_t tenant, uint64_t bytes) {
    if (tenant == 0 || bytes == 0 || !o.charge) return Status::Ok();
    Status s = o.charge(tenant, bytes);
    if (!s.ok()) {
      std::lock_guard<std::mutex> lock(mu);
      ++stats.refused_quota;
    }
    return s;
  }
  void Uncharge(uint32_t tenant, uint64_t bytes) {
    if (tenant != 0 && bytes != 0 && o.uncharge) o.uncharge(tenant, bytes);
  }
  uint64_t HoldsOf(const SequenceTable& t, uint64_t length) const {
    return HoldsLen(t.layout().bytes(), t.layout().block_tokens, length);
  }
  uint64_t HoldsLen(uint64_t block_bytes, uint32_t block_tokens, uint64_t length) const {
    const uint64_t blocks = block_tokens ? (length + block_tokens - 1) / block_tokens : 0;
    uint64_t per = store->ChunkBytesFor(std::min<uint64_t>(block_bytes, store->slot_bytes()));
    if (per < block_bytes) per = block_bytes;  // an open block's buffer
    if (o.codec.enabled()) per += block_bytes;  // the decoded copy beside the encoded block
    return blocks * per + length * sizeof(TokenId);
  }
  // Sets e's charge to what a sequence of `length` tokens holds, when that is
  // less than it is charged now. REQUIRES e.mu.
  void Settle(Entry& e, uint64_t length) {
    const uint64_t now = HoldsOf(*e.slot->table, length);
    if (now < e.charged) {
      Uncharge(e.tenant, e.charged - now);
      e.charged = now;
    }
  }

  // Registers `local` of `slot` under a new id, charged `charged`, or
  // releases it (and its charge) when the node or the tenant is at its limit.
  Result<SeqId> Add(const std::shared_ptr<Slot>& slot, SeqId local, uint32_t tenant, uint64_t charged) {
    auto e = std::make_shared<Entry>();
    e->slot = slot;
    e->local = local;
    e->tenant = tenant;
    e->charged = charged;
    e->last_used.store(Now());
    std::string full;
    {
      std::lock_guard<std::mutex> lock(mu);
      full = SequencesFull(tenant);
      if (full.empty()) {
        const SeqId id = next_id++;
        seqs.emplace(id, std::move(e));
        ++slot->live;
        ++live_by_tenant[tenant];
        ++stats.created;
        return id;
      }
      ++stats.refused;
    }
    (void)slot->table->Release(local);
    Uncharge(tenant, charged);
    return ResourceExhausted(full);
  }

  // Forgets entry e (already out of the map) and releases its sequence and its charge.
  void Drop(const std::shared_ptr<Entry>& e) {
    std::lock_guard<std::mutex> lock(e->mu);  // waits for a call in flight
    if (e->released) return;
    e->released = true;
    (void)e->slot->table->Release(e->local);
    Uncharge(e->tenant, e->charged);
    e->charged = 0;
  }
};

SequenceService::SequenceService(BlockStore* store, const ModelSpec& model, SequenceServiceOptions options,
                                 Clock* clock)
    : impl_(std::make_unique<Impl>()) {
  impl_->store = store;
  impl_->model = model;
  impl_->o = options;
  if (impl_->o.idle_timeout_ms <= 0) impl_->o.idle_timeout_ms = 1;
  impl_->clock = clock ? clock : SystemClock();
  impl_->next_reap_ns = impl_->Now() + std::max<int64_t>(impl_->IdleNs() / 4, 1);
}

SequenceService::~SequenceService() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->seqs.clear();  // entries release with their tables below
  impl_->slots.clear();
}

const SequenceServiceOptions& SequenceService::options() const { return impl_->o; }

Result<SeqCreated> SequenceService::Create(const SeqCreateArgs& a, const SeqCaller& caller) {
  Impl& im = *impl_;
  im.MaybeReap(this);
  const Range layers = a.layers.empty() ? Range{0, im.model.num_layers} : a.layers;
  const Range heads = a.heads.empty() ? Range{0, im.model.num_kv_heads} : a.heads;
  if (a.priority >= kMaxPriorityClasses) return InvalidArgument("priority out of range");
  SliceKey key{layers.begin, layers.end, heads.begin, heads.end, a.tenant_salt, a.priority, caller.ns.hi, caller.ns.lo};
  bool full = false;
  {
    std::lock_guard<std::mutex> lock(im.mu);
    full = !im.SequencesFull(caller.tenant).empty();
  }
  if (full) ReapIdle();  // at the limit, idle sequences make room first
  std::shared_ptr<Slot> slot;
  {
    std::lock_guard<std::mutex> lock(im.mu);
    if (std::string why = im.SequencesFull(caller.tenant); !why.empty()) {
      ++im.stats.refused;
      return ResourceExhausted(why);
    }
    auto it = im.slots.find(key);
    if (it != im.slots.end()) {
      slot = it->second;
    } else {
      const bool shared = im.Shared(caller.tenant);
      const uint32_t share = im.Share(im.o.max_slices);
      if (im.slots.size() >= im.o.max_slices || (shared && im.SlicesOf(caller.tenant) >= share)) {
        // forget tables without sequences
        for (auto s = im.slots.begin(); s != im.slots.end();) s = s->second->live == 0 ? im.slots.erase(s) : std::next(s);
      }
      if (im.slots.size() >= im.o.max_slices)
        return ResourceExhausted("node serves its limit of " + std::to_string(im.o.max_slices) + " sequence slices");
      if (shared && im.SlicesOf(caller.tenant) >= share)
        return ResourceExhausted("tenant uses its share of " + std::to_string(share) + " of the node's " +
                                 std::to_string(im.o.max_slices) + " sequence slices");
      SequenceOptions so;
      so.tenant_salt = a.tenant_salt;
      so.scope = caller.ns;
      so.priority = a.priority;
      so.codec = im.o.codec;
      so.tiers = im.o.tiers;
      KVMESH_ASSIGN_OR_RETURN(auto table, SequenceTable::Create(im.store, im.model, layers, heads, std::move(so)));
      slot = std::make_shared<Slot>();
      slot->table = std::move(table);
      slot->owner = caller.tenant;
      im.slots.emplace(key, slot);
    }
  }
  SequenceTable& t = *slot->table;
  const SeqId local = a.prefix.empty() ? t.Create() : t.CreateFromPrefix(a.prefix, a.max_blocks);
  SeqCreated c;
  c.length = t.Length(local).value_or(0);
  c.attached_blocks = c.length / im.model.block_tokens;
  // The attached prefix blocks are the sequence's to hold now: charged.
  const uint64_t charge = im.HoldsOf(t, c.length);
  if (Status q = im.Charge(caller.tenant, charge); !q.ok()) {
    (void)t.Release(local);
    return q;
  }
  KVMESH_ASSIGN_OR_RETURN(c.id, im.Add(slot, local, caller.tenant, charge));
  return c;
}

Result<uint32_t> SequenceService::Append(SeqId id, std::span<const TokenId> tokens, std::span<const std::byte> k,
                                         std::span<const std::byte> v, const SeqCaller& caller) {
  Impl& im = *impl_;
  return im.Locked(this, id, caller.tenant, [&](Entry& e) -> Result<uint32_t> {
    SequenceTable& t = *e.slot->table;
    const BlockLayout& L = t.layout();
    const uint64_t side = L.side_bytes(tokens.size());
    if (k.size() != side || v.size() != side)
      return InvalidArgument("append of " + std::to_string(tokens.size()) + " tokens needs K and V of " +
                             std::to_string(side) + " bytes each ([layer][n][heads][head_dim]), got " +
                             std::to_string(k.size()) + " and " + std::to_string(v.size()));
    KVMESH_ASSIGN_OR_RETURN(uint32_t len, t.Length(e.local));
    if (uint64_t{len} + tokens.size() > im.o.max_sequence_tokens)
      return ResourceExhausted("a sequence holds at most " + std::to_string(im.o.max_sequence_tokens) + " tokens");
    // Charged before it grows: a tenant past its quota appends nothing.
    const uint64_t want = im.HoldsOf(t, uint64_t{len} + tokens.size());
    if (want > e.charged) {
      KVMESH_RETURN_IF_ERROR(im.Charge(e.tenant, want - e.charged));
      e.charged = want;
    }
    Status st = t.Append(e.local, tokens, k, v);
    if (!st.ok()) im.Settle(e, t.Length(e.local).value_or(len));
    KVMESH_RETURN_IF_ERROR(st);
    return len;
  });
}

Status SequenceService::Truncate(SeqId id, uint32_t n, const SeqCaller& caller) {
  Impl& im = *impl_;
  return im.Locked(this, id, caller.tenant, [&](Entry& e) {
    Status st = e.slot->table->Truncate(e.local, n);
    if (st.ok()) im.Settle(e, e.slot->table->Length(e.local).value_or(0));
    return st;
  });
}

Result<SeqId> SequenceService::Fork(SeqId id, const SeqCaller& caller) {
  Impl& im = *impl_;
  std::shared_ptr<Slot> slot;
  uint64_t charge = 0;
  KVMESH_ASSIGN_OR_RETURN(SeqId local, im.Locked(this, id, caller.tenant, [&](Entry& e) -> Result<SeqId> {
                            slot = e.slot;
                            // The fork holds as much as its source: charged first.
                            charge = im.HoldsOf(*e.slot->table, e.slot->table->Length(e.local).value_or(0));
                            KVMESH_RETURN_IF_ERROR(im.Charge(caller.tenant, charge));
                            Result<SeqId> f = e.slot->table->Fork(e.local);
                            if (!f.ok()) im.Uncharge(caller.tenant, charge);
                            return f;
                          }));
  return im.Add(slot, local, caller.tenant, charge);  // outside the entry's lock
}

Status SequenceService::Release(SeqId id, const SeqCaller& caller) {
  Impl& im = *impl_;
  std::shared_ptr<Entry> e;
  {
    std::lock_guard<std::mutex> lock(im.mu);
    auto it = im.seqs.find(id);
    if (it == im.seqs.end() || it->second->tenant != caller.tenant) return Unknown(id);
    e = std::move(it->second);
    im.seqs.erase(it);
    im.Forget(e);
  }
  im.Drop(e);
  im.MaybeReap(this);
  return Status::Ok();
}

Result<SequenceState> SequenceService::Info(SeqId id, const SeqCaller& caller) {
  return impl_->Locked(this, id, caller.tenant, [&](Entry& e) -> Result<SequenceState> {
    SequenceTable& t = *e.slot->table;
    SequenceState s;
    KVMESH_ASSIGN_OR_RETURN(s.tokens, t.Tokens(e.local));
    KVMESH_ASSIGN_OR_RETURN(s.sealed_blocks, t.SealedBlocks(e.local));
    s.length = static_cast<uint32_t>(s.tokens.size());
    return s;
  });
}

Result<SeqRows> SequenceService::Read(SeqId id, uint32_t from, uint32_t n, size_t max_bytes,
                                      std::vector<std::byte>* k, std::vector<std::byte>* v,
                                      const SeqCaller& caller) {
  Impl& im = *impl_;
  return im.Locked(this, id, caller.tenant, [&](Entry& e) -> Result<SeqRows> {
    SequenceTable& t = *e.slot->table;
    KVMESH_ASSIGN_OR_RETURN(SequenceView view, t.View(e.local));
    if (uint64_t{from} + n > view.length)
      return InvalidArgument("read of positions [" + std::to_string(from) + ", " + std::to_string(uint64_t{from} + n) +
                             ") outside a sequence of " + std::to_string(view.length) + " tokens");
    const BlockLayout& L = view.layout;
    SeqRows rows;
    rows.layers = L.layers.size();
    const size_t dim_bytes = size_t{L.head_dim} * DTypeSize(L.dtype);
    rows.row_bytes = static_cast<uint32_t>(dim_bytes * L.heads.size());
    const uint64_t per_pos = uint64_t{2} * rows.layers * rows.row_bytes;
    rows.n = per_pos == 0 ? n
                          : static_cast<uint32_t>(std::min<uint64_t>(n, std::max<uint64_t>(1, max_bytes / per_pos)));
    const size_t side = size_t{rows.layers} * rows.n * rows.row_bytes;
    k->resize(side);
    v->resize(side);
    // Sealed blocks may live in device memory: copy those out once each.
    MemoryBackend& mem = im.store->backend();
    const std::byte* base = mem.base();
    std::map<size_t, std::vector<std::byte>> staged;
    auto block = [&](uint32_t pos) -> const std::byte* {
      const size_t b = pos / L.block_tokens;
      const std::byte* p = view.blocks[b];
      if (mem.host_accessible() || p < base || p >= base + mem.size()) return p;
      auto it = staged.find(b);
      if (it == staged.end()) {
        it = staged.emplace(b, std::vector<std::byte>(L.bytes())).first;
        mem.CopyOut(it->second.data(), p, L.bytes());
      }
      return it->second.data();
    };
    for (uint32_t i = 0; i < rows.n; ++i) {
      const uint32_t pos = from + i;
      const std::byte* blk = block(pos);
      for (uint32_t l = 0; l < rows.layers; ++l) {
        for (uint32_t h = 0; h < L.heads.size(); ++h) {
          const size_t dst = (size_t{l} * rows.n + i) * rows.row_bytes + h * dim_bytes;
          const uint32_t layer = L.layers.begin + l, head = L.heads.begin + h;
          std::memcpy(k->data() + dst, blk + L.Offset(layer, 0, head, pos % L.block_tokens), dim_bytes);
          std::memcpy(v->data() + dst, blk + L.Offset(layer, 1, head, pos % L.block_tokens), dim_bytes);
        }
      }
    }
    return rows;
  });
}

size_t SequenceService::ReapIdle() {
  Impl& im = *impl_;
  const int64_t cutoff = im.Now() - im.IdleNs();
  std::vector<std::shared_ptr<Entry>> idle;
  {
    std::lock_guard<std::mutex> lock(im.mu);
    for (auto it = im.seqs.begin(); it != im.seqs.end();) {
      if (it->second->last_used.load(std::memory_order_relaxed) < cutoff) {
        im.Forget(it->second);
        idle.push_back(std::move(it->second));
        it = im.seqs.erase(it);
      } else {
        ++it;
      }
    }
    im.stats.reaped += idle.size();
  }
  for (auto& e : idle) im.Drop(e);
  return idle.size();
}

uint64_t SequenceService::Holds(uint64_t block_bytes, uint32_t block_tokens, uint64_t length) const {
  return impl_->HoldsLen(block_bytes, block_tokens, length);
}

SequenceServiceStats SequenceService::Stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  SequenceServiceStats s = impl_->stats;
  s.live = impl_->seqs.size();
  s.tables = impl_->slots.size();
  return s;
}

}  // namespace kvmesh

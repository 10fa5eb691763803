// Plain LRU and LRU-with-priority.
#include <algorithm>

#include "eviction/eviction_policy.h"
#include "eviction/list_pool.h"
#include "eviction/policies.h"

namespace kvmesh::eviction_internal {
namespace {

class LruPolicy final : public EvictionPolicy {
 public:
  explicit LruPolicy(const PolicyOptions& o) {
    pool_.Share(o.shared_index);
    pool_.Reserve(o.capacity_hint);
    chain_.enabled = o.leaf_first;
  }
  std::string_view name() const override { return "lru"; }
  void Insert(EntryId id, const AccessInfo& info) override { chain_.Place(list_, pool_, pool_.Alloc(id), info); }
  void Touch(EntryId id, const AccessInfo& info) override { TouchIfPresent(id, info); }
  bool TouchIfPresent(EntryId id, const AccessInfo& info) override {
    uint32_t i = pool_.Find(id);
    if (i == kNil) return false;
    list_.Unlink(pool_, i);
    chain_.Place(list_, pool_, i, info);
    return true;
  }
  void Remove(EntryId id, RemoveReason) override {
    uint32_t i = pool_.Take(id);
    if (i == kNil) return;
    list_.Unlink(pool_, i);
    chain_.Forget(i);
    pool_.Recycle(i);
  }
  std::optional<EntryId> Victim() override {
    if (list_.empty()) return std::nullopt;
    return pool_[list_.tail].id;
  }
  void Release(EntryId id) override {  // to the tail: the next victim
    const uint32_t i = pool_.Find(id);
    if (i == kNil) return;
    list_.Unlink(pool_, i);
    list_.PushBack(pool_, i);
    chain_.Forget(i);
  }
  bool Contains(EntryId id) const override { return pool_.Find(id) != kNil; }
  size_t size() const override { return pool_.size(); }

 private:
  NodePool pool_;
  DList list_;
  ChainPlacer chain_;
};

// LRU-with-priority: one LRU list per class. The victim is the least recently
// used entry of the lowest *effective* class, where an entry's effective class
// is its class minus one for every aging period it has gone untouched (never
// below 0). Within a list entries are ordered by last access, so the tail of
// each list has the lowest effective class of that list; comparing the K tails
// (K <= 8) finds the global victim exactly, in O(K) = O(1), with no background
// aging pass. Ties go to the older entry.
class LruPriorityPolicy final : public EvictionPolicy {
 public:
  explicit LruPriorityPolicy(const PolicyOptions& o)
      : classes_(ClassCount(o)),
        aging_ns_(o.aging_ns),
        clock_(o.clock ? o.clock : SystemClock()) {
    pool_.Share(o.shared_index);
    pool_.Reserve(o.capacity_hint);
    chain_.enabled = o.leaf_first;
  }
  std::string_view name() const override { return "lru-priority"; }

  void Insert(EntryId id, const AccessInfo& info) override {
    uint32_t i = pool_.Alloc(id);
    Node& n = pool_[i];
    n.cls = Clamp(info.priority);
    n.last_ns = clock_->NowNanos();
    chain_.Place(lists_[n.cls], pool_, i, info);
  }
  void Touch(EntryId id, const AccessInfo& info) override { TouchIfPresent(id, info); }
  bool TouchIfPresent(EntryId id, const AccessInfo& info) override {
    uint32_t i = pool_.Find(id);
    if (i == kNil) return false;
    Node& n = pool_[i];
    ListOf(n).Unlink(pool_, i);
    n.released = false;
    n.cls = Clamp(info.priority);
    n.last_ns = clock_->NowNanos();
    chain_.Place(lists_[n.cls], pool_, i, info);
    return true;
  }
  void Remove(EntryId id, RemoveReason) override {
    uint32_t i = pool_.Take(id);
    if (i == kNil) return;
    ListOf(pool_[i]).Unlink(pool_, i);
    chain_.Forget(i);
    pool_.Recycle(i);
  }
  void Release(EntryId id) override {
    if (const uint32_t i = pool_.Find(id); i != kNil) MoveToReleased(pool_, i, ListOf(pool_[i]), released_, chain_);
  }
  std::optional<EntryId> Victim() override {
    if (!released_.empty()) return pool_[released_.tail].id;
    const int64_t now = clock_->NowNanos();
    LowestTail low;
    for (uint8_t c = 0; c < classes_; ++c)
      if (!lists_[c].empty()) low.Offer(pool_, lists_[c].tail, Effective(pool_[lists_[c].tail], now));
    if (low.best == kNil) return std::nullopt;
    return pool_[low.best].id;
  }
  Priority EffectiveClass(EntryId id) const override {
    uint32_t i = pool_.Find(id);
    return i == kNil ? 0 : static_cast<Priority>(Effective(pool_[i], clock_->NowNanos()));
  }
  bool Contains(EntryId id) const override { return pool_.Find(id) != kNil; }
  size_t size() const override { return pool_.size(); }

 private:
  DList& ListOf(const Node& n) { return n.released ? released_ : lists_[n.cls]; }
  uint8_t Clamp(Priority p) const { return p < classes_ ? p : static_cast<uint8_t>(classes_ - 1); }
  int Effective(const Node& n, int64_t now) const {
    if (aging_ns_ <= 0 || n.cls == 0) return n.cls;
    int64_t idle = now - n.last_ns;
    int64_t drops = idle > 0 ? idle / aging_ns_ : 0;
    return drops >= n.cls ? 0 : n.cls - static_cast<int>(drops);
  }

  uint8_t classes_;
  int64_t aging_ns_;
  Clock* clock_;
  NodePool pool_;
  DList lists_[kMaxPriorityClasses];
  DList released_;  // Release()d entries, the latest at the tail
  ChainPlacer chain_;
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeLru(const PolicyOptions& o) { return std::make_unique<LruPolicy>(o); }
std::unique_ptr<EvictionPolicy> MakeLruPriority(const PolicyOptions& o) {
  return std::make_unique<LruPriorityPolicy>(o);
}

}  // namespace kvmesh::eviction_internal

// ARC: Adaptive Replacement Cache (Megiddo & Modha, FAST'03).
//
// T1 holds entries seen once recently, T2 entries seen at least twice; B1 and
// B2 are ghost lists (ids only) of entries recently evicted from T1 and T2.
// A miss that hits a ghost list moves the target size p of T1: a B1 ghost
// means "T1 was too small", a B2 ghost the opposite. The victim comes from T1
// when |T1| exceeds p (or equals it and the incoming id is a B2 ghost),
// otherwise from T2.
//
// Mapping onto EvictionPolicy: the owner calls Admit(x) on every miss before
// it evicts; ARC adapts p there and remembers whether x is a B2 ghost, which
// steers the following Victim() exactly as ARC's REPLACE(x). If the owner does
// not call Admit, Insert adapts p (the victim was then chosen without the
// B2 refinement). Remove(kEvicted) moves the entry to its ghost list;
// kErased and kPinned forget it. The cache size c is PolicyOptions::
// capacity_hint, or the largest size seen when that is 0.
#include <algorithm>

#include "eviction/eviction_policy.h"
#include "eviction/list_pool.h"
#include "eviction/policies.h"

namespace kvmesh::eviction_internal {
namespace {

enum ArcList : uint8_t { kT1 = 0, kT2 = 1, kB1 = 2, kB2 = 3 };

class ArcPolicy final : public EvictionPolicy {
 public:
  explicit ArcPolicy(const PolicyOptions& o) : c_(o.capacity_hint) { pool_.Reserve(2 * o.capacity_hint); }
  std::string_view name() const override { return "arc"; }

  bool Admit(EntryId id, const AccessInfo&) override {
    Adapt(id);
    return true;
  }

  void Insert(EntryId id, const AccessInfo&) override {
    uint32_t i = pool_.Find(id);
    if (i != kNil && (pool_[i].list == kB1 || pool_[i].list == kB2)) {
      Adapt(id);
      lists_[pool_[i].list].Unlink(pool_, i);
      Push(kT2, i);
    } else {
      Push(kT1, pool_.Alloc(id));
    }
    adapted_ = false;
    pending_in_b2_ = false;
    c_ = std::max(c_, resident());
    TrimGhosts();
  }
  void Touch(EntryId id, const AccessInfo&) override {
    uint32_t i = pool_.Find(id);
    if (i == kNil || pool_[i].list > kT2) return;
    lists_[pool_[i].list].Unlink(pool_, i);
    Push(kT2, i);
  }
  void Remove(EntryId id, RemoveReason reason) override {
    uint32_t i = pool_.Find(id);
    if (i == kNil || pool_[i].list > kT2) return;
    uint8_t from = pool_[i].list;
    lists_[from].Unlink(pool_, i);
    if (reason == RemoveReason::kEvicted) {
      Push(from == kT1 ? kB1 : kB2, i);
      TrimGhosts();
    } else {
      pool_.Free(i);
    }
  }
  std::optional<EntryId> Victim() override {
    const DList& t1 = lists_[kT1];
    const DList& t2 = lists_[kT2];
    if (t1.empty() && t2.empty()) return std::nullopt;
    bool from_t1 = !t1.empty() && (t1.size > p_ || (pending_in_b2_ && t1.size == p_) || t2.empty());
    return pool_[from_t1 ? t1.tail : t2.tail].id;
  }
  bool Contains(EntryId id) const override {
    uint32_t i = pool_.Find(id);
    return i != kNil && pool_[i].list <= kT2;
  }
  size_t size() const override { return resident(); }

  // For tests: the current target size of T1.
  size_t target_t1() const { return p_; }

 private:
  size_t resident() const { return lists_[kT1].size + lists_[kT2].size; }
  void Push(uint8_t list, uint32_t i) {
    pool_[i].list = list;
    lists_[list].PushFront(pool_, i);
  }
  // ARC's adaptation on a ghost hit (once per miss).
  void Adapt(EntryId id) {
    if (adapted_ && adapted_id_ == id) return;
    adapted_ = false;
    pending_in_b2_ = false;
    uint32_t i = pool_.Find(id);
    if (i == kNil) return;
    const size_t b1 = lists_[kB1].size, b2 = lists_[kB2].size;
    if (pool_[i].list == kB1) {
      size_t delta = std::max<size_t>(b1 ? b2 / b1 : 1, 1);
      p_ = std::min(c_, p_ + delta);
    } else if (pool_[i].list == kB2) {
      size_t delta = std::max<size_t>(b2 ? b1 / b2 : 1, 1);
      p_ = p_ > delta ? p_ - delta : 0;
      pending_in_b2_ = true;
    } else {
      return;
    }
    adapted_ = true;
    adapted_id_ = id;
  }
  void DropTail(uint8_t list) {
    uint32_t t = lists_[list].tail;
    lists_[list].Unlink(pool_, t);
    pool_.Free(t);
  }
  // Directory bounds: |T1| + |B1| <= c and |T1|+|T2|+|B1|+|B2| <= 2c.
  void TrimGhosts() {
    while (!lists_[kB1].empty() && lists_[kT1].size + lists_[kB1].size > c_) DropTail(kB1);
    while (resident() + lists_[kB1].size + lists_[kB2].size > 2 * c_) {
      if (!lists_[kB2].empty()) DropTail(kB2);
      else if (!lists_[kB1].empty()) DropTail(kB1);
      else break;
    }
  }

  size_t c_;
  size_t p_ = 0;  // target size of T1
  bool adapted_ = false;  // p was already adapted for the miss of adapted_id_
  EntryId adapted_id_ = 0;
  bool pending_in_b2_ = false;
  NodePool pool_;
  DList lists_[4];
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeArc(const PolicyOptions& o) { return std::make_unique<ArcPolicy>(o); }

}  // namespace kvmesh::eviction_internal

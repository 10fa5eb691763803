// ARC: Adaptive Replacement Cache (Megiddo & Modha, FAST'03).
//
// T1 holds entries seen once recently, T2 entries seen at least twice; B1 and
// B2 are ghost lists (identities only) of entries recently evicted from T1 and
// T2. A miss that hits a ghost list moves the target size p of T1: a B1 ghost
// means "T1 was too small", a B2 ghost the opposite. The victim comes from T1
// when |T1| exceeds p (or equals it and the incoming entry is a B2 ghost),
// otherwise from T2.
//
// Mapping onto EvictionPolicy: the owner calls Admit on every miss before it
// evicts; ARC adapts p there and remembers whether the entry is a B2 ghost,
// which steers the following Victim() exactly as ARC's REPLACE(x). If the
// owner does not call Admit, Insert adapts p (the victim was then chosen
// without the B2 refinement). Ghosts are remembered by GhostId (the key hash
// when given), because a block store reuses EntryIds (slots) for other keys.
// Remove(kEvicted) moves the entry to its ghost list; kErased and kPinned
// forget it. The cache size c is PolicyOptions::capacity_hint, or the largest
// size seen when that is 0.
#include <algorithm>

#include "eviction/eviction_policy.h"
#include "eviction/list_pool.h"
#include "eviction/policies.h"

namespace kvmesh::eviction_internal {
namespace {

enum ArcList : uint8_t { kT1 = 0, kT2 = 1, kB1 = 2, kB2 = 3 };

class ArcPolicy final : public EvictionPolicy {
 public:
  explicit ArcPolicy(const PolicyOptions& o) : c_(o.capacity_hint) {
    pool_.Reserve(o.capacity_hint);
    ghosts_.Reserve(o.capacity_hint);
  }
  std::string_view name() const override { return "arc"; }

  bool Admit(EntryId id, const AccessInfo& info) override {
    Adapt(GhostId(id, info));
    return true;
  }

  void Insert(EntryId id, const AccessInfo& info) override {
    const uint64_t gid = GhostId(id, info);
    Adapt(gid);
    const uint32_t i = pool_.Alloc(id);
    pool_[i].key = gid;
    const uint32_t g = ghosts_.Find(gid);
    if (g != kNil) {  // a ghost hit: seen twice within the directory's memory
      lists_[ghosts_[g].list].Unlink(ghosts_, g);
      ghosts_.Free(g);
      Push(pool_, kT2, i);
    } else {
      Push(pool_, kT1, i);
    }
    adapted_ = false;
    pending_in_b2_ = false;
    c_ = std::max(c_, resident());
    TrimGhosts();
  }
  void Touch(EntryId id, const AccessInfo&) override {
    uint32_t i = pool_.Find(id);
    if (i == kNil) return;
    lists_[pool_[i].list].Unlink(pool_, i);
    Push(pool_, kT2, i);
  }
  void Remove(EntryId id, RemoveReason reason) override {
    uint32_t i = pool_.Take(id);
    if (i == kNil) return;
    const uint8_t from = pool_[i].list;
    const uint64_t gid = pool_[i].key;
    lists_[from].Unlink(pool_, i);
    pool_.Recycle(i);
    if (reason == RemoveReason::kEvicted && ghosts_.Find(gid) == kNil) {
      Push(ghosts_, from == kT1 ? kB1 : kB2, ghosts_.Alloc(gid));
      TrimGhosts();
    }
  }
  std::optional<EntryId> Victim() override {
    const DList& t1 = lists_[kT1];
    const DList& t2 = lists_[kT2];
    if (t1.empty() && t2.empty()) return std::nullopt;
    bool from_t1 = !t1.empty() && (t1.size > p_ || (pending_in_b2_ && t1.size == p_) || t2.empty());
    return pool_[from_t1 ? t1.tail : t2.tail].id;
  }
  bool Contains(EntryId id) const override { return pool_.Find(id) != kNil; }
  size_t size() const override { return resident(); }

 private:
  size_t resident() const { return lists_[kT1].size + lists_[kT2].size; }
  void Push(NodePool& pool, uint8_t list, uint32_t i) {
    pool[i].list = list;
    lists_[list].PushFront(pool, i);
  }
  // ARC's adaptation on a ghost hit (once per miss).
  void Adapt(uint64_t gid) {
    if (adapted_ && adapted_id_ == gid) return;
    adapted_ = false;
    pending_in_b2_ = false;
    const uint32_t g = ghosts_.Find(gid);
    if (g == kNil) return;
    const size_t b1 = lists_[kB1].size, b2 = lists_[kB2].size;
    if (ghosts_[g].list == kB1) {
      const size_t delta = std::max<size_t>(b1 ? b2 / b1 : 1, 1);
      p_ = std::min(c_, p_ + delta);
    } else {
      const size_t delta = std::max<size_t>(b2 ? b1 / b2 : 1, 1);
      p_ = p_ > delta ? p_ - delta : 0;
      pending_in_b2_ = true;
    }
    adapted_ = true;
    adapted_id_ = gid;
  }
  void DropGhostTail(uint8_t list) {
    const uint32_t t = lists_[list].tail;
    lists_[list].Unlink(ghosts_, t);
    ghosts_.Free(t);
  }
  // Directory bounds: |T1| + |B1| <= c and |T1|+|T2|+|B1|+|B2| <= 2c.
  void TrimGhosts() {
    while (!lists_[kB1].empty() && lists_[kT1].size + lists_[kB1].size > c_) DropGhostTail(kB1);
    while (resident() + lists_[kB1].size + lists_[kB2].size > 2 * c_) {
      if (!lists_[kB2].empty()) DropGhostTail(kB2);
      else if (!lists_[kB1].empty()) DropGhostTail(kB1);
      else break;
    }
  }

  size_t c_;
  size_t p_ = 0;          // target size of T1
  bool adapted_ = false;  // p was already adapted for the miss of adapted_id_
  uint64_t adapted_id_ = 0;
  bool pending_in_b2_ = false;
  NodePool pool_;    // resident entries (T1, T2) by EntryId; Node::key = GhostId
  NodePool ghosts_;  // B1, B2 by GhostId
  DList lists_[4];   // T1, T2 over pool_; B1, B2 over ghosts_
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeArc(const PolicyOptions& o) { return std::make_unique<ArcPolicy>(o); }

}  // namespace kvmesh::eviction_internal

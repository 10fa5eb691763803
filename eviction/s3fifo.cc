// S3-FIFO (Yang et al., SOSP'23): three FIFO queues and a 2-bit counter.
//
// New entries enter a small FIFO S (10% of the cache); entries whose id is in
// the ghost FIFO G (ids recently evicted from S) enter the main FIFO M. A hit
// only bumps the entry's counter (capped at 3) and moves nothing, so hits cost
// no list surgery. To find a victim: while S is at least its target size,
// S's oldest entry moves to M if it was hit since it entered (counter >= 1)
// and is the victim otherwise (it then goes to G); else M's oldest entry is
// reinserted at M's head with its counter decremented while the counter is
// positive, and is the victim when the counter is 0. One-hit wonders thus
// leave quickly through S while reused entries settle in M.
//
// Victim() performs these moves (they do not change what is cached) and
// returns the entry to evict; a second call without changes returns the same.
// Ghosts are remembered by GhostId (the key hash when the owner gives one).
// The cache size c is PolicyOptions::capacity_hint, or the largest size seen.
#include <algorithm>

#include "eviction/eviction_policy.h"
#include "eviction/list_pool.h"
#include "eviction/policies.h"

namespace kvmesh::eviction_internal {
namespace {

enum S3List : uint8_t { kSmall = 0, kMain = 1, kGhost = 2, kReleased = 3 };
constexpr uint32_t kMaxFreq = 3;
constexpr uint32_t kMoveToMain = 1;  // hits in S needed to be promoted to M

class S3FifoPolicy final : public EvictionPolicy {
 public:
  explicit S3FifoPolicy(const PolicyOptions& o) : c_(o.capacity_hint) {
    pool_.Share(o.shared_index);
    ghosts_.Share(o.shared_index);
    pool_.Reserve(o.capacity_hint);
    ghosts_.Reserve(o.capacity_hint);
  }
  std::string_view name() const override { return "s3-fifo"; }

  void Insert(EntryId id, const AccessInfo& info) override {
    const uint64_t gid = GhostId(id, info);
    const uint32_t i = pool_.Alloc(id);
    pool_[i].key = gid;
    if (const uint32_t g = ghosts_.Find(gid); g != kNil) {
      lists_[kGhost].Unlink(ghosts_, g);
      ghosts_.Free(g);
      Push(pool_, kMain, i);
    } else {
      Push(pool_, kSmall, i);
    }
    c_ = std::max(c_, resident());
  }
  void Touch(EntryId id, const AccessInfo& info) override { TouchIfPresent(id, info); }
  bool TouchIfPresent(EntryId id, const AccessInfo&) override {
    const uint32_t i = pool_.Find(id);
    if (i == kNil) return false;
    if (pool_[i].list == kReleased) {  // read again after its release: back to M, as a reused entry
      lists_[kReleased].Unlink(pool_, i);
      Push(pool_, kMain, i);
    }
    if (pool_[i].freq < kMaxFreq) ++pool_[i].freq;
    return true;
  }
  void Release(EntryId id) override {
    const uint32_t i = pool_.Find(id);
    if (i == kNil || pool_[i].list == kReleased) return;
    lists_[pool_[i].list].Unlink(pool_, i);
    pool_[i].freq = 0;
    pool_[i].list = kReleased;
    lists_[kReleased].PushBack(pool_, i);
  }
  void Remove(EntryId id, RemoveReason reason) override {
    const uint32_t i = pool_.Take(id);
    if (i == kNil) return;
    const uint8_t from = pool_[i].list;
    const uint64_t gid = pool_[i].key;
    lists_[from].Unlink(pool_, i);
    pool_.Recycle(i);
    if (reason == RemoveReason::kEvicted && from == kSmall && ghosts_.Find(gid) == kNil) {
      Push(ghosts_, kGhost, ghosts_.Alloc(gid));
      const size_t ghost_cap = c_ > SmallTarget() ? c_ - SmallTarget() : 1;  // |M|'s target
      while (lists_[kGhost].size > ghost_cap) {
        const uint32_t t = lists_[kGhost].tail;
        lists_[kGhost].Unlink(ghosts_, t);
        ghosts_.Free(t);
      }
    }
  }
  std::optional<EntryId> Victim() override {
    if (!lists_[kReleased].empty()) return pool_[lists_[kReleased].tail].id;
    DList& s = lists_[kSmall];
    DList& m = lists_[kMain];
    while (!s.empty() || !m.empty()) {
      if (!s.empty() && (s.size >= SmallTarget() || m.empty())) {
        const uint32_t t = s.tail;
        if (pool_[t].freq < kMoveToMain) return pool_[t].id;
        s.Unlink(pool_, t);
        pool_[t].freq = 0;
        Push(pool_, kMain, t);
      } else {
        const uint32_t t = m.tail;
        if (pool_[t].freq == 0) return pool_[t].id;
        --pool_[t].freq;
        m.Unlink(pool_, t);
        Push(pool_, kMain, t);
      }
    }
    return std::nullopt;
  }
  bool Contains(EntryId id) const override { return pool_.Find(id) != kNil; }
  size_t size() const override { return resident(); }

 private:
  size_t resident() const { return lists_[kSmall].size + lists_[kMain].size + lists_[kReleased].size; }
  size_t SmallTarget() const { return std::max<size_t>(c_ / 10, 1); }
  void Push(NodePool& pool, uint8_t list, uint32_t i) {
    pool[i].list = list;
    lists_[list].PushFront(pool, i);
  }

  size_t c_;
  NodePool pool_;    // S and M by EntryId; Node::key = GhostId
  NodePool ghosts_;  // G by GhostId
  DList lists_[4];   // S, M and released entries over pool_; G over ghosts_
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeS3Fifo(const PolicyOptions& o) { return std::make_unique<S3FifoPolicy>(o); }

}  // namespace kvmesh::eviction_internal

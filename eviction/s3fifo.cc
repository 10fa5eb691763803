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
// The cache size c is PolicyOptions::capacity_hint, or the largest size seen.
#include <algorithm>

#include "eviction/eviction_policy.h"
#include "eviction/list_pool.h"
#include "eviction/policies.h"

namespace kvmesh::eviction_internal {
namespace {

enum S3List : uint8_t { kSmall = 0, kMain = 1, kGhost = 2 };
constexpr uint32_t kMaxFreq = 3;
constexpr uint32_t kMoveToMain = 1;  // hits in S needed to be promoted to M

class S3FifoPolicy final : public EvictionPolicy {
 public:
  explicit S3FifoPolicy(const PolicyOptions& o) : c_(o.capacity_hint) { pool_.Reserve(2 * o.capacity_hint); }
  std::string_view name() const override { return "s3-fifo"; }

  void Insert(EntryId id, const AccessInfo&) override {
    uint32_t i = pool_.Find(id);
    if (i != kNil && pool_[i].list == kGhost) {
      lists_[kGhost].Unlink(pool_, i);
      pool_[i].freq = 0;
      Push(kMain, i);
    } else {
      i = pool_.Alloc(id);
      Push(kSmall, i);
    }
    c_ = std::max(c_, resident());
  }
  void Touch(EntryId id, const AccessInfo&) override {
    uint32_t i = pool_.Find(id);
    if (i == kNil || pool_[i].list == kGhost) return;
    if (pool_[i].freq < kMaxFreq) ++pool_[i].freq;
  }
  void Remove(EntryId id, RemoveReason reason) override {
    uint32_t i = pool_.Find(id);
    if (i == kNil || pool_[i].list == kGhost) return;
    uint8_t from = pool_[i].list;
    lists_[from].Unlink(pool_, i);
    if (reason == RemoveReason::kEvicted && from == kSmall) {
      Push(kGhost, i);
      const size_t ghost_cap = c_ > SmallTarget() ? c_ - SmallTarget() : 1;  // |M|'s target
      while (lists_[kGhost].size > ghost_cap) {
        uint32_t t = lists_[kGhost].tail;
        lists_[kGhost].Unlink(pool_, t);
        pool_.Free(t);
      }
    } else {
      pool_.Free(i);
    }
  }
  std::optional<EntryId> Victim() override {
    DList& s = lists_[kSmall];
    DList& m = lists_[kMain];
    while (!s.empty() || !m.empty()) {
      if (!s.empty() && (s.size >= SmallTarget() || m.empty())) {
        uint32_t t = s.tail;
        if (pool_[t].freq < kMoveToMain) return pool_[t].id;
        s.Unlink(pool_, t);
        pool_[t].freq = 0;
        Push(kMain, t);
      } else {
        uint32_t t = m.tail;
        if (pool_[t].freq == 0) return pool_[t].id;
        --pool_[t].freq;
        m.Unlink(pool_, t);
        Push(kMain, t);
      }
    }
    return std::nullopt;
  }
  bool Contains(EntryId id) const override {
    uint32_t i = pool_.Find(id);
    return i != kNil && pool_[i].list != kGhost;
  }
  size_t size() const override { return resident(); }

 private:
  size_t resident() const { return lists_[kSmall].size + lists_[kMain].size; }
  size_t SmallTarget() const { return std::max<size_t>(c_ / 10, 1); }
  void Push(uint8_t list, uint32_t i) {
    pool_[i].list = list;
    lists_[list].PushFront(pool_, i);
  }

  size_t c_;
  NodePool pool_;
  DList lists_[3];
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeS3Fifo(const PolicyOptions& o) { return std::make_unique<S3FifoPolicy>(o); }

}  // namespace kvmesh::eviction_internal

// Two class-aware policies whose aging follows the cache itself, the experts
// that "adaptive" adds to the classic ones (each can also run alone).
//
// Turnover. T is an exponentially weighted mean (weight 1/64) of the idle time
// (now - last access, on the owner's clock) of the entries evicted so far: how
// long an entry lasts untouched in this cache. Aging by a multiple of T
// instead of a fixed number of seconds makes the same rule work for a small
// cache that turns over in seconds and a large one that keeps blocks for
// minutes, and for fast (agent) and slow (chat) traffic alike. Before the
// first eviction there is no aging.
//
// "turnover-priority": LRU inside priority classes (like lru-priority), but an
// entry's effective class falls continuously, by one class per T of idleness:
// eff = class - idle / T. The victim is the tail (least recently used entry) of
// the class list whose tail has the lowest eff; comparing the K <= 8 tails is
// exact because within a list eff falls with idleness. Ties: the older entry.
//
// "turnover-freq" (an expert of "adaptive", not in the factory): the same
// with a frequency bonus, eff = class + 2 log2(accesses) - idle / T, the log2
// floored and capped at 7. One list per (class, log2 bucket); the K x 8 tails
// are compared, exact for the same reason.
//
// "freq-class" / "freq-class-turnover": strict priority class first (like
// "score"), then accumulated importance, then LRU. Importance is the sum of the
// AccessInfo::score hints of an entry's accesses (the replay passes 1 + the
// number of earlier requests that carried the block), halved per aging period
// of idleness: aging_ns for "freq-class", 3 T for "freq-class-turnover". It
// is kept in log2 buckets, one LRU list per (class, bucket), so every
// operation is O(classes x buckets) = O(1), where "score" keeps an ordered set.
// Victim: in the lowest non-empty class, the bucket tail with the lowest
// decayed log2 importance (approximate inside a bucket: the tail is the
// oldest, not necessarily the least important).
#include <algorithm>
#include <cmath>

#include "eviction/eviction_policy.h"
#include "eviction/list_pool.h"
#include "eviction/policies.h"

namespace kvmesh::eviction_internal {
namespace {

// Mean idle time of evicted entries, in clock nanoseconds (0 until the first eviction).
class Turnover {
 public:
  void Evicted(int64_t idle_ns) {
    const double idle = static_cast<double>(std::max<int64_t>(idle_ns, 0));
    mean_ = seen_ ? mean_ + (idle - mean_) / 64.0 : idle;
    seen_ = true;
  }
  double mean() const { return mean_; }

 private:
  double mean_ = 0;
  bool seen_ = false;
};

constexpr double kFreqBonus = 2.0;  // turnover-freq: classes per doubling of accesses

// What the policies of this file share: one LRU list per (class, bucket), a
// list of released entries, leaf-first placement, and the turnover measured on
// evictions. Derived::Place(i, info) sets node i's class and bucket (Node::cls,
// Node::list) and links it with chain_.Place; Derived has the Victim rule.
template <class Derived>
class ClassBucketPolicy : public EvictionPolicy {
 public:
  static constexpr int kBuckets = 8;

  void Insert(EntryId id, const AccessInfo& info) override { Self().Place(pool_.Alloc(id), info); }
  void Touch(EntryId id, const AccessInfo& info) override { TouchIfPresent(id, info); }
  bool TouchIfPresent(EntryId id, const AccessInfo& info) override {
    const uint32_t i = pool_.Find(id);
    if (i == kNil) return false;
    ListOf(pool_[i]).Unlink(pool_, i);
    pool_[i].released = false;
    Self().Place(i, info);
    return true;
  }
  void Remove(EntryId id, RemoveReason reason) override {
    const uint32_t i = pool_.Take(id);
    if (i == kNil) return;
    // A released entry's idle time says nothing of how long entries last here.
    if (reason == RemoveReason::kEvicted && !pool_[i].released)
      turnover_.Evicted(clock_->NowNanos() - pool_[i].last_ns);
    ListOf(pool_[i]).Unlink(pool_, i);
    chain_.Forget(i);
    pool_.Recycle(i);
  }
  void Release(EntryId id) override {
    if (const uint32_t i = pool_.Find(id); i != kNil) MoveToReleased(pool_, i, ListOf(pool_[i]), released_, chain_);
  }
  bool Contains(EntryId id) const override { return pool_.Find(id) != kNil; }
  size_t size() const override { return pool_.size(); }

 protected:
  explicit ClassBucketPolicy(const PolicyOptions& o)
      : classes_(ClassCount(o)), clock_(o.clock ? o.clock : SystemClock()) {
    pool_.Share(o.shared_index);
    pool_.Reserve(o.capacity_hint);
    chain_.enabled = o.leaf_first;
  }
  Derived& Self() { return static_cast<Derived&>(*this); }
  DList& ListOf(const Node& n) { return n.released ? released_ : lists_[n.cls][n.list]; }
  uint8_t ClampClass(Priority p) const { return p < classes_ ? p : static_cast<uint8_t>(classes_ - 1); }

  uint8_t classes_;
  Clock* clock_;
  Turnover turnover_;
  NodePool pool_;
  DList lists_[kMaxPriorityClasses][kBuckets];
  DList released_;  // Release()d entries, the latest at the tail
  ChainPlacer chain_;
};

class TurnoverPriorityPolicy final : public ClassBucketPolicy<TurnoverPriorityPolicy> {
 public:
  TurnoverPriorityPolicy(const PolicyOptions& o, double freq_bonus) : ClassBucketPolicy(o), freq_bonus_(freq_bonus) {}
  std::string_view name() const override { return freq_bonus_ > 0 ? "turnover-freq" : "turnover-priority"; }

  std::optional<EntryId> Victim() override {
    if (!released_.empty()) return pool_[released_.tail].id;
    const int64_t now = clock_->NowNanos();
    LowestTail low;
    for (uint8_t c = 0; c < classes_; ++c) {
      for (int b = 0; b < (freq_bonus_ > 0 ? kBuckets : 1); ++b) {
        const DList& l = lists_[c][b];
        if (!l.empty()) low.Offer(pool_, l.tail, Effective(pool_[l.tail], now));
      }
    }
    if (low.best == kNil) return std::nullopt;
    return pool_[low.best].id;
  }
  Priority EffectiveClass(EntryId id) const override {
    const uint32_t i = pool_.Find(id);
    if (i == kNil) return 0;
    const Node& n = pool_[i];
    const double eff = std::min<double>(n.cls, Effective(n, clock_->NowNanos()));
    return static_cast<Priority>(std::max(0.0, std::ceil(eff)));
  }

 private:
  friend class ClassBucketPolicy<TurnoverPriorityPolicy>;
  void Place(uint32_t i, const AccessInfo& info) {
    Node& n = pool_[i];
    n.cls = ClampClass(info.priority);
    n.last_ns = clock_->NowNanos();
    if (freq_bonus_ > 0) {
      ++n.freq;
      const int lg = static_cast<int>(std::log2(static_cast<double>(n.freq)));
      n.list = static_cast<uint8_t>(std::min(kBuckets - 1, lg));
    } else {
      n.list = 0;
    }
    chain_.Place(ListOf(n), pool_, i, info);
  }
  double Effective(const Node& n, int64_t now) const {
    const double t = turnover_.mean();
    const double base = n.cls + freq_bonus_ * n.list;
    if (t <= 0) return base;
    return base - static_cast<double>(now - n.last_ns) / t;
  }

  double freq_bonus_;
};

class FreqClassPolicy final : public ClassBucketPolicy<FreqClassPolicy> {  // kBuckets: log2 importance 0..7+
 public:
  static constexpr double kTurnoverPeriods = 3.0;

  FreqClassPolicy(const PolicyOptions& o, bool turnover)
      : ClassBucketPolicy(o), aging_ns_(o.aging_ns), turnover_aging_(turnover) {}
  std::string_view name() const override { return turnover_aging_ ? "freq-class-turnover" : "freq-class"; }

  std::optional<EntryId> Victim() override {
    if (!released_.empty()) return pool_[released_.tail].id;
    const int64_t now = clock_->NowNanos();
    for (uint8_t c = 0; c < classes_; ++c) {
      LowestTail low;
      for (int b = 0; b < kBuckets; ++b) {
        const DList& l = lists_[c][b];
        if (!l.empty()) low.Offer(pool_, l.tail, DecayedLog2(pool_[l.tail], now));
      }
      if (low.best != kNil) return pool_[low.best].id;
    }
    return std::nullopt;
  }
  Priority EffectiveClass(EntryId id) const override {
    const uint32_t i = pool_.Find(id);
    return i == kNil ? 0 : pool_[i].cls;
  }

 private:
  friend class ClassBucketPolicy<FreqClassPolicy>;
  void Place(uint32_t i, const AccessInfo& info) {
    Node& n = pool_[i];
    const int64_t now = clock_->NowNanos();
    double imp = n.score;
    if (const double h = HalfLife(); h > 0 && imp > 0) imp *= std::exp2(-static_cast<double>(now - n.last_ns) / h);
    imp += std::max(0.0f, info.score);
    n.score = static_cast<float>(imp);
    n.cls = ClampClass(info.priority);
    n.list = static_cast<uint8_t>(std::clamp(static_cast<int>(std::log2(1.0 + imp)), 0, kBuckets - 1));
    n.last_ns = now;
    chain_.Place(ListOf(n), pool_, i, info);
  }
  // The idle time that halves importance; 0 = no decay.
  double HalfLife() const { return turnover_aging_ ? kTurnoverPeriods * turnover_.mean() : static_cast<double>(aging_ns_); }
  double DecayedLog2(const Node& n, int64_t now) const {
    const double h = HalfLife();
    const double lg = std::log2(1.0 + n.score);
    return h > 0 ? lg - static_cast<double>(now - n.last_ns) / h : lg;
  }

  int64_t aging_ns_;
  bool turnover_aging_;
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeTurnoverPriority(const PolicyOptions& o) {
  return std::make_unique<TurnoverPriorityPolicy>(o, 0.0);
}
std::unique_ptr<EvictionPolicy> MakeTurnoverFreq(const PolicyOptions& o) {
  return std::make_unique<TurnoverPriorityPolicy>(o, kFreqBonus);
}
std::unique_ptr<EvictionPolicy> MakeFreqClass(const PolicyOptions& o) {
  return std::make_unique<FreqClassPolicy>(o, /*turnover=*/false);
}
std::unique_ptr<EvictionPolicy> MakeFreqClassTurnover(const PolicyOptions& o) {
  return std::make_unique<FreqClassPolicy>(o, /*turnover=*/true);
}

}  // namespace kvmesh::eviction_internal

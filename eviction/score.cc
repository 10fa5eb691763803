// Score-based eviction for client hints ("score"): H2O-style importance and
// explicit priorities.
//
// Order (lowest evicted first): priority class, then importance, then last
// access. The importance of an entry is the sum of the AccessInfo::score
// hints of its accesses, each decayed by half every `aging_ns` of idleness
// (so a block that stopped being attended to loses its rank, like H2O's
// accumulated attention over a sliding horizon); aging_ns = 0 keeps plain
// sums. A client that sends only priorities gets strict class order with LRU
// inside a class; one that sends only scores gets "evict the least attended
// block" (H2O heavy hitters survive).
//
// Decay is applied lazily: scores are stored relative to a global epoch
// (score x 2^(t/aging)) so ordering stays exact without touching idle
// entries; the stored values are rebased when they grow large.
// O(log n) per operation (an ordered set).
#include <algorithm>
#include <cmath>
#include <set>
#include <tuple>

#include "eviction/eviction_policy.h"
#include "eviction/list_pool.h"
#include "eviction/policies.h"

namespace kvmesh::eviction_internal {
namespace {

class ScorePolicy final : public EvictionPolicy {
 public:
  explicit ScorePolicy(const PolicyOptions& o)
      : classes_(ClassCount(o)),
        aging_ns_(o.aging_ns),
        clock_(o.clock ? o.clock : SystemClock()) {
    pool_.Reserve(o.capacity_hint);
    origin_ns_ = clock_->NowNanos();
  }
  std::string_view name() const override { return "score"; }

  void Insert(EntryId id, const AccessInfo& info) override {
    uint32_t i = pool_.Alloc(id);
    pool_[i].score = 0.0f;
    Update(i, info);
  }
  void Touch(EntryId id, const AccessInfo& info) override {
    uint32_t i = pool_.Find(id);
    if (i == kNil) return;
    order_.erase(KeyOf(i));
    Update(i, info);
  }
  void Remove(EntryId id, RemoveReason) override {
    uint32_t i = pool_.Take(id);
    if (i == kNil) return;
    order_.erase(KeyOf(i));
    pool_.Recycle(i);
  }
  std::optional<EntryId> Victim() override {
    if (order_.empty()) return std::nullopt;
    return pool_[std::get<3>(*order_.begin())].id;
  }
  Priority EffectiveClass(EntryId id) const override {
    uint32_t i = pool_.Find(id);
    return i == kNil ? 0 : pool_[i].cls;
  }
  bool Contains(EntryId id) const override { return pool_.Find(id) != kNil; }
  size_t size() const override { return pool_.size(); }

 private:
  // (class, scaled importance, access sequence, node)
  using Key = std::tuple<uint8_t, float, uint64_t, uint32_t>;
  Key KeyOf(uint32_t i) const { return {pool_[i].cls, pool_[i].score, pool_[i].key, i}; }

  // Scale factor of "now": a hint given now counts 2^(elapsed/aging) in stored units.
  double Scale(int64_t now) const {
    if (aging_ns_ <= 0) return 1.0;
    return std::exp2(static_cast<double>(now - origin_ns_) / static_cast<double>(aging_ns_));
  }
  void Update(uint32_t i, const AccessInfo& info) {
    const int64_t now = clock_->NowNanos();
    double scale = Scale(now);
    if (scale > 1e18) {
      pool_[i].score = static_cast<float>(pool_[i].score / scale);  // i is not in order_ now
      Rebase(now);
      scale = 1.0;
    }
    Node& n = pool_[i];
    n.cls = info.priority < classes_ ? info.priority : static_cast<uint8_t>(classes_ - 1);
    n.score = static_cast<float>(n.score + static_cast<double>(info.score) * scale);
    n.key = ++seq_;
    n.last_ns = now;
    order_.insert(KeyOf(i));
  }
  // Moves the origin to `now`, dividing every stored score by the old scale.
  void Rebase(int64_t now) {
    const double scale = Scale(now);
    std::set<Key> rebuilt;
    for (const Key& k : order_) {
      uint32_t i = std::get<3>(k);
      pool_[i].score = static_cast<float>(pool_[i].score / scale);
      rebuilt.insert(KeyOf(i));
    }
    order_.swap(rebuilt);
    origin_ns_ = now;
  }

  uint8_t classes_;
  int64_t aging_ns_;
  Clock* clock_;
  int64_t origin_ns_ = 0;
  uint64_t seq_ = 0;
  NodePool pool_;
  std::set<Key> order_;
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeScore(const PolicyOptions& o) { return std::make_unique<ScorePolicy>(o); }

}  // namespace kvmesh::eviction_internal

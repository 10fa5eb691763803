// LFU with dynamic aging (LFU-DA, Arlitt et al. 2000).
//
// Each entry's key is  hits + L,  where L is the key of the last evicted
// entry at the time of the entry's latest access. Plain LFU lets blocks that
// were popular long ago squat forever; adding L ("the cache's age") lets a
// newcomer outrank them once enough has been evicted since their last hit.
// The victim is the least recently used entry of the smallest key.
//
// Entries with equal keys share one LRU list; the lists live in an ordered map
// keyed by key, so Insert/Touch/Victim are O(log B) for B distinct keys
// (B is small in practice: keys cluster around L).
#include <map>

#include "eviction/eviction_policy.h"
#include "eviction/list_pool.h"
#include "eviction/policies.h"

namespace kvmesh::eviction_internal {
namespace {

class LfuPolicy final : public EvictionPolicy {
 public:
  explicit LfuPolicy(const PolicyOptions& o) { pool_.Reserve(o.capacity_hint); }
  std::string_view name() const override { return "lfu"; }

  void Insert(EntryId id, const AccessInfo&) override {
    uint32_t i = pool_.Alloc(id);
    pool_[i].freq = 1;
    Link(i, age_ + 1);
  }
  void Touch(EntryId id, const AccessInfo&) override {
    uint32_t i = pool_.Find(id);
    if (i == kNil) return;
    Unlink(i);
    Node& n = pool_[i];
    if (n.freq < UINT32_MAX) ++n.freq;
    Link(i, age_ + n.freq);
  }
  void Remove(EntryId id, RemoveReason reason) override {
    uint32_t i = pool_.Take(id);
    if (i == kNil) return;
    if (reason == RemoveReason::kEvicted) age_ = pool_[i].key;  // the cache ages to the victim's key
    Unlink(i);
    pool_.Recycle(i);
  }
  std::optional<EntryId> Victim() override {
    if (buckets_.empty()) return std::nullopt;
    return pool_[buckets_.begin()->second.tail].id;
  }
  bool Contains(EntryId id) const override { return pool_.Find(id) != kNil; }
  size_t size() const override { return pool_.size(); }

 private:
  void Link(uint32_t i, uint64_t key) {
    pool_[i].key = key;
    buckets_[key].PushFront(pool_, i);
  }
  void Unlink(uint32_t i) {
    auto it = buckets_.find(pool_[i].key);
    it->second.Unlink(pool_, i);
    if (it->second.empty()) buckets_.erase(it);
  }

  NodePool pool_;
  std::map<uint64_t, DList> buckets_;  // key -> entries with that key, MRU first
  uint64_t age_ = 0;                   // L: key of the last evicted entry
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeLfu(const PolicyOptions& o) { return std::make_unique<LfuPolicy>(o); }

}  // namespace kvmesh::eviction_internal

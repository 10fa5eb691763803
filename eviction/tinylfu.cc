// TinyLFU admission in front of any policy ("tinylfu-<inner>", e.g. "tinylfu-lru").
//
// Every access (Admit on a miss, Touch on a hit) is recorded in a
// FrequencySketch, by GhostId (the key hash when the owner gives one, since a
// block store's EntryIds are reused slots). While the cache has room every new entry is admitted; once
// it is full, a new entry is admitted only if its estimated frequency is
// higher than that of the entry the inner policy would evict for it, so a
// burst of one-time blocks cannot flush blocks that are used again and again.
//
// The capacity is PolicyOptions::capacity_hint; when that is 0 it is learned
// as the size at the first eviction (everything is admitted until then).
// REQUIRES of the owner: Admit is called on every miss, before any eviction
// for it (the replay and the block store do).
#include <string>

#include <absl/container/flat_hash_map.h>

#include "eviction/eviction_policy.h"
#include "eviction/frequency_sketch.h"
#include "eviction/list_pool.h"
#include "eviction/policies.h"

namespace kvmesh::eviction_internal {
namespace {

class TinyLfuFilter final : public EvictionPolicy {
 public:
  TinyLfuFilter(std::unique_ptr<EvictionPolicy> inner, const PolicyOptions& o)
      : inner_(std::move(inner)),
        name_("tinylfu-" + std::string(inner_->name())),
        capacity_(o.capacity_hint),
        sketch_(o.capacity_hint ? o.capacity_hint : 4096) {}

  std::string_view name() const override { return name_; }

  bool Admit(EntryId id, const AccessInfo& info) override {
    const uint64_t gid = GhostId(id, info);
    sketch_.Record(gid);
    if (capacity_ == 0 || inner_->size() < capacity_) return inner_->Admit(id, info);
    std::optional<EntryId> victim = inner_->Victim();
    if (victim && sketch_.Estimate(gid) <= sketch_.Estimate(IdentityOf(*victim))) return false;
    return inner_->Admit(id, info);
  }
  void Insert(EntryId id, const AccessInfo& info) override {
    if (info.key_hash) identity_[id] = info.key_hash;
    inner_->Insert(id, info);
  }
  void Touch(EntryId id, const AccessInfo& info) override {
    sketch_.Record(GhostId(id, info));
    inner_->Touch(id, info);
  }
  void Remove(EntryId id, RemoveReason reason) override {
    if (reason == RemoveReason::kEvicted && capacity_ == 0) capacity_ = inner_->size();
    identity_.erase(id);
    inner_->Remove(id, reason);
  }
  std::optional<EntryId> Victim() override { return inner_->Victim(); }
  void Release(EntryId id) override { inner_->Release(id); }
  Priority EffectiveClass(EntryId id) const override { return inner_->EffectiveClass(id); }
  bool Contains(EntryId id) const override { return inner_->Contains(id); }
  size_t size() const override { return inner_->size(); }

 private:
  uint64_t IdentityOf(EntryId id) const {
    auto it = identity_.find(id);
    return it == identity_.end() ? id : it->second;
  }

  std::unique_ptr<EvictionPolicy> inner_;
  absl::flat_hash_map<EntryId, uint64_t> identity_;  // id -> key hash, when the owner gives one
  std::string name_;
  size_t capacity_;
  FrequencySketch sketch_;
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeTinyLfu(std::unique_ptr<EvictionPolicy> inner, const PolicyOptions& o) {
  return std::make_unique<TinyLfuFilter>(std::move(inner), o);
}

}  // namespace kvmesh::eviction_internal

#include "shard_node/key_groups.h"

#include <algorithm>

#include "kvmesh/block_key.h"

namespace kvmesh {

void KeyGroups::Unlink(Shard& s, uint64_t g) {
  auto it = s.groups.find(g);
  if (it == s.groups.end()) return;
  const size_t pos = it->second.pos;
  s.groups.erase(it);
  if (pos + 1 != s.order.size()) {
    s.order[pos] = s.order.back();
    s.groups[s.order[pos]].pos = pos;
  }
  s.order.pop_back();
}

void KeyGroups::Added(const BlockKey& k) {
  if (!IsCoEvictedKey(k)) return;
  Shard& s = ShardOf(k.hi);
  std::lock_guard<std::mutex> lock(s.mu);
  auto [it, fresh] = s.groups.try_emplace(k.hi);
  if (fresh) {
    it->second.pos = s.order.size();
    s.order.push_back(k.hi);
  }
  std::vector<BlockKey>& m = it->second.members;
  if (std::find(m.begin(), m.end(), k) == m.end()) m.push_back(k);
}

void KeyGroups::Removed(const BlockKey& k) {
  if (!IsCoEvictedKey(k)) return;
  Shard& s = ShardOf(k.hi);
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.groups.find(k.hi);
  if (it == s.groups.end()) return;
  std::vector<BlockKey>& m = it->second.members;
  auto at = std::find(m.begin(), m.end(), k);
  if (at == m.end()) return;
  *at = m.back();
  m.pop_back();
  if (m.empty()) Unlink(s, k.hi);
}

bool KeyGroups::Check(uint64_t g, const ExistsFn& exists, const EraseFn& erase) {
  Shard& s = ShardOf(g);
  std::vector<BlockKey> members;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.groups.find(g);
    if (it == s.groups.end()) return true;
    members = it->second.members;
  }
  bool intact = true;
  for (const BlockKey& m : members) {
    if (exists(m)) continue;
    intact = false;
    break;
  }
  if (intact) return true;
  // Broken: take the group out (a member added since stays out of this
  // drop: it was stored after the loss and is checked on its own), then
  // erase what is left of it.
  {
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.groups.find(g);
    if (it != s.groups.end()) {
      std::vector<BlockKey>& now = it->second.members;
      std::vector<BlockKey> keep;
      for (const BlockKey& k : now)
        if (std::find(members.begin(), members.end(), k) == members.end()) keep.push_back(k);
      if (keep.empty()) {
        Unlink(s, g);
      } else {
        now = std::move(keep);
      }
    }
    ++s.dropped_groups;
    s.dropped_keys += members.size();
  }
  for (const BlockKey& m : members) erase(m);
  return false;
}

bool KeyGroups::Intact(const BlockKey& k, const ExistsFn& exists, const EraseFn& erase) {
  if (!IsCoEvictedKey(k)) return true;
  return Check(k.hi, exists, erase);
}

void KeyGroups::Sweep(size_t n, const ExistsFn& exists, const EraseFn& erase) {
  for (size_t i = 0; i < n; ++i) {
    Shard& s = shards_[sweep_shard_.fetch_add(1, std::memory_order_relaxed) % kShards];
    uint64_t g = 0;
    {
      std::lock_guard<std::mutex> lock(s.mu);
      if (s.order.empty()) continue;
      if (s.cursor >= s.order.size()) s.cursor = 0;
      g = s.order[s.cursor++];
    }
    (void)Check(g, exists, erase);
  }
}

KeyGroups::Counts KeyGroups::counts() const {
  Counts c;
  for (const Shard& s : shards_) {
    std::lock_guard<std::mutex> lock(s.mu);
    c.groups += s.groups.size();
    for (const auto& [g, grp] : s.groups) c.keys += grp.members.size();
    c.dropped_groups += s.dropped_groups;
    c.dropped_keys += s.dropped_keys;
  }
  return c;
}

}  // namespace kvmesh

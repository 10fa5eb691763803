// Belady's clairvoyant optimum (MIN) with bypass, for ReplayBelady.
//
// Each cached block is keyed by the position of its next lookup (positions are
// unique, so a key also names its block: blocks[key]); a block never used
// again gets key N + id. The key set is ordered, so the furthest next use is
// its last element: O(log capacity) per lookup.
#include <algorithm>
#include <chrono>
#include <limits>
#include <set>

#include "eviction/replay.h"

namespace kvmesh {

std::vector<uint32_t> NextUse(const Trace& trace) {
  const uint32_t n = static_cast<uint32_t>(trace.lookups());
  std::vector<uint32_t> next(n, n);
  std::vector<uint32_t> last(trace.distinct, n);
  for (uint32_t k = n; k-- > 0;) {
    next[k] = last[trace.blocks[k]];
    last[trace.blocks[k]] = k;
  }
  return next;
}

ReplayResult ReplayBelady(const Trace& trace, size_t capacity, std::atomic<uint64_t>* progress,
                          const PrefillModel& model) {
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t n = trace.lookups();
  const std::vector<uint32_t> next = NextUse(trace);
  const std::vector<double> flops = model.LookupFlops(trace);
  auto key_of = [&](uint32_t k) -> uint64_t {
    return next[k] < n ? next[k] : n + trace.blocks[k];
  };
  auto block_of = [&](uint64_t key) -> uint32_t {
    return key < n ? trace.blocks[key] : static_cast<uint32_t>(key - n);
  };
  std::vector<uint64_t> cur(trace.distinct, UINT64_MAX);  // a cached block's key; MAX = absent
  std::set<uint64_t> cache;

  ReplayResult res;
  res.policy = "belady";
  res.capacity = capacity;
  for (size_t r = 0; r < trace.requests(); ++r) {
    bool prefix = true;
    for (uint32_t k = trace.begin[r]; k < trace.begin[r + 1]; ++k) {
      const uint32_t b = trace.blocks[k];
      const uint64_t key = key_of(k);
      ++res.lookups;
      res.flops_total += flops[k];
      if (cur[b] != UINT64_MAX) {
        ++res.hits;
        if (prefix) {
          ++res.prefix_hits;
          res.flops_saved += flops[k];
        }
        cache.erase(cur[b]);
        cache.insert(key);
        cur[b] = key;
        continue;
      }
      prefix = false;
      if (capacity == 0) {
        ++res.declined;
        continue;
      }
      if (cache.size() >= capacity) {
        const uint64_t furthest = *cache.rbegin();
        if (key > furthest) {  // its next use is later than every cached block's: bypass
          ++res.declined;
          continue;
        }
        cache.erase(std::prev(cache.end()));
        cur[block_of(furthest)] = UINT64_MAX;
        ++res.evictions;
      }
      cache.insert(key);
      cur[b] = key;
    }
    if (progress) progress->fetch_add(trace.begin[r + 1] - trace.begin[r], std::memory_order_relaxed);
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

ReplayResult ReplayBeladyFlops(const Trace& trace, size_t capacity, const PrefillModel& model,
                               std::atomic<uint64_t>* progress) {
  constexpr int kSamples = 64;
  constexpr double kNever = std::numeric_limits<double>::infinity();
  const auto t0 = std::chrono::steady_clock::now();
  const uint32_t n = static_cast<uint32_t>(trace.lookups());
  const std::vector<uint32_t> next = NextUse(trace);
  const std::vector<double> flops = model.LookupFlops(trace);
  constexpr uint32_t kNone = UINT32_MAX;
  // Per block: its chain parent (the block before it when first seen), whether
  // cached, its next use and that use's FLOPs, its cached children, and its
  // position in `leaves` (cached blocks without cached children).
  std::vector<uint32_t> parent(trace.distinct, kNone), next_use(trace.distinct, n), children(trace.distinct, 0);
  std::vector<uint32_t> leaf_pos(trace.distinct, kNone);
  std::vector<double> next_flops(trace.distinct, 0);
  std::vector<uint8_t> cached(trace.distinct, 0), counted(trace.distinct, 0);  // counted: in children[parent]
  std::vector<uint32_t> leaves;
  size_t size = 0;
  uint64_t rng = 0x9E3779B97F4A7C15ull;
  auto random = [&rng] {  // splitmix64
    uint64_t z = (rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  auto add_leaf = [&](uint32_t b) {
    leaf_pos[b] = static_cast<uint32_t>(leaves.size());
    leaves.push_back(b);
  };
  auto drop_leaf = [&](uint32_t b) {
    const uint32_t at = leaf_pos[b];
    leaves[at] = leaves.back();
    leaf_pos[leaves[at]] = at;
    leaves.pop_back();
    leaf_pos[b] = kNone;
  };
  // FLOPs-weighted distance: lookups until the next use per FLOP that use saves.
  auto badness = [&](uint32_t b, uint32_t now) {
    return next_use[b] >= n ? kNever : static_cast<double>(next_use[b] - now) / std::max(next_flops[b], 1.0);
  };

  ReplayResult res;
  res.policy = "belady-flops";
  res.capacity = capacity;
  for (size_t r = 0; r < trace.requests(); ++r) {
    bool prefix = true, declined = false;
    for (uint32_t k = trace.begin[r]; k < trace.begin[r + 1]; ++k) {
      const uint32_t b = trace.blocks[k];
      if (parent[b] == kNone && k > trace.begin[r]) parent[b] = trace.blocks[k - 1];
      ++res.lookups;
      res.flops_total += flops[k];
      const uint32_t nu = next[k];
      if (cached[b]) {
        ++res.hits;
        if (prefix) {
          ++res.prefix_hits;
          res.flops_saved += flops[k];
        }
        next_use[b] = nu;
        next_flops[b] = nu < n ? flops[nu] : 0;
        continue;
      }
      prefix = false;
      if (declined || capacity == 0) {
        ++res.declined;
        continue;
      }
      next_use[b] = nu;
      next_flops[b] = nu < n ? flops[nu] : 0;
      if (size >= capacity) {
        uint32_t victim = kNone;
        double worst = -1;
        for (int i = 0; i < kSamples && !leaves.empty(); ++i) {
          const uint32_t c = leaves[random() % leaves.size()];
          const double x = badness(c, k);
          if (x > worst) {
            worst = x;
            victim = c;
          }
          if (x == kNever) break;
        }
        if (victim == kNone || badness(b, k) >= worst) {  // not worth a place: neither are its children
          ++res.declined;
          declined = true;
          continue;
        }
        drop_leaf(victim);
        cached[victim] = 0;
        --size;
        ++res.evictions;
        if (counted[victim]) {
          counted[victim] = 0;
          if (--children[parent[victim]] == 0) add_leaf(parent[victim]);
        }
      }
      cached[b] = 1;
      ++size;
      if (children[b] == 0) add_leaf(b);
      if (const uint32_t p = parent[b]; p != kNone && cached[p]) {
        counted[b] = 1;
        if (children[p]++ == 0) drop_leaf(p);
      }
    }
    if (progress) progress->fetch_add(trace.begin[r + 1] - trace.begin[r], std::memory_order_relaxed);
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace kvmesh

// Belady's clairvoyant optimum (MIN) with bypass, for ReplayBelady.
//
// Each cached block is keyed by the position of its next lookup (positions are
// unique, so a key also names its block: blocks[key]); a block never used
// again gets key N + id. The key set is ordered, so the furthest next use is
// its last element: O(log capacity) per lookup.
#include <chrono>
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

ReplayResult ReplayBelady(const Trace& trace, size_t capacity, std::atomic<uint64_t>* progress) {
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t n = trace.lookups();
  const std::vector<uint32_t> next = NextUse(trace);
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
      if (cur[b] != UINT64_MAX) {
        ++res.hits;
        if (prefix) ++res.prefix_hits;
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

}  // namespace kvmesh

// eviction/frequency_sketch.h — TinyLFU's approximate access-frequency
// estimator (Einziger, Friedman & Manes, "TinyLFU", ACM ToS 2017).
//
// A count-min sketch (4 rows of 4-bit saturating counters) behind a
// doorkeeper (a Bloom filter): the first access of an id only sets its
// doorkeeper bits, so the many ids seen once never reach the counters. After
// `sample` recorded accesses every counter is halved and the doorkeeper
// cleared (the "reset" that makes the estimate favour recent popularity).
// Estimate = min over rows + (1 if the doorkeeper holds the id).
//
// Memory: 4 x width bytes for the counters (one byte each, saturating at 15
// like 4-bit counters) plus width/4 bytes for the doorkeeper.
// Thread-safety: none.
#pragma once

#include <cstdint>
#include <vector>

#include "eviction/eviction_policy.h"

namespace kvmesh::eviction_internal {

class FrequencySketch {
 public:
  // capacity: the cache size in entries; the sketch gets the next power of
  // two >= max(capacity, 64) counters per row and samples 10 x capacity.
  explicit FrequencySketch(size_t capacity);

  void Record(EntryId id);
  uint32_t Estimate(EntryId id) const;
  uint64_t resets() const { return resets_; }

 private:
  static uint64_t Mix(EntryId id, uint64_t seed);
  uint32_t Counter(int row, uint64_t h) const;
  void Reset();

  uint64_t width_;  // counters per row, power of two
  uint64_t mask_;
  std::vector<uint8_t> counters_;     // 4 rows x width, saturating at 15
  std::vector<uint64_t> doorkeeper_;  // Bloom filter bits (2 probes)
  uint64_t door_mask_;
  uint64_t sample_;
  uint64_t recorded_ = 0;
  uint64_t resets_ = 0;
};

}  // namespace kvmesh::eviction_internal

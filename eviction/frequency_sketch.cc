#include "eviction/frequency_sketch.h"

#include "common/hash.h"

#include <algorithm>
#include <bit>

namespace kvmesh::eviction_internal {
namespace {
constexpr int kRows = 4;
constexpr uint8_t kMaxCount = 15;
constexpr uint64_t kSeeds[kRows] = {0x9E3779B97F4A7C15ull, 0xC2B2AE3D27D4EB4Full, 0x165667B19E3779F9ull,
                                    0xD6E8FEB86659FD93ull};
}  // namespace

FrequencySketch::FrequencySketch(size_t capacity) {
  width_ = std::bit_ceil(std::max<uint64_t>(capacity, 64));
  mask_ = width_ - 1;
  counters_.assign(kRows * width_, 0);
  // Doorkeeper: 2 x width bits, so about one bit set per sampled id at the reset point.
  doorkeeper_.assign((2 * width_) / 64, 0);
  door_mask_ = 2 * width_ - 1;
  sample_ = 10 * std::max<uint64_t>(capacity, 1);
}

uint64_t FrequencySketch::Mix(EntryId id, uint64_t seed) {
  return Mix64(id ^ seed);
}

uint32_t FrequencySketch::Counter(int row, uint64_t h) const { return counters_[row * width_ + (h & mask_)]; }

void FrequencySketch::Record(EntryId id) {
  const uint64_t d1 = Mix(id, 0x51ED270B27A1C0DEull) & door_mask_;
  const uint64_t d2 = Mix(id, 0xA0761D6478BD642Full) & door_mask_;
  const bool in_door = (doorkeeper_[d1 >> 6] >> (d1 & 63) & 1) && (doorkeeper_[d2 >> 6] >> (d2 & 63) & 1);
  if (!in_door) {
    doorkeeper_[d1 >> 6] |= uint64_t{1} << (d1 & 63);
    doorkeeper_[d2 >> 6] |= uint64_t{1} << (d2 & 63);
  } else {
    // Conservative update: raise only the rows holding the minimum.
    uint32_t lo = kMaxCount;
    uint64_t h[kRows];
    for (int r = 0; r < kRows; ++r) {
      h[r] = Mix(id, kSeeds[r]);
      lo = std::min(lo, Counter(r, h[r]));
    }
    if (lo < kMaxCount)
      for (int r = 0; r < kRows; ++r) {
        uint8_t& c = counters_[r * width_ + (h[r] & mask_)];
        if (c == lo) ++c;
      }
  }
  if (++recorded_ >= sample_) Reset();
}

uint32_t FrequencySketch::Estimate(EntryId id) const {
  uint32_t lo = kMaxCount;
  for (int r = 0; r < kRows; ++r) lo = std::min(lo, Counter(r, Mix(id, kSeeds[r])));
  const uint64_t d1 = Mix(id, 0x51ED270B27A1C0DEull) & door_mask_;
  const uint64_t d2 = Mix(id, 0xA0761D6478BD642Full) & door_mask_;
  const bool in_door = (doorkeeper_[d1 >> 6] >> (d1 & 63) & 1) && (doorkeeper_[d2 >> 6] >> (d2 & 63) & 1);
  return lo + (in_door ? 1 : 0);
}

void FrequencySketch::Reset() {
  for (uint8_t& c : counters_) c >>= 1;
  std::fill(doorkeeper_.begin(), doorkeeper_.end(), 0);
  recorded_ /= 2;
  ++resets_;
}

}  // namespace kvmesh::eviction_internal

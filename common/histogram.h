// common/histogram.h — a fixed-size log-linear latency histogram.
//
// Buckets: 16 linear sub-buckets per power of two from 1 ns to ~2^40 ns (~18
// minutes); relative error of a reported percentile <= 1/16. Record() is
// allocation-free and O(1). Not thread-safe: keep one per thread and Merge().
#pragma once

#include <array>
#include <bit>
#include <cstdint>
#include <string>

namespace kvmesh {

class LatencyHistogram {
 public:
  static constexpr int kSubBits = 4;
  static constexpr int kSub = 1 << kSubBits;
  static constexpr int kMaxExp = 40;
  static constexpr int kBuckets = (kMaxExp + 1) * kSub;

  void Record(int64_t ns) {
    if (ns < 0) ns = 0;
    ++counts_[Index(static_cast<uint64_t>(ns))];
    ++count_;
    sum_ += static_cast<double>(ns);
    if (static_cast<uint64_t>(ns) > max_) max_ = static_cast<uint64_t>(ns);
  }
  void Merge(const LatencyHistogram& o) {
    for (int i = 0; i < kBuckets; ++i) counts_[i] += o.counts_[i];
    count_ += o.count_;
    sum_ += o.sum_;
    if (o.max_ > max_) max_ = o.max_;
  }
  void Reset() { *this = LatencyHistogram(); }

  uint64_t count() const { return count_; }
  double mean_ns() const { return count_ ? sum_ / static_cast<double>(count_) : 0.0; }
  uint64_t max_ns() const { return max_; }

  // Value at quantile q in [0,1] (upper edge of its bucket, capped by max).
  uint64_t Percentile(double q) const {
    if (count_ == 0) return 0;
    uint64_t rank = static_cast<uint64_t>(q * static_cast<double>(count_ - 1)) + 1;
    uint64_t seen = 0;
    for (int i = 0; i < kBuckets; ++i) {
      seen += counts_[i];
      if (seen >= rank) {
        uint64_t v = UpperEdge(i);
        return v < max_ ? v : max_;
      }
    }
    return max_;
  }

 private:
  static int Index(uint64_t v) {
    if (v < kSub) return static_cast<int>(v);
    int exp = 63 - std::countl_zero(v);  // >= kSubBits
    if (exp > kMaxExp) return kBuckets - 1;
    int sub = static_cast<int>((v >> (exp - kSubBits)) & (kSub - 1));
    return (exp - kSubBits + 1) * kSub + sub;
  }
  static uint64_t UpperEdge(int idx) {
    if (idx < kSub) return static_cast<uint64_t>(idx);
    int exp = idx / kSub + kSubBits - 1;
    uint64_t sub = static_cast<uint64_t>(idx % kSub);
    uint64_t base = (uint64_t{1} << exp) | (sub << (exp - kSubBits));
    return base + (uint64_t{1} << (exp - kSubBits)) - 1;
  }

  std::array<uint64_t, kBuckets> counts_{};
  uint64_t count_ = 0;
  double sum_ = 0;
  uint64_t max_ = 0;
};

}  // namespace kvmesh

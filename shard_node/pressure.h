// shard_node/pressure.h — memory-pressure levels of a node's primary tier.
//
// Pressure is the primary tier's used bytes over its current limit (the
// budget, or less when the inference engine takes memory back through
// TieredStore::SetPrimaryLimit). A node that is merely full at its own budget
// is not under pressure (its store evicts on put, demoting when it can, as a
// cache should): pressure exists only while the limit is below the budget.
// Offloading to lower tiers runs first; when the
// primary tier is still above the high watermark after it, the controller
// escalates one level per maintenance tick, and each level's action runs once
// when it is entered:
//
//   level 1  evict (demote when a lower tier exists) the oldest 25% of blocks
//   level 2  re-encode resident raw blocks at lower precision (fp16 -> int8/fp8)
//   level 3  refuse new admissions (Put -> Busy) while reads keep working
//
// Once the ratio falls under the low watermark the controller steps back down
// one level per tick (3 -> 2 -> 1 -> 0), so recovery is as visible as the
// escalation. Between the watermarks the level holds (hysteresis).
//
// Pure logic, no locks: the owner serialises calls (TieredStore's maintenance).
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace kvmesh {

struct PressureOptions {
  bool enabled = true;
  double high_watermark = 0.80;  // escalate while above this after offloading
  double low_watermark = 0.70;   // step down while under this
  int max_level = 3;             // 0..3: the highest level the node may reach
};

class PressureController {
 public:
  explicit PressureController(const PressureOptions& o) : o_(o) {}

  // Feeds the ratio measured after this tick's offload; returns the new level
  // (the owner runs the entered level's action when it went up).
  int Update(double ratio) {
    const int before = level_;
    if (!o_.enabled) {
      level_ = 0;
    } else if (ratio > o_.high_watermark && level_ < o_.max_level) {
      ++level_;
    } else if (ratio < o_.low_watermark && level_ > 0) {
      --level_;
    }
    if (level_ != before) ++entered_[level_];
    return level_;
  }
  int level() const { return level_; }
  // How many times each level was entered (index 0: returns to normal).
  const std::array<uint64_t, 4>& entered() const { return entered_; }

  static std::string_view LevelName(int level) {
    switch (level) {
      case 0: return "normal";
      case 1: return "evict-oldest";
      case 2: return "reencode";
      default: return "refuse-admissions";
    }
  }

 private:
  PressureOptions o_;
  int level_ = 0;
  std::array<uint64_t, 4> entered_{};
};

}  // namespace kvmesh

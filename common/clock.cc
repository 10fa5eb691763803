#include "kvmesh/clock.h"

#include <chrono>
#include <fstream>
#include <string>

namespace kvmesh {
namespace {
class SteadyClock final : public Clock {
 public:
  int64_t NowNanos() const override {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
};
}  // namespace

uint64_t HostBootId() {
  static const uint64_t id = [] {
    std::ifstream f("/proc/sys/kernel/random/boot_id");
    std::string s;
    if (!(f >> s) || s.empty()) return uint64_t{0};
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
    return h == 0 ? 1 : h;
  }();
  return id;
}

Clock* SystemClock() {
  static SteadyClock clock;
  return &clock;
}

}  // namespace kvmesh

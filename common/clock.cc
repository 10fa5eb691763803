#include "kvmesh/clock.h"

#include <chrono>

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

Clock* SystemClock() {
  static SteadyClock clock;
  return &clock;
}

}  // namespace kvmesh

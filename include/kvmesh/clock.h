// kvmesh/clock.h — an injectable monotonic clock, so eviction aging, watermarks
// and timeouts can be driven by tests (after TensorRT-LLM's injectable clock).
#pragma once

#include <atomic>
#include <cstdint>

namespace kvmesh {

class Clock {
 public:
  virtual ~Clock() = default;
  // Monotonic nanoseconds from an arbitrary origin. Thread-safe.
  virtual int64_t NowNanos() const = 0;
};

// The process-wide steady clock. Never null, never destroyed.
Clock* SystemClock();

// This host's boot (a hash of /proc/sys/kernel/random/boot_id; 0 when it
// cannot be read): two processes with the same non-zero id share
// std::chrono::steady_clock (CLOCK_MONOTONIC), so a deadline one of them sets
// means the same instant to the other.
uint64_t HostBootId();

// A clock that moves only when told to. Thread-safe.
class ManualClock final : public Clock {
 public:
  explicit ManualClock(int64_t start_ns = 1'000'000'000) : now_(start_ns) {}
  int64_t NowNanos() const override { return now_.load(std::memory_order_acquire); }
  void Advance(int64_t ns) { now_.fetch_add(ns, std::memory_order_acq_rel); }
  void AdvanceSeconds(double s) { Advance(static_cast<int64_t>(s * 1e9)); }
  void Set(int64_t ns) { now_.store(ns, std::memory_order_release); }

 private:
  std::atomic<int64_t> now_;
};

}  // namespace kvmesh

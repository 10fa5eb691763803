// PolicyGroup (eviction/eviction_policy.h): members' scores in relaxed
// atomics, one slot per member, so a member publishes and sums without a lock
// (a sum may mix two publications of another member: a score, not a count).
#include <array>
#include <atomic>
#include <mutex>

#include "eviction/eviction_policy.h"

namespace kvmesh {

struct PolicyGroup::State {
  struct Member {
    std::atomic<bool> active{false};
    std::array<std::atomic<double>, kMaxScores> score{};
  };
  std::mutex mu;  // Join and Leave
  std::array<Member, kMaxMembers> members;
  std::atomic<uint32_t> used{0};  // slots [0, used) have been handed out
  std::atomic<uint32_t> leader{0};
};

PolicyGroup::PolicyGroup() : s_(std::make_unique<State>()) {}
PolicyGroup::~PolicyGroup() = default;

int PolicyGroup::Join() {
  std::lock_guard<std::mutex> lock(s_->mu);
  const uint32_t used = s_->used.load(std::memory_order_relaxed);
  for (uint32_t i = 0; i < used; ++i) {
    if (!s_->members[i].active.load(std::memory_order_relaxed)) {
      for (auto& x : s_->members[i].score) x.store(0, std::memory_order_relaxed);
      s_->members[i].active.store(true, std::memory_order_release);
      return static_cast<int>(i);
    }
  }
  if (used == kMaxMembers) return -1;
  s_->members[used].active.store(true, std::memory_order_release);
  s_->used.store(used + 1, std::memory_order_release);
  return static_cast<int>(used);
}

void PolicyGroup::Leave(int slot) {
  if (slot < 0 || static_cast<size_t>(slot) >= kMaxMembers) return;
  std::lock_guard<std::mutex> lock(s_->mu);
  s_->members[slot].active.store(false, std::memory_order_release);
}

void PolicyGroup::Publish(int slot, const double* scores, size_t n) {
  if (slot < 0 || static_cast<size_t>(slot) >= kMaxMembers) return;
  auto& m = s_->members[slot];
  for (size_t i = 0; i < n && i < kMaxScores; ++i) m.score[i].store(scores[i], std::memory_order_relaxed);
}

void PolicyGroup::Sum(double* out, size_t n) const {
  n = n < kMaxScores ? n : kMaxScores;
  for (size_t i = 0; i < n; ++i) out[i] = 0;
  const uint32_t used = s_->used.load(std::memory_order_acquire);
  for (uint32_t m = 0; m < used; ++m) {
    const auto& x = s_->members[m];
    if (!x.active.load(std::memory_order_acquire)) continue;
    for (size_t i = 0; i < n; ++i) out[i] += x.score[i].load(std::memory_order_relaxed);
  }
}

uint32_t PolicyGroup::leader() const { return s_->leader.load(std::memory_order_relaxed); }
void PolicyGroup::set_leader(uint32_t i) { s_->leader.store(i, std::memory_order_relaxed); }

}  // namespace kvmesh

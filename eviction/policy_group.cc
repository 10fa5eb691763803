// PolicyGroup (eviction/eviction_policy.h): members' scores in relaxed
// atomics, one slot per member, so a member publishes and sums without a lock
// (a sum may mix two publications of another member: a score, not a count).
// Peers' scores (other nodes') are one more such slot. PolicyGroups is a
// short list of groups under a mutex, read by heartbeats and /stats only.
#include <algorithm>
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
  std::atomic<uint32_t> width{0};  // scores the members publish
  std::array<std::atomic<double>, kMaxScores> peers{};
  std::atomic<uint32_t> peers_n{0};  // how many peers' scores are set
  std::vector<std::string> names;  // under mu
};

PolicyGroup::PolicyGroup() : s_(std::make_unique<State>()) {}
PolicyGroup::~PolicyGroup() = default;

int PolicyGroup::Join(const std::vector<std::string_view>& names) {
  std::lock_guard<std::mutex> lock(s_->mu);
  if (s_->names.empty())
    for (size_t i = 0; i < names.size() && i < kMaxScores; ++i) s_->names.emplace_back(names[i]);
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
  n = std::min(n, kMaxScores);
  for (size_t i = 0; i < n; ++i) m.score[i].store(scores[i], std::memory_order_relaxed);
  if (s_->width.load(std::memory_order_relaxed) < n) s_->width.store(static_cast<uint32_t>(n), std::memory_order_relaxed);
}

size_t PolicyGroup::Own(double* out, size_t n) const {
  n = std::min(n, kMaxScores);
  for (size_t i = 0; i < n; ++i) out[i] = 0;
  const uint32_t used = s_->used.load(std::memory_order_acquire);
  bool any = false;
  for (uint32_t m = 0; m < used; ++m) {
    const auto& x = s_->members[m];
    if (!x.active.load(std::memory_order_acquire)) continue;
    any = true;
    for (size_t i = 0; i < n; ++i) out[i] += x.score[i].load(std::memory_order_relaxed);
  }
  return any ? s_->width.load(std::memory_order_relaxed) : 0;  // none left: nothing to report
}

void PolicyGroup::Sum(double* out, size_t n) const {
  n = std::min(n, kMaxScores);
  Own(out, n);
  for (size_t i = 0; i < n; ++i) out[i] += s_->peers[i].load(std::memory_order_relaxed);
}

void PolicyGroup::SetPeers(const double* scores, size_t n) {
  n = std::min(n, kMaxScores);
  for (size_t i = 0; i < kMaxScores; ++i) s_->peers[i].store(i < n ? scores[i] : 0.0, std::memory_order_relaxed);
  s_->peers_n.store(static_cast<uint32_t>(n), std::memory_order_relaxed);
}

size_t PolicyGroup::Peers(double* out, size_t n) const {
  n = std::min(n, kMaxScores);
  for (size_t i = 0; i < n; ++i) out[i] = s_->peers[i].load(std::memory_order_relaxed);
  return std::min<size_t>(n, s_->peers_n.load(std::memory_order_relaxed));
}

std::string PolicyGroup::name(uint32_t i) const {
  std::lock_guard<std::mutex> lock(s_->mu);
  return i < s_->names.size() ? s_->names[i] : std::string();
}

uint32_t PolicyGroup::leader() const { return s_->leader.load(std::memory_order_relaxed); }
void PolicyGroup::set_leader(uint32_t i) { s_->leader.store(i, std::memory_order_relaxed); }

std::shared_ptr<PolicyGroup> PolicyGroups::Get(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [k, g] : groups_)
    if (k == key) return g;
  groups_.emplace_back(key, std::make_shared<PolicyGroup>());
  return groups_.back().second;
}

std::vector<PolicyGroups::Entry> PolicyGroups::Snapshot() const {
  std::vector<std::pair<std::string, std::shared_ptr<PolicyGroup>>> groups;
  {
    std::lock_guard<std::mutex> lock(mu_);
    groups = groups_;
  }
  std::sort(groups.begin(), groups.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<Entry> out;
  for (const auto& [key, g] : groups) {
    std::array<double, PolicyGroup::kMaxScores> own{}, peers{};
    const size_t n = g->Own(own.data(), own.size());
    if (n == 0) continue;
    Entry e;
    e.key = key;
    e.own.assign(own.begin(), own.begin() + n);
    const size_t m = g->Peers(peers.data(), n);
    e.peers.assign(peers.begin(), peers.begin() + m);
    e.following = g->name(g->leader());
    out.push_back(std::move(e));
  }
  return out;
}

void PolicyGroups::SetPeers(const PeerScores& peers) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [key, g] : groups_) {
    const std::vector<double>* p = nullptr;
    for (const auto& [k, v] : peers)
      if (k == key) p = &v;
    if (p != nullptr)
      g->SetPeers(p->data(), p->size());
    else
      g->SetPeers(nullptr, 0);
  }
}

}  // namespace kvmesh

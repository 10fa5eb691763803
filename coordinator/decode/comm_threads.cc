// In-process StepComm: ranks are threads; collectives meet at a barrier.
#include <barrier>
#include <cstring>

#include "coordinator/decode/step_comm.h"

namespace kvmesh::decode {
namespace {

// State shared by the n communicators of one group. Each collective is two
// barrier phases: publish pointers, then (after every rank has read) reuse.
struct Group {
  explicit Group(int n) : size(n), bar(n), ptrs(n) {}
  int size;
  std::barrier<> bar;
  std::vector<void*> ptrs;  // slot r written by rank r before phase 1
};

class ThreadComm final : public StepComm {
 public:
  ThreadComm(std::shared_ptr<Group> g, int rank) : g_(std::move(g)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return g_->size; }
  std::string_view backend() const override { return "threads"; }

  Status AllReduceSum(std::span<float> data) override { return Reduce(data, [](float a, float b) { return a + b; }); }
  Status AllReduceMin(std::span<uint64_t> data) override {
    return Reduce(data, [](uint64_t a, uint64_t b) { return a < b ? a : b; });
  }
  Status AllReduceSumU64(std::span<uint64_t> data) override {
    return Reduce(data, [](uint64_t a, uint64_t b) { return a + b; });
  }
  Status Broadcast(std::span<std::byte> data, int root) override {
    if (g_->size == 1) return Status::Ok();
    g_->ptrs[rank_] = data.data();
    g_->bar.arrive_and_wait();
    if (rank_ != root && !data.empty()) std::memcpy(data.data(), g_->ptrs[root], data.size());
    g_->bar.arrive_and_wait();
    return Status::Ok();
  }
  Status Barrier() override {
    g_->bar.arrive_and_wait();
    return Status::Ok();
  }

 private:
  template <typename T, typename Op>
  Status Reduce(std::span<T> data, Op op) {
    if (g_->size == 1) return Status::Ok();
    g_->ptrs[rank_] = data.data();
    g_->bar.arrive_and_wait();
    // Every rank computes the same result in rank order, into scratch.
    scratch_.resize(data.size() * sizeof(T));
    T* out = reinterpret_cast<T*>(scratch_.data());
    const T* first = static_cast<const T*>(g_->ptrs[0]);
    if (!data.empty()) std::memcpy(out, first, data.size() * sizeof(T));  // an empty span's data() may be null
    for (int r = 1; r < g_->size; ++r) {
      const T* in = static_cast<const T*>(g_->ptrs[r]);
      for (size_t i = 0; i < data.size(); ++i) out[i] = op(out[i], in[i]);
    }
    g_->bar.arrive_and_wait();  // nobody reads the inputs any more
    if (!data.empty()) std::memcpy(data.data(), out, data.size() * sizeof(T));
    return Status::Ok();
  }

  std::shared_ptr<Group> g_;
  int rank_;
  std::vector<std::byte> scratch_;
};

}  // namespace

std::vector<std::unique_ptr<StepComm>> MakeThreadComms(int n) {
  auto g = std::make_shared<Group>(n);
  std::vector<std::unique_ptr<StepComm>> v;
  for (int r = 0; r < n; ++r) v.push_back(std::make_unique<ThreadComm>(g, r));
  return v;
}

}  // namespace kvmesh::decode

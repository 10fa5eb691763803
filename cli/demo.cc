#include "cli/demo.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_set>

#include "common/hash.h"
#include "common/progress.h"
#include "kvmesh/clock.h"

namespace kvmesh {

void FillBlock(const BlockKey& key, std::span<std::byte> out) {
  uint64_t x = key.lo ^ (key.hi * 0x9E3779B97F4A7C15ull);
  size_t i = 0;
  for (; i + 8 <= out.size(); i += 8) {
    const uint64_t z = SplitMix64(&x);
    std::memcpy(out.data() + i, &z, 8);
  }
  for (; i < out.size(); ++i) out[i] = static_cast<std::byte>(i);
}

namespace {

struct ThreadState {
  DemoReport r;
  std::vector<std::byte> read_buf, put_buf, expect;
  std::vector<GetItem> gets;
  std::vector<PutItem> puts;
};

// The infinite-cache reference: every chain key ever stored.
struct Ideal {
  std::mutex mu;
  std::unordered_set<BlockKey> seen;
};

void RunOne(Router& router, const WorkloadRequest& req, ThreadState& t, Ideal& ideal, size_t block_bytes) {
  Clock* clock = SystemClock();
  DemoReport& r = t.r;
  const uint32_t bt = router.block_tokens();
  RequestOptions opts;
  std::vector<BlockKey> keys = router.Keys(req.prompt, opts);
  const size_t n = keys.size();
  r.prompt_blocks += n;
  ++r.requests;
  {
    std::lock_guard<std::mutex> lock(ideal.mu);
    size_t run = 0;
    while (run < n && ideal.seen.count(keys[run])) ++run;
    r.ideal_matched_blocks += run;
    for (const BlockKey& k : keys) ideal.seen.insert(k);
  }

  int64_t t0 = clock->NowNanos();
  size_t m = router.MatchPrefix(req.prompt, opts).value_or(0);
  int64_t t1 = clock->NowNanos();
  r.match.Record(t1 - t0);
  r.matched_blocks += m;

  // Read the cached prefix into "GPU memory".
  size_t first_missing = m;
  if (m > 0) {
    if (t.read_buf.size() < m * block_bytes) t.read_buf.resize(m * block_bytes);
    t.gets.clear();
    for (size_t i = 0; i < m; ++i)
      t.gets.push_back(GetItem{keys[i], std::span(t.read_buf).subspan(i * block_bytes, block_bytes), 0, {}});
    int64_t g0 = clock->NowNanos();
    (void)router.GetBatch(t.gets, opts);
    r.get.Record(clock->NowNanos() - g0);
    t.expect.resize(block_bytes);
    for (size_t i = 0; i < m; ++i) {
      if (!t.gets[i].status.ok()) {
        ++r.read_misses;
        first_missing = std::min(first_missing, i);
        continue;
      }
      ++r.read_blocks;
      FillBlock(keys[i], t.expect);
      if (t.gets[i].size != block_bytes ||
          std::memcmp(t.gets[i].dst.data(), t.expect.data(), block_bytes) != 0)
        ++r.mismatches;
    }
  }

  // "Prefill" the rest and store it.
  if (first_missing < n) {
    const size_t count = n - first_missing;
    if (t.put_buf.size() < count * block_bytes) t.put_buf.resize(count * block_bytes);
    const size_t sys_blocks = req.system_tokens / bt;
    int64_t p0 = clock->NowNanos();
    for (int pass = 0; pass < 2; ++pass) {  // pass 0: system prompt blocks, pass 1: the rest
      t.puts.clear();
      for (size_t i = first_missing; i < n; ++i) {
        bool sys = i < sys_blocks;
        if (sys != (pass == 0)) continue;
        auto buf = std::span(t.put_buf).subspan((i - first_missing) * block_bytes, block_bytes);
        FillBlock(keys[i], buf);
        t.puts.push_back(PutItem{keys[i], buf, {}});
      }
      if (t.puts.empty()) continue;
      RequestOptions po = opts;
      po.priority = pass == 0 ? 2 : (req.single_shot ? 0 : 1);
      (void)router.PutBatch(t.puts, po);
      for (const PutItem& it : t.puts) {
        if (it.status.ok()) ++r.stored_blocks; else ++r.put_errors;
      }
    }
    r.put.Record(clock->NowNanos() - p0);
  }
}

}  // namespace

Result<DemoReport> RunDemo(Router& router, const DemoOptions& o) {
  const size_t block_bytes = router.model().FullBlockBytes();
  const uint32_t threads = std::max(1u, o.threads);
  Ideal ideal;
  std::vector<ThreadState> states(threads);
  std::atomic<uint64_t> done{0};
  uint64_t total = 0;
  std::vector<WorkloadOptions> wos;
  for (uint32_t t = 0; t < threads; ++t) {
    WorkloadOptions w = o.workload;
    w.seed = o.workload.seed + t;
    w.conversations = o.workload.conversations / threads + (t < o.workload.conversations % threads ? 1 : 0);
    total += ConversationWorkload(w).total_requests();
    wos.push_back(w);
  }
  ProgressBar bar("demo", total, o.progress);
  const int64_t start = SystemClock()->NowNanos();
  auto worker = [&](uint32_t t) {
    ConversationWorkload wl(wos[t]);
    while (auto req = wl.Next()) {
      RunOne(router, *req, states[t], ideal, block_bytes);
      done.fetch_add(1, std::memory_order_relaxed);
    }
  };
  std::vector<std::thread> pool;
  for (uint32_t t = 1; t < threads; ++t) pool.emplace_back(worker, t);
  // Thread 0 runs here and also draws the progress bar between requests.
  {
    ConversationWorkload wl(wos[0]);
    while (auto req = wl.Next()) {
      RunOne(router, *req, states[0], ideal, block_bytes);
      bar.Update(done.fetch_add(1, std::memory_order_relaxed) + 1);
    }
  }
  for (auto& th : pool) th.join();
  bar.Finish();
  DemoReport r;
  r.wall_s = static_cast<double>(SystemClock()->NowNanos() - start) / 1e9;
  for (ThreadState& s : states) {
    const DemoReport& x = s.r;
    r.requests += x.requests;
    r.prompt_blocks += x.prompt_blocks;
    r.matched_blocks += x.matched_blocks;
    r.ideal_matched_blocks += x.ideal_matched_blocks;
    r.read_blocks += x.read_blocks;
    r.read_misses += x.read_misses;
    r.mismatches += x.mismatches;
    r.stored_blocks += x.stored_blocks;
    r.put_errors += x.put_errors;
    r.match.Merge(x.match);
    r.get.Merge(x.get);
    r.put.Merge(x.put);
  }
  return r;
}

}  // namespace kvmesh

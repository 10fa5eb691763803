// bench/bench_kv_index.cc — the cost of KV-aware routing's prefix index
// (kvmesh/kv_route.h): route lookups per second on one core and the index's
// bytes per block, each beside a baseline measured in the same run: a bare
// absl::flat_hash_set of the same 64-bit block hashes, probed for the same
// keys (the least any hash index must do), and its memory. Route runs two
// ways: into a vector the caller keeps (pooled: no allocation per call) and
// into a new vector per call (the allocating form), alternating in one run,
// and the heap allocations each makes per call are counted (this binary
// replaces operator new to count them).
//
//   build/bin/bench_kv_index [--blocks N] [--instances I] [--request-blocks R]
//
// The index holds N distinct blocks: sessions of R chained blocks, each held
// by 2 of I instances in random tiers. A route is one request of R keys (a
// stored session: its whole prefix is found) against 4 candidates.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <absl/container/flat_hash_set.h>

#include "bench/bench_util.h"
#include "kvmesh/kv_route.h"

using namespace kvmesh;

namespace {
std::atomic<uint64_t> g_allocations{0};
}  // namespace

void* operator new(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

int main(int argc, char** argv) {
  size_t blocks = 1'000'000, instances = 16, request = 32;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return std::strtoull(argv[++i], nullptr, 10);
    };
    if (a == "--help" || a == "-h") {
      std::printf("usage: bench_kv_index [--blocks N (1000000)] [--instances I (16)] [--request-blocks R (32)]\n"
                  "Route lookups/s on one core and bytes per block of the KV-aware routing index,\n"
                  "beside a bare hash set of the same block hashes.\n");
      return 0;
    }
    if (a == "--blocks") blocks = next();
    else if (a == "--instances") instances = next();
    else if (a == "--request-blocks") request = next();
    else {
      std::fprintf(stderr, "unknown option %s (--help)\n", a.c_str());
      return 2;
    }
  }
  if (instances < 4 || instances > KvIndex::kMaxInstances || request == 0 || blocks < request) {
    std::fprintf(stderr, "need 4 <= instances <= %zu, request-blocks >= 1, blocks >= request-blocks\n",
                 KvIndex::kMaxInstances);
    return 2;
  }
  std::mt19937_64 rng(42);
  std::vector<std::string> names;
  for (size_t i = 0; i < instances; ++i) names.push_back("engine-" + std::to_string(i));
  const size_t sessions = blocks / request;
  std::vector<std::vector<BlockKey>> keys(sessions);
  KvIndex index;
  absl::flat_hash_set<uint64_t> baseline;
  std::fprintf(stderr, "bench_kv_index: indexing %zu sessions of %zu blocks...\n", sessions, request);
  for (size_t s = 0; s < sessions; ++s) {
    keys[s].resize(request);
    for (BlockKey& k : keys[s]) k = BlockKey{rng(), rng()};
    for (int copy = 0; copy < 2; ++copy) {
      const std::string& who = names[rng() % instances];
      const KvTier tier = static_cast<KvTier>(rng() % 3);
      if (!index.Stored(who, tier, keys[s]).ok()) return 1;
    }
    for (const BlockKey& k : keys[s]) baseline.insert(k.lo);
    if (s % (sessions / 10 + 1) == 0) std::fprintf(stderr, "  %zu%%\n", s * 100 / sessions);
  }
  const std::vector<std::string> candidates(names.begin(), names.begin() + 4);
  constexpr size_t kRoutes = 200'000;
  std::vector<size_t> order(kRoutes);
  for (size_t& o : order) o = rng() % sessions;
  volatile uint64_t sink = 0;
  std::vector<PrefixMatch> pooled;
  const std::vector<bench::Sample> s = bench::MeasureAlternating(
      5,
      {[&] {
        for (size_t o : order) {
          index.Route(keys[o], candidates, &pooled);
          sink = sink + pooled[0].blocks;
        }
        return static_cast<double>(order.size());
      },
      [&] {
        for (size_t o : order) sink = sink + index.Route(keys[o], candidates)[0].blocks;
        return static_cast<double>(order.size());
      },
      [&] {
        for (size_t o : order) {
          uint64_t found = 0;
          for (const BlockKey& k : keys[o]) found += baseline.contains(k.lo);
          sink = sink + found;
        }
        return static_cast<double>(order.size());
      }});
  const bench::Sample &route = s[0], &allocating = s[1], &probe = s[2];
  // Heap allocations per call, after the warm-up above (the pooled vector is sized).
  constexpr size_t kCounted = 10'000;
  uint64_t before = g_allocations.load();
  for (size_t i = 0; i < kCounted; ++i) index.Route(keys[order[i]], candidates, &pooled);
  const double pooled_allocs = double(g_allocations.load() - before) / kCounted;
  before = g_allocations.load();
  for (size_t i = 0; i < kCounted; ++i) sink = sink + index.Route(keys[order[i]], candidates)[0].blocks;
  const double allocating_allocs = double(g_allocations.load() - before) / kCounted;
  const double index_bpb = static_cast<double>(index.memory_bytes()) / static_cast<double>(index.blocks());
  const double set_bpb = static_cast<double>(baseline.capacity() * (sizeof(uint64_t) + 1)) /
                         static_cast<double>(baseline.size());
  std::printf("blocks %zu, instances %zu, request %zu blocks, 4 candidates, 5 trials (median [min, max])\n",
              index.blocks(), instances, request);
  std::printf("route lookups/s (one core):   index %.0f [%.0f, %.0f]   bare hash-set probes %.0f   ratio %.2f\n",
              route.median, route.min, route.max, probe.median, route.median / probe.median);
  std::printf("  pooled vs allocating Route:  pooled %.0f   a new vector per call %.0f [%.0f, %.0f]   ratio %.2f\n",
              route.median, allocating.median, allocating.min, allocating.max, route.median / allocating.median);
  std::printf("  heap allocations per Route:  pooled %.2f   a new vector per call %.2f\n", pooled_allocs,
              allocating_allocs);
  std::printf("block lookups/s (one core):   index %.0f   bare hash-set %.0f\n", route.median * request,
              probe.median * request);
  std::printf("bytes per block:              index %.1f   bare hash-set %.1f   ratio %.2f\n", index_bpb, set_bpb,
              index_bpb / set_bpb);
  std::printf("memory per million blocks:    index %.1f MiB\n", index_bpb * 1e6 / (1 << 20));
  return 0;
}

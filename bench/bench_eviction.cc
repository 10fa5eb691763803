// bench_eviction: what an eviction policy costs per block lookup, beside
// a baseline measured in the same run (default `lru`; docs/eviction.md quotes
// these rows).
//
//   build/bin/bench_eviction [--trace FILE] [--capacity-fractions 0.01,0.1]
//                            [--policies adaptive,lru-priority,...] [--baseline lru]
//                            [--no-store] [--quick] [--trials N] [--json]
//
// The workload is a Mooncake trace (default: the public conversation trace in
// tests/data/traces), replayed as `kvmesh replay` replays it: each request's
// blocks in order, a hit touches, a miss evicts the policy's victims and
// inserts, with the replay's client hints (eviction/replay.h DeriveHints),
// chain positions and a clock that follows the trace. Capacity is a fraction
// of the trace's distinct blocks. Rows:
//   policy <name> <fraction>  the policy object alone, lookups/s, vs the baseline
//                             (the hints are derived before the timed loop)
//   store <name> <fraction>   a BlockStore of 8 stripes and 256-byte blocks
//                             driven as a node is: Exists(touch) of every block
//                             of a request, then Put of each missing one, vs
//                             the same store running the baseline
//   lookup policy|store <name> <fraction>
//                             the same passes, timing only the lookup path: a
//                             request's blocks in order up to its first miss
//                             (Contains + Touch; the store's Exists(touch), what
//                             a node's match_prefix does), per call made; two
//                             clock reads per request are inside the time, on
//                             both sides. Each request's lookup time is the
//                             least it took in any trial (the warm-up left
//                             out): the workload is the same every trial, and
//                             on a loaded machine one preemption inside the
//                             timed parts (a few ms against some 10 ms of
//                             lookups per pass) would outweigh the rest
// A name with ":unsampled" runs `adaptive` with every expert simulating every
// key (PolicyOptions::shadow_sample_floor = 0), e.g. `--policies adaptive
// --baseline adaptive:unsampled --capacity-fractions 0.05,0.1,0.2` measures the
// sampled shadows against the previous design. A ratio under 1 means slower than
// the baseline. Rates are medians of 5 trials (3
// with --quick, N with --trials N); each trial runs the policy and its baseline back to back, so
// both see the same load. The lookup rows give the least-time figure instead
// (as "median" in --json; min and max are per-trial rates). Every row also checks that the run hit something,
// and prints the prefix hit rates, the policy's and the baseline's (the
// policy-object rows: the figures `kvmesh replay` gives; the store rows: the
// blocks Exists found before a request's first miss; not timed).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/bench_util.h"
#include "common/hash.h"
#include "eviction/eviction_policy.h"
#include "eviction/replay.h"
#include "kvmesh/clock.h"
#include "shard_node/block_store.h"

using namespace kvmesh;
using kvmesh::bench::MeasurePair;
using kvmesh::bench::Sample;

namespace {

struct Row {
  std::string name;
  Sample value, baseline;  // lookups/s
  double prefix_hit_rate = -1;  // policy rows: the policy's, as `kvmesh replay` counts it
  double baseline_prefix_hit_rate = -1;
};

// Time a pass spent on its lookup path (see the header), per request, and the calls made there.
struct LookupTime {
  double seconds = 0;
  uint64_t calls = 0;
  std::vector<double> per_request;  // seconds
  double rate() const { return seconds > 0 ? static_cast<double>(calls) / seconds : 0; }
  void Add(double dt) {
    seconds += dt;
    per_request.push_back(dt);
  }
};

// The lookup rate of passes of the same workload, each request at its least
// time over the passes (the first, MeasurePair's warm-up, left out), with the
// per-pass rates' min and max.
Sample LeastTimes(const std::vector<LookupTime>& passes) {
  const size_t first = passes.size() > 1 ? 1 : 0;
  std::vector<double> least = passes[first].per_request;
  double lo = passes[first].rate(), hi = lo;
  for (size_t p = first + 1; p < passes.size(); ++p) {
    for (size_t r = 0; r < least.size() && r < passes[p].per_request.size(); ++r)
      least[r] = std::min(least[r], passes[p].per_request[r]);
    lo = std::min(lo, passes[p].rate());
    hi = std::max(hi, passes[p].rate());
  }
  double seconds = 0;
  for (double t : least) seconds += t;
  return Sample{seconds > 0 ? static_cast<double>(passes[first].calls) / seconds : 0, lo, hi};
}

// The replay's accesses, derived once: one AccessInfo per lookup.
struct Workload {
  Trace trace;
  std::vector<AccessInfo> infos;
};

Workload Derive(Trace t) {
  Workload w;
  w.infos.resize(t.lookups());
  std::vector<uint32_t> shares(t.distinct, 0);
  const std::vector<double> flops = PrefillModel{}.LookupFlops(t);
  const double unit = PrefillModel{}.BlockFlops(0, 512);
  for (size_t r = 0; r < t.requests(); ++r) {
    for (size_t k = t.begin[r]; k < t.begin[r + 1]; ++k) {
      AccessInfo info = DeriveHints(t, r, k, shares[t.blocks[k]], HintOptions{});
      info.depth = static_cast<uint32_t>(k - t.begin[r]);
      info.cost = static_cast<float>(flops[k] / unit);
      w.infos[k] = info;
    }
    for (size_t k = t.begin[r]; k < t.begin[r + 1]; ++k) ++shares[t.blocks[k]];
  }
  w.trace = std::move(t);
  return w;
}

// "<factory name>[:unsampled]" -> the factory name and whether to sample.
std::pair<std::string, bool> ParseName(const std::string& name) {
  const size_t colon = name.find(':');
  if (colon == std::string::npos) return {name, false};
  if (name.substr(colon) != ":unsampled") {
    std::cerr << "bench_eviction: unknown suffix in '" << name << "' (known: :unsampled)\n";
    std::exit(2);
  }
  return {name.substr(0, colon), true};
}

// One pass of the trace through a fresh policy; returns lookups done and
// (through *prefix_hits) the prefix hits; adds the lookup path's time to *lookup.
double RunPolicy(const Workload& w, const std::string& name, size_t capacity, uint64_t* prefix_hits,
                 LookupTime* lookup) {
  ManualClock clock(0);
  PolicyOptions po;
  po.capacity_hint = capacity;
  po.clock = &clock;
  const auto [factory, unsampled] = ParseName(name);
  if (unsampled) po.shadow_sample_floor = 0;
  auto made = MakeEvictionPolicy(factory, po);
  if (!made.ok()) {
    std::cerr << "bench_eviction: " << made.status().ToString() << "\n";
    std::exit(2);
  }
  EvictionPolicy& p = **made;
  const Trace& t = w.trace;
  uint64_t hits = 0;
  for (size_t r = 0; r < t.requests(); ++r) {
    clock.Set(t.timestamp_ms[r] * 1'000'000);
    const size_t first = t.begin[r], last = t.begin[r + 1];
    size_t k = first;
    const double t0 = bench::NowSeconds();
    for (; k < last && p.Contains(t.blocks[k]); ++k) p.Touch(t.blocks[k], w.infos[k]);  // the prefix hits
    lookup->Add(bench::NowSeconds() - t0);
    lookup->calls += std::min(k + 1, last) - first;
    hits += k - first;
    for (; k < last; ++k) {
      const EntryId id = t.blocks[k];
      const AccessInfo& info = w.infos[k];
      if (p.Contains(id)) {
        p.Touch(id, info);
        continue;
      }
      if (!p.Admit(id, info)) continue;
      while (p.size() >= capacity) {
        const std::optional<EntryId> v = p.Victim();
        if (!v) break;
        p.Remove(*v, RemoveReason::kEvicted);
      }
      p.Insert(id, info);
    }
  }
  if (prefix_hits) *prefix_hits = hits;
  return static_cast<double>(t.lookups());
}

BlockKey TraceKey(uint32_t block) { return BlockKey{Mix64(block + 1), block}; }

// One pass of the trace through a fresh block store running `name`; adds
// the lookup path's time (the Exists calls) to *lookup.
double RunStore(const Workload& w, const std::string& name, size_t capacity, uint64_t* hits_out,
                LookupTime* lookup) {
  constexpr size_t kBlock = 256;
  ManualClock clock(0);
  StoreOptions o;
  o.slot_bytes = kBlock;
  o.size_classes = 1;
  o.stripes = 8;
  o.capacity_bytes = std::max<size_t>(capacity, o.stripes) * kBlock;
  const auto [factory, unsampled] = ParseName(name);
  o.policy = factory;
  if (unsampled) o.policy_options.shadow_sample_floor = 0;
  o.policy_options.clock = &clock;
  o.policy_options.aging_ns = 30'000'000'000;  // cluster_configs/local.json
  o.clock = &clock;
  o.verify_checksums = true;
  auto made = BlockStore::Create(std::move(o));
  if (!made.ok()) {
    std::cerr << "bench_eviction: " << made.status().ToString() << "\n";
    std::exit(2);
  }
  BlockStore& s = **made;
  const Trace& t = w.trace;
  std::byte payload[kBlock] = {};
  uint64_t hits = 0;
  for (size_t r = 0; r < t.requests(); ++r) {
    clock.Set(t.timestamp_ms[r] * 1'000'000);
    const size_t first = t.begin[r], last = t.begin[r + 1];
    size_t k = first;
    const double t0 = bench::NowSeconds();
    for (; k < last && s.Exists(TraceKey(t.blocks[k]), /*touch=*/true); ++k) ++hits;
    lookup->Add(bench::NowSeconds() - t0);
    lookup->calls += std::min(k + 1, last) - first;
    for (; k < last; ++k) {
      std::memcpy(payload, &t.blocks[k], sizeof(uint32_t));
      (void)s.Put(TraceKey(t.blocks[k]), std::span<const std::byte>(payload, kBlock));
    }
  }
  if (hits_out) *hits_out = hits;
  return static_cast<double>(t.lookups());
}

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string trace_path = std::string(KVMESH_TRACE_DIR) + "/conversation_trace.jsonl";
  std::vector<std::string> fractions{"0.01", "0.1"};
  std::vector<std::string> policies{"adaptive",   "lru-priority", "s3-fifo", "arc",
                                       "turnover-priority", "freq-class", "freq-class-turnover"};
  std::string baseline = "lru";
  bool quick = false, json = false, no_store = false;
  int trials = 0;  // 0: 5, or 3 with --quick
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") quick = true;
    else if (a == "--json") json = true;
    else if (a == "--no-store") no_store = true;
    else if (a == "--trace" && i + 1 < argc) trace_path = argv[++i];
    else if (a == "--capacity-fractions" && i + 1 < argc) fractions = Split(argv[++i]);
    else if (a == "--policies" && i + 1 < argc) policies = Split(argv[++i]);
    else if (a == "--baseline" && i + 1 < argc) baseline = argv[++i];
    else if (a == "--trials" && i + 1 < argc && std::atoi(argv[i + 1]) > 0) trials = std::atoi(argv[++i]);
    else {
      (a == "--help" || a == "-h" ? std::cout : std::cerr)
          << "usage: bench_eviction [--trace FILE] [--capacity-fractions F,...] [--policies P,...]"
             " [--baseline P] [--no-store] [--quick] [--trials N] [--json]\n";
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  auto loaded = LoadMooncakeTrace(trace_path);
  if (!loaded.ok()) {
    std::cerr << "bench_eviction: " << loaded.status().ToString() << "\n";
    return 2;
  }
  const Workload w = Derive(std::move(*loaded));
  if (trials == 0) trials = quick ? 3 : 5;
  std::vector<Row> rows, lookup_rows;  // the lookup rows print after the others
  for (const std::string& f : fractions) {
    const double frac = std::stod(f);
    const size_t capacity = std::max<size_t>(1, static_cast<size_t>(frac * static_cast<double>(w.trace.distinct)));
    // Runs `pass` (a RunPolicy or RunStore) for `name` and the baseline in
    // alternating trials; adds the whole-pass row and the lookup-path row.
    // Returns the policy's hits.
    auto measure = [&](const std::string& kind, const std::string& name, const auto& pass) {
      if (!json) std::fprintf(stderr, "bench_eviction: %s %s at %s...\n", kind.c_str(), name.c_str(), f.c_str());
      uint64_t hits[2] = {0, 0};           // the policy's, the baseline's
      std::vector<LookupTime> lookups[2];  // per trial
      auto side = [&](int k) {
        return [&, k] {
          LookupTime lt;
          lt.per_request.reserve(w.trace.requests());
          const double n = pass(w, k == 0 ? name : baseline, capacity, &hits[k], &lt);
          lookups[k].push_back(std::move(lt));
          return n;
        };
      };
      auto [v, b] = MeasurePair(trials, side(0), side(1));
      Row row{kind + " " + name + " " + f, v, b};
      row.prefix_hit_rate = static_cast<double>(hits[0]) / static_cast<double>(w.trace.lookups());
      row.baseline_prefix_hit_rate = static_cast<double>(hits[1]) / static_cast<double>(w.trace.lookups());
      rows.push_back(row);
      row.name = "lookup " + row.name;
      row.value = LeastTimes(lookups[0]);
      row.baseline = LeastTimes(lookups[1]);
      lookup_rows.push_back(row);
      return hits[0];
    };
    for (const std::string& name : policies) measure("policy", name, RunPolicy);
    if (no_store) continue;
    for (const std::string& name : policies) {
      if (measure("store", name, RunStore) == 0) {
        std::cerr << "bench_eviction: the store running " << name << " hit nothing\n";
        return 1;
      }
    }
  }
  rows.insert(rows.end(), lookup_rows.begin(), lookup_rows.end());
  if (json) {
    nlohmann::json j = nlohmann::json::array();
    for (const Row& r : rows) {
      nlohmann::json e{{"name", r.name},           {"unit", "lookups/s"}, {"median", r.value.median},
                       {"min", r.value.min},       {"max", r.value.max},  {"baseline", baseline},
                       {"baseline_median", r.baseline.median}, {"ratio", r.value.median / r.baseline.median}};
      if (r.prefix_hit_rate >= 0) e["prefix_hit_rate"] = r.prefix_hit_rate;
      if (r.baseline_prefix_hit_rate >= 0) e["baseline_prefix_hit_rate"] = r.baseline_prefix_hit_rate;
      j.push_back(e);
    }
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("trace %s: %zu requests, %zu lookups, %zu distinct blocks; baseline: %s\n", trace_path.c_str(),
              w.trace.requests(), w.trace.lookups(), w.trace.distinct, baseline.c_str());
  std::printf("%-40s %10s %10s %8s %9s %9s %9s %9s\n", "benchmark (median of trials)", "Mlookup/s", "baseline",
              "ratio", "ns/lookup", "baseline", "prefix %", "baseline");
  for (const Row& r : rows) {
    std::printf("%-40s %10.2f %10.2f %7.3fx %9.0f %9.0f", r.name.c_str(), r.value.median / 1e6,
                r.baseline.median / 1e6, r.value.median / r.baseline.median, 1e9 / r.value.median,
                1e9 / r.baseline.median);
    if (r.prefix_hit_rate >= 0) std::printf(" %9.2f %9.2f", 100 * r.prefix_hit_rate, 100 * r.baseline_prefix_hit_rate);
    std::printf("\n");
  }
  return 0;
}

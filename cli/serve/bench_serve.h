// cli/serve/bench_serve.h — `kvmesh bench-serve`: the latency-throughput
// curve of a serving system with and without kvmesh (issue 33).
//
// For every configuration and every offered rate, one run: the same
// open-loop multi-turn workload (workload.h) sent round-robin to `engines`
// engines (engine.h; threads of this process, each with its own kvmesh
// client, or with engine_procs each a `kvmesh serve-engine` child process:
// engine_proc.h), measured per request (TTFT, TPOT) and summarised (RunResult).
// (Round robin, or KV-aware with a -kv / -kv-approx suffix: routing.h; with
// a further +procs suffix, that configuration's engines are child processes.)
// Configurations:
//   recompute     every prompt prefilled whole; no cache
//   local         each engine's own device-tier prefix cache only
//   kvmesh        local cache + kvmesh as the shared tier, load-or-recompute decided per block run
//   kvmesh-blind  the same, every run kvmesh holds loaded (the blind policy)
//   kvmesh-ssd, kvmesh-ssd-blind   the same two against a second cluster
//                 under pressure: small device and host tiers over an SSD
//                 tier, so most of what a load finds was demoted to the SSD
// The kvmesh tier is real: daemons started the usual way (daemons.h), or an
// embedded cluster in this process (cluster = "embedded", for tests).
// Each run keeps its keys apart from the others' (its own tenant salt).
//
// Thread-safety: RunBenchServe is a function of its options; one at a time
// per process (it starts threads and daemons).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/serve/engine.h"
#include "cli/serve/reference.h"
#include "cli/serve/roofline.h"
#include "cli/serve/routing.h"
#include "cli/serve/workload.h"
#include "kvmesh/status.h"

namespace kvmesh {
class NetworkClient;
}

namespace kvmesh::serve {

struct BenchServeOptions {
  std::string engine_model = "roofline:llama-3.1-8b:h200";
  double mfu = 0.5, mbu = 0.8;
  std::vector<double> rates = {2, 4, 8};
  std::vector<std::string> configs = {"recompute", "local", "kvmesh", "kvmesh-blind"};
  uint32_t engines = 2;
  WorkloadOptions workload;       // rate is set per run
  // A Mooncake-format trace (path) as the schedule instead of `workload`:
  // one run per configuration, rates ignored (the trace's own, x trace.speed).
  std::string trace_path;
  TraceWindow trace;
  double drain_s = 20;            // after the last arrival, unfinished requests get this long
  uint32_t block_tokens = 16;
  size_t local_cache_blocks = 4096;  // 64k tokens: 8 GiB of Llama-3.1-8B KV
  uint32_t max_batch = 64;
  uint64_t max_prefill_tokens = 16384;
  uint32_t kv_scale = 8;          // blocks move at 1/kv_scale of their real size
  // The kvmesh tier.
  std::string cluster = "daemons";  // "daemons" | "embedded"
  std::string transport = "tcp";    // "tcp" | "ucx" (daemons)
  std::string kvmesh_bin;           // the kvmesh binary (daemons)
  std::string work_dir;             // daemons' config and logs (default /tmp/kvmesh-bench-serve-<pid>)
  uint32_t nodes = 2;
  uint64_t node_memory = 1ull << 30;  // bytes moved per node (host tier)
  // The pressure cluster (kvmesh-ssd*): device and host tiers of
  // pressure_memory each, then an SSD tier of ssd_memory in work_dir.
  uint64_t pressure_memory = 16ull << 20;
  uint64_t ssd_memory = 4ull << 30;
  double probe_interval_s = 1.0;    // shadow loads: at most one per this long per run (LinkEstimate)
  uint32_t prefix_reps = 3;         // RunPrefixCheck: loads of each prefix after the first (their median is reported)
  // The SLO a request must meet to count in goodput.
  double slo_ttft_s = 0.5, slo_tpot_s = 0.05;
  // The -kv-approx configurations: how long a routed prompt counts as on its engine (routing.h).
  double approx_ttl_s = 30;
  // Each engine a child process (`kvmesh_bin serve-engine`, engine_proc.h)
  // with its own kvmesh client, instead of a thread of this process; the
  // kvmesh configurations then need cluster = "daemons".
  bool engine_procs = false;
};

struct RunResult {
  std::string config;
  double rate = 0;                 // offered, nominal
  uint64_t requests = 0, finished = 0, met_slo = 0;
  double window_s = 0;             // first to last arrival
  double offered_rps = 0;          // requests / window
  double ttft_p50 = 0, ttft_p99 = 0, tpot_p50 = 0, tpot_p99 = 0;  // seconds (unfinished: time waited, a floor)
  double req_s = 0, tok_s = 0, goodput = 0;  // finished/s, output tok/s, met_slo/s over the window
  double hit_rate = 0;             // prompt tokens not prefilled / prompt tokens
  double local_hit_rate = 0, loaded_rate = 0;
  // The second and later turns alone (each one's prefix is its session's past).
  double later_turn_hit_rate = 0;
  DecisionCounters decisions;
  RoutingCounters routing;         // the -kv configurations (routing.h)
  double link_latency_s = 0, link_bytes_per_s = 0;  // the estimate at the run's end
  double link_deviation = 0;       // its per-byte cost's mean deviation / mean
  double probe_latency_s = 0, probe_bytes_per_s = 0;  // the seed (the probe)
  // Per request (same order as the schedule): TTFT (unfinished: time waited)
  // and RequestRecord::run, to compare the same requests across configurations.
  std::vector<double> ttft;
  std::vector<uint8_t> run;
  // The bound per request, in this run (RequestRecord::kvmesh_path_s against
  // recompute_path_s): over the requests kvmesh held a run for (hits), the
  // ratio's p50, p99 and max and how many were over 1.05; over every request
  // with a lookup (misses too: they waited for it), how many were over 1.05.
  uint64_t path_hits = 0, path_hits_over = 0, path_lookups = 0, path_lookups_over = 0;
  double path_ratio_p50 = 0, path_ratio_p99 = 0, path_ratio_max = 0;
  // KV bytes the kvmesh tier held at the run's end less at its start (what
  // the run added, net of what it evicted), per tier, at real size (stored
  // bytes x kv_scale; a codec's blocks at their encoded size), and the same
  // blocks' raw size; the cluster's codec.
  struct Held {
    double device = 0, host = 0, ssd = 0, logical = 0;
  } held;
  std::string codec;
  double seconds = 0;              // wall time of the run
};

// Progress: (run label, requests arrived, finished, total) a few times a second.
using ServeProgress = std::function<void(const std::string&, uint64_t, uint64_t, uint64_t)>;

// Every configuration at every rate. InvalidArgument for an unknown config
// or engine model; Unavailable when the daemons do not start.
Result<std::vector<RunResult>> RunBenchServe(const BenchServeOptions& o, const ServeProgress& progress = {});

// A hit against a recompute, one request alone: a prefix of prefix_tokens
// stored in kvmesh, then a request of that prefix + suffix_tokens. TTFT of
// recomputing = the engine model's prefill of the whole prompt; TTFT of the
// hit = the lookup as measured + the load (measured x kv_scale) + the prefill of the
// suffix after the cached prefix; the decision picks one by its estimates
// (a fresh probe and every load before the request), and its TTFT is what the
// pick costs. The prefix is requested 1 + prefix_reps times: the first
// request after the store is reported apart (first_*), the medians are of the
// prefix_reps after it.
// One request of the check: the estimate and decision at its arrival, the
// lookup and load as measured, the hit's TTFT and the TTFT as decided.
struct PrefixRequest {
  double est_load_s = 0, lookup_s = 0, load_s = 0, hit_ttft_s = 0, decided_ttft_s = 0;
  size_t got = 0;  // blocks the load found
  bool decided_load = false;
};
struct PrefixCheckResult {
  uint32_t prefix_tokens = 0, suffix_tokens = 0;
  double recompute_ttft_s = 0, hit_ttft_s = 0;
  double decided_ttft_s = 0;  // the median of the reps' TTFT as decided at each request
  double lookup_s = 0;  // MatchPrefix, measured
  double load_s = 0;    // lookup_s + the GetBatch's measured time x kv_scale (the median of prefix_reps)
  double load_min_s = 0, load_max_s = 0;  // the fastest and slowest of the prefix_reps loads
  size_t blocks_got = 0;                  // blocks the median load found (all of the prefix, unless evicted)
  double est_load_s = 0;                  // the median of the estimates at the reps' requests
  double est_recompute_s = 0;
  bool decided_load = false;              // decided_loads > reps / 2
  uint32_t reps = 0, decided_loads = 0;   // the reps, and how many of them the decision loaded
  PrefixRequest first;  // the first request after the store, apart
  uint64_t bytes = 0;  // real-size bytes of the prefix's KV
  // The wait, before the first timed load, for the nodes to warm the
  // registered destination (LocalDaemons::WaitWarmed; the same for every row).
  double pool_warm_s = 0;
};
// progress(prefix tokens), when given, once a prefix is stored (before its load).
Result<std::vector<PrefixCheckResult>> RunPrefixCheck(const BenchServeOptions& o,
                                                      const std::vector<uint32_t>& prefix_tokens,
                                                      uint32_t suffix_tokens = 16,
                                                      const std::function<void(uint32_t)>& progress = {});

// The kvmesh tier of the runs, for the world-model workload (world_serve.h):
// the cluster config of `model`'s KV layout (the options' nodes, memory and
// transport), its daemons (none for cluster = "embedded"), and one router per
// engine under a run's tenant salt (embedded: one router shared).
class LocalDaemons;
Result<nlohmann::json> ServeClusterJson(const BenchServeOptions& o, const Roofline& model);
Result<std::unique_ptr<LocalDaemons>> StartServeDaemons(const BenchServeOptions& o, const nlohmann::json& cluster);
struct ServeTier {
  virtual ~ServeTier() = default;
  virtual Router& router(size_t engine) = 0;
};
Result<std::unique_ptr<ServeTier>> OpenServeTier(const BenchServeOptions& o, const nlohmann::json& cluster,
                                                 const LocalDaemons* daemons, const std::string& salt);

// The engine model o.engine_model names: its roofline (for `reference`, its
// shape only: KV bytes per token) and, for `reference`, the model computed.
struct EngineModel {
  std::optional<Roofline> roofline;
  std::shared_ptr<const ReferenceShared> reference;
};
Result<EngineModel> LoadEngineModel(const std::string& engine_model, double mfu, double mbu);

// An engine's kvmesh client of the daemons at `coordinator` (host:port)
// under the run's tenant salt, once the coordinator lists `nodes` nodes (10 s
// at most: a node prints its listening line before the coordinator lists it).
Result<std::unique_ptr<NetworkClient>> ConnectEngineClient(const std::string& coordinator, const std::string& client_id,
                                                          const std::string& salt, size_t nodes);

// Percentile p (0..100) of v (sorted inside); 0 for an empty v.
double Percentile(std::vector<double> v, double p);

}  // namespace kvmesh::serve

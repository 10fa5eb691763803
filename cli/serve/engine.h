// cli/serve/engine.h — one inference engine of `kvmesh bench-serve`: a
// continuous-batching loop whose compute time comes from an engine model
// (roofline.h) and whose KV really moves through kvmesh.
//
// Each step admits waiting requests (up to max_batch running, max_prefill_tokens
// new tokens a step; at least one), finds each one's cached prefix, then
// prefills the rest of every admitted prompt and decodes one token for every
// running request, as one batched step of the engine model. The prefix comes
// from, in order: the engine's own device-tier prefix cache (an LRU over
// blocks, local_cache_blocks of them: what vLLM or SGLang keep alone), then,
// with the kvmesh tier, the run of blocks after it that kvmesh holds
// (Router::MatchPrefix, asked by the engine's lookup thread from the
// request's arrival, so that the lookup overlaps the step in progress;
// admission waits for it within a bound, EngineOptions::lookup_wait_share). Per such run the engine decides to load it (GetBatch)
// or to recompute it (LoadPolicy below); the decision and its inputs are
// counted. A load runs on the engine's loader thread while the batch goes on
// (as vLLM's and SGLang's asynchronous KV loads do); the request is admitted
// at the first step after its load. Prompt blocks go to kvmesh after their prefill and the answer's
// blocks after the last token, from a background thread (an asynchronous
// offload, as engine connectors do), never from the step.
//
// Time: the step's wall time is real: its admissions' waits for lookups as
// measured + the engine model's step time (slept). A load takes its measured time, then the loader
// sleeps kv_scale - 1 times that (bytes move at 1 / kv_scale of their real
// size, see EngineOptions::kv_scale).
//
// Thread-safety: Submit and Finish from any thread; records() once Join returned.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cli/serve/reference.h"
#include "cli/serve/roofline.h"
#include "cli/serve/workload.h"
#include "kvmesh/router.h"

namespace kvmesh::serve {

enum class CacheMode { kRecompute, kLocal, kKvmesh };
// kDecide: load a run when the estimated load time (LinkEstimate, a
// pessimistic estimate) is below its recompute time (the engine model), else
// recompute it. kBlind: always load.
enum class LoadPolicy { kDecide, kBlind };

// The measured cost of a load from one kvmesh tier over one link, in
// real-size bytes: a fixed cost per load (an intercept: the GetBatch call,
// its round trips to the nodes) plus bytes x seconds-per-byte (a slope),
// fitted apart from the recent loads seen (the last kWindow): where they
// hold sizes at least 1.5x apart, the slope is the median of the slopes
// between such pairs and the intercept the median of (seconds - slope x
// bytes) (a Theil-Sen line: a few noisy loads do not move it); where they
// hold one size, the intercept is kept and the slope is the median of
// (seconds - intercept) / bytes. One cost per byte (the first cut, an EWMA of
// seconds / bytes) charged a fixed cost seen on small loads to every byte of
// a big one, and so passed up big hits.
// Its deviation is the larger of an EWMA (weight 0.25) of each load's error
// against the estimate before it, as a share of that estimate, each error
// clipped at max(3 x the deviation, 0.5) (one outlier, such as the first get
// after a store, moves it by at most a quarter of that), and the second
// largest slowness (error > 0) of the window's loads (one outlier in the
// window is forgiven, two are not: a link that really slowed, or a tier
// with a heavy tail). Estimate is pessimistic,
// like a TCP retransmission timer: intercept + bytes x slope x (1 + 2 x
// deviation), so a link whose speed swings is trusted less. Seeded by a
// probe (ProbeLink: gets of several sizes, Seed()ed into the window; the
// constructor's intercept and slope until loads of two sizes were seen; its
// deviation share 0.5 when not given: unsure until loads were seen).
// ClaimProbe keeps it learning while the decision recomputes: at most once per
// probe_interval_s, the caller measures a load nobody waits for (a shadow
// load) and Observes it. Thread-safe (shared by the engines of a run).
class LinkEstimate {
 public:
  // deviation_share: the seed's deviation as a share of the load time.
  LinkEstimate(double latency_s, double seconds_per_byte, double probe_interval_s = 1.0,
               double deviation_share = 0.5);
  double Estimate(double bytes) const;
  // A load seen: into the window, the fit and the deviation.
  void Observe(double bytes, double seconds);
  // A probe's load: into the window and the fit, not the deviation nor observed().
  void Seed(double bytes, double seconds);
  // True at most once per probe_interval_s (the caller then shadow-loads);
  // now_s on any monotonic clock.
  bool ClaimProbe(double now_s);
  double latency_s() const;        // the fixed cost per load (intercept)
  double bytes_per_s() const;      // 1 / the per-byte cost (slope)
  double deviation() const;        // the loads' error / the estimate (see above)
  uint64_t observed() const;

  static constexpr size_t kWindow = 16;

 private:
  void AddLocked(double bytes, double seconds);  // into the window, then refit
  void FitLocked();
  double DeviationLocked() const;

  struct Load {
    double bytes = 0, seconds = 0;
  };
  mutable std::mutex mu_;
  double latency_s_, cost_, dev_;  // guarded by mu_ (cost_: seconds per byte; dev_: share)
  double probe_interval_s_, last_probe_s_ = -1e300;  // guarded by mu_
  uint64_t observed_ = 0;          // guarded by mu_
  std::array<Load, kWindow> window_{};  // guarded by mu_: a ring, the last `held_` loads
  size_t held_ = 0, next_ = 0;     // guarded by mu_
  std::array<double, kWindow> slow_{};  // guarded by mu_: a ring, the last loads' error when slow, else 0
  size_t slow_held_ = 0, slow_next_ = 0;  // guarded by mu_
};

// Chained hashes of the full blocks of `tokens` (FNV-1a over the previous
// hash and the block's tokens): block i's hash names the whole prefix. The
// names the engine's own prefix cache keeps.
std::vector<uint64_t> BlockChain(const std::vector<TokenId>& tokens, uint32_t block_tokens);

// Told, from the engine's thread, the blocks its own prefix cache gained and
// evicted in one insertion (an engine's KV events: BlockStored, BlockRemoved).
using LocalCacheListener = std::function<void(std::span<const uint64_t> stored, std::span<const uint64_t> removed)>;

struct EngineOptions {
  const Roofline* model = nullptr;       // required (with `reference`: its shape only, for KV bytes)
  // The `reference` engine model (reference.h): steps really compute; null: the roofline's time is slept.
  std::shared_ptr<const ReferenceShared> reference;
  uint32_t block_tokens = 16;
  size_t local_cache_blocks = 4096;      // 0 with kRecompute
  uint32_t max_batch = 64;
  uint64_t max_prefill_tokens = 16384;   // new tokens per step (a longer prompt runs alone)
  CacheMode mode = CacheMode::kRecompute;
  LoadPolicy policy = LoadPolicy::kDecide;
  Router* router = nullptr;              // the kvmesh tier (kKvmesh); shared, thread-safe
  LinkEstimate* link = nullptr;          // kKvmesh
  // Blocks move at real_block_bytes / kv_scale bytes (what fits this
  // machine); a load's measured time is charged kv_scale times (conservative:
  // its fixed latency is scaled too).
  uint32_t kv_scale = 1;
  std::chrono::steady_clock::time_point origin;  // time 0 of the request schedule
  LocalCacheListener on_local_cache;     // optional: KV-aware routing's feed (routing.h)
  // The lookup (MatchPrefix) runs on the engine's lookup thread from the
  // request's arrival, while the engine's current step goes on; admission
  // waits for its answer at most lookup_wait_share x the engine model's
  // recompute time of the request's uncached tokens, then takes it as a miss
  // (so a slow lookup costs a request at most that share over recomputing).
  // 0.04: the 5% bound less a margin for a wait that ends late (a budget of
  // the whole 5% overshot: 1.052x once in a quiet pressure run).
  double lookup_wait_share = 0.04;
  // Shadow loads (LinkEstimate::ClaimProbe) move at most this many blocks of
  // the run (the estimate is per byte) and run on the background (put)
  // thread, at a lower scheduling priority than the engine's step, never on
  // the loader that the loaded requests wait for.
  uint32_t shadow_max_blocks = 64;
};

// One request's fate. Times in seconds from the run's origin; < 0: never.
struct RequestRecord {
  double arrival = 0, first_token = -1, finish = -1;
  uint32_t prompt_tokens = 0, output_tokens = 0;
  uint32_t local_hit_tokens = 0;   // from the engine's own cache
  uint32_t loaded_tokens = 0;      // loaded from kvmesh
  uint32_t engine = 0;
  // kvmesh held a run of this prompt beyond the local prefix: 0 no, 1 loaded, 2 recomputed.
  uint8_t run = 0;
  // The same request against recomputing it, in this run (kKvmesh): what its
  // path through kvmesh cost before its prefill could start or end (the wait
  // for its lookup, for a load: the time from the decision to its admission
  // plus the engine model's prefill of the rest; else the prefill of every
  // uncached token) against the engine model's prefill of every token after
  // the local prefix. 0 without a lookup.
  double kvmesh_path_s = 0, recompute_path_s = 0;
};

struct DecisionCounters {
  uint64_t lookups = 0;               // MatchPrefix calls
  uint64_t runs = 0;                  // block runs kvmesh held beyond the local prefix
  uint64_t runs_loaded = 0, runs_recomputed = 0;
  uint64_t blocks_loaded = 0, blocks_recomputed = 0;  // blocks of those runs
  uint64_t load_misses = 0;           // blocks MatchPrefix saw that GetBatch then missed
  double est_load_s = 0, est_recompute_s = 0;  // of every run, whichever was chosen
  double charged_load_s = 0;          // what the loads cost (measured x kv_scale)
  // Loads slower than their recompute estimate: count and the time lost.
  uint64_t loads_slower = 0;
  double load_loss_s = 0;
  uint64_t bytes_loaded = 0, bytes_put = 0;   // real-size bytes (moved: / kv_scale)
  uint64_t put_errors = 0, get_errors = 0;
  // The bound: per run, what the decision cost (a load's charged time, or
  // the recompute estimate) against recomputing it; loads over 1.05 x their
  // recompute are counted (the 5% bound).
  double decided_s = 0;
  uint64_t loads_over_bound = 0;
  double worst_load_ratio = 0;        // max charged load / recompute of a loaded run
  // Shadow loads (LinkEstimate::ClaimProbe): loads measured for the estimate
  // while their run was recomputed.
  uint64_t shadow_loads = 0;
  double shadow_load_s = 0;
  // The lookups on the request's path: the time admissions waited for a
  // lookup's answer, the lookups not back within their bound (taken as
  // misses), and the lookups' own time (on the lookup thread).
  double lookup_wait_s = 0, lookup_rpc_s = 0;
  uint64_t lookup_timeouts = 0;
  void Add(const DecisionCounters& o);
};

class Engine {
 public:
  Engine(uint32_t index, EngineOptions o, const std::vector<ServeRequest>* requests,
         std::vector<RequestRecord>* records);
  ~Engine();
  void Start();
  void Submit(size_t request);  // request index; its arrival time has come
  void Finish();                // no more submissions: drain, then stop
  void Join();                  // after Finish
  void Abort();                 // stop now (unfinished requests stay unfinished)
  const DecisionCounters& counters() const { return counters_; }
  uint64_t finished() const { return finished_.load(std::memory_order_relaxed); }

 private:
  // A request inside the engine.
  struct Live {
    size_t index = 0;
    std::vector<uint64_t> chain;  // chained block hashes of prompt + output
    uint64_t cached_tokens = 0;   // prefix not computed (local hit + loaded)
    uint64_t new_tokens = 0;      // computed in its prefill
    size_t remote_blocks = 0;     // leading blocks kvmesh holds (stored: no put needed)
    uint32_t generated = 0;
    // A load handed to the loader thread: blocks [local_blocks, + load_count).
    bool looked_up = false;
    size_t local_blocks = 0, load_count = 0, got = 0;
    double est_recompute_s = 0, measured_load_s = 0, charged_load_s = 0;
    double decided_at = 0;        // Now() when its load was decided (a load's wait, for the bound)
    double lookup_wait_s = 0;     // admission's wait for its lookup
    bool lookup_late = false;     // its lookup was not back in time: a miss
    int seq = -1;                 // its sequence in compute_ (the reference engine model)
  };
  class LocalCache;
  void Loop();
  void PutLoop();
  // Finds r's prefix; false when its kvmesh run went to the loader (r moved).
  bool Admit(Live& r);
  void LoadLoop();
  void LookupLoop();
  // The lookup's answer for request i (leading blocks kvmesh holds), waiting
  // at most wait_s; nullopt when it is not back by then.
  std::optional<size_t> AwaitLookup(size_t i, double wait_s);
  void ShadowLoad(size_t request, size_t first_block, size_t blocks);
  void StoreBlocks(Live& r, size_t upto_tokens);
  double Now() const;
  double RecomputeSeconds(uint64_t new_tokens, uint64_t cached_tokens) const;
  double RealBlockBytes() const;

  const uint32_t index_;
  const EngineOptions o_;
  const std::vector<ServeRequest>* const requests_;
  std::vector<RequestRecord>* const records_;
  std::unique_ptr<LocalCache> local_;
  std::unique_ptr<ReferenceCompute> compute_;  // engine thread; with o_.reference
  DecisionCounters counters_;  // engine thread; read after Join
  std::vector<std::byte> payload_;
  std::atomic<uint64_t> finished_{0};

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<size_t> inbox_;  // guarded by mu_
  std::deque<Live> ready_;    // guarded by mu_: loaded, back from the loader
  size_t loads_in_flight_ = 0;  // engine thread only
  double wake_late_s_ = 0;      // engine thread only: how late lookup waits ended (an EWMA, up fast, down slowly)
  bool finishing_ = false, aborted_ = false;  // guarded by mu_

  struct PutJob {
    size_t request;
    size_t first_block, end_block;
    bool shadow = false;      // a shadow load of these blocks, not a put
  };
  std::mutex put_mu_;
  std::condition_variable put_cv_;
  std::deque<PutJob> puts_;   // guarded by put_mu_
  bool put_stop_ = false;     // guarded by put_mu_
  std::atomic<uint64_t> bytes_put_{0}, put_errors_{0};

  std::mutex load_mu_;
  std::condition_variable load_cv_;
  std::deque<Live> loads_;     // guarded by load_mu_
  bool load_stop_ = false;     // guarded by load_mu_
  std::atomic<uint64_t> load_errors_{0};
  std::atomic<uint64_t> shadow_loads_{0}, shadow_load_us_{0};

  // Lookups from arrival (LookupLoop): per request, -1 pending, else the
  // leading blocks kvmesh holds (0 on an error).
  std::mutex lookup_mu_;
  std::condition_variable lookup_cv_;
  std::deque<size_t> lookups_;  // guarded by lookup_mu_
  bool lookup_stop_ = false;    // guarded by lookup_mu_
  std::unique_ptr<std::atomic<int64_t>[]> remote_;
  std::atomic<uint64_t> lookup_rpc_us_{0}, lookup_errors_{0};

  std::thread thread_, put_thread_, load_thread_, lookup_thread_;
};

}  // namespace kvmesh::serve

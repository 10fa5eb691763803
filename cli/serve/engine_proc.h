// cli/serve/engine_proc.h — `kvmesh bench-serve --engine-procs`: each engine
// a child process (`kvmesh serve-engine`) with its own kvmesh client, driven
// by the harness over its stdin and stdout (one line per message).
//
// The child runs the same Engine (engine.h) as the in-process runs. Its
// options come as the first stdin line (EngineProcConfig as JSON: the engine
// model, cache mode and policy, the coordinator's address and the run's
// tenant salt, the seed of the load estimate, and the schedule's options: the
// schedule is a pure function of them, so the child rebuilds the same
// requests and checks their hash); it connects to the daemons (TCP or UCX as
// the cluster's config says) and answers {"ready":true}. Then, on stdin:
//   "origin <ns>"  time 0 of the schedule, steady_clock (CLOCK_MONOTONIC) ns:
//                  one host, one clock
//   "<index>"      request <index> arrived (Engine::Submit)
//   "end"          no more arrivals (Engine::Finish)
//   end of input   stop now (Engine::Abort), report, exit
// and on stdout:
//   {"f":n}                  n requests finished (the harness's in-flight
//                            count for routing, and progress)
//   {"c":[...],"x":[...]}    its prefix cache stored / evicted these blocks
//                            (only when asked: KV-aware routing's events)
//   {"r":[i, first_token, finish, local, loaded, run, kvmesh_path_s,
//         recompute_path_s]}  after the stop, one per request it was given
//   {"d":{...},"link":[latency_s, bytes_per_s, deviation]}  its
//                            DecisionCounters and its load estimate at the end
//   {"done":true}            last line
// or {"error":"..."} and exit 1 when it cannot start.
//
// Lifetime: the child dies with the harness (PR_SET_PDEATHSIG, and its
// stdin's end); an EngineProcess kills its child's process group when it is
// destroyed and the child has not exited 5 s after its stdin closed. A child
// that exits before {"done"} is dead: death() says how, and the run fails
// with that report rather than waiting for its requests.
//
// Thread-safety: an EngineProcess is driven from one thread; finished() and
// death() from any. Its reader thread calls the cache listener.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/serve/engine.h"
#include "cli/serve/workload.h"
#include "kvmesh/status.h"

namespace kvmesh::serve {

// What a child needs to run engine `index` of one run.
struct EngineProcConfig {
  uint32_t index = 0;
  std::string engine_model;
  double mfu = 0.5, mbu = 0.8;
  uint32_t block_tokens = 16, max_batch = 64, kv_scale = 1;
  uint64_t local_cache_blocks = 0, max_prefill_tokens = 16384;
  int mode = 0, policy = 0;          // CacheMode, LoadPolicy
  std::string coordinator, salt;     // kKvmesh: the daemons' coordinator, the run's tenant salt
  uint64_t nodes = 0;                // nodes the coordinator must list before the child is ready
  double link_latency_s = 0, link_seconds_per_byte = 0, probe_interval_s = 1;  // LinkEstimate's seed
  double link_deviation_share = 0.5;                                          // its deviation / its cost
  bool kv_events = false;            // send its prefix cache's events ({"c","x"})
  // The schedule: MakeWorkload(workload), or the trace's window when trace_path is set.
  WorkloadOptions workload;
  std::string trace_path;
  TraceWindow trace;
  uint64_t schedule_hash = 0;        // ScheduleHash of the harness's schedule
};
nlohmann::json ToJson(const EngineProcConfig& c);

// FNV-1a over every request's arrival and tokens: the child's schedule must
// be the harness's.
uint64_t ScheduleHash(const std::vector<ServeRequest>& requests);

class EngineProcess {
 public:
  // Spawns `kvmesh_bin serve-engine` (stderr to log_path), sends `config`
  // and waits at most timeout_s for its ready line. `listener`, when set, is
  // called with its prefix cache's events (from the reader thread).
  static Result<std::unique_ptr<EngineProcess>> Start(const std::string& kvmesh_bin, const EngineProcConfig& config,
                                                      const std::string& log_path, LocalCacheListener listener,
                                                      double timeout_s);
  ~EngineProcess();
  Status Begin(std::chrono::steady_clock::time_point origin);
  void Submit(size_t request);  // a write to a dead child is dropped (death() says why)
  void Finish();
  // Stops the child (its stdin closes), waits at most timeout_s for its
  // report, then kills it; fills recs[i] of the requests it reported (first
  // token, finish, hits, run, path times) and its counters and estimate.
  Status Collect(std::vector<RequestRecord>* recs, double timeout_s);
  uint64_t finished() const { return finished_.load(std::memory_order_relaxed); }
  // Empty while the child lives or after it reported; else how it died.
  std::string death() const;
  const DecisionCounters& counters() const { return counters_; }
  double link_latency_s = 0, link_bytes_per_s = 0, link_deviation = 0;  // after Collect
  pid_t pid() const { return pid_; }

 private:
  EngineProcess() = default;
  void ReadLoop();
  bool WriteLine(const std::string& line);
  void CloseInput();
  // Waits at most grace_s for the child to exit, then kills its process
  // group; its wait status. Once: from the reader thread when it died before
  // its report, else from the owner (after the reader saw its end, or when
  // it gave up on it).
  int Reap(double grace_s);

  uint32_t index_ = 0;
  std::string log_;
  pid_t pid_ = -1;
  int in_ = -1, out_ = -1;
  std::mutex reap_mu_;
  bool reaped_ = false;  // guarded by reap_mu_: the reader (a death) or the owner waited for it
  LocalCacheListener listener_;
  std::atomic<uint64_t> finished_{0};
  DecisionCounters counters_;
  std::thread reader_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool ready_ = false, done_ = false, eof_ = false;  // guarded by mu_
  std::string error_;                                 // guarded by mu_: its {"error"} line
  std::vector<nlohmann::json> records_;               // guarded by mu_: its {"r"} lines
  nlohmann::json report_;                             // guarded by mu_: its {"d"} line
  std::string death_;                                 // guarded by mu_
};

// The child: `kvmesh serve-engine` (protocol above) on stdin and stdout.
int RunServeEngine();

}  // namespace kvmesh::serve

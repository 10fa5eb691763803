// tests/soak/soak.h — shared pieces of kvmesh_soak, the soak / chaos harness
// (docs/soak.md): options, the counters every thread bumps, the invariant
// log, and the payload functions that let every byte read back be checked.
//
// Every payload is a pure function of what names it: a block of the prefix
// workload is Payload(key, seed), a live sequence's K/V row is
// SeqRow(seed, token, position, layer, head, kv). A byte read back that
// differs from the function's value is a wrong byte, whoever wrote it.
//
// Thread-safety: Stats is atomics; Invariants and Context lock themselves.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvmesh/status.h"
#include "kvmesh/types.h"

namespace kvmesh::soak {

using SteadyClock = std::chrono::steady_clock;

struct Options {
  std::string kvmesh_bin;       // the kvmesh binary the daemons run
  double seconds = 300;         // soak duration after warm-up
  uint32_t nodes = 3;           // kvmesh node daemons
  uint32_t prefix_threads = 3;  // Put/MatchPrefix/GetBatch clients
  uint32_t seq_threads = 2;     // live-sequence clients
  uint64_t seed = 42;
  int64_t timeout_ms = 1000;       // every client call's timeout
  int64_t timeout_margin_ms = 1500;  // a call may take timeout + margin (one refresh + retry, scheduling)
  int64_t recover_ms = 10000;      // bound: a restarted node serving again
  int64_t hit_recover_ms = 20000;  // bound: hit rate back to half its pre-kill level
  int64_t chaos_gap_ms = 1500;     // mean pause between chaos events
  std::string node_memory = "2MiB";  // device (primary) budget per node
  std::string node_host = "4MiB";    // host tier budget per node ("" = no tier)
  std::string transport = "tcp";     // data plane: tcp | ucx (malformed frames always go to the TCP port)
  uint32_t replicas = 1;             // $.placement.replicas: copies of each block
  uint32_t fd_slack = 12;      // fds the client may hold more at the end than at the start
  uint32_t thread_slack = 2;
  std::string json_out;        // also write the report here
  std::string work_dir;        // config and daemon logs (default /tmp/kvmesh-soak-<pid>)
  bool keep_logs = false;
  bool chaos = true;
  // After a StaleEpoch answer the router refreshes the map once and retries;
  // when that refresh fails (the coordinator unreachable just then), the
  // StaleEpoch reaches the caller. With this set it is a counted refusal of
  // any call or GetBatch item (Stats::stale_epoch), not a violation. The soak
  // leaves it off: there only a Put may answer it.
  bool stale_epoch_refusal = false;
};

// Counters of one kind of client call.
struct OpStats {
  std::atomic<uint64_t> calls{0}, ok{0};
  std::atomic<uint64_t> miss[16] = {};     // by StatusCode, IsMiss codes
  std::atomic<uint64_t> refused[16] = {};  // by StatusCode, documented refusals
  std::atomic<uint64_t> max_us{0}, over_timeout{0};
};

enum Op : int {
  kMatch, kGetBatch, kPut, kGetUnknown, kSeqCreate, kSeqAppend, kSeqTruncate, kSeqFork, kSeqRead, kSeqInfo,
  kSeqRelease, kFill, kProbe, kNumOps
};
const char* OpName(int op);

struct Stats {
  OpStats ops[kNumOps];
  std::atomic<uint64_t> prompt_blocks{0}, matched_blocks{0};  // prefix hit rate = matched / prompt
  std::atomic<uint64_t> read_hits{0}, read_gone{0};           // blocks read back after a match, and gone since
  std::atomic<uint64_t> blocks_put{0}, blocks_verified{0}, bytes_verified{0};
  std::atomic<uint64_t> seq_bytes_verified{0}, seq_tokens_verified{0};
  std::atomic<uint64_t> seq_attached_tokens{0};               // prefix reuse by CreateSequence
  std::atomic<uint64_t> seq_killed_probes{0}, seq_killed_unavailable{0}, seq_killed_notfound{0};
  std::atomic<uint64_t> seq_resyncs{0};                       // state re-read after a failed mutation
  std::atomic<uint64_t> wrong_bytes{0};
  // Chaos.
  std::atomic<uint64_t> kills{0}, restarts{0}, stalls{0}, fills{0}, fill_blocks{0};
  std::atomic<uint64_t> coordinator_kills{0}, served_without_coordinator{0};
  std::atomic<uint64_t> replica_checked{0}, replica_served{0};  // kept blocks read with one node down
  std::atomic<uint64_t> garbage_conns{0}, garbage_closed{0};
  std::atomic<uint64_t> corrupt_puts{0}, corrupt_refused{0};  // torn PUT payloads, refused DATA_LOSS
  std::atomic<uint64_t> unexpected_exits{0};
  std::atomic<uint64_t> stale_epoch{0};  // StaleEpoch answers let through by Options::stale_epoch_refusal
};

// The invariant log: every violation with its time; the run fails on any.
class Invariants {
 public:
  explicit Invariants(SteadyClock::time_point start) : start_(start) {}
  void Violation(const std::string& kind, const std::string& what);
  size_t count() const;
  nlohmann::json Json() const;  // {"total", "by_kind", "first": [...]}

 private:
  SteadyClock::time_point start_;
  mutable std::mutex mu_;
  std::map<std::string, uint64_t> by_kind_;  // guarded by mu_
  std::vector<nlohmann::json> first_;        // guarded by mu_, the first 50
  size_t total_ = 0;                         // guarded by mu_
};

// ---- payloads ---------------------------------------------------------------

inline uint64_t Mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Fills out with the stream of words Mix(s), Mix(s+1), ... (little-endian).
inline void FillStream(uint64_t s, std::span<std::byte> out) {
  size_t i = 0;
  for (; i + 8 <= out.size(); i += 8) {
    uint64_t w = Mix(s++);
    std::memcpy(out.data() + i, &w, 8);
  }
  if (i < out.size()) {
    uint64_t w = Mix(s);
    std::memcpy(out.data() + i, &w, out.size() - i);
  }
}

// The only bytes key `k` ever holds in the prefix workload.
inline void Payload(const BlockKey& k, uint64_t seed, std::span<std::byte> out) {
  FillStream(Mix(k.hi ^ Mix(k.lo ^ seed)), out);
}

// K (kv=0) or V (kv=1) of one head of one layer of the token at `pos`.
inline void SeqRow(uint64_t seed, TokenId tok, uint32_t pos, uint32_t layer, uint32_t head, uint32_t kv,
                   std::span<std::byte> out) {
  uint64_t s = Mix(seed ^ (uint64_t(uint32_t(tok)) << 20) ^ pos);
  s = Mix(s ^ (uint64_t{layer} << 40) ^ (uint64_t{head} << 8) ^ kv);
  FillStream(s, out);
}

class Cluster;

// What every soak thread shares. The cluster is read only through its
// generation counters (atomics) outside the chaos thread.
struct Context {
  Context(const Options& opts, SteadyClock::time_point t0) : o(opts), inv(t0), start(t0) {}
  const Options& o;
  Stats st;
  Invariants inv;
  Cluster* cluster = nullptr;
  SteadyClock::time_point start;
  std::atomic<bool> stop{false};        // workers
  std::atomic<bool> stop_chaos{false};

  // Counts a call of kind op that started at t0: OK, a miss (IsMiss), one
  // of the `refusals` documented for it, or an invariant violation. A call
  // longer than timeout + margin is a violation too. True when OK.
  bool Count(int op, const Status& s, SteadyClock::time_point t0, std::initializer_list<StatusCode> refusals = {});
  // True (and counted) when s is a StaleEpoch that Options::stale_epoch_refusal lets through.
  bool StaleRefusal(const Status& s);

  // Records a sequence id a node handed out. A node id never hands out the
  // same id twice, across its restarts too: a reused id makes a handle kept
  // from before the restart reach another client's sequence. Violation on reuse.
  void NoteSeqId(const std::string& node_id, uint64_t id);

  // Prefix hit rate of each past second of the run (the progress loop appends).
  void PushHitRate(double rate);
  std::vector<double> HitRates() const;

 private:
  std::mutex ids_mu_;
  std::map<std::string, std::unordered_set<uint64_t>> seq_ids_;  // guarded by ids_mu_
  size_t seq_ids_total_ = 0;                                      // guarded by ids_mu_
  mutable std::mutex hit_mu_;
  std::vector<double> hit_rates_;  // guarded by hit_mu_
};

// Number of fds in /proc/self/fd and threads in /proc/self/status.
uint32_t CountFds();
uint32_t CountThreads();
// fds by kind ("socket", "pipe", "anon_inode", "file", ...).
std::map<std::string, uint32_t> FdKinds();

}  // namespace kvmesh::soak

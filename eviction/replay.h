// eviction/replay.h — replays a Mooncake-format request trace through the real
// eviction policies (built by MakeEvictionPolicy) and through Belady's
// clairvoyant optimum, and measures block and prefix hit rates and the
// prefill FLOPs the cache saves.
//
// Semantics (shared/traces/README.md): requests in file order; within a
// request, blocks in order; a cached block is a hit (Touch); an absent block
// is a miss: the policy's Admit may decline it, otherwise the cache evicts
// Victim()s until it has room and Inserts it. Capacity counts blocks. The
// prefix hit rate counts only the leading run of hits of each request (what an
// inference server can reuse), over all lookups.
//
// Client hints: the trace has no priorities, so the replay derives each
// access's AccessInfo only from what a client knows when it sends the request
// (see DeriveHints and docs/eviction.md): whether the block is the request's
// partial last block, its depth in the prefix, and how many earlier requests
// carried it. Policies that ignore hints are unaffected. Every access also
// carries its position in the request (AccessInfo::depth) and its prefill
// FLOPs relative to a first full block (AccessInfo::cost, PrefillModel), and
// each result counts the FLOPs its prefix hits saved.
//
//   KVMESH_ASSIGN_OR_RETURN(Trace t, LoadMooncakeTrace("conversation_trace.jsonl"));
//   ReplayResult lru = ReplayPolicy(t, "lru", 1828).value();
//   ReplayResult opt = ReplayBelady(t, 1828);
//
// Thread-safety: a Trace is immutable after loading; the Replay* functions may
// run concurrently on the same Trace.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <istream>
#include <memory>
#include <queue>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>

#include "eviction/eviction_policy.h"
#include "kvmesh/status.h"

namespace kvmesh {

struct Trace {
  std::string source;
  // Block ids renumbered densely in order of first appearance (0..distinct-1).
  std::vector<uint32_t> blocks;
  // Request r's blocks are blocks[begin[r] .. begin[r+1]).
  std::vector<uint32_t> begin;
  std::vector<int64_t> timestamp_ms;
  std::vector<uint32_t> input_length;  // tokens
  std::vector<uint32_t> output_length;  // tokens
  // Optional client session fields (scripts/gen-trace.py --sessions; not in
  // Mooncake traces): the request's session (-1: none) and whether the
  // session closes after it. Both empty when no line has a "session".
  std::vector<int64_t> session;
  std::vector<uint8_t> closes;
  size_t distinct = 0;

  size_t requests() const { return timestamp_ms.size(); }
  size_t lookups() const { return blocks.size(); }
};

// Reads Mooncake JSONL: one object per line with integer `timestamp` (ms),
// `input_length`, `output_length` and an array `hash_ids`; optionally a
// non-negative integer `session` and a boolean `closes`; other keys are
// ignored, blank lines skipped. Errors name the line.
Result<Trace> ParseMooncakeTrace(std::istream& in, std::string_view source);
Result<Trace> LoadMooncakeTrace(const std::string& path);

// The client's side of session closes (ReplayOptions::session_closes): which
// sessions are open, which blocks each read, and when each closes (its last
// request's timestamp plus ms_per_output_token per output token, when its
// answer is done). A session's private blocks are those no other session has
// read. The replay releases them in its policy; a replay through a cluster
// sends them to the nodes (Router::Release). Not thread-safe.
class SessionCloses {
 public:
  // REQUIRES: `t` has sessions (t.session not empty) and outlives this.
  SessionCloses(const Trace& t, double ms_per_output_token);
  ~SessionCloses();
  // For every session closed by `now_ms`, calls release(b) for each of its
  // private blocks, shallowest first (so the deepest, released last, leaves
  // first), and forgets the session. Returns how many calls returned true.
  uint64_t CloseDue(int64_t now_ms, const std::function<bool(uint32_t)>& release);
  // Records that request r's session read its blocks (after its lookups).
  void Read(size_t r);

 private:
  struct Session {
    std::vector<uint32_t> blocks;  // in first-read order
    absl::flat_hash_set<uint32_t> seen;
  };
  const Trace& t_;
  double ms_per_token_;
  std::vector<uint32_t> readers_;  // block -> sessions that read it
  absl::flat_hash_map<int64_t, Session> open_;
  std::priority_queue<std::pair<int64_t, int64_t>, std::vector<std::pair<int64_t, int64_t>>, std::greater<>> due_;
};

// Prefill compute of a block: what an inference server spends recomputing it
// when it is not cached. Per layer, a token costs 24 D^2 FLOPs in the dense
// layers (QKV and output projections 4 D^2, a 4x MLP 8 D^2, two FLOPs per
// multiply-add) plus 4 D (p + 1) in attention over the p tokens before it
// (QK^T and AV), with D = heads x head_dim. A block of t tokens after p0
// prefix tokens costs layers x (24 D^2 t + 4 D (t p0 + t (t + 1) / 2)): the
// deeper the block, the more it costs, because attention covers its prefix.
struct PrefillModel {
  uint32_t layers = 4;          // the config's model: num_layers
  uint32_t heads = 4;           //                     num_kv_heads
  uint32_t head_dim = 64;       //                     head_dim
  uint32_t block_tokens = 512;  // tokens per trace block (Mooncake hashes 512-token blocks)

  // FLOPs of block `index` of a prompt when it holds `tokens` tokens.
  double BlockFlops(uint32_t index, uint32_t tokens) const;
  // The FLOPs of every lookup of `trace` (the last block of a request holds
  // input_length - index x block_tokens tokens, clamped to 1..block_tokens).
  std::vector<double> LookupFlops(const Trace& trace) const;
};

struct HintOptions {
  uint32_t block_tokens = 512;  // Mooncake hashes 512-token blocks
  uint32_t priority_classes = 4;
};

// The hint rule for access `k` (an index into trace.blocks) of request `r`,
// given `shares` = the number of earlier requests that carried the block.
// Uses nothing from the future. Documented in docs/eviction.md.
AccessInfo DeriveHints(const Trace& trace, size_t r, size_t k, uint32_t shares, const HintOptions& o);

struct ReplayOptions {
  HintOptions hints;
  bool derive_hints = true;        // false: no priority or score hints (depth and cost are still given)
  PrefillModel model;              // FLOPs per lookup: ReplayResult::flops_*, AccessInfo::cost
  int64_t aging_ns = 60'000'000'000;  // PolicyOptions::aging_ns (the clock follows trace timestamps)
  size_t shadow_sample_floor = PolicyOptions{}.shadow_sample_floor;  // adaptive (0: every expert sees every key)
  std::atomic<uint64_t>* progress = nullptr;  // incremented by lookups done (may be null)
  // Session closes as a client hint (a trace with "session"/"closes"): when a
  // session closes, at its last request's timestamp plus
  // close_ms_per_output_token per output token (when its answer is done), the
  // blocks it read that no other session has ever read and no open session
  // holds are Release()d, shallowest first, so the deepest leaves first.
  // A session that closes and comes back counts as a new one.
  bool session_closes = false;
  double close_ms_per_output_token = 20.0;
};

struct ReplayResult {
  std::string policy;
  size_t capacity = 0;         // blocks; 0 = infinite
  uint64_t lookups = 0;
  uint64_t hits = 0;
  uint64_t prefix_hits = 0;    // hits in the leading run of each request
  uint64_t declined = 0;       // misses the admission filter refused
  uint64_t evictions = 0;
  uint64_t released = 0;       // Release() calls for closed sessions' blocks (session_closes)
  double flops_total = 0;      // prefill FLOPs of every lookup (PrefillModel)
  double flops_saved = 0;      // ... of the prefix hits: compute the cache saved
  double seconds = 0;
  std::string leader;          // adaptive policies: the expert followed at the end

  double hit_rate() const { return lookups ? static_cast<double>(hits) / lookups : 0; }
  double prefix_hit_rate() const { return lookups ? static_cast<double>(prefix_hits) / lookups : 0; }
  double flops_saved_fraction() const { return flops_total > 0 ? flops_saved / flops_total : 0; }
};

// A policy as the replay names it: "<factory name>[@<aging seconds>[/<classes>]]",
// e.g. "lru-priority@120/8": PolicyOptions::aging_ns and the number of priority
// classes (of the policy and of DeriveHints) for that run only.
struct PolicySpec {
  std::string name;
  std::optional<int64_t> aging_ns;
  std::optional<uint32_t> classes;
};
Result<PolicySpec> ParsePolicySpec(std::string_view spec);

// Replays through MakeEvictionPolicy at `capacity` blocks (> 0); `policy` is a
// PolicySpec. InvalidArgument for an unknown policy or capacity 0.
Result<ReplayResult> ReplayPolicy(const Trace& trace, std::string_view policy, size_t capacity,
                                  const ReplayOptions& o = {});
// Belady's optimum with bypass: on a miss with a full cache, evict the cached
// block whose next use is furthest, or decline the new block when its own
// next use is later still (or never). Exact; O(log capacity) per lookup.
// Optimal for block hits, not for FLOPs saved (see ReplayBeladyFlops).
ReplayResult ReplayBelady(const Trace& trace, size_t capacity, std::atomic<uint64_t>* progress = nullptr,
                          const PrefillModel& model = {});
// The clairvoyant reference for FLOPs saved. Belady maximises hits, treating
// blocks alike, but a deep block saves more compute than a shallow one, so a
// schedule with fewer hits can save more FLOPs (tests/test_replay.cc has a
// case). This one evicts by FLOPs saved per lookup of residency: on a miss
// with a full cache it samples 64 cached blocks that have no cached child
// (evicting a parent first would void its children's prefix hits) and evicts
// the one with the largest (distance to next use) / (FLOPs of that use); never
// used again counts as infinitely far. It declines the new block, and the rest
// of its request's chain, when the new block's own ratio is larger still.
// A greedy heuristic with foresight, not a proven optimum (the FLOPs-weighted
// prefix problem has none that is cheap): it is reported beside Belady, and
// the reference is the better of the two. Deterministic; O(64) per eviction.
ReplayResult ReplayBeladyFlops(const Trace& trace, size_t capacity, const PrefillModel& model,
                               std::atomic<uint64_t>* progress = nullptr);
// Infinite cache: a block hits when it appeared before.
ReplayResult ReplayInfinite(const Trace& trace, const PrefillModel& model = {});

// For each lookup k, the index of the next lookup of the same block, or
// trace.lookups() when there is none.
std::vector<uint32_t> NextUse(const Trace& trace);

}  // namespace kvmesh

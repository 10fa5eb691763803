// eviction/replay.h — replays a Mooncake-format request trace through the real
// eviction policies (built by MakeEvictionPolicy) and through Belady's
// clairvoyant optimum, and measures block and prefix hit rates.
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
// carried it. Policies that ignore hints are unaffected.
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
#include <istream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

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
  size_t distinct = 0;

  size_t requests() const { return timestamp_ms.size(); }
  size_t lookups() const { return blocks.size(); }
};

// Reads Mooncake JSONL: one object per line with integer `timestamp` (ms),
// `input_length`, `output_length` and an array `hash_ids`; other keys are
// ignored, blank lines skipped. Errors name the line.
Result<Trace> ParseMooncakeTrace(std::istream& in, std::string_view source);
Result<Trace> LoadMooncakeTrace(const std::string& path);

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
  bool derive_hints = true;        // false: every access gets AccessInfo{}
  int64_t aging_ns = 60'000'000'000;  // PolicyOptions::aging_ns (the clock follows trace timestamps)
  std::atomic<uint64_t>* progress = nullptr;  // incremented by lookups done (may be null)
};

struct ReplayResult {
  std::string policy;
  size_t capacity = 0;         // blocks; 0 = infinite
  uint64_t lookups = 0;
  uint64_t hits = 0;
  uint64_t prefix_hits = 0;    // hits in the leading run of each request
  uint64_t declined = 0;       // misses the admission filter refused
  uint64_t evictions = 0;
  double seconds = 0;

  double hit_rate() const { return lookups ? static_cast<double>(hits) / lookups : 0; }
  double prefix_hit_rate() const { return lookups ? static_cast<double>(prefix_hits) / lookups : 0; }
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
ReplayResult ReplayBelady(const Trace& trace, size_t capacity, std::atomic<uint64_t>* progress = nullptr);
// Infinite cache: a block hits when it appeared before.
ReplayResult ReplayInfinite(const Trace& trace);

// For each lookup k, the index of the next lookup of the same block, or
// trace.lookups() when there is none.
std::vector<uint32_t> NextUse(const Trace& trace);

}  // namespace kvmesh

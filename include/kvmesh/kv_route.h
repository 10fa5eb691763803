// kvmesh/kv_route.h — KV-aware routing: a prefix index over KV events
// (kvmesh nodes', and engines' in vLLM's format) and route(keys, candidates):
// per engine instance, the longest run of leading blocks it has cached, by
// tier, and a score weighing tier and the instance's load. docs/kv-events.md
// ("Routing") has the score and the event sources.
//
// An instance is whatever publishes events under a name: a kvmesh node (the
// one beside an engine: its GPU tier is that engine's device), or an engine.
// Blocks are named by their chained keys (kvmesh/block_key.h); the index
// keeps the low 64 bits of each (an event's 16-byte hash, or an int hash
// as it is), so a key and its events meet whichever hash form ($.events.hash)
// the publisher used.
//
// Thread-safety: all methods are thread-safe (a reader-writer lock; routes
// run concurrently with each other).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvmesh/status.h"
#include "kvmesh/types.h"

namespace kvmesh {

// Where an instance holds a block, fastest first.
enum class KvTier : uint8_t { kGpu = 0, kCpu = 1, kDisk = 2 };
// The tier a KV event's `medium` names: "GPU" (also nil: engines' device
// blocks), "CPU" / "CPU_PINNED", "DISK"; case-insensitive. InvalidArgument otherwise.
Result<KvTier> ParseKvTier(std::string_view medium);

struct RouteWeights {
  double gpu = 1.0;   // a leading block in the instance's GPU tier
  double cpu = 0.5;   // ... in its host tier
  double disk = 0.25; // ... on its SSD
  double load = 0.5;  // subtracted per unit of load (SetLoad: 0 idle .. 1 saturated)
  // Approximate mode (Routed): how long a block routed to an instance counts
  // as on its device, in seconds from its last routing. 0: approximate mode off.
  double approx_ttl_s = 0;
};

struct PrefixMatch {
  std::string instance;
  uint32_t gpu_blocks = 0;   // leading blocks all in GPU
  uint32_t cpu_blocks = 0;   // leading blocks all in GPU or CPU
  uint32_t blocks = 0;       // leading blocks cached in any tier: the longest cached prefix
  double load = 0;
  // (gpu*gpu_blocks + cpu*(cpu_blocks-gpu_blocks) + disk*(blocks-cpu_blocks)) / keys
  // - load_weight*load: in [-load_weight, 1].
  double score = 0;
};

class KvIndex {
 public:
  static constexpr size_t kMaxInstances = 64;
  explicit KvIndex(RouteWeights w = {});
  ~KvIndex();
  KvIndex(const KvIndex&) = delete;
  KvIndex& operator=(const KvIndex&) = delete;

  // Applies one EventBatch payload (msgpack, vLLM's format) that `instance`
  // published: BlockStored / BlockRemoved in their medium, AllBlocksCleared.
  // InvalidArgument for a payload that is not one (nothing of it applied
  // beyond the events before the bad one); ResourceExhausted past kMaxInstances.
  Status ApplyBatch(std::string_view instance, std::span<const std::byte> payload);
  // The same changes one at a time.
  Status Stored(std::string_view instance, KvTier tier, std::span<const BlockKey> keys);
  Status Removed(std::string_view instance, KvTier tier, std::span<const BlockKey> keys);
  Status Cleared(std::string_view instance);
  // The instance's load, 0 (idle) to 1 (saturated); values outside are clamped.
  Status SetLoad(std::string_view instance, double load);

  // Approximate mode, for instances that publish no events (llm-d's
  // approximate prefix scorer, SGLang's cache-aware router): the request
  // with these keys went to `instance`, so it will hold them on its device
  // for a while. Each key counts as in the instance's GPU tier until
  // RouteWeights::approx_ttl_s after its last Routed (beside what events
  // say). FailedPrecondition when approx_ttl_s is 0. `now_s` is on any
  // monotonic clock shared with Route's (default: steady_clock's seconds).
  // Expired entries are dropped as Routed goes (every 4096 calls, a sweep).
  Status Routed(std::string_view instance, std::span<const BlockKey> keys, double now_s = -1);
  size_t approx_entries() const;  // (block, instance) pairs Routed has not yet dropped

  // One PrefixMatch per candidate (unknown names: nothing cached, load 0),
  // best first: higher score, then lower load, then the candidates' order.
  // `keys`: the request's chained block keys in order (Router::Keys).
  // Into `*out`, reusing its storage: a caller that keeps `out` across
  // calls with the same candidates allocates nothing (the hot path).
  void Route(std::span<const BlockKey> keys, std::span<const std::string> candidates, std::vector<PrefixMatch>* out,
             double now_s = -1) const;

  // The same, into a new vector (allocates per call).
  std::vector<PrefixMatch> Route(std::span<const BlockKey> keys, std::span<const std::string> candidates) const;

  size_t blocks() const;         // distinct blocks indexed (from events)
  size_t memory_bytes() const;   // what the index's tables hold (approximate mode's included)
  std::vector<std::string> instances() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvmesh

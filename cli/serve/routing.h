// cli/serve/routing.h — which engine a request of `kvmesh bench-serve` goes
// to: round robin, or KV-aware routing through KvIndex (kvmesh/kv_route.h),
// the index an llm-d / Dynamo / SGLang router keeps over engines' KV events.
//
// A configuration's name picks its routing by a suffix (RoutingOf):
//   <config>            round robin (request i to engine i mod N)
//   <config>-kv         KV-aware: each engine's own prefix cache reports the
//                       blocks it gains and evicts (LocalCacheListener, its
//                       KV events) into the index as device blocks; a request
//                       goes to Route()'s best engine
//   <config>-kv-approx  KV-aware without engine events: the index infers what
//                       each engine holds from where requests went, for
//                       approx_ttl_s (KvIndex::Routed)
// The load Route() weighs is each engine's requests in flight / max_batch.
// The kvmesh tier's blocks are not indexed: every engine reaches them at the
// same cost here, so they would add the same term to every candidate.
//
// Thread-safety: Pick from one thread (the arrival loop); listeners from the
// engines' threads (KvIndex is thread-safe).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cli/serve/engine.h"
#include "cli/serve/workload.h"
#include "kvmesh/kv_route.h"
#include "kvmesh/status.h"

namespace kvmesh::serve {

enum class Routing { kRoundRobin, kKvAware, kKvApprox };

struct RoutedConfig {
  std::string base;  // the cache configuration ("kvmesh" of "kvmesh-kv")
  Routing routing = Routing::kRoundRobin;
};
RoutedConfig RoutingOf(const std::string& config);

struct RoutingCounters {
  uint64_t picks = 0;
  uint64_t prefix_picks = 0;     // picks of an engine the index said held a prefix
  uint64_t predicted_blocks = 0; // leading blocks the index promised on the engines picked
};

struct RunResult;
// For each -kv / -kv-approx run whose round-robin configuration ran at the
// same rate (the same arrivals): TTFT p50/p99 and goodput of both and their
// ratio, and how many picks went to an engine holding a prefix. Prints
// nothing when no such pair ran.
void PrintRoutingComparison(const std::vector<RunResult>& results);

class RequestRouter {
 public:
  // `in_flight(e)`: engine e's requests submitted and not finished.
  RequestRouter(Routing routing, uint32_t engines, uint32_t block_tokens, uint32_t max_batch, double approx_ttl_s);
  // The engine for `request`; in_flight[e] as above.
  uint32_t Pick(const ServeRequest& request, const std::vector<uint64_t>& in_flight);
  // The listener for engine e's prefix cache (kKvAware), else empty.
  LocalCacheListener Listener(uint32_t engine);
  const RoutingCounters& counters() const { return counters_; }

 private:
  const Routing routing_;
  const uint32_t engines_, block_tokens_, max_batch_;
  KvIndex index_;
  std::vector<std::string> names_;
  uint64_t next_ = 0;
  // Pick's buffers, reused (no allocation per request beyond the chain).
  std::vector<BlockKey> keys_;
  std::vector<PrefixMatch> matches_;
  RoutingCounters counters_;
};

}  // namespace kvmesh::serve

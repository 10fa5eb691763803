#include "cli/serve/routing.h"

#include <algorithm>
#include <cstdio>

#include "cli/serve/bench_serve.h"

namespace kvmesh::serve {
namespace {

bool EndsWith(const std::string& s, const std::string& tail) {
  return s.size() > tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

RouteWeights WeightsFor(Routing r, double approx_ttl_s) {
  RouteWeights w;
  if (r == Routing::kKvApprox) w.approx_ttl_s = approx_ttl_s;
  return w;
}

}  // namespace

RoutedConfig RoutingOf(const std::string& config) {
  if (EndsWith(config, "-kv-approx")) return {config.substr(0, config.size() - 10), Routing::kKvApprox};
  if (EndsWith(config, "-kv")) return {config.substr(0, config.size() - 3), Routing::kKvAware};
  return {config, Routing::kRoundRobin};
}

RequestRouter::RequestRouter(Routing routing, uint32_t engines, uint32_t block_tokens, uint32_t max_batch,
                             double approx_ttl_s)
    : routing_(routing), engines_(std::max<uint32_t>(engines, 1)), block_tokens_(block_tokens),
      max_batch_(std::max<uint32_t>(max_batch, 1)), index_(WeightsFor(routing, approx_ttl_s)) {
  for (uint32_t e = 0; e < engines_; ++e) names_.push_back("engine-" + std::to_string(e));
}

uint32_t RequestRouter::Pick(const ServeRequest& request, const std::vector<uint64_t>& in_flight) {
  ++counters_.picks;
  if (routing_ == Routing::kRoundRobin) return static_cast<uint32_t>(next_++ % engines_);
  for (uint32_t e = 0; e < engines_; ++e)
    (void)index_.SetLoad(names_[e], double(e < in_flight.size() ? in_flight[e] : 0) / max_batch_);
  // The engine's own block names (BlockChain), as the index's 64-bit hashes.
  const std::vector<uint64_t> chain = BlockChain(request.prompt, block_tokens_);
  keys_.resize(chain.size());
  for (size_t i = 0; i < chain.size(); ++i) keys_[i] = BlockKey{0, chain[i]};
  index_.Route(keys_, names_, &matches_);
  const PrefixMatch& best = matches_.front();
  const uint32_t engine = static_cast<uint32_t>(
      std::find(names_.begin(), names_.end(), best.instance) - names_.begin());
  if (best.blocks > 0) {
    ++counters_.prefix_picks;
    counters_.predicted_blocks += best.blocks;
  }
  // Approximate mode: the engine will hold this prompt once it ran it.
  if (routing_ == Routing::kKvApprox) (void)index_.Routed(best.instance, keys_);
  return engine;
}

LocalCacheListener RequestRouter::Listener(uint32_t engine) {
  if (routing_ != Routing::kKvAware) return {};
  const std::string name = names_[engine];
  return [this, name](std::span<const uint64_t> stored, std::span<const uint64_t> removed) {
    // Engine hashes are 64-bit: the index keeps a key's low half. The
    // buffer is the engine thread's own, reused.
    thread_local std::vector<BlockKey> k;
    k.clear();
    for (uint64_t h : stored) k.push_back(BlockKey{0, h});
    (void)index_.Stored(name, KvTier::kGpu, k);
    k.clear();
    for (uint64_t h : removed) k.push_back(BlockKey{0, h});
    (void)index_.Removed(name, KvTier::kGpu, k);
  };
}

void PrintRoutingComparison(const std::vector<RunResult>& results) {
  bool header = false;
  for (const RunResult& kv : results) {
    const RoutedConfig rc = RoutingOf(kv.config);
    if (rc.routing == Routing::kRoundRobin) continue;
    const RunResult* rr = nullptr;
    for (const RunResult& x : results)
      if (x.config == rc.base && x.rate == kv.rate) rr = &x;
    if (!rr) continue;
    if (!header) {
      std::printf("KV-aware routing against round robin (same arrivals); ms; ratio = KV-aware / round robin\n");
      std::printf("%-18s %6s %17s %17s %15s %12s\n", "config", "rate", "ttft50 (ratio)", "ttft99 (ratio)",
                  "goodput (ratio)", "prefix picks");
      header = true;
    }
    auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
    std::printf("%-18s %6.2f %7.1f (%5.2fx) %7.1f (%5.2fx) %6.2f (%5.2fx) %5llu/%-5llu\n", kv.config.c_str(), kv.rate,
                kv.ttft_p50 * 1e3, ratio(kv.ttft_p50, rr->ttft_p50), kv.ttft_p99 * 1e3,
                ratio(kv.ttft_p99, rr->ttft_p99), kv.goodput, ratio(kv.goodput, rr->goodput),
                (unsigned long long)kv.routing.prefix_picks, (unsigned long long)kv.routing.picks);
  }
}

}  // namespace kvmesh::serve

#include "cli/replay_cluster.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "kvmesh/clock.h"
#include "kvmesh/embedded.h"
#include "shard_node/shard_node.h"

namespace kvmesh::cli {
namespace {

constexpr uint32_t kBlockTokens = 2;  // a trace block's id in two tokens

// The cluster the trace runs on: `base` with tiny blocks, every node's host
// memory sized to its share of `capacity`, and the policy under test.
Result<ClusterConfig> ClusterFor(const ClusterConfig& base, const PolicySpec& spec, size_t capacity,
                                 const ReplayOptions& o) {
  if (base.nodes.empty()) return InvalidArgument(base.source + ": $.nodes: no nodes to replay through");
  ClusterConfig c = base;
  c.model.num_layers = 1;
  c.model.num_kv_heads = 1;
  c.model.head_dim = 32;  // 256-byte blocks: one aligned slot each
  c.model.dtype = DType::kFp16;
  c.model.block_tokens = kBlockTokens;
  c.model.num_experts = 0;
  c.placement.affinity.clear();  // no expert in the requests: every node takes keys by rendezvous
  c.store.slot_bytes = 0;
  c.store.size_classes = 1;
  c.codec = CodecConfig{};
  c.eviction.policy = spec.name;
  c.eviction.aging_s = static_cast<double>(spec.aging_ns.value_or(o.aging_ns)) / 1e9;
  if (spec.classes) c.eviction.priority_classes = *spec.classes;
  c.eviction.shadow_sample_floor = o.shadow_sample_floor;
  const uint64_t block = c.model.FullBlockBytes();
  const uint64_t stripes = std::max<uint32_t>(c.store.stripes, 1);
  const uint64_t per_stripe = (capacity + c.nodes.size() * stripes - 1) / (c.nodes.size() * stripes);
  for (NodeConfig& n : c.nodes) n.memory = NodeMemory{0, std::max<uint64_t>(per_stripe, 1) * stripes * block, 0, ""};
  return c;
}

}  // namespace

Result<ReplayResult> ReplayThroughCluster(const Trace& trace, std::string_view policy, size_t capacity,
                                          const ClusterConfig& base, const ReplayOptions& o) {
  if (capacity == 0) return InvalidArgument("replay capacity must be at least one block");
  KVMESH_ASSIGN_OR_RETURN(const PolicySpec spec, ParsePolicySpec(policy));
  KVMESH_ASSIGN_OR_RETURN(const ClusterConfig cfg, ClusterFor(base, spec, capacity, o));
  ManualClock clock(1'000'000'000);
  const int64_t origin_ns = clock.NowNanos();
  KVMESH_ASSIGN_OR_RETURN(std::unique_ptr<EmbeddedCluster> cluster,
                          EmbeddedCluster::Start(cfg, RouterOptions{}, &clock));
  // Every block must take one slot, so the nodes hold the capacity asked for.
  uint64_t slots = 0;
  for (size_t i = 0; i < cluster->num_nodes(); ++i) slots += cluster->node(i).Stats().store.slots_total;
  if (slots < capacity)
    return Internal("the cluster holds " + std::to_string(slots) + " blocks, not " + std::to_string(capacity));
  Router& router = cluster->router();

  const auto t0 = std::chrono::steady_clock::now();
  ReplayResult res;
  res.policy = std::string(policy);
  res.capacity = capacity;
  const std::vector<double> flops = o.model.LookupFlops(trace);
  const std::vector<std::byte> payload(cfg.model.FullBlockBytes(), std::byte{0x5a});
  std::vector<BlockKey> key_of(trace.distinct);  // a block's key, once seen (its chain fixes it)
  std::vector<uint8_t> known(trace.distinct, 0);
  std::optional<SessionCloses> sessions;
  if (o.session_closes && !trace.session.empty()) sessions.emplace(trace, o.close_ms_per_output_token);
  std::vector<TokenId> tokens;
  std::vector<std::span<const std::byte>> blocks;
  std::vector<BlockKey> release;
  int64_t now_ns = origin_ns;
  for (size_t r = 0; r < trace.requests(); ++r) {
    now_ns = std::max(now_ns, origin_ns + trace.timestamp_ms[r] * 1'000'000);
    clock.Set(now_ns);
    if (sessions) {
      release.clear();
      sessions->CloseDue(trace.timestamp_ms[r], [&](uint32_t b) {
        release.push_back(key_of[b]);
        return true;
      });
      if (!release.empty()) KVMESH_RETURN_IF_ERROR(router.Release(release));
    }
    const size_t first = trace.begin[r], n = trace.begin[r + 1] - first;
    tokens.clear();
    for (size_t k = first; k < first + n; ++k) {
      tokens.push_back(static_cast<TokenId>(trace.blocks[k] & 0x7fffffff));
      tokens.push_back(static_cast<TokenId>(trace.blocks[k] >> 31));
    }
    KVMESH_ASSIGN_OR_RETURN(const size_t hit, router.MatchPrefix(tokens));
    res.lookups += n;
    res.prefix_hits += hit;
    for (size_t k = first; k < first + n; ++k) {
      res.flops_total += flops[k];
      if (k < first + hit) res.flops_saved += flops[k];
    }
    if (hit < n) {
      blocks.assign(n - hit, std::span<const std::byte>(payload));
      KVMESH_RETURN_IF_ERROR(router.Put(tokens, blocks, RequestOptions{}, hit));
    }
    if (sessions) {
      const std::vector<BlockKey> keys = router.Keys(tokens);
      for (size_t i = 0; i < n; ++i) {
        const uint32_t b = trace.blocks[first + i];
        if (!known[b]) {
          known[b] = 1;
          key_of[b] = keys[i];
        }
      }
      sessions->Read(r);
    }
    if (o.progress) o.progress->fetch_add(n, std::memory_order_relaxed);
  }
  res.hits = res.prefix_hits;
  // The expert the nodes follow at the end: the first primary group's (every
  // node's primary stores share it; with 256-byte blocks and one size class
  // it is the only one).
  for (const PolicyGroups::Entry& e : cluster->node(0).policy_groups().Snapshot())
    if (e.key.rfind("primary/", 0) == 0 && res.leader.empty()) res.leader = e.following;
  for (size_t i = 0; i < cluster->num_nodes(); ++i) {
    const NodeStats s = cluster->node(i).Stats();
    res.evictions += s.store.evictions;
    res.released += s.store.releases;
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace kvmesh::cli

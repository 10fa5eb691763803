#include "coordinator/decode/cluster.h"

#include <mutex>
#include <thread>

#include "kernels/codec.h"
#include "kvmesh/embedded.h"
#include "shard_node/codec_stage.h"
#include "shard_node/shard_node.h"

namespace kvmesh::decode {
namespace {

// The options of a rank's sequence table: the config's codec, if any, for
// the KV blocks it seals, and the node's tiers, so prefix blocks demoted to
// host or SSD are promoted back instead of recomputed.
SequenceOptions RankSequenceOptions(const ClusterConfig& config, ShardNode* node) {
  SequenceOptions so;
  so.codec = config.codec;
  so.tiers = node->tiers();
  return so;
}

}  // namespace

Result<ClusterConfig> DecodeClusterConfig(const ClusterConfig& base, const ModelConfig& m, int ranks) {
  if (base.nodes.empty()) return InvalidArgument("decode: the cluster config has no nodes");
  ClusterConfig c = base;
  c.model = m.Spec();
  uint32_t max_heads = 0;
  for (int r = 0; r < ranks; ++r) {
    KVMESH_ASSIGN_OR_RETURN(RankPlan p, PlanRank(m, r, ranks));
    max_heads = std::max(max_heads, p.kv_heads.size());
    const std::string g = "decode-rank-" + std::to_string(r);
    c.placement.groups[g] = {base.nodes[static_cast<size_t>(r) % base.nodes.size()].id};
    c.placement.affinity.push_back(AffinityRule{Affinity::Kind::kRank, {uint32_t(r), uint32_t(r) + 1}, g});
  }
  KVMESH_ASSIGN_OR_RETURN(BlockLayout slice, BlockLayout::Slice(c.model, {0, m.layers}, {0, max_heads}));
  c.store.slot_bytes = slice.bytes();
  if (c.codec.enabled()) {
    // Sealed blocks are stored encoded: a slot holds one encoded slice, so
    // the codec's saving becomes more blocks per shard.
    KVMESH_ASSIGN_OR_RETURN(kernels::CodecPolicy policy, MakeCodecPolicy(c.codec, "$.codec"));
    KVMESH_ASSIGN_OR_RETURN(auto codec, kernels::MakeCodec(std::move(policy)));
    KVMESH_ASSIGN_OR_RETURN(c.store.slot_bytes, codec->MaxEncodedSize(kernels::BlockShape::FromLayout(slice)));
  }
  return c;
}

Status RunOnThreads(const ClusterConfig& config, std::shared_ptr<const Weights> w, int ranks, const RankBody& body) {
  const ModelConfig& m = w->config;
  KVMESH_ASSIGN_OR_RETURN(auto cluster, EmbeddedCluster::Start(config));
  auto comms = MakeThreadComms(ranks);
  std::vector<std::unique_ptr<SequenceTable>> tables;
  std::vector<std::unique_ptr<RankEngine>> engines;
  std::vector<ShardNode*> nodes;
  for (int r = 0; r < ranks; ++r) {
    KVMESH_ASSIGN_OR_RETURN(RankPlan p, PlanRank(m, r, ranks));
    ShardNode* node = &cluster->node(static_cast<size_t>(r) % cluster->num_nodes());
    BlockStore* store = &node->store();
    KVMESH_ASSIGN_OR_RETURN(auto t, SequenceTable::Create(store, config.model, {0, m.layers}, p.kv_heads,
                                                          RankSequenceOptions(config, node)));
    engines.push_back(std::make_unique<RankEngine>(w, p, t.get(), comms[r].get()));
    tables.push_back(std::move(t));
    nodes.push_back(node);
  }
  std::mutex mu;
  Status first;
  auto run = [&](int r) {
    Router& router = cluster->router();
    RequestOptions ro;
    ro.layers = {0, m.layers};
    ro.heads = engines[r]->plan().kv_heads;
    ro.affinity = Affinity::Rank(static_cast<uint32_t>(r));
    PrefixLookup lookup = [&router, ro](std::span<const TokenId> t) { return router.MatchPrefix(t, ro).value_or(0); };
    const bool first_on_node = static_cast<size_t>(r) < cluster->num_nodes();
    Status s = body(*engines[r], lookup, first_on_node ? nodes[r] : nullptr);
    if (!s.ok()) {
      std::lock_guard<std::mutex> lock(mu);
      if (first.ok()) first = s.WithContext("rank " + std::to_string(r));
    }
  };
  std::vector<std::thread> threads;
  for (int r = 1; r < ranks; ++r) threads.emplace_back(run, r);
  run(0);
  for (auto& t : threads) t.join();
  engines.clear();
  tables.clear();  // unpin before the cluster goes
  return first;
}

Status RunOnComm(const ClusterConfig& config, std::shared_ptr<const Weights> w, StepComm& comm, const RankBody& body) {
  if (config.nodes.empty()) return InvalidArgument("decode: the cluster config has no nodes");
  const ModelConfig& m = w->config;
  const int r = comm.rank();
  KVMESH_ASSIGN_OR_RETURN(RankPlan p, PlanRank(m, r, comm.size()));
  const std::string& id = config.nodes[static_cast<size_t>(r) % config.nodes.size()].id;
  KVMESH_ASSIGN_OR_RETURN(auto node, ShardNode::Create(config, id));
  KVMESH_ASSIGN_OR_RETURN(auto table, SequenceTable::Create(&node->store(), config.model, {0, m.layers}, p.kv_heads,
                                                            RankSequenceOptions(config, node.get())));
  RankEngine engine(w, p, table.get(), &comm);
  SequenceTable* t = table.get();
  PrefixLookup lookup = [t](std::span<const TokenId> toks) { return t->MatchPrefix(toks); };
  return body(engine, lookup, node.get());
}

Status RunOnMpi(const ClusterConfig& config, std::shared_ptr<const Weights> w, StepComm& comm, const RankBody& body) {
  return RunOnComm(config, std::move(w), comm, body);
}

}  // namespace kvmesh::decode

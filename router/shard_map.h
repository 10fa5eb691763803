// router/shard_map.h — the cluster's shard map and expert-aware placement
// (docs/architecture.md, "Placement").
//
// The map lists the live nodes (with rendezvous weights), the shard groups and
// the affinity rules, versioned by an epoch that the coordinator advances on
// every membership change. Placement of a key: pick the group from the
// request's affinity hint (no hint or no rule -> every node), then weighted
// rendezvous (highest random weight) hashing over the group's live nodes:
// score(node, key) = -weight / ln(U(node, key)), U uniform in (0,1) from a
// 64-bit mix of the key and the node id. Adding or removing one node of N
// moves only the keys whose top node changes: about 1/N of them.
//
// Thread-safety: immutable after Build; share it by shared_ptr<const ShardMap>.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kvmesh/config.h"
#include "kvmesh/types.h"

namespace kvmesh {

struct ShardInfo {
  std::string id;
  double weight = 1.0;
  uint64_t id_hash = 0;  // xxh3 of id: the node's rendezvous seed
  std::string host;      // network address (network mode)
  NodePorts ports;
};

class ShardMap {
 public:
  static constexpr size_t kMaxReplicas = 8;

  // From a cluster config (every configured node live).
  static Result<std::shared_ptr<const ShardMap>> FromConfig(const ClusterConfig& c, uint64_t epoch = 1);
  // From explicit parts (used by the coordinator when membership changes).
  // Groups name node ids; ids missing from `nodes` (dead nodes) are skipped.
  static Result<std::shared_ptr<const ShardMap>> Build(
      uint64_t epoch, std::vector<ShardInfo> nodes,
      const std::map<std::string, std::vector<std::string>>& groups,
      const std::vector<AffinityRule>& affinity, uint32_t replicas);

  uint64_t epoch() const { return epoch_; }
  uint32_t replicas() const { return replicas_; }
  const std::vector<ShardInfo>& nodes() const { return nodes_; }
  int IndexOf(const std::string& id) const;

  // Node indices (into nodes()) for `key`, best first, at most
  // min(replicas, group size). Empty only when the map has no live node.
  // A grouped key (kvmesh/block_key.h) is placed by its group: every block
  // of a group gets the same nodes.
  // Allocation-free: writes into out[] and returns the count.
  size_t Place(const BlockKey& key, const Affinity& hint, uint32_t out[kMaxReplicas]) const;
  size_t Place(const BlockKey& key, const Affinity& hint, uint32_t out[kMaxReplicas], uint32_t replicas) const;
  // The first choice only.
  int Primary(const BlockKey& key, const Affinity& hint) const;

  // The node indices eligible for a hint (its group, or all nodes).
  const std::vector<uint32_t>& GroupFor(const Affinity& hint) const;

 private:
  uint64_t epoch_ = 0;
  uint32_t replicas_ = 1;
  std::vector<ShardInfo> nodes_;
  std::vector<uint32_t> all_;
  bool uniform_weights_ = true;  // then the raw hash orders nodes like the score does
  std::vector<std::vector<uint32_t>> groups_;  // resolved group members
  struct Rule {
    Affinity::Kind kind;
    Range values;
    size_t group;
  };
  std::vector<Rule> rules_;
};

// The rendezvous score of one node for one key (exposed for tests and tools).
double RendezvousScore(const BlockKey& key, uint64_t node_hash, double weight);

}  // namespace kvmesh

#include "router/shard_map.h"

#include "common/hash.h"
#include "kvmesh/block_key.h"

#include <xxhash.h>

#include <algorithm>
#include <cmath>

namespace kvmesh {
namespace {


uint64_t RendezvousHash(const BlockKey& key, uint64_t node_hash) {
  return Mix64(key.lo ^ Mix64(key.hi ^ node_hash));
}

}  // namespace

double RendezvousScore(const BlockKey& key, uint64_t node_hash, double weight) {
  const uint64_t h = RendezvousHash(key, node_hash);
  // Uniform in (0,1), never 0 or 1.
  const double u = (static_cast<double>(h >> 11) + 0.5) * (1.0 / 9007199254740992.0);
  return -weight / std::log(u);
}

Result<std::shared_ptr<const ShardMap>> ShardMap::FromConfig(const ClusterConfig& c, uint64_t epoch) {
  std::vector<ShardInfo> nodes;
  nodes.reserve(c.nodes.size());
  for (const NodeConfig& n : c.nodes) nodes.push_back(ShardInfo{n.id, n.weight, 0, n.host, n.ports});
  return Build(epoch, std::move(nodes), c.placement.groups, c.placement.affinity, c.placement.replicas);
}

Result<std::shared_ptr<const ShardMap>> ShardMap::Build(
    uint64_t epoch, std::vector<ShardInfo> nodes, const std::map<std::string, std::vector<std::string>>& groups,
    const std::vector<AffinityRule>& affinity, uint32_t replicas) {
  auto m = std::shared_ptr<ShardMap>(new ShardMap());
  m->epoch_ = epoch;
  m->replicas_ = std::clamp<uint32_t>(replicas, 1, kMaxReplicas);
  for (ShardInfo& n : nodes) {
    if (!(n.weight > 0)) return InvalidArgument("node " + n.id + ": weight must be > 0");
    n.id_hash = XXH3_64bits(n.id.data(), n.id.size());
    if (n.weight != nodes.front().weight) m->uniform_weights_ = false;
  }
  m->nodes_ = std::move(nodes);
  for (uint32_t i = 0; i < m->nodes_.size(); ++i) m->all_.push_back(i);
  std::map<std::string, size_t> group_index;
  for (const auto& [name, ids] : groups) {
    std::vector<uint32_t> members;
    for (const std::string& id : ids) {
      int idx = m->IndexOf(id);
      if (idx >= 0) members.push_back(static_cast<uint32_t>(idx));  // dead nodes are skipped
    }
    group_index[name] = m->groups_.size();
    m->groups_.push_back(std::move(members));
  }
  for (const AffinityRule& r : affinity) {
    auto it = group_index.find(r.group);
    if (it == group_index.end()) return InvalidArgument("affinity rule names unknown group " + r.group);
    m->rules_.push_back(Rule{r.kind, r.values, it->second});
  }
  return std::shared_ptr<const ShardMap>(std::move(m));
}

int ShardMap::IndexOf(const std::string& id) const {
  for (size_t i = 0; i < nodes_.size(); ++i)
    if (nodes_[i].id == id) return static_cast<int>(i);
  return -1;
}

const std::vector<uint32_t>& ShardMap::GroupFor(const Affinity& hint) const {
  if (hint.kind != Affinity::Kind::kNone) {
    for (const Rule& r : rules_) {
      if (r.kind == hint.kind && hint.value >= r.values.begin && hint.value < r.values.end) {
        // A group whose nodes are all dead falls back to the whole cluster.
        if (!groups_[r.group].empty()) return groups_[r.group];
        break;
      }
    }
  }
  return all_;
}

size_t ShardMap::Place(const BlockKey& key, const Affinity& hint, uint32_t out[kMaxReplicas]) const {
  return Place(key, hint, out, replicas_);
}

size_t ShardMap::Place(const BlockKey& block_key, const Affinity& hint, uint32_t out[kMaxReplicas],
                       uint32_t replicas) const {
  const BlockKey key = PlacementKey(block_key);  // a grouped key goes where its group goes
  const std::vector<uint32_t>& group = GroupFor(hint);
  const size_t want = std::min<size_t>(std::min<uint32_t>(replicas, kMaxReplicas), group.size());
  double best[kMaxReplicas];
  size_t n = 0;
  for (uint32_t idx : group) {
    const ShardInfo& s = nodes_[idx];
    // With equal weights -w/ln(u) is monotone in u, so the hash itself ranks
    // nodes and the log is skipped (the common case, ~4x cheaper per key).
    double score = uniform_weights_ ? static_cast<double>(RendezvousHash(key, s.id_hash))
                                    : RendezvousScore(key, s.id_hash, s.weight);
    if (n < want) {
      ++n;
    } else if (score <= best[n - 1]) {
      continue;
    }
    // Insert into the sorted top list (descending).
    size_t pos = n - 1;
    while (pos > 0 && best[pos - 1] < score) {
      best[pos] = best[pos - 1];
      out[pos] = out[pos - 1];
      --pos;
    }
    best[pos] = score;
    out[pos] = idx;
  }
  return n;
}

int ShardMap::Primary(const BlockKey& key, const Affinity& hint) const {
  uint32_t out[kMaxReplicas];
  return Place(key, hint, out, 1) ? static_cast<int>(out[0]) : -1;
}

}  // namespace kvmesh

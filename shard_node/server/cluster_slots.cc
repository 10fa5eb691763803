#include "shard_node/server/cluster_slots.h"

#include "kvmesh/block_key.h"

namespace kvmesh {

Result<std::shared_ptr<const RespClusterView>> BuildClusterView(const PublishedMap& m, std::string_view self_id) {
  KVMESH_ASSIGN_OR_RETURN(std::shared_ptr<const ShardMap> map, BuildShardMap(m));
  auto v = std::make_shared<RespClusterView>();
  v->epoch = m.epoch;
  for (const ShardInfo& n : map->nodes()) {
    if (n.id == self_id) v->self = static_cast<int>(v->nodes.size());
    v->nodes.push_back({RespClusterNodeId(n.id), n.host, n.ports.resp, n.ports.data});
  }
  v->owner.assign(kRespClusterSlots, -1);
  uint32_t out[ShardMap::kMaxReplicas];
  for (uint32_t s = 0; s < kRespClusterSlots; ++s) {
    if (map->Place(SlotPlacementKey(s), Affinity{}, out, 1) == 0) continue;
    if (v->nodes[out[0]].port != 0) v->owner[s] = static_cast<int32_t>(out[0]);
  }
  return std::shared_ptr<const RespClusterView>(std::move(v));
}

std::shared_ptr<const RespClusterView> SingleNodeClusterView(const std::string& node_id, const std::string& host,
                                                             uint16_t resp_port, uint16_t bus_port) {
  auto v = std::make_shared<RespClusterView>();
  v->nodes.push_back({RespClusterNodeId(node_id), host, resp_port, bus_port});
  v->self = 0;
  v->owner.assign(kRespClusterSlots, 0);
  return v;
}

}  // namespace kvmesh

#include "kvmesh/embedded.h"

#include "coordinator/embedded/inproc_channel.h"
#include "router/shard_map.h"
#include "shard_node/shard_node.h"

namespace kvmesh {

EmbeddedCluster::~EmbeddedCluster() {
  router_.reset();  // channels point at the nodes
  nodes_.clear();
}

Result<std::unique_ptr<EmbeddedCluster>> EmbeddedCluster::Start(const ClusterConfig& config,
                                                                RouterOptions router_options, Clock* clock) {
  std::unique_ptr<EmbeddedCluster> c(new EmbeddedCluster());
  c->config_ = config;
  std::vector<std::shared_ptr<ShardChannel>> channels;
  // One process: the nodes' stores share their eviction policy groups
  // directly, as daemons do through the coordinator's heartbeats.
  auto groups = std::make_shared<PolicyGroups>();
  for (const NodeConfig& n : config.nodes) {
    KVMESH_ASSIGN_OR_RETURN(auto node, ShardNode::Create(config, n.id, clock, std::nullopt, groups));
    channels.push_back(MakeInProcessChannel(node.get()));
    c->nodes_.push_back(std::move(node));
  }
  KVMESH_ASSIGN_OR_RETURN(auto map, ShardMap::FromConfig(config));
  KVMESH_ASSIGN_OR_RETURN(c->router_,
                          Router::Create(config.model, std::move(map), std::move(channels), std::move(router_options)));
  return c;
}

}  // namespace kvmesh

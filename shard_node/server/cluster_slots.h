// shard_node/server/cluster_slots.h — a node's view of Redis Cluster mode
// ($.resp.cluster, docs/resp.md "Redis Cluster mode"): which node's RESP port
// serves each of the 16384 hash slots, computed from the shard map the
// coordinator publishes with the placement every router and proxy uses
// (a slot's keys are placed by the slot: kvmesh/block_key.h PlacementKey).
//
// The node daemon fetches the map (GET /map) whenever its heartbeat shows a
// new epoch and installs the view here; the RESP front reads it per command.
// A node without a coordinator serves every slot itself.
//
// Thread-safety: Install and View may run on any threads.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "router/map_json.h"
#include "transport/resp/resp_commands.h"

namespace kvmesh {

// The view of `m` as node `self_id` sees it: a slot is owned by the first
// node placement ranks for it (replicas hold no RESP keys: a node's RESP
// front stores on itself), and not served when that node has no RESP port.
Result<std::shared_ptr<const RespClusterView>> BuildClusterView(const PublishedMap& m, std::string_view self_id);

// Every slot served by one node (a node without a coordinator).
std::shared_ptr<const RespClusterView> SingleNodeClusterView(const std::string& node_id, const std::string& host,
                                                             uint16_t resp_port, uint16_t bus_port);

class ClusterSlots final : public RespCluster {
 public:
  std::shared_ptr<const RespClusterView> View() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return view_;
  }
  void Install(std::shared_ptr<const RespClusterView> v) {
    std::lock_guard<std::mutex> lock(mu_);
    view_ = std::move(v);
  }

 private:
  mutable std::mutex mu_;
  std::shared_ptr<const RespClusterView> view_;
};

}  // namespace kvmesh

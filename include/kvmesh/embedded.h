// kvmesh/embedded.h — a whole cluster inside one process (launch mode 1):
// one ShardNode per configured node, in-process channels, and a Router over
// them. The demo and most tests run on it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kvmesh/config.h"
#include "kvmesh/router.h"

namespace kvmesh {

class ShardNode;
class Clock;

class EmbeddedCluster {
 public:
  static Result<std::unique_ptr<EmbeddedCluster>> Start(const ClusterConfig& config,
                                                        RouterOptions router_options = {},
                                                        Clock* clock = nullptr);
  ~EmbeddedCluster();

  Router& router() { return *router_; }
  const ClusterConfig& config() const { return config_; }
  size_t num_nodes() const { return nodes_.size(); }
  ShardNode& node(size_t i) { return *nodes_[i]; }

 private:
  EmbeddedCluster() = default;
  ClusterConfig config_;
  std::vector<std::unique_ptr<ShardNode>> nodes_;
  std::unique_ptr<Router> router_;
};

}  // namespace kvmesh

// shard_node/server/node_daemon.h — one `kvmesh node`: a ShardNode served over
// the binary protocol (DataServer), Redis protocol (RespServer) and HTTP
// (/metrics Prometheus text, /healthz, /stats), registered with the
// coordinator and heartbeating to it (the coordinator's answers carry the
// epoch the node enforces). Without a coordinator the node is standalone and
// serves every epoch.
//
// Thread-safety: Start/Stop from one thread.
#pragma once

#include <memory>
#include <string>

#include "kvmesh/config.h"
#include "kvmesh/status.h"

namespace kvmesh {

struct NodeDaemonOptions {
  std::string node_id;      // must name a node of the config
  std::string coordinator;  // "host:port", or several separated by commas (tried in turn); empty: standalone
  bool resp = true;         // serve the RESP front
};

class NodeDaemon {
 public:
  static Result<std::unique_ptr<NodeDaemon>> Start(const ClusterConfig& config, NodeDaemonOptions options);
  virtual ~NodeDaemon() = default;
  // {"event":"listening","role":"node","node_id":...,"ports":{"data":..,"http":..,"resp":..},"pid":..}
  virtual std::string ListeningJson() const = 0;
  virtual uint16_t data_port() const = 0;
  // Hex UCX worker address when $.transport.backend is "ucx", else "".
  virtual std::string ucx_address() const = 0;
  virtual uint64_t epoch() const = 0;
  // Leaves the coordinator (best effort), stops every server. Idempotent.
  virtual void Stop() = 0;
};

}  // namespace kvmesh

// cli/serve/daemons.h — the kvmesh daemons `kvmesh bench-serve` runs
// against, launched the usual way: a `kvmesh coordinator` and N `kvmesh
// node` processes on 127.0.0.1 with ports picked at start (each prints its
// listening JSON line), each in its own process group with its stderr in a
// log file under work_dir; SIGTERM, then SIGKILL, on destruction.
//
// Thread-safety: one thread drives a LocalDaemons.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvmesh/status.h"

namespace kvmesh::serve {

class LocalDaemons {
 public:
  // Writes `config` (a cluster config with $.nodes[*].id) to work_dir and
  // starts the coordinator and every node with `kvmesh_bin`. Returns once
  // every node printed its listening line.
  static Result<std::unique_ptr<LocalDaemons>> Start(const std::string& kvmesh_bin, const nlohmann::json& config,
                                                     const std::string& work_dir);
  ~LocalDaemons();
  const std::string& coordinator() const { return coordinator_; }  // "127.0.0.1:port"
  // Every node's /stats document (shard_node StatsJson), in config order.
  Result<std::vector<nlohmann::json>> NodeStats() const;
  // Waits (at most timeout_s) until no node has registered client memory of
  // this host left to warm (kvmesh_ucx_warm_pending_bytes, UCX only: else at
  // once); returns the seconds waited, DeadlineExceeded past the timeout.
  Result<double> WaitWarmed(double timeout_s) const;

 private:
  struct Proc {
    pid_t pid = -1;
    int out = -1;
    std::string buf;
  };
  LocalDaemons() = default;
  Status Spawn(const std::vector<std::string>& argv, const std::string& log, Proc* p);
  Result<nlohmann::json> WaitListening(Proc& p, const std::string& log);
  std::vector<Proc> procs_;
  std::string coordinator_;
  std::vector<uint16_t> node_http_;  // the nodes' HTTP ports, from their listening lines
};

}  // namespace kvmesh::serve

// coordinator/etcd_control.h — one coordinator's part in a control plane kept
// in etcd ($.coordinator.etcd; docs/launch.md, "etcd-backed launch").
//
// Keys, under the prefix P ($.coordinator.etcd.prefix):
//   P leader       this leader's id, under its lease (created only if absent)
//   P epoch        the published map's epoch (decimal)
//   P map          the published shard map (router/map_json.h)
//   P nodes/<id>   a node's registration {"id","host","weight","ports","ucx"},
//                  under a lease of its own (dead_after_ms, rounded up to
//                  seconds) that the coordinator the node talks to keeps alive
//
// Every Tick (the coordinator's reaper thread, every heartbeat_ms / 2):
//  1. the nodes that talk to this coordinator (Membership::LocalMembers) get
//     their registration put under a lease and that lease renewed; a node
//     that left (/leave) has its lease revoked, which deletes its key;
//  2. leadership: a follower whose leader key is gone grants a lease and
//     creates the key in a transaction that succeeds only while it is absent;
//     the leader renews its lease every lease_ms / 3 and stops leading at
//     once when a renewal says the lease expired or when its own clock passes
//     the lease's end (measured from before the renewal was sent);
//  3. the map: read from etcd and handed to Membership (GET /map, the epoch in
//     answers). The leader compares the registered nodes with it and, when
//     they differ and its lease still has lease_ms / 4 to run, publishes the
//     next epoch in a transaction that compares the leader key's create
//     revision (still its own election) and the epoch key's mod revision (no
//     one published since it read it): an old leader that was paused or cut
//     off past its lease can never publish, so no epoch number is used twice.
//
// Thread-safety: Tick and Stop from one thread; StatusJson from any.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "coordinator/etcd_client.h"
#include "coordinator/membership.h"
#include "kvmesh/config.h"

namespace kvmesh {

class EtcdControl {
 public:
  // `self`: this coordinator's id in the leader key (its host:port). Events
  // go out as `members`' own (Membership::LogEvent), with "self".
  static Result<std::unique_ptr<EtcdControl>> Create(const ClusterConfig& config, Membership* members,
                                                     std::string self);
  ~EtcdControl();

  // One round of the three steps above (blocking calls to etcd).
  void Tick();

  // The steps of a round, public so that a test can interleave two
  // coordinators at the moments that matter (tests/test_ha_etcd.cc).
  Status SyncNodes();
  Status Lead();
  // Step 3 in two: reading the map (handed to Membership) and, for the
  // leader, the map to publish when the registered nodes differ from it...
  struct MapPlan {
    std::string text;        // the map to publish (router/map_json.h)
    uint64_t epoch = 0;      // its epoch
    uint64_t previous = 0;   // the epoch it follows (0: none)
    int64_t epoch_mod = 0;   // the epoch key's mod revision when read (0: absent)
    size_t nodes = 0;
  };
  Result<std::optional<MapPlan>> PlanMap();
  // ...and publishing it, if the lease still has lease_ms / 4 to run by this
  // clock and the transaction's compares hold. True when it was published.
  Result<bool> CommitMap(const MapPlan& plan);
  // Leaving: a leader revokes its lease, so that a follower leads at once.
  void Stop();
  bool leader() const;

 private:
  EtcdControl(const ClusterConfig& config, Membership* members, std::string self);
  using Clock = std::chrono::steady_clock;
  struct NodeLease {
    int64_t lease = 0;
    std::string value;  // what was put under it
    Clock::time_point renewed;
  };
  void StepDown(const std::string& reason);
  void Log(nlohmann::json j);
  void PublishStatus();

  const ClusterConfig config_;
  Membership* const members_;
  const std::string self_;
  std::unique_ptr<EtcdClient> etcd_;
  const std::string prefix_;
  std::map<std::string, NodeLease> node_leases_;  // by node id
  bool leader_ = false;
  int64_t lease_ = 0;              // the leader's lease
  int64_t leader_revision_ = 0;    // the leader key's create revision while leading
  Clock::time_point lease_end_;    // when the lease may have run out, by this clock
  Clock::time_point renewed_;
  std::string leader_id_;          // the last leader seen
  uint64_t leader_changes_ = 0;    // times leader_id_ changed (from a known leader)
  uint64_t elected_ = 0;           // times this coordinator became leader
  uint64_t published_ = 0;         // maps this coordinator published
  Clock::time_point last_ok_;      // the last round that reached etcd
  bool unreachable_logged_ = false;
  mutable std::mutex status_mu_;
  bool leader_public_ = false;     // guarded by status_mu_: leader_ for other threads
};

}  // namespace kvmesh

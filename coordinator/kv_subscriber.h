// coordinator/kv_subscriber.h — feeds a KvIndex (kvmesh/kv_route.h) from KV
// event publishers: kvmesh nodes ($.events) and engines (vLLM's
// ZmqEventPublisher), one ZMQ SUB socket each. A batch whose sequence number
// skips is a gap: the subscriber asks the publisher's replay socket for the
// missed batches and, when replay cannot fill the gap (a kvmesh node that
// dropped events, or batches older than its replay buffer), for a snapshot
// (docs/kv-events.md). A publisher without a replay endpoint (an engine
// started without one) is read as it comes.
//
// Thread-safety: one thread of its own applies every batch; the methods are
// thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kvmesh/kv_route.h"
#include "kvmesh/status.h"

namespace kvmesh {

struct KvEventSource {
  std::string instance;         // the name routes use
  std::string endpoint;         // "tcp://host:port" of the PUB socket
  std::string replay_endpoint;  // "tcp://host:port" of the ROUTER socket; "": none
  std::string topic;            // subscription prefix ("": everything)
};

struct KvSubscriberStats {
  uint64_t batches = 0, gaps = 0, replays = 0, snapshots = 0, bad_batches = 0;
  uint64_t snapshot_continuations = 0;  // answers asked for after a snapshot's first (a cursor)
};

class KvEventSubscriber {
 public:
  // `index` must outlive the subscriber.
  static Result<std::unique_ptr<KvEventSubscriber>> Start(KvIndex* index, std::vector<KvEventSource> sources);
  ~KvEventSubscriber();  // Stop()
  void Stop();

  // The last sequence number applied from `instance` (-1: none yet).
  int64_t last_seq(const std::string& instance) const;
  KvSubscriberStats Stats() const;

 private:
  struct Impl;
  explicit KvEventSubscriber(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvmesh

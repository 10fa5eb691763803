// router/replica_plan.h — which replica of a key a client asks, and how the
// answers of several replicas make one, decided without I/O. The Router
// (router/router.cc: blocking, a batch at a time over ShardChannel) and the
// RESP proxy's engine (router/proxy/resp_engine.cc: asynchronous, an I/O at
// a time over NodeLink) only execute it; tests/test_client_plans.cc checks
// it alone.
//
// The rules:
//  - A write (PUT, ERASE, RELEASE) goes to every replica rank the map gives
//    the key. A PUT is stored when any replica stored it; otherwise it fails
//    with the error of the lowest rank that answered (WriteMerge).
//  - A read asks rank 0. A GET answered with a miss (IsMiss: not found,
//    corrupt in transit, unreachable, timed out) and an EXISTS whose node did
//    not answer ask the next rank, while the map places the key on one.
//  - The first StaleEpoch answer refreshes the map once and the operation is
//    placed again with the new map (a read from rank 0), when the refresh
//    succeeded; a second StaleEpoch answer is final (EpochRetry).
//
// Thread-safety: free functions on values and small value types; an object
// is used by one thread at a time.
#pragma once

#include <cstdint>
#include <limits>

#include "kvmesh/status.h"
#include "kvmesh/types.h"
#include "router/shard_map.h"

namespace kvmesh {

enum class ReplicaOp : uint8_t { kPut, kGet, kExists, kErase };  // kErase: RELEASE too

inline bool IsReplicaWrite(ReplicaOp op) { return op == ReplicaOp::kPut || op == ReplicaOp::kErase; }

// The ranks an operation of kind `op` starts on at once: every replica for a
// write, rank 0 alone for a read.
inline uint32_t StartRanks(const ShardMap& map, ReplicaOp op) {
  return IsReplicaWrite(op) ? std::max<uint32_t>(1, map.replicas()) : 1;
}

// The node at replica `rank` of `key` in `map`, or kNoNode when the map
// places the key on `rank` nodes or fewer.
inline constexpr uint32_t kNoNode = std::numeric_limits<uint32_t>::max();
uint32_t NodeAtRank(const ShardMap& map, const BlockKey& key, const Affinity& hint, uint32_t rank);

// Calls add(i, node) for every i < n with want(i) whose key_of(i) has a node
// at `rank`, in index order: one round of a batch. Returns whether any did.
template <typename KeyOf, typename Want, typename Add>
bool PlaceRank(const ShardMap& map, size_t n, const Affinity& hint, uint32_t rank, KeyOf key_of, Want want, Add add) {
  bool any = false;
  for (size_t i = 0; i < n; ++i) {
    if (!want(i)) continue;
    const uint32_t node = NodeAtRank(map, key_of(i), hint, rank);
    if (node == kNoNode) continue;
    add(i, node);
    any = true;
  }
  return any;
}

// Whether a read of kind `op` answered `s` at `rank` asks rank + 1 next. `s`
// is the key's answer: for a GET the item's status (or the call's, when the
// call failed), for an EXISTS the call's (found or not found is an answer).
// StaleEpoch is EpochRetry's, never a reason to ask the next rank.
bool AskNextRank(ReplicaOp op, const Status& s);

// One key's PUT answers from its replicas, in any order.
class WriteMerge {
 public:
  void Add(uint32_t rank, const Status& s);
  bool stored() const { return stored_; }
  // OK when any replica stored the key; else the lowest rank's error;
  // Unavailable when no replica answered.
  Status Result() const;

 private:
  bool stored_ = false;
  uint32_t error_rank_ = kNoNode;
  Status error_;
};

// The stale-epoch rule of one operation (or of one I/O in flight).
class EpochRetry {
 public:
  // An answer that asks for a map refresh.
  static bool IsStale(const Status& s) { return s.code() == StatusCode::kStaleEpoch; }
  // True when an operation that saw a stale answer (saw_stale) refreshes the
  // map now: no refresh was done for it yet.
  bool WantsRefresh(bool saw_stale) const { return saw_stale && !refreshed_; }
  // Records the refresh's outcome; true when the operation is to be placed
  // again (the refresh succeeded).
  bool Refreshed(const Status& refresh) {
    refreshed_ = true;
    return refresh.ok();
  }
  bool refreshed() const { return refreshed_; }
  // The rank an I/O at `rank` is placed at again after a refresh: a read
  // starts over at rank 0, a write's leg keeps its rank.
  static uint32_t RankAfterRefresh(ReplicaOp op, uint32_t rank) { return IsReplicaWrite(op) ? rank : 0; }

 private:
  bool refreshed_ = false;
};

}  // namespace kvmesh

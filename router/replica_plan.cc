#include "router/replica_plan.h"

namespace kvmesh {

uint32_t NodeAtRank(const ShardMap& map, const BlockKey& key, const Affinity& hint, uint32_t rank) {
  uint32_t place[ShardMap::kMaxReplicas];
  return rank < map.Place(key, hint, place) ? place[rank] : kNoNode;
}

bool AskNextRank(ReplicaOp op, const Status& s) {
  if (s.code() == StatusCode::kStaleEpoch) return false;
  switch (op) {
    case ReplicaOp::kGet: return IsMiss(s);
    case ReplicaOp::kExists: return !s.ok();
    case ReplicaOp::kPut:
    case ReplicaOp::kErase: return false;
  }
  return false;
}

void WriteMerge::Add(uint32_t rank, const Status& s) {
  if (s.ok()) {
    stored_ = true;
  } else if (rank < error_rank_) {
    error_rank_ = rank;
    error_ = s;
  }
}

Status WriteMerge::Result() const {
  if (stored_) return Status::Ok();
  if (error_rank_ == kNoNode) return Unavailable("no live node for this key");
  return error_;
}

}  // namespace kvmesh

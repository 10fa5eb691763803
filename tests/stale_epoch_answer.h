// The one answer a node gives a frame whose shard-map epoch is older than its
// own, whatever path the frame took in (FrameHandler::Handle, the node's one
// door): StaleEpoch, naming the epoch sent, the node and the node's epoch.
// Shared by tests/test_node_door.cc (TCP, UCX) and tests/test_tls.cc (TLS).
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <string>

#include "kvmesh/status.h"

namespace kvmesh::testing {

inline void CheckStaleAnswer(const Status& s, uint64_t sent, const std::string& node, uint64_t node_epoch) {
  INFO(s.ToString());
  CHECK(s.code() == StatusCode::kStaleEpoch);
  CHECK(s.message() == "shard-map epoch " + std::to_string(sent) + " is stale; node " + node + " is at epoch " +
                           std::to_string(node_epoch) + ": refresh the map");
}

}  // namespace kvmesh::testing

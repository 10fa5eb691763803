// coordinator/embedded/inproc_channel.h — the channel of the embedded
// cluster: router calls reach a ShardNode in the same process as plain
// function calls (no frames, no copies beyond the one into the caller's
// buffer). Tests and benchmarks use it to put a router in front of nodes they
// build themselves.
#pragma once

#include <memory>

#include "transport/shard_channel.h"

namespace kvmesh {

class ShardNode;

// A channel that calls `node` directly. REQUIRES: node outlives it.
// Thread-safety: as ShardNode (every call is thread-safe).
std::unique_ptr<ShardChannel> MakeInProcessChannel(ShardNode* node);

}  // namespace kvmesh

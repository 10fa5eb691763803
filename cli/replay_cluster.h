// cli/replay_cluster.h — a trace replayed through a whole embedded cluster
// (`kvmesh replay --through-cluster`): what the nodes' block stores get from
// a policy, beside what `kvmesh replay` measures on the policy object alone.
//
// Each trace request becomes what an inference engine does: MatchPrefix of
// its blocks (the cached leading run, refreshed: the prefix hits), then Put
// of every block from the first miss on. Blocks are tiny (the config's model
// cut to one layer, one head of 32 dims, 2-token blocks: 256 bytes) because
// eviction does not depend on their bytes; each node's host memory holds
// capacity / nodes blocks (rounded up to whole stripes). What the nodes see
// differs from the replay's policy object in three ways, which is what this
// measures: keys spread over nodes and stripes (each stripe runs its own
// policy over a share of the capacity), no chain position reaches a store
// (`adaptive` scores its experts on block hits there), and no derived
// priority hints (every block gets the default class; compare with
// `kvmesh replay --no-hints`). The nodes' clocks follow the trace timestamps
// (a ManualClock), so aging works in trace time as in the replay.
//
// With o.session_closes, the client releases a closed session's private
// blocks through Router::Release (SessionCloses decides which, as the replay
// does).
#pragma once

#include <string_view>

#include "eviction/replay.h"
#include "kvmesh/config.h"

namespace kvmesh::cli {

// `base` gives the nodes, stripes, placement and eviction settings; its
// memory, tiers and model are replaced as above; `policy` is a PolicySpec
// ($.eviction.policy, with its aging and classes). The result counts prefix
// hits only (hits = prefix_hits), evictions and releases as the nodes count
// them, FLOPs with o.model, and (leader) the expert an adaptive policy's
// nodes follow at the end. o.derive_hints is ignored (no hints).
Result<ReplayResult> ReplayThroughCluster(const Trace& trace, std::string_view policy, size_t capacity,
                                          const ClusterConfig& base, const ReplayOptions& o);

}  // namespace kvmesh::cli

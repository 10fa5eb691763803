// coordinator/decode/cluster.h — where the decode ranks and their KV live.
//
// Threads mode (tests, `kvmesh decode`): one process, an EmbeddedCluster,
// one thread per rank joined by thread collectives. Rank r's KV slice (all
// layers, its KV heads) is placed with Affinity::Rank(r) in group
// "decode-rank-r" = {node r mod N}, so Router::MatchPrefix with that hint
// asks exactly the shard where rank r seals its blocks.
//
// Process mode (`mpirun ... kvmesh decode --mpi`, or `kvmesh decode
// --tcp-rank R --tcp-world N ...` started once per rank): one process per
// rank, each with its own ShardNode (config node r mod N) in its address
// space; prefix lookups ask the local store and the ranks agree with
// AllReduceMin. The step collectives are whatever StepComm the caller made.
#pragma once

#include <functional>
#include <memory>

#include "coordinator/decode/driver.h"
#include "kvmesh/config.h"

namespace kvmesh::decode {

// `base` with the decode model's KV spec, slots sized to one rank's slice
// (encoded, when base has a codec: the ranks' sequences then seal their KV
// blocks through it), and one rank-affinity group per rank. InvalidArgument
// when base has no nodes or a codec the kernels reject.
Result<ClusterConfig> DecodeClusterConfig(const ClusterConfig& base, const ModelConfig& m, int ranks);

// What a rank body gets: its engine (with its comm and sequence table), the
// prefix lookup for its slice, and its shard node (its KV lives in the node's
// primary BlockStore); the node is nullptr for a rank that shares its node
// with a lower rank in the same process, so shard totals count each node once.
using RankBody = std::function<Status(RankEngine&, const PrefixLookup&, ShardNode*)>;

// Runs body on `ranks` threads over a fresh embedded cluster of `config`
// (from DecodeClusterConfig). Returns the first rank error.
Status RunOnThreads(const ClusterConfig& config, std::shared_ptr<const Weights> w, int ranks, const RankBody& body);

// Runs body for this process's rank (comm.rank() of comm.size()) over a fresh
// ShardNode of `config`: config node rank mod N, its primary store holding
// this rank's KV slice; prefix lookups ask that local store. For any backend
// whose ranks are separate processes (MPI, TCP, NCCL). Collective: every rank
// calls it with the same config and weights.
Status RunOnComm(const ClusterConfig& config, std::shared_ptr<const Weights> w, StepComm& comm, const RankBody& body);

// RunOnComm for an MPI rank (kept for callers under mpirun).
Status RunOnMpi(const ClusterConfig& config, std::shared_ptr<const Weights> w, StepComm& comm, const RankBody& body);

}  // namespace kvmesh::decode

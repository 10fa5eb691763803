// tests/soak/soak_workload.h — the soak's client threads and its chaos thread.
//
// PrefixWorker: an inference server's prefill on seeded conversations
// (shared system prompts, skewed reuse, far more blocks than the cluster
// holds): MatchPrefix, GetBatch of the matched blocks (every byte checked
// against Payload), Put of the rest; now and then a GetBatch of keys never
// stored (must miss).
//
// SequenceWorker: live sequences (create with a shared prompt, append,
// truncate, fork, read, info, release), every token's K/V checked against
// SeqRow. A mutation that failed leaves the sequence in one of two states;
// the next call reads it back and accepts either (never a third). Handles on
// a node killed since their creation are probed read-only: they must answer
// Unavailable / DeadlineExceeded, or NotFound once the node is back, never OK.
// Every sequence id a node hands out is recorded (Context::NoteSeqId): the
// same node id handing out an id twice, across restarts, is a violation.
//
// ChaosLoop: SIGKILL + restart (then the time until the cluster serves again
// and until the hit rate recovers), SIGSTOP/SIGCONT stalls, fills past
// capacity, malformed connections to a node's data port; daemon exits checked
// every 100 ms.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "kvmesh/network.h"
#include "kvmesh/router.h"
#include "soak.h"

namespace kvmesh::soak {

void PrefixWorker(Context& c, Router& r, uint32_t thread);
void SequenceWorker(Context& c, Router& r, uint32_t thread);

struct ChaosReport {
  std::vector<double> recover_ms;      // restart -> serving again, per kill and stall
  std::vector<double> hit_recover_ms;  // restart -> hit rate back to half its pre-kill level
  std::map<std::string, uint64_t> garbage_by_kind;
};
// Runs until c.stop_chaos; leaves every node running and serving.
void ChaosLoop(Context& c, Cluster& cluster, NetworkClient& client, ChaosReport* report);
// 32 fresh blocks (keys drawn from salt, payloads Payload(key)) put at
// priority 3, evicted last; their keys, or none when any put failed.
std::vector<BlockKey> PutProbeBlocks(Context& c, Router& r, uint64_t salt);
// Reads keys back and compares each with Payload(key) (a difference is a
// wrong_bytes violation naming the block as `what`); how many came back
// intact. With `why`, the items not served are tallied there by status name
// ("call: <name>" for each item when the call itself failed).
size_t ReadProbeBlocks(Context& c, Router& r, std::span<const BlockKey> keys,
                       std::map<std::string, uint64_t>* why = nullptr, std::string_view what = "probe");
// Puts and reads back 32 fresh blocks: true when every one round-trips.
bool Probe(Context& c, Router& r, uint64_t salt);

}  // namespace kvmesh::soak

// cli/demo.h — the main job: replay a seeded conversation workload
// through a router as an inference server's prefill would, and measure it.
//
// For every request: MatchPrefix(prompt) -> m cached blocks; GetBatch reads
// them (and checks every byte against the block's expected content); the
// blocks from the first miss on are "computed" (filled deterministically from
// their key) and Put back: system-prompt blocks at priority 2, conversation
// blocks at 1, one-shot requests at 0.
#pragma once

#include <array>
#include <cstdint>

#include "common/histogram.h"
#include "cli/workload.h"
#include "kvmesh/router.h"

namespace kvmesh {

struct DemoOptions {
  WorkloadOptions workload;
  uint32_t threads = 1;  // client threads (each drives its own workload stream)
  bool progress = true;
};

struct DemoReport {
  uint64_t requests = 0;
  uint64_t prompt_blocks = 0;       // full blocks over all prompts
  uint64_t matched_blocks = 0;      // leading cached blocks found by MatchPrefix
  uint64_t ideal_matched_blocks = 0;  // what an infinite cache would have matched
  uint64_t read_blocks = 0;         // blocks read back with GetBatch
  uint64_t read_misses = 0;         // matched but gone by the time of the read
  uint64_t mismatches = 0;          // blocks whose bytes were wrong (must be 0)
  uint64_t stored_blocks = 0;       // blocks put
  uint64_t put_errors = 0;
  double wall_s = 0;
  LatencyHistogram match, get, put;  // per call
  double prefix_hit_rate() const { return prompt_blocks ? double(matched_blocks) / prompt_blocks : 0; }
  double ideal_hit_rate() const { return prompt_blocks ? double(ideal_matched_blocks) / prompt_blocks : 0; }
};

// Fills `out` with the deterministic content of block `key` (what "prefill"
// computes for it in the demo).
void FillBlock(const BlockKey& key, std::span<std::byte> out);

Result<DemoReport> RunDemo(Router& router, const DemoOptions& o);

}  // namespace kvmesh

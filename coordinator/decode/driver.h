// coordinator/decode/driver.h — the decode driver: a seeded workload of
// conversations and agent loops with shared prefixes, served by continuous
// batching over the model-parallel RankEngine, with TTFT/TPOT/throughput and
// prefix-hit measurements.
//
// Every rank runs RunDecodeWorkload with the same options (SPMD): scheduling
// depends only on tokens and step counts, never on time, so the ranks make
// the same decisions; rank 0 (the driver) samples, broadcasts the tokens,
// measures and logs. A conversation's next turn is ready only when its
// previous turn finished (its prompt holds the previous reply), so prefix
// reuse sees what a real server sees.
//
// Prefill looks up the prompt's prefix (match_prefix on every rank's shard,
// the ranks agree on the minimum), attaches those blocks to a new sequence and
// computes only the rest. With prefix_reuse off every prompt is computed in
// full (sealed blocks are still stored, so KV bytes compare fairly).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "common/histogram.h"
#include "coordinator/decode/engine.h"

namespace kvmesh {
class ShardNode;
}

namespace kvmesh::decode {

struct DecodeWorkloadOptions {
  uint64_t seed = 42;
  // Chat: conversations over a few shared system prompts.
  uint32_t conversations = 12;
  uint32_t system_prompts = 3;
  uint32_t system_tokens_min = 96, system_tokens_max = 192;
  uint32_t turns_min = 2, turns_max = 4;
  uint32_t user_tokens_min = 16, user_tokens_max = 48;
  uint32_t reply_tokens_min = 8, reply_tokens_max = 24;
  // Agent loops: one shared tool prompt, each step adds an observation and
  // generates a short action.
  uint32_t agents = 4;
  uint32_t tool_tokens = 160;
  uint32_t steps_min = 3, steps_max = 6;
  uint32_t observation_tokens_min = 16, observation_tokens_max = 48;
  uint32_t action_tokens_min = 4, action_tokens_max = 12;
};

struct DecodeRunOptions {
  uint32_t batch = 8;           // requests decoded together (continuous batching)
  bool prefix_reuse = true;
  float temperature = 0.8f;     // <= 0: greedy
  uint64_t sample_seed = 1;
  uint32_t prefill_chunk = 256;  // prompt tokens fed per request per step
  std::string label;             // "reuse", "no-reuse", ... (event logs)
  // Rank 0: called with each JSON event line (no newline). May be empty.
  std::function<void(const std::string&)> events;
};

// Looks up how many leading full blocks of a prompt this rank's shard holds.
using PrefixLookup = std::function<size_t(std::span<const TokenId>)>;

struct DecodeReport {
  uint64_t requests = 0;
  uint64_t generated_tokens = 0;
  uint64_t prompt_tokens = 0;
  uint64_t computed_prompt_tokens = 0;  // prompt tokens fed through the model
  uint64_t prompt_blocks = 0;           // full blocks over all prompts
  uint64_t matched_blocks = 0;          // attached from the cache
  uint64_t steps = 0;
  uint64_t rows_fed = 0;                // tokens fed through the model (this rank)
  double wall_s = 0;
  LatencyHistogram ttft;   // admission to first token, per request
  LatencyHistogram tpot;   // mean time per output token after the first, per request
  LatencyHistogram e2e;    // ready (previous turn done) to last token, per request
  LatencyHistogram queue;  // ready to admission
  uint64_t kv_bytes_stored = 0;    // sealed blocks in the shards' primary (device) tier, all ranks, end of run
  uint64_t kv_bytes_logical = 0;   // the same blocks before encoding (== stored without a KV codec)
  uint64_t kv_bytes_host = 0;      // demoted to the host tier (tiered configs)
  uint64_t kv_bytes_ssd = 0;       // demoted to the SSD tier
  uint64_t kv_blocks_stored = 0;
  uint64_t kv_seals = 0, kv_seal_dedups = 0;
  uint64_t token_digest = 0;  // order-independent hash of every (request, index, token)

  double tokens_per_s() const { return wall_s > 0 ? generated_tokens / wall_s : 0; }
  double requests_per_s() const { return wall_s > 0 ? requests / wall_s : 0; }
  double prefix_hit_rate() const { return prompt_blocks ? double(matched_blocks) / prompt_blocks : 0; }
};

// Runs the workload on this rank. Collective: every rank must call it with
// the same options. The report's timings are rank 0's.
// `node` is this rank's shard, for the KV byte counts per tier; nullptr when
// another rank reports the same shard (ranks sharing a node in one process).
Result<DecodeReport> RunDecodeWorkload(RankEngine& engine, const PrefixLookup& lookup, ShardNode* node,
                                       const DecodeWorkloadOptions& w, const DecodeRunOptions& o);

// ---- Speculative decoding (item 6) -----------------------------------------
//
// Self-speculation, two drafts that need no second model:
//  - early exit: the target's first draft_layers layers (plus the final norm
//    and LM head), reading and writing the target's own KV for those layers;
//  - int4 KV (QuantSpec-style): the whole target, with attention reading K/V
//    rounded to int4. This models the numerics of an int4 cache (what decides
//    acceptance), not its bandwidth saving: on this CPU it costs a full step.
// Per round: the draft proposes k tokens (greedy), the draft positions are
// rolled back, the target verifies all k in one multi-token forward, and the
// rejected tokens are rolled back with SequenceTable::Truncate. Greedy, so the
// output equals plain greedy decode token for token.
struct SpecOptions {
  uint32_t prompts = 4;
  uint32_t prompt_tokens = 64;
  uint32_t new_tokens = 48;
  uint32_t draft_tokens = 4;  // k
  uint32_t draft_layers = 1;
  bool int4_draft = false;    // int4-KV draft instead of early exit
  uint64_t seed = 7;
};

struct SpecReport {
  uint64_t generated = 0;
  uint64_t rounds = 0, proposed = 0, accepted = 0;
  uint64_t rolled_back = 0;      // tokens removed by Truncate after verification
  double plain_s = 0, spec_s = 0;  // decode time (prefill excluded), all prompts
  LatencyHistogram plain_tpot, spec_tpot;  // per prompt
  bool same_tokens = false;      // speculative output == plain greedy output
  double acceptance() const { return proposed ? double(accepted) / proposed : 0; }
};

// Collective, like RunDecodeWorkload.
Result<SpecReport> RunSpeculative(RankEngine& engine, const SpecOptions& o);

}  // namespace kvmesh::decode

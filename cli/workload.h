// cli/workload.h — a seeded workload of multi-turn conversations that
// share system prompts, as an inference server sees them: each request is the
// whole history so far plus a new user message, so later turns (and other
// conversations with the same system prompt) can reuse cached prefixes.
//
// Conversations run interleaved: `concurrency` of them are active at a time,
// each request picks one at random, and a finished conversation is replaced
// by a new one until `conversations` have been started. Deterministic for a
// seed. Not thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <vector>

#include "kvmesh/types.h"

namespace kvmesh {

struct WorkloadOptions {
  uint64_t seed = 42;
  uint32_t system_prompts = 8;
  uint32_t system_tokens_min = 256, system_tokens_max = 1536;
  uint32_t conversations = 400;
  uint32_t concurrency = 32;
  uint32_t turns_min = 1, turns_max = 8;
  uint32_t user_tokens_min = 32, user_tokens_max = 256;
  uint32_t reply_tokens_min = 64, reply_tokens_max = 384;
  double single_shot_fraction = 0.25;  // one-turn requests (batch jobs): cached at the lowest priority
  uint32_t vocab = 32000;
};

struct WorkloadRequest {
  uint64_t request_id = 0;
  uint32_t conversation = 0;
  uint32_t turn = 0;               // 0-based
  bool last_turn = false;
  bool single_shot = false;
  uint32_t system_prompt = 0;      // which shared system prompt
  uint32_t system_tokens = 0;      // the prompt's first system_tokens tokens are the system prompt
  std::vector<TokenId> prompt;     // the full prompt of this turn
  std::vector<TokenId> reply;      // the tokens the model "generates" for it
};

class ConversationWorkload {
 public:
  explicit ConversationWorkload(const WorkloadOptions& o);
  // The next request, or nullopt when every conversation has finished.
  std::optional<WorkloadRequest> Next();
  // Total requests this workload will produce (known up front).
  uint64_t total_requests() const { return total_requests_; }

 private:
  struct Conv {
    uint32_t id, system_prompt, turns, turn = 0;
    bool single_shot;
    std::vector<TokenId> history;
  };
  Conv Start(uint32_t id);
  std::vector<TokenId> Tokens(uint32_t n);
  uint32_t Uniform(uint32_t lo, uint32_t hi);

  WorkloadOptions o_;
  std::mt19937_64 rng_;
  std::vector<std::vector<TokenId>> system_;
  std::vector<uint32_t> conv_turns_;  // pre-drawn so total_requests is known
  std::vector<uint8_t> conv_single_;
  std::vector<Conv> active_;
  uint32_t started_ = 0;
  uint64_t next_id_ = 0;
  uint64_t total_requests_ = 0;
};

}  // namespace kvmesh

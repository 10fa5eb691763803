#include "cli/workload.h"

#include <cmath>

namespace kvmesh {

ConversationWorkload::ConversationWorkload(const WorkloadOptions& o) : o_(o), rng_(o.seed) {
  for (uint32_t i = 0; i < o_.system_prompts; ++i)
    system_.push_back(Tokens(Uniform(o_.system_tokens_min, o_.system_tokens_max)));
  for (uint32_t c = 0; c < o_.conversations; ++c) {
    bool single = std::uniform_real_distribution<double>(0, 1)(rng_) < o_.single_shot_fraction;
    uint32_t turns = single ? 1 : Uniform(std::max(o_.turns_min, 2u), std::max(o_.turns_max, 2u));
    conv_single_.push_back(single);
    conv_turns_.push_back(turns);
    total_requests_ += turns;
  }
}

uint32_t ConversationWorkload::Uniform(uint32_t lo, uint32_t hi) {
  return std::uniform_int_distribution<uint32_t>(lo, std::max(lo, hi))(rng_);
}

std::vector<TokenId> ConversationWorkload::Tokens(uint32_t n) {
  std::vector<TokenId> t(n);
  std::uniform_int_distribution<TokenId> d(1, static_cast<TokenId>(o_.vocab - 1));
  for (auto& x : t) x = d(rng_);
  return t;
}

ConversationWorkload::Conv ConversationWorkload::Start(uint32_t id) {
  Conv c;
  c.id = id;
  // Popular system prompts are shared more (Zipf-like, s = 1).
  double total = 0;
  for (uint32_t i = 1; i <= o_.system_prompts; ++i) total += 1.0 / i;
  double u = std::uniform_real_distribution<double>(0, total)(rng_);
  c.system_prompt = o_.system_prompts - 1;
  for (uint32_t i = 1; i <= o_.system_prompts; ++i) {
    u -= 1.0 / i;
    if (u <= 0) {
      c.system_prompt = i - 1;
      break;
    }
  }
  c.turns = conv_turns_[id];
  c.single_shot = conv_single_[id];
  c.history = system_[c.system_prompt];
  return c;
}

std::optional<WorkloadRequest> ConversationWorkload::Next() {
  while (active_.size() < o_.concurrency && started_ < o_.conversations) active_.push_back(Start(started_++));
  if (active_.empty()) return std::nullopt;
  size_t pick = std::uniform_int_distribution<size_t>(0, active_.size() - 1)(rng_);
  Conv& c = active_[pick];
  WorkloadRequest r;
  r.request_id = next_id_++;
  r.conversation = c.id;
  r.turn = c.turn;
  r.single_shot = c.single_shot;
  r.system_prompt = c.system_prompt;
  r.system_tokens = static_cast<uint32_t>(system_[c.system_prompt].size());
  std::vector<TokenId> user = Tokens(Uniform(o_.user_tokens_min, o_.user_tokens_max));
  c.history.insert(c.history.end(), user.begin(), user.end());
  r.prompt = c.history;
  r.reply = Tokens(Uniform(o_.reply_tokens_min, o_.reply_tokens_max));
  c.history.insert(c.history.end(), r.reply.begin(), r.reply.end());
  ++c.turn;
  r.last_turn = c.turn >= c.turns;
  if (r.last_turn) {
    active_[pick] = std::move(active_.back());
    active_.pop_back();
  }
  return r;
}

}  // namespace kvmesh

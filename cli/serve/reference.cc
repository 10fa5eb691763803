#include "cli/serve/reference.h"

#include <chrono>
#include <cstdlib>
#include <vector>

namespace kvmesh::serve {

bool IsReferenceModel(const std::string& engine_model) {
  return engine_model == "reference" || engine_model.rfind("reference:", 0) == 0;
}

Result<std::shared_ptr<const ReferenceShared>> ReferenceShared::Create(const std::string& spec) {
  if (!IsReferenceModel(spec)) return InvalidArgument("not a reference engine model: '" + spec + "'");
  auto s = std::make_shared<ReferenceShared>();
  decode::ModelConfig& c = s->config;
  if (spec != "reference") {
    const std::string dims = spec.substr(10);
    unsigned layers = 0, hidden = 0;
    char x = 0, extra = 0;
    if (std::sscanf(dims.c_str(), "%u%c%u%c", &layers, &x, &hidden, &extra) != 3 || x != 'x' || layers == 0 ||
        hidden == 0)
      return InvalidArgument("engine model '" + spec + "': expected reference:LAYERSxHIDDEN, e.g. reference:4x128");
    c.layers = layers;
    c.hidden = hidden;
  }
  c.model_id = "bench-serve-reference";
  KVMESH_RETURN_IF_ERROR(c.Validate());
  KVMESH_ASSIGN_OR_RETURN(s->weights, decode::Weights::Generate(c));
  ModelShape& m = s->shape;
  m.name = "reference-" + std::to_string(c.layers) + "x" + std::to_string(c.hidden);
  m.layers = c.layers;
  m.hidden = c.hidden;
  m.heads = c.q_heads;
  m.kv_heads = c.kv_heads;
  m.head_dim = c.head_dim;
  m.intermediate = c.ffn;
  m.vocab = c.vocab;
  m.experts = c.experts;
  m.top_k = c.top_k;
  m.dtype_bytes = 4;
  // Calibration: 64 new tokens from no context, and 64 after 1024 cached;
  // the fastest of three each (the least disturbed by other work).
  ReferenceCompute rc(s);
  std::vector<TokenId> prompt(1024 + 64);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = TokenId(i % c.vocab);
  auto timed = [&](uint64_t cached) {
    double best = 1e300;
    for (int i = 0; i < 3; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      const int seq = rc.Prefill(std::span<const TokenId>(prompt).subspan(0, cached + 64), cached);
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      rc.Release(seq);
    }
    return best;
  };
  const double t0 = timed(0), t1 = timed(1024);
  // pairs of 64 new tokens after c cached: 64 x (c + 65 / 2)
  const double p0 = 64 * (0 + 65 / 2.0), p1 = 64 * (1024 + 65 / 2.0);
  s->per_pair_s = std::max(t1 - t0, 0.0) / (p1 - p0);
  s->per_token_s = std::max(t0 - s->per_pair_s * p0, 0.0) / 64;
  return std::shared_ptr<const ReferenceShared>(std::move(s));
}

double ReferenceShared::PrefillSeconds(uint64_t new_tokens, uint64_t cached_tokens) const {
  const double n = double(new_tokens);
  return per_token_s * n + per_pair_s * n * (double(cached_tokens) + (n + 1) / 2);
}

ReferenceCompute::ReferenceCompute(std::shared_ptr<const ReferenceShared> shared)
    : shared_(std::move(shared)), model_(shared_->weights) {}

int ReferenceCompute::Prefill(std::span<const TokenId> prompt, uint64_t cached_tokens) {
  const int seq = model_.NewSequence();
  model_.Extend(seq, uint32_t(cached_tokens));
  const uint32_t vocab = shared_->config.vocab;
  std::vector<TokenId> rest;
  rest.reserve(prompt.size() - cached_tokens);
  for (size_t i = cached_tokens; i < prompt.size(); ++i) rest.push_back(prompt[i] % vocab);
  (void)model_.Feed(seq, rest);
  return seq;
}

void ReferenceCompute::Decode(int seq, TokenId token) {
  const TokenId t = token % shared_->config.vocab;
  (void)model_.Feed(seq, std::span<const TokenId>(&t, 1));
}

void ReferenceCompute::Release(int seq) { model_.Truncate(seq, model_.Length(seq)); }

}  // namespace kvmesh::serve

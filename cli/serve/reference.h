// cli/serve/reference.h — the `reference` engine model of `kvmesh bench-serve`:
// the reference MoE decoder of coordinator/decode (decode::ReferenceModel,
// fp32 on the CPU) really computes every prefill and decode token, and the
// step takes the time it took.
//
// A request's sequence starts with its cached prefix as context (K and V of
// zeros, decode::ReferenceModel::Extend: the attention over it costs what it
// would, its values are not what was loaded), then the new prompt tokens are
// fed one by one (the reference model has no batched prefill), then one
// token per decode step. The recompute estimate the load-or-recompute
// decision needs comes from a calibration measured at start:
// seconds = a x new tokens + b x (query, key) pairs, fitted to a prefill of
// 64 tokens from no context and one after 1024 cached tokens.
//
// Thread-safety: ReferenceShared is immutable after Create and shared by the
// engines; a ReferenceCompute belongs to one engine thread.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "cli/serve/roofline.h"
#include "coordinator/decode/model.h"
#include "kvmesh/status.h"

namespace kvmesh::serve {

// "reference" or "reference:LAYERSxHIDDEN" (e.g. reference:4x128); the other
// dimensions are decode::ModelConfig's defaults (8 query heads, 4 KV heads
// of 16, FFN 256, 4 experts top-2, vocab 256).
struct ReferenceShared {
  decode::ModelConfig config;
  std::shared_ptr<const decode::Weights> weights;
  double per_token_s = 0, per_pair_s = 0;  // the calibration
  // The shape in roofline terms (fp32 KV: 4 bytes), for the KV bytes per token.
  ModelShape shape;
  static Result<std::shared_ptr<const ReferenceShared>> Create(const std::string& spec);
  double PrefillSeconds(uint64_t new_tokens, uint64_t cached_tokens) const;
};

class ReferenceCompute {
 public:
  explicit ReferenceCompute(std::shared_ptr<const ReferenceShared> shared);
  // A new sequence: cached_tokens of context, then prompt[cached_tokens..] fed.
  int Prefill(std::span<const TokenId> prompt, uint64_t cached_tokens);
  void Decode(int seq, TokenId token);
  void Release(int seq);  // frees the sequence's KV

 private:
  std::shared_ptr<const ReferenceShared> shared_;
  decode::ReferenceModel model_;
};

bool IsReferenceModel(const std::string& engine_model);

}  // namespace kvmesh::serve

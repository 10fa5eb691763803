// cli/serve/roofline.h — the `roofline:<model>:<gpu>[:tp<N>]` engine model of
// `kvmesh bench-serve`: how long one continuous-batching step of a named real
// model takes on a named GPU, from its FLOPs and the bytes it reads, with no
// GPU present. The formulas are written out in docs/serving.md.
//
//   step_s = max(FLOPs / (tp * peak_flops * mfu), bytes / (tp * hbm_bw * mbu))
//
// FLOPs of a step: 2 * active_params per token computed (prefill tokens and
// one per decoding request) + the attention's 4 * layers * heads * head_dim
// per (query, key) pair (causal: a prefill of n new tokens after c cached
// ones has n * (c + (n + 1) / 2) pairs; a decode step at context c has c).
// Bytes of a step: the weights the step touches once (all experts of a MoE
// when the step's tokens reach every expert, else tokens * top_k experts)
// + the KV it reads and writes (kv_bytes_per_token per cached and new token).
//
// Thread-safety: values; const use from many threads is safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvmesh/status.h"

namespace kvmesh::serve {

// A transformer's shape, from its published config.json.
struct ModelShape {
  std::string name;
  uint32_t layers = 0, hidden = 0, heads = 0, kv_heads = 0, head_dim = 0;
  uint32_t intermediate = 0;  // SwiGLU MLP width (per expert for a MoE)
  uint32_t vocab = 0;
  uint32_t experts = 0, top_k = 0;  // 0, 0: dense
  uint32_t dtype_bytes = 2;         // BF16 weights and KV

  // KV bytes per token: 2 (K and V) x layers x kv_heads x head_dim x dtype bytes.
  uint64_t KvBytesPerToken() const;
  // Parameters a token passes through (attention, its top_k experts' MLPs,
  // the LM head; the embedding lookup is no compute).
  double ActiveParams() const;
  // All parameters stored (every expert; embedding, LM head, norms).
  double TotalParams() const;
  // MLP parameters of one expert of one layer (the whole MLP when dense).
  double ExpertParams() const;
};

// A GPU from its vendor's data sheet (dense BF16, no sparsity).
struct GpuSpec {
  std::string name;
  double peak_flops = 0;  // FLOP/s
  double hbm_bw = 0;      // bytes/s
  double hbm_bytes = 0;
};

// The models and GPUs `roofline:` knows, by lower-case name
// ("llama-3.1-8b", "llama-3.1-70b", "mixtral-8x7b"; "h100", "h200").
Result<ModelShape> FindModel(std::string_view name);
Result<GpuSpec> FindGpu(std::string_view name);
std::vector<std::string> ModelNames();

// One request's part of a step.
struct PrefillWork {
  uint64_t new_tokens = 0;     // tokens computed now
  uint64_t cached_tokens = 0;  // context before them (loaded or kept)
};

class Roofline {
 public:
  // mfu: the share of peak FLOP/s reached; mbu: the share of HBM bandwidth.
  Roofline(ModelShape model, GpuSpec gpu, uint32_t tp = 1, double mfu = 0.5, double mbu = 0.8);
  // "roofline:llama-3.1-8b:h200" or "...:h100:tp4".
  static Result<Roofline> Parse(std::string_view spec, double mfu = 0.5, double mbu = 0.8);

  const ModelShape& model() const { return model_; }
  const GpuSpec& gpu() const { return gpu_; }
  uint32_t tp() const { return tp_; }
  double mfu() const { return mfu_; }
  double mbu() const { return mbu_; }
  std::string Name() const;

  // FLOPs and bytes of one step: the prefills plus one token for each
  // decoding request at context decode_contexts[i].
  double StepFlops(const std::vector<PrefillWork>& prefills, const std::vector<uint64_t>& decode_contexts) const;
  double StepBytes(const std::vector<PrefillWork>& prefills, const std::vector<uint64_t>& decode_contexts) const;
  double StepSeconds(const std::vector<PrefillWork>& prefills, const std::vector<uint64_t>& decode_contexts) const;
  // A lone prefill: the time a request's recompute costs.
  double PrefillSeconds(uint64_t new_tokens, uint64_t cached_tokens) const {
    return StepSeconds({PrefillWork{new_tokens, cached_tokens}}, {});
  }

 private:
  ModelShape model_;
  GpuSpec gpu_;
  uint32_t tp_;
  double mfu_, mbu_;
};

}  // namespace kvmesh::serve

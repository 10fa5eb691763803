// coordinator/decode/model.h — the reference decoder-only transformer that
// exercises kvmesh with real attention. It needs no downloaded
// weights: every tensor is generated from the seed, so any process (or MPI
// rank) rebuilds the same model. It exists to move real KV through the cache,
// not to produce language.
//
// Architecture (per layer, pre-norm, fp32 on the CPU):
//   h  = RMSNorm(x) ; q = Wq h, k = Wk h, v = Wv h  (RoPE on q and k)
//   x += Wo · Attention(q, K, V)  with GQA: query head i reads KV head i / (Q / KV)
//   h2 = RMSNorm(x) ; x += FFN(h2)
// FFN is SwiGLU: W2 (silu(W1 h) * (W3 h)). With experts > 0 it is an MoE: a
// linear gate scores the experts, the top_k are mixed with softmax weights.
// Logits = LmHead · RMSNorm(x).
//
// Thread-safety: Weights are immutable after Generate and shared read-only.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvmesh/status.h"
#include "kvmesh/types.h"

namespace kvmesh::decode {

struct ModelConfig {
  std::string model_id = "kvmesh-ref";
  uint32_t vocab = 256;
  uint32_t hidden = 128;
  uint32_t layers = 4;
  uint32_t q_heads = 8;
  uint32_t kv_heads = 4;  // divides q_heads (GQA group = q_heads / kv_heads)
  uint32_t head_dim = 16;  // even (RoPE)
  uint32_t ffn = 256;      // FFN (or per-expert) inner size
  uint32_t experts = 4;    // 0: dense FFN
  uint32_t top_k = 2;
  uint32_t block_tokens = 16;
  uint64_t seed = 1;
  float rope_theta = 10000.0f;

  Status Validate() const;
  // The kvmesh ModelSpec of this model's KV (fp32; model_id carries the seed
  // and shape, so two different models never share a key).
  ModelSpec Spec() const;
  uint64_t Params() const;
};

struct LayerWeights {
  std::vector<float> attn_norm, ffn_norm;  // [hidden]
  std::vector<float> wq;                   // [q_heads*head_dim][hidden]
  std::vector<float> wk, wv;               // [kv_heads*head_dim][hidden]
  std::vector<float> wo;                   // [hidden][q_heads*head_dim]
  std::vector<float> gate;                 // [experts][hidden] (MoE only)
  // One entry per expert (one for a dense FFN):
  std::vector<std::vector<float>> w1, w3;  // [ffn][hidden]
  std::vector<std::vector<float>> w2;      // [hidden][ffn]
};

struct Weights {
  ModelConfig config;
  std::vector<float> embed;       // [vocab][hidden]
  std::vector<float> lm_head;     // [vocab][hidden] (untied: a tied head makes a
                                  // random model echo its input token)
  std::vector<float> final_norm;  // [hidden]
  std::vector<LayerWeights> layers;

  static Result<std::shared_ptr<const Weights>> Generate(const ModelConfig& c);
};

// ---- Math shared by the reference and the model-parallel engine ----------

// y[b*ldy + r] = dot(W[r*ldw .. +cols], x[b*ldx ..]) for r < rows, b < batch.
// The summation order of one row never depends on batch, so a row computes
// the same bits whatever else is in the batch.
void MatMul(const float* W, size_t ldw, size_t rows, size_t cols, const float* x, size_t ldx, size_t batch, float* y,
            size_t ldy);
float Dot(const float* a, const float* b, size_t n);
// out = x / rms(x) * gain.
void RmsNorm(const float* x, const float* gain, size_t n, float* out);
// Rotates pairs (i, i + dim/2) of one head vector for position pos.
void Rope(float* v, uint32_t dim, uint32_t pos, float theta);
// cos and sin of pair i's angle at position pos: the one formula Rope uses,
// also for the CUDA model, which takes the angles from the host.
void RopeAngle(uint32_t dim, uint32_t pos, uint32_t i, float theta, float* c, float* s);
float Silu(float x);
// v = n uniform floats in (-a, a) from a splitmix64 stream named by (seed, tag):
// every weight of the reference models (this one and world_model.h).
void FillUniform(std::vector<float>& v, size_t n, uint64_t seed, uint64_t tag, float a);
// Logits = LogitScale * LmHead . RMSNorm(x): keeps logits of a random model in a
// range where sampling is neither uniform nor always greedy.
inline float LogitScale(const ModelConfig& c) { return 4.0f / std::sqrt(static_cast<float>(c.hidden)); }
// Indices and softmax weights of the top_k gate logits (ties: lower index).
void TopK(const float* logits, uint32_t n, uint32_t k, uint32_t* idx, float* w);
// Samples a token from logits: greedy when temperature <= 0, else softmax
// sampling with a uniform draw from (seed, request, index).
TokenId Sample(std::span<const float> logits, float temperature, uint64_t seed, uint64_t request, uint64_t index);

// ---- The single-process reference (no kvmesh) -----------------------------
//
// One token at a time, full model, KV in plain vectors. The oracle the
// distributed decode is compared against.
class ReferenceModel {
 public:
  explicit ReferenceModel(std::shared_ptr<const Weights> w);

  int NewSequence();
  int Fork(int seq);
  void Truncate(int seq, uint32_t n);  // drop the last n tokens
  // Appends n positions of zero K and V: a context whose KV came from
  // elsewhere (a cache), for a caller that measures the cost of attending to
  // it (kvmesh bench-serve's `reference` engine), not its values.
  void Extend(int seq, uint32_t n);
  uint32_t Length(int seq) const;
  // Feeds tokens one by one; returns the logits after the last.
  std::vector<float> Feed(int seq, std::span<const TokenId> tokens);

 private:
  struct Seq {
    std::vector<std::vector<std::vector<float>>> k, v;  // [layer][pos][kv_heads*head_dim]
    uint32_t len = 0;
  };
  std::vector<float> Step(Seq& s, TokenId t);
  std::shared_ptr<const Weights> w_;
  std::vector<Seq> seqs_;
};

}  // namespace kvmesh::decode

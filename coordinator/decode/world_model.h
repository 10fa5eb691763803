// coordinator/decode/world_model.h — the reference world model: a small
// spatio-temporal transformer over frames of patch tokens (Genie-style
// dynamics model), random weights from a seed, fp32 on the CPU, built from the
// reference decoder's ops (model.h: MatMul, RmsNorm, Silu, FillUniform).
// docs/worldmodel.md describes it and its KV block.
//
// A frame (gray 8-bit, width x height) is cut into patch x patch patches; each
// patch is one token. The tokenizer (codes > 0) is a VQ codebook over the
// patch's pool x pool pixel means, seeded and fixed, with hysteresis: a patch
// keeps its previous token unless another code is nearer by more than
// `hysteresis` (so sensor noise below the quantizer step maps to the same
// token), and x = TokenEmbed[token] + pos[patch]. codes == 0 is the continuous
// front end: x = Win . (pool x pool means / 255 - 0.5) + pos[patch]. Per
// layer, pre-norm:
//   spatial attention: every patch attends to the patches of the same frame
//     within spatial_radius on the patch grid (neighbourhood attention);
//   temporal attention: each patch attends causally to the same patch position
//     in the stream's last `window` frames and itself;
//   FFN (SwiGLU).
// The next-frame logits of a patch are LogitScale . Head . (RMSNorm(x) +
// ActionEmbed[action]) over a vocabulary of `vocab` patch tokens: the frame's
// KV depends on its pixels only, the action conditions the prediction.
//
// KV block of one patch (ModelSpec from Spec(): block_tokens 1, fp32, heads x
// head_dim = hidden), row-major [kv layer][k|v][hidden]: kv layer 2l holds the
// spatial K and V of layer l, 2l+1 the temporal K and V, and the last one the
// patch's output (K slot: RMSNorm(x) after the last layer, V slot: x), from
// which a reused patch's logits are made without recomputing it.
//
// Attention sums are taken relative to the query's own value vector
// (out = v_self + sum_j w_j (v_j - v_self)), so attending to copies of one's
// own KV returns it bit for bit: a frame identical to its predecessors gives
// the same logits whether it is recomputed or reused.
//
// Thread-safety: WorldWeights are immutable; WorldModel::ComputeFrame is
// const and reentrant (scratch is per call).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvmesh/status.h"
#include "kvmesh/types.h"

namespace kvmesh::decode {

struct WorldModelConfig {
  std::string model_id = "kvmesh-world";
  uint32_t width = 64, height = 64, patch = 8;
  uint32_t hidden = 64;
  uint32_t heads = 4;  // head_dim = hidden / heads
  uint32_t layers = 4;
  uint32_t ffn = 128;
  uint32_t vocab = 64;    // patch tokens the head predicts
  uint32_t actions = 8;   // action vocabulary
  uint32_t window = 16;   // frames of temporal context
  uint32_t spatial_radius = 1;  // spatial attention reaches patches within this (Chebyshev) grid distance
  uint32_t pool = 2;      // the tokenizer sees pool x pool pixel means (a low-pass front end)
  uint32_t codes = 0;     // VQ codebook size (0: embed the pixel means continuously; `kvmesh worldmodel`: 512)
  // K and V of every layer projected from the patch's (layer-normed)
  // embedding instead of the layer's input (cross-layer KV from the input,
  // as YOCO-style models share one KV across layers): a patch's KV is then a
  // function of its token alone, and its output depends on the tokens within
  // spatial_radius (not layers x spatial_radius) and on its own past tokens.
  bool input_kv = false;
  float hysteresis = 8;   // VQ: gray levels (L2 over the means) a new code must be nearer by to replace the previous token
  uint64_t seed = 1;

  Status Validate() const;
  uint32_t head_dim() const { return hidden / heads; }
  uint32_t grid_w() const { return width / patch; }
  uint32_t num_patches() const { return (width / patch) * (height / patch); }
  uint32_t pooled() const { return (patch / pool) * (patch / pool); }  // the tokenizer's features per patch
  // Floats of one patch's block: (2 * layers + 1) kv layers of K and V.
  size_t BlockFloats() const { return size_t{2} * (2 * layers + 1) * hidden; }
  size_t BlockBytes() const { return BlockFloats() * sizeof(float); }
  // The kvmesh ModelSpec of a patch block (model_id carries the seed and shape).
  ModelSpec Spec() const;
  uint64_t Params() const;
  // Multiply-adds of one patch through the model with `context` temporal
  // entries (projections, FFN, head; attention scores included).
  uint64_t MacsPerPatch(uint32_t context) const;
};

struct WorldWeights {
  WorldModelConfig config;
  std::vector<float> patch_in;  // codes == 0: [hidden][(patch/pool)^2]
  std::vector<float> codebook;  // codes > 0: [codes][(patch/pool)^2], gray levels 0..255
  std::vector<float> token_in;  // codes > 0: [codes][hidden]
  std::vector<float> pos;       // [patches][hidden]
  struct Layer {
    std::vector<float> s_norm, t_norm, f_norm;     // [hidden]
    std::vector<float> s_wq, s_wk, s_wv, s_wo;     // [hidden][hidden]
    std::vector<float> t_wq, t_wk, t_wv, t_wo;     // [hidden][hidden]
    std::vector<float> w1, w3;                     // [ffn][hidden]
    std::vector<float> w2;                         // [hidden][ffn]
  };
  std::vector<Layer> layers;
  std::vector<float> final_norm;  // [hidden]
  std::vector<float> action;      // [actions][hidden]
  std::vector<float> head;        // [vocab][hidden]

  static Result<std::shared_ptr<const WorldWeights>> Generate(const WorldModelConfig& c);
};

// One frame's inputs. reused[p]: the block of patch p to reuse (BlockFloats
// floats), or nullptr to compute p. history[p]: blocks of patch p in earlier
// frames, oldest first (only read for computed patches; the model takes the
// last window - 1 of them).
struct WorldFrameInput {
  std::span<const uint8_t> pixels;
  uint32_t action = 0;
  std::span<const float* const> reused;
  std::span<const std::vector<const float*>> history;
  // The frame's tokens (WorldModel::Tokenize, num_patches entries); empty:
  // tokenized here without a previous frame (no hysteresis).
  // CacheBlend-style selective refresh (0: off). The first layer is computed
  // for every patch, reused ones included (their history must then be given
  // too); a reused patch whose fresh layer-1 spatial K and V deviate from its
  // reused block's by more than this (||fresh - reused|| / ||reused||) is
  // computed through every layer, the others keep the reused block.
  float refresh_deviation = 0;
  // Out, when not null (num_patches entries): 1 where a reused patch was
  // refreshed (its block written to `blocks` like a computed one's), else 0;
  // and, for reused patches, the measured deviation.
  uint8_t* refreshed = nullptr;
  float* deviation = nullptr;
  std::span<const uint32_t> tokens = {};
};

class WorldModel {
 public:
  explicit WorldModel(std::shared_ptr<const WorldWeights> w);
  const WorldModelConfig& config() const { return w_->config; }

  // Computes the patches that are not reused: writes their blocks to
  // blocks[p * BlockFloats()], and the logits of every patch to
  // logits[p * vocab]. REQUIRES: spans sized for num_patches().
  Status ComputeFrame(const WorldFrameInput& in, std::span<float> blocks, std::span<float> logits) const;

  // The tokens of a frame (num_patches entries into out). codes > 0: the
  // nearest code of each patch, or previous[p] when that code is not nearer
  // by more than `hysteresis` (previous empty: the first frame). codes == 0: a
  // 32-bit hash of the patch's pooled pixel sums (the exact model input).
  Status Tokenize(std::span<const uint8_t> pixels, std::span<const uint32_t> previous, std::span<uint32_t> out) const;

  // Fingerprints of what each patch's block is computed from, the tokens
  // through the model's dependency graph: spatial attention's ordered
  // neighbourhood at each layer and temporal attention's history (as a
  // sorted multiset: attention is order-free, and a history that gains and
  // loses equal entries gives the same block up to float summation order; a
  // history of copies of the patch's own entry counts as none, since it adds
  // exactly nothing).
  // history: the fingerprints temporal_out gave for earlier frames of the
  // stream, oldest first, each num_patches x layers (the last window - 1 are
  // used, as ComputeFrame uses them). Two blocks with equal block_out
  // fingerprints are computed from identical inputs: reusing one for the
  // other is what recomputation gives. temporal_out: [patch][layer],
  // block_out: [patch].
  void Signatures(std::span<const uint32_t> tokens, std::span<const uint64_t* const> history,
                  std::span<uint64_t> temporal_out, std::span<uint64_t> block_out) const;

 private:
  std::shared_ptr<const WorldWeights> w_;
};

// The predicted token of each patch (argmax of its logits; ties: lower id).
std::vector<uint32_t> PredictedTokens(std::span<const float> logits, uint32_t vocab);

}  // namespace kvmesh::decode

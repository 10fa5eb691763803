// kernels/lowrank.h — per-head low-rank bases for the lowrank codec.
//
// For every (layer, k|v, head) of a model the basis holds a mean vector and
// `rank` orthonormal directions (the top principal components of sample K or V
// rows, the idea behind PiKV's LoRA/SVD compression). A block then stores, per
// token, the rank coefficients of (x - mean) in fp16; decode reconstructs
// mean + coefficients x basis. The basis is stored once per model (a file,
// `codec.basis` in the config) and named in each block by its 64-bit id, so a
// block is never decoded against a different basis.
//
// Thread-safety: immutable after Fit/Parse; share it via shared_ptr.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kernels/codec.h"

namespace kvmesh::kernels {

class LowRankBasis {
 public:
  // Fits the basis of layers [shape.layer_begin, +layers) x heads of `shape`
  // from sample raw blocks of that shape (at least one). The residual of each
  // head is the fraction of the samples' centred energy the basis misses.
  static Result<LowRankBasis> Fit(const BlockShape& shape, std::span<const std::span<const std::byte>> samples,
                                  uint32_t rank);
  // Serialised form ("KVLR" file); Parse rejects anything malformed.
  std::vector<std::byte> Serialize() const;
  static Result<LowRankBasis> Parse(std::span<const std::byte> bytes);
  static Result<LowRankBasis> Load(const std::string& path);
  Status Save(const std::string& path) const;

  uint32_t layer_begin() const { return layer_begin_; }
  uint32_t layers() const { return layers_; }
  uint32_t head_begin() const { return head_begin_; }
  uint32_t heads() const { return heads_; }
  uint32_t head_dim() const { return head_dim_; }
  uint32_t rank() const { return rank_; }
  uint64_t id() const { return id_; }
  // Mean fraction of centred energy missed, over all heads (0..1).
  double mean_residual() const;
  // OK when the basis covers (layer, head) with the given head_dim and rank.
  Status Covers(uint32_t layer, uint32_t head, uint32_t head_dim, uint32_t rank) const;

  // Row pointers for (absolute layer, kv, absolute head). REQUIRES Covers().
  const float* mean(uint32_t layer, uint32_t kv, uint32_t head) const;
  const float* basis(uint32_t layer, uint32_t kv, uint32_t head) const;  // [rank][head_dim]
  float residual(uint32_t layer, uint32_t kv, uint32_t head) const;

  // Encodes / decodes one plane of `tokens` rows, using the first `rank` directions.
  void EncodePlane(uint32_t layer, uint32_t kv, uint32_t head, uint32_t rank, const uint8_t* in,
                   uint8_t in_type, uint32_t tokens, uint8_t* out) const;
  void DecodePlane(uint32_t layer, uint32_t kv, uint32_t head, uint32_t rank, const uint8_t* enc,
                   uint32_t tokens, uint8_t* out, uint8_t out_type) const;

 private:
  size_t Index(uint32_t layer, uint32_t kv, uint32_t head) const {
    return (static_cast<size_t>(layer - layer_begin_) * 2 + kv) * heads_ + (head - head_begin_);
  }
  void ComputeId();  // also fills basis_t_
  void ComputeTranspose();

  uint32_t layer_begin_ = 0, layers_ = 0, head_begin_ = 0, heads_ = 0, head_dim_ = 0, rank_ = 0;
  std::vector<float> mean_;      // [plane][dim]
  std::vector<float> basis_;     // [plane][rank][dim]
  std::vector<float> residual_;  // [plane]
  std::vector<float> basis_t_;   // [plane][dim][rank], for encoding
  uint64_t id_ = 0;
};

}  // namespace kvmesh::kernels

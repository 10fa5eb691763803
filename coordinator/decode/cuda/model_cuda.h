// coordinator/decode/cuda/model_cuda.h — the reference model (model.h) on a CUDA
// device: the same seeded weights, the same formulas, fp32, with the weights
// and every sequence's KV cache resident in device memory.
//
// It is ReferenceModel's GPU twin (fp32 math on the CPU, CUDA where a GPU
// is present), built on coordinator/decode/cuda/model_ops.h. Prompts are fed in
// chunks of rows at once (causal attention inside the chunk), decode one row
// a step. MatMul, RMSNorm and RoPE give the CPU's bits; softmax and SiLU use
// CUDA's expf, so logits agree with ReferenceModel within fp32 rounding
// (coordinator/decode/cuda/gpu_model_test.cc states and checks the bound). MoE gating
// (top-k over a few experts) runs on the host with the CPU's TopK, from the
// device's gate logits, so both pick the same experts.
//
// Built with CUDA only (model_cuda.cc); without it (model_cuda_none.cc) Create
// answers Unavailable. With no usable device, Create answers Unavailable too.
//
// Thread-safety: none; one model per thread. Owns one CUDA stream.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "coordinator/decode/model.h"

namespace kvmesh::decode {

// OK when a CUDA device is usable here; else why not.
Status CudaDeviceStatus();

class CudaReferenceModel {
 public:
  // max_positions: the longest sequence (KV cache rows reserved per sequence).
  // Unavailable: no CUDA build or device, or device memory exhausted.
  static Result<std::unique_ptr<CudaReferenceModel>> Create(std::shared_ptr<const Weights> w,
                                                            uint32_t max_positions = 2048);
  ~CudaReferenceModel();
  CudaReferenceModel(const CudaReferenceModel&) = delete;
  CudaReferenceModel& operator=(const CudaReferenceModel&) = delete;

  Result<int> NewSequence();
  Result<int> Fork(int seq);             // shares nothing: copies the KV rows
  Status Truncate(int seq, uint32_t n);  // drop the last n tokens
  Status Release(int seq);               // frees the sequence's device memory
  uint32_t Length(int seq) const;
  // Feeds tokens at the end of seq; returns the logits after the last.
  // ResourceExhausted past max_positions, InvalidArgument for a bad token.
  Result<std::vector<float>> Feed(int seq, std::span<const TokenId> tokens);

  struct Impl;

 private:
  explicit CudaReferenceModel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvmesh::decode

// coordinator/decode/cuda/model_ops.h — the fp32 operations of the reference decoder
// (coordinator/decode/model.h) on a CUDA device: matrix-vector products,
// RMSNorm, RoPE, GQA attention over a contiguous KV cache, SwiGLU and the
// small element-wise steps between them.
//
// Same formulas as the CPU, and where the CPU's result depends only on + * /
// and sqrt, the same bits: the kernels are built with --fmad=false and
// -prec-div/-prec-sqrt, and MatMul/RmsNorm sum in exactly the order of
// decode::Dot (eight strided partial sums, the same combining tree, then the
// tail), so MatMul and RmsNorm equal the CPU's byte for byte. RoPE takes its
// cos/sin from the caller (the host computes them with the CPU's formula), so
// it is exact too. Only expf differs (CUDA's expf is within 2 ulp, glibc's
// within 1): attention's softmax, SiLU and so everything downstream of the
// first layer agree within fp32 rounding, not bit for bit; the GPU test states
// the tolerance.
//
// Shape after codec_cuda.h: check the arguments, run on the caller's stream
// and buffers (all pointers are device pointers unless named host_), never
// allocate, never synchronise. C++17 and the CUDA runtime only, so it builds on
// a bare GPU machine (kernels/cuda/CMakeLists.txt also works as a top-level
// project).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace kvmesh::kernels::cuda {

// y[b*ldy + r] = Dot(W[r*ldw ..], x[b*ldx ..], cols) for r < rows, b < batch.
cudaError_t MatMul(const float* W, size_t ldw, size_t rows, size_t cols, const float* x, size_t ldx, size_t batch,
                   float* y, size_t ldy, cudaStream_t stream);

// out[r] = x[r] / sqrt(mean(x[r]^2) + 1e-6) * gain, for `rows` rows of n.
cudaError_t RmsNorm(const float* x, const float* gain, size_t n, size_t rows, float* out, cudaStream_t stream);

// Rotates pairs (i, i + dim/2) of every head vector of every row:
// v[r][h][..dim], heads per row; cs[r][2*i] = cos, cs[r][2*i+1] = sin of row
// r's position at frequency i (dim/2 pairs per row).
cudaError_t Rope(float* v, size_t rows, uint32_t heads, uint32_t dim, const float* cs, cudaStream_t stream);

// Causal GQA attention of `rows` query rows against one sequence's cache.
// q: [rows][q_heads*dim]; k, v: [positions][kv_heads*dim] (the cache, rows
// already written); row r attends to positions [0, pos0 + r]; out like q.
// scratch: rows*q_heads*(pos0+rows) floats. Query head i reads KV head
// i / (q_heads / kv_heads).
cudaError_t Attention(const float* q, const float* k, const float* v, size_t rows, uint32_t pos0, uint32_t q_heads,
                      uint32_t kv_heads, uint32_t dim, float* scratch, float* out, cudaStream_t stream);

// a[i] = silu(a[i]) * b[i], i < n.
cudaError_t SwiGlu(float* a, const float* b, size_t n, cudaStream_t stream);

// y[i] += alpha * x[i], i < n (alpha = 1: a plain residual add).
cudaError_t Axpy(float alpha, const float* x, float* y, size_t n, cudaStream_t stream);

// x[i] *= alpha, i < n.
cudaError_t Scale(float alpha, float* x, size_t n, cudaStream_t stream);

// out[r] = table[idx[r]] (rows of n floats): embedding look-up and row gather.
cudaError_t GatherRows(const float* table, const uint32_t* idx, size_t rows, size_t n, float* out, cudaStream_t stream);

// y[idx[r]] += w[r] * x[r] (rows of n floats; idx distinct within one call).
cudaError_t ScatterAxpyRows(const float* x, const uint32_t* idx, const float* w, size_t rows, size_t n, float* y,
                            cudaStream_t stream);

}  // namespace kvmesh::kernels::cuda

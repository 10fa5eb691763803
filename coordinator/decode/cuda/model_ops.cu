// coordinator/decode/cuda/model_ops.cu — see model_ops.h. The per-thread work is in
// model_ops_threads.h (tested on the CPU); every product and sum there and
// here uses the explicit round-to-nearest intrinsics, so no flag can fuse one
// into an FMA and change a bit against the CPU.
#include <cmath>

#include "coordinator/decode/cuda/model_ops.h"
#include "coordinator/decode/cuda/model_ops_threads.h"

namespace kvmesh::kernels::cuda {
namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kThreads = 256;

unsigned Blocks(size_t n, int per_block) { return static_cast<unsigned>((n + per_block - 1) / per_block); }

// decode::Dot by eight lanes of a warp (threads::DotLanePartial per lane);
// the xor shuffles 1, 2, 4 build the CPU's tree ((0+1)+(2+3))+((4+5)+(6+7))
// for lane 0 (IEEE addition commutes exactly), which adds the tail. Every
// lane of the warp must call it; lane8 == 0 of each group of eight gets the
// full result.
__device__ float DotLanes(const float* a, const float* b, size_t n, unsigned lane8, bool live) {
  float acc = live ? threads::DotLanePartial(a, b, n, lane8) : 0.0f;
  acc = __fadd_rn(acc, __shfl_xor_sync(kFull, acc, 1));
  acc = __fadd_rn(acc, __shfl_xor_sync(kFull, acc, 2));
  acc = __fadd_rn(acc, __shfl_xor_sync(kFull, acc, 4));
  if (live && lane8 == 0) acc = threads::DotTail(a, b, n, acc);
  return acc;
}

__global__ void MatMulKernel(const float* W, size_t ldw, size_t rows, size_t cols, const float* x, size_t ldx,
                             size_t batch, float* y, size_t ldy) {
  const size_t o = static_cast<size_t>(blockIdx.x) * (blockDim.x / 8) + threadIdx.x / 8;
  const unsigned lane8 = threadIdx.x % 8;
  const threads::MatMulIndex m = threads::MatMulOutput(o, rows, batch);  // dead groups still join the shuffles
  const float s = DotLanes(W + m.r * ldw, x + m.b * ldx, cols, lane8, m.live);
  if (m.live && lane8 == 0) y[m.b * ldy + m.r] = s;
}

// One warp per row.
__global__ void RmsNormKernel(const float* x, const float* gain, size_t n, float* out) {
  const size_t row = blockIdx.x;
  const unsigned lane = threadIdx.x;
  const float* xr = x + row * n;
  const float dot = DotLanes(xr, xr, n, lane, lane < 8);
  float inv = lane == 0 ? threads::RmsInv(dot, n) : 0.0f;
  inv = __shfl_sync(kFull, inv, 0);
  for (size_t i = lane; i < n; i += 32) out[row * n + i] = threads::RmsOut(xr[i], inv, gain[i]);
}

__global__ void RopeKernel(float* v, size_t rows, uint32_t heads, uint32_t dim, const float* cs) {
  threads::RopeThread(v, rows, heads, dim, cs, static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x);
}

__device__ float BlockReduce(float v, bool is_max, float* shared) {
  for (int off = 16; off > 0; off /= 2) {
    const float o = __shfl_xor_sync(kFull, v, off);
    v = is_max ? fmaxf(v, o) : __fadd_rn(v, o);
  }
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  __syncthreads();  // shared may still be read by the previous reduction
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float r = shared[0];
  for (unsigned w = 1; w < warps; ++w) r = is_max ? fmaxf(r, shared[w]) : __fadd_rn(r, shared[w]);
  return r;
}

// One block per (query row, query head).
__global__ void AttentionKernel(const float* q, const float* k, const float* v, uint32_t pos0, uint32_t q_heads,
                                uint32_t kv_heads, uint32_t dim, float scale, size_t stride, float* scratch,
                                float* out) {
  __shared__ float red[32];
  const uint32_t r = blockIdx.x, i = blockIdx.y;
  const threads::AttentionIndex a = threads::AttentionOf(q, scratch, r, i, pos0, q_heads, kv_heads, dim, stride);
  float mx = -INFINITY;
  for (uint32_t p = threadIdx.x; p < a.P; p += blockDim.x) {
    a.scores[p] = threads::AttentionScore(a, k, dim, scale, p);
    mx = fmaxf(mx, a.scores[p]);
  }
  mx = BlockReduce(mx, true, red);
  float sum = 0.0f;
  for (uint32_t p = threadIdx.x; p < a.P; p += blockDim.x) {
    a.scores[p] = expf(__fsub_rn(a.scores[p], mx));
    sum = __fadd_rn(sum, a.scores[p]);
  }
  sum = BlockReduce(sum, false, red);
  __syncthreads();  // every score written before any thread reads them all
  float* o = out + (static_cast<size_t>(r) * q_heads + i) * dim;
  for (uint32_t d = threadIdx.x; d < dim; d += blockDim.x) o[d] = threads::AttentionOut(a, v, sum, d);
}

__global__ void SwiGluKernel(float* a, const float* b, size_t n) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) a[i] = threads::SwiGluOf(a[i], b[i]);
}

__global__ void AxpyKernel(float alpha, const float* x, float* y, size_t n) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = threads::AxpyOf(alpha, x[i], y[i]);
}

__global__ void ScaleKernel(float alpha, float* x, size_t n) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = threads::MulRn(x[i], alpha);
}

__global__ void GatherKernel(const float* table, const uint32_t* idx, size_t rows, size_t n, float* out) {
  const size_t t = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t < rows * n) threads::GatherThread(table, idx, n, out, t);
}

__global__ void ScatterAxpyKernel(const float* x, const uint32_t* idx, const float* w, size_t rows, size_t n,
                                  float* y) {
  const size_t t = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t < rows * n) threads::ScatterAxpyThread(x, idx, w, n, y, t);
}

}  // namespace

cudaError_t MatMul(const float* W, size_t ldw, size_t rows, size_t cols, const float* x, size_t ldx, size_t batch,
                   float* y, size_t ldy, cudaStream_t stream) {
  if (rows == 0 || batch == 0) return cudaSuccess;
  if (!W || !x || !y || ldw < cols || ldx < cols || ldy < rows) return cudaErrorInvalidValue;
  MatMulKernel<<<Blocks(rows * batch, kThreads / 8), kThreads, 0, stream>>>(W, ldw, rows, cols, x, ldx, batch, y, ldy);
  return cudaGetLastError();
}

cudaError_t RmsNorm(const float* x, const float* gain, size_t n, size_t rows, float* out, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (!x || !gain || !out || n == 0) return cudaErrorInvalidValue;
  RmsNormKernel<<<static_cast<unsigned>(rows), 32, 0, stream>>>(x, gain, n, out);
  return cudaGetLastError();
}

cudaError_t Rope(float* v, size_t rows, uint32_t heads, uint32_t dim, const float* cs, cudaStream_t stream) {
  const size_t n = rows * heads * (dim / 2);
  if (n == 0) return cudaSuccess;
  if (!v || !cs || dim % 2 != 0) return cudaErrorInvalidValue;
  RopeKernel<<<Blocks(n, kThreads), kThreads, 0, stream>>>(v, rows, heads, dim, cs);
  return cudaGetLastError();
}

cudaError_t Attention(const float* q, const float* k, const float* v, size_t rows, uint32_t pos0, uint32_t q_heads,
                      uint32_t kv_heads, uint32_t dim, float* scratch, float* out, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (!q || !k || !v || !scratch || !out || dim == 0 || kv_heads == 0 || q_heads % kv_heads != 0)
    return cudaErrorInvalidValue;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dim));  // the CPU's expression, on the host
  const size_t stride = pos0 + rows;
  AttentionKernel<<<dim3(static_cast<unsigned>(rows), q_heads), 128, 0, stream>>>(q, k, v, pos0, q_heads, kv_heads, dim,
                                                                                  scale, stride, scratch, out);
  return cudaGetLastError();
}

cudaError_t SwiGlu(float* a, const float* b, size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (!a || !b) return cudaErrorInvalidValue;
  SwiGluKernel<<<Blocks(n, kThreads), kThreads, 0, stream>>>(a, b, n);
  return cudaGetLastError();
}

cudaError_t Axpy(float alpha, const float* x, float* y, size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (!x || !y) return cudaErrorInvalidValue;
  AxpyKernel<<<Blocks(n, kThreads), kThreads, 0, stream>>>(alpha, x, y, n);
  return cudaGetLastError();
}

cudaError_t Scale(float alpha, float* x, size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (!x) return cudaErrorInvalidValue;
  ScaleKernel<<<Blocks(n, kThreads), kThreads, 0, stream>>>(alpha, x, n);
  return cudaGetLastError();
}

cudaError_t GatherRows(const float* table, const uint32_t* idx, size_t rows, size_t n, float* out,
                       cudaStream_t stream) {
  if (rows * n == 0) return cudaSuccess;
  if (!table || !idx || !out) return cudaErrorInvalidValue;
  GatherKernel<<<Blocks(rows * n, kThreads), kThreads, 0, stream>>>(table, idx, rows, n, out);
  return cudaGetLastError();
}

cudaError_t ScatterAxpyRows(const float* x, const uint32_t* idx, const float* w, size_t rows, size_t n, float* y,
                            cudaStream_t stream) {
  if (rows * n == 0) return cudaSuccess;
  if (!x || !idx || !w || !y) return cudaErrorInvalidValue;
  ScatterAxpyKernel<<<Blocks(rows * n, kThreads), kThreads, 0, stream>>>(x, idx, w, rows, n, y);
  return cudaGetLastError();
}

}  // namespace kvmesh::kernels::cuda

// coordinator/decode/cuda/model_ops_threads.h — what one CUDA thread (or lane) of each
// kernel in model_ops.cu does, as host/device functions of its indices. The
// __global__ kernels only compute their indices, call these and do the warp
// shuffles and block reductions; tests/test_decode.cc runs these on the CPU
// (emulating the shuffles lane by lane) against the reference model's CPU
// functions, so the index math and the summation order that make MatMul,
// RMSNorm and RoPE bit-identical are checked on machines without a GPU.
//
// Every product and sum goes through MulRn/AddRn/SubRn: round-to-nearest
// intrinsics on the device (nothing can be fused into an FMA), plain
// operations on the host (built without FMA contraction).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/codec_math.h"  // KVMESH_HD

namespace kvmesh::kernels::cuda::threads {

// The device pass uses the intrinsics; the host pass (tests) plain operations.
#if defined(__CUDA_ARCH__)
#define KVMESH_RN(dev, host) return dev
#else
#define KVMESH_RN(dev, host) return host
#endif
KVMESH_HD float MulRn(float a, float b) { KVMESH_RN(__fmul_rn(a, b), a * b); }
KVMESH_HD float AddRn(float a, float b) { KVMESH_RN(__fadd_rn(a, b), a + b); }
KVMESH_HD float SubRn(float a, float b) { KVMESH_RN(__fsub_rn(a, b), a - b); }
KVMESH_HD float DivRn(float a, float b) { KVMESH_RN(__fdiv_rn(a, b), a / b); }
KVMESH_HD float SqrtRn(float a) { KVMESH_RN(__fsqrt_rn(a), std::sqrt(a)); }
#undef KVMESH_RN

// decode::Dot by one thread: eight strided partial sums, the same combining
// tree ((0+1)+(2+3))+((4+5)+(6+7)), then the tail in order.
KVMESH_HD float DotSeq(const float* a, const float* b, uint32_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  uint32_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] = AddRn(acc[j], MulRn(a[i + j], b[i + j]));
  float s =
      AddRn(AddRn(AddRn(acc[0], acc[1]), AddRn(acc[2], acc[3])), AddRn(AddRn(acc[4], acc[5]), AddRn(acc[6], acc[7])));
  for (; i < n; ++i) s = AddRn(s, MulRn(a[i], b[i]));
  return s;
}

// decode::Dot by eight lanes: lane j's partial sum (elements j, j+8, ...
// below n/8*8). The kernel then adds the lanes with xor shuffles 1, 2, 4,
// which for lane 0 is the CPU's tree (IEEE addition commutes exactly), and
// lane 0 adds the tail (DotTail).
KVMESH_HD float DotLanePartial(const float* a, const float* b, size_t n, unsigned lane8) {
  const size_t n8 = n / 8 * 8;
  float acc = 0.0f;
  for (size_t i = lane8; i < n8; i += 8) acc = AddRn(acc, MulRn(a[i], b[i]));
  return acc;
}
KVMESH_HD float DotTail(const float* a, const float* b, size_t n, float s) {
  for (size_t i = n / 8 * 8; i < n; ++i) s = AddRn(s, MulRn(a[i], b[i]));
  return s;
}

// MatMul: the group of eight lanes number g computes output o = g: (row r, batch b).
struct MatMulIndex {
  size_t r, b;
  bool live;
};
KVMESH_HD MatMulIndex MatMulOutput(size_t o, size_t rows, size_t batch) {
  const bool live = o < rows * batch;
  return {live ? o % rows : 0, live ? o / rows : 0, live};
}

// RMSNorm's scale from the row's Dot(x, x): 1 / sqrt(mean + 1e-6).
KVMESH_HD float RmsInv(float dot, size_t n) {
  const float ms = DivRn(dot, static_cast<float>(n));
  return DivRn(1.0f, SqrtRn(AddRn(ms, 1e-6f)));
}
KVMESH_HD float RmsOut(float x, float inv, float gain) { return MulRn(MulRn(x, inv), gain); }

// RoPE: thread t < rows * heads * dim/2 rotates pair i of head h of row r.
KVMESH_HD void RopeThread(float* v, size_t rows, uint32_t heads, uint32_t dim, const float* cs, size_t t) {
  const uint32_t half = dim / 2;
  if (t >= rows * heads * half) return;
  const uint32_t i = static_cast<uint32_t>(t % half);
  const size_t rh = t / half, r = rh / heads;
  float* h = v + rh * dim;
  const float c = cs[r * dim + 2 * i], s = cs[r * dim + 2 * i + 1];
  const float a = h[i], b = h[i + half];
  h[i] = SubRn(MulRn(a, c), MulRn(b, s));
  h[i + half] = AddRn(MulRn(a, s), MulRn(b, c));
}

// Attention of query row r, head i (one block): where its query, its KV head
// and its scores are, and how many positions it sees.
struct AttentionIndex {
  const float* q;  // the query head vector
  size_t kv_off;   // offset of its KV head inside one position's K (or V) row
  size_t kvw;      // floats of one position's K (or V) row
  float* scores;   // scratch for its scores
  uint32_t P;      // positions it attends to: [0, pos0 + r]
};
KVMESH_HD AttentionIndex AttentionOf(const float* q, float* scratch, uint32_t r, uint32_t i, uint32_t pos0,
                                     uint32_t q_heads, uint32_t kv_heads, uint32_t dim, size_t stride) {
  const uint32_t kvh = i / (q_heads / kv_heads);
  return {q + (static_cast<size_t>(r) * q_heads + i) * dim, static_cast<size_t>(kvh) * dim,
          static_cast<size_t>(kv_heads) * dim, scratch + (static_cast<size_t>(r) * q_heads + i) * stride, pos0 + r + 1};
}
KVMESH_HD float AttentionScore(const AttentionIndex& a, const float* k, uint32_t dim, float scale, uint32_t p) {
  return MulRn(DotSeq(a.q, k + static_cast<size_t>(p) * a.kvw + a.kv_off, dim), scale);
}
// Output element d: sum over positions in order of (score / sum) * v.
KVMESH_HD float AttentionOut(const AttentionIndex& a, const float* v, float sum, uint32_t d) {
  float acc = 0.0f;
  for (uint32_t p = 0; p < a.P; ++p)
    acc = AddRn(acc, MulRn(DivRn(a.scores[p], sum), v[static_cast<size_t>(p) * a.kvw + a.kv_off + d]));
  return acc;
}

KVMESH_HD float SwiGluOf(float a, float b) { return MulRn(DivRn(a, AddRn(1.0f, expf(-a))), b); }
KVMESH_HD float AxpyOf(float alpha, float x, float y) { return AddRn(y, MulRn(alpha, x)); }

// Row gather / scatter: thread t < rows * n moves element t % n of row t / n.
KVMESH_HD void GatherThread(const float* table, const uint32_t* idx, size_t n, float* out, size_t t) {
  out[t] = table[static_cast<size_t>(idx[t / n]) * n + t % n];
}
KVMESH_HD void ScatterAxpyThread(const float* x, const uint32_t* idx, const float* w, size_t n, float* y, size_t t) {
  const size_t r = t / n, c = t % n;
  float* dst = y + static_cast<size_t>(idx[r]) * n + c;
  *dst = AxpyOf(w[r], x[t], *dst);
}

}  // namespace kvmesh::kernels::cuda::threads

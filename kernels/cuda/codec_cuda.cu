// CUDA kernels for the codecs: one thread per group computes scales (pass 1),
// one thread per code byte writes codes (pass 2), one thread per code byte
// decodes. Every value comes from the shared functions in codec_math.h.
#include "kernels/cuda/codec_cuda.h"

namespace kvmesh::kernels::cuda {
namespace {

constexpr int kThreads = 256;

struct Plane {
  const uint8_t* raw;
  uint8_t* enc;
};

__device__ __forceinline__ size_t RawOff(const PlaneSet& s, size_t p) {
  return (p / s.inner) * s.raw_outer_stride + (p % s.inner) * s.raw_inner_stride;
}
__device__ __forceinline__ size_t EncOff(const PlaneSet& s, size_t p) {
  return (p / s.inner) * s.enc_outer_stride + (p % s.inner) * s.enc_inner_stride;
}

// Pass 1: one thread per (plane, group).
__global__ void GroupStatsKernel(PlaneSet s, const uint8_t* raw, uint8_t* enc, size_t total) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= total) return;
  const size_t p = i / s.geom.groups, gi = i % s.geom.groups;
  EncodeGroupStats(s.geom, raw + RawOff(s, p), enc + EncOff(s, p), gi);
}

// Pass 2: one thread per (plane, padded code byte); padding bytes get 0.
__global__ void CodesKernel(PlaneSet s, const uint8_t* raw, uint8_t* enc, size_t per_plane, size_t total) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= total) return;
  const size_t p = i / per_plane, b = i % per_plane;
  uint8_t* out = enc + EncOff(s, p);
  if (b < CodeBytes(s.geom)) {
    EncodeCodeByte(s.geom, raw + RawOff(s, p), out, b);
  } else {
    out[s.geom.codes_off + b] = 0;
  }
}

// fp16 / bf16 / raw planes: one thread per element (+ padding bytes).
__global__ void ConvertEncodeKernel(PlaneSet s, const uint8_t* raw, uint8_t* enc, size_t per_plane, size_t total) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= total) return;
  const size_t p = i / per_plane, e = i % per_plane;
  const PlaneGeom& g = s.geom;
  const size_t elems = static_cast<size_t>(g.tokens) * g.dim;
  const uint8_t* in = raw + RawOff(s, p);
  uint8_t* out = enc + EncOff(s, p);
  const uint32_t esize = g.codec == kCodecRaw ? ElemSize(g.in_type) : 2u;
  const uint8_t t = g.codec == kCodecFp16 ? kElemFp16 : kElemBf16;
  if (e < elems) {
    if (g.codec == kCodecRaw || t == g.in_type) {  // bytes as they are (like the CPU's memcpy, NaN payloads too)
      for (uint32_t k = 0; k < esize; ++k) out[e * esize + k] = in[e * esize + k];
    } else {
      StoreElem(out, e, t, LoadElem(in, e, g.in_type));
    }
  } else {
    // Padding: elements past the end cover the bytes up to g.bytes.
    const size_t first = elems * esize + (e - elems) * esize;
    for (uint32_t k = 0; k < esize && first + k < g.bytes; ++k) out[first + k] = 0;
  }
}

__global__ void DecodeKernel(PlaneSet s, const uint8_t* enc, uint8_t* raw, uint8_t out_type, size_t per_plane,
                             size_t total) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= total) return;
  const size_t p = i / per_plane, b = i % per_plane;
  const PlaneGeom& g = s.geom;
  const uint8_t* in = enc + EncOff(s, p);
  uint8_t* out = raw + RawOff(s, p);
  const size_t elems = static_cast<size_t>(g.tokens) * g.dim;
  if (IsQuantising(g.codec)) {
    if (g.codec == kCodecInt4) {
      StoreElem(out, 2 * b, out_type, DecodeElement(g, in, 2 * b));
      if (2 * b + 1 < elems) StoreElem(out, 2 * b + 1, out_type, DecodeElement(g, in, 2 * b + 1));
    } else {
      StoreElem(out, b, out_type, DecodeElement(g, in, b));
    }
    return;
  }
  const uint8_t t = g.codec == kCodecRaw ? g.in_type : (g.codec == kCodecFp16 ? kElemFp16 : kElemBf16);
  if (t == out_type) {  // bytes as they are, like the CPU's memcpy
    for (uint32_t k = 0; k < ElemSize(t); ++k) out[b * ElemSize(t) + k] = in[b * ElemSize(t) + k];
  } else {
    StoreElem(out, b, out_type, LoadElem(in, b, t));
  }
}

unsigned Blocks(size_t total) { return static_cast<unsigned>((total + kThreads - 1) / kThreads); }

bool Valid(const PlaneSet& s, const void* a, const void* b) {
  return a != nullptr && b != nullptr && s.outer > 0 && s.inner > 0 && s.geom.tokens > 0 && s.geom.dim > 0 &&
         s.geom.codec < kCodecKindCount && s.geom.codec != kCodecLowRank;
}

}  // namespace

cudaError_t EncodePlanes(const PlaneSet& s, const void* raw, void* enc, cudaStream_t stream) {
  if (!Valid(s, raw, enc)) return cudaErrorInvalidValue;
  const size_t planes = static_cast<size_t>(s.outer) * s.inner;
  const auto* in = static_cast<const uint8_t*>(raw);
  auto* out = static_cast<uint8_t*>(enc);
  if (IsQuantising(s.geom.codec)) {
    const size_t groups = planes * s.geom.groups;
    GroupStatsKernel<<<Blocks(groups), kThreads, 0, stream>>>(s, in, out, groups);
    const size_t per_plane = s.geom.bytes - s.geom.codes_off;
    const size_t total = planes * per_plane;
    CodesKernel<<<Blocks(total), kThreads, 0, stream>>>(s, in, out, per_plane, total);
  } else {
    const uint32_t esize = s.geom.codec == kCodecRaw ? ElemSize(s.geom.in_type) : 2u;
    const size_t per_plane = (s.geom.bytes + esize - 1) / esize;
    const size_t total = planes * per_plane;
    ConvertEncodeKernel<<<Blocks(total), kThreads, 0, stream>>>(s, in, out, per_plane, total);
  }
  return cudaGetLastError();
}

cudaError_t DecodePlanes(const PlaneSet& s, const void* enc, void* raw, uint8_t out_type, cudaStream_t stream) {
  if (!Valid(s, enc, raw) || out_type > kElemFp32) return cudaErrorInvalidValue;
  const size_t planes = static_cast<size_t>(s.outer) * s.inner;
  const size_t elems = static_cast<size_t>(s.geom.tokens) * s.geom.dim;
  const size_t per_plane = IsQuantising(s.geom.codec) ? CodeBytes(s.geom) : elems;
  const size_t total = planes * per_plane;
  DecodeKernel<<<Blocks(total), kThreads, 0, stream>>>(s, static_cast<const uint8_t*>(enc), static_cast<uint8_t*>(raw),
                                                       out_type, per_plane, total);
  return cudaGetLastError();
}

}  // namespace kvmesh::kernels::cuda

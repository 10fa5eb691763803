// kernels/codec_math.h — the arithmetic every codec backend shares.
//
// This header is the single definition of what the quantising codecs compute:
// number conversions (fp16, bf16, fp8 e4m3/e5m2), the geometry of a quantised
// plane (where its scales, zero points and codes live) and the per-group
// encode / per-element decode steps. The scalar CPU path and the CUDA kernels
// call these functions directly, and the AVX2 path reproduces them lane by
// lane, which is why all three produce the same bytes.
//
// Rules that keep the backends bit-identical (tests check them):
//   * only +, -, *, / and rint on floats, each rounded separately: kernels are
//     built with -ffp-contract=off (g++) and --fmad=false (nvcc), so a*b+c is
//     never fused;
//   * maxima and minima are taken as `x > acc ? x : acc` starting from a finite
//     value, so NaN inputs are ignored and the result does not depend on the
//     order of the reduction (which is what lets SIMD lanes and warps reduce
//     in their own order);
//   * scales are rounded to fp16 *before* the codes are computed, and the
//     codes are computed from the rounded scale, so decode sees the same scale.
//
// Host-only C++17 plus CUDA: no <bit>, no std:: containers, no exceptions.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define KVMESH_HD __host__ __device__ __forceinline__
#else
#define KVMESH_HD inline
#endif

namespace kvmesh::kernels {

// ---- Codec and layout identifiers (stored in the block format: never renumber) --
enum CodecKind : uint8_t {
  kCodecRaw = 0,      // the input bytes unchanged (any dtype)
  kCodecFp16 = 1,     // elements converted to fp16
  kCodecBf16 = 2,     // elements converted to bf16
  kCodecInt8 = 3,     // symmetric int8 per group, fp16 scales
  kCodecInt4 = 4,     // asymmetric uint4 per group, fp16 scale + fp16 zero point
  kCodecFp8E4M3 = 5,  // fp8 e4m3 (OCP "fn": max 448, no inf) per group, fp16 scales
  kCodecFp8E5M2 = 6,  // fp8 e5m2 (max 57344) per group, fp16 scales
  kCodecLowRank = 7,  // per-head rank-r projection, fp16 coefficients
  kCodecKindCount = 8,
};

// How quantisation groups run through a [token][dim] plane.
enum QuantAxis : uint8_t {
  kPerToken = 0,    // groups of `group` consecutive dims inside one token row
  kPerChannel = 1,  // groups of `group` consecutive tokens inside one dim column (KIVI keys)
};

// Element types of the raw (uncompressed) block; same numbering as kvmesh::DType.
enum ElemType : uint8_t { kElemFp16 = 0, kElemBf16 = 1, kElemFp32 = 2 };

KVMESH_HD constexpr uint32_t ElemSize(uint8_t t) { return t == kElemFp32 ? 4u : 2u; }

KVMESH_HD constexpr bool IsQuantising(uint8_t c) {
  return c == kCodecInt8 || c == kCodecInt4 || c == kCodecFp8E4M3 || c == kCodecFp8E5M2;
}

// ---- Bit casts ---------------------------------------------------------------
KVMESH_HD uint32_t FloatBits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
KVMESH_HD float BitsFloat(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// ---- fp16 --------------------------------------------------------------------
KVMESH_HD float HalfToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) return BitsFloat(sign | 0x7F800000u | (mant << 13));  // inf / NaN
  if (exp == 0) {
    // Subnormal or zero: mant * 2^-24, exact in float.
    float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return BitsFloat(FloatBits(v) | sign);
  }
  return BitsFloat(sign | ((exp + 112u) << 23) | (mant << 13));
}

// Round-to-nearest-even, like F16C's vcvtps2ph with imm 0 on finite values.
KVMESH_HD uint16_t FloatToHalf(float f) {
  uint32_t u = FloatBits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  u &= 0x7FFFFFFFu;
  uint32_t o;
  if (u >= 0x47800000u) {  // >= 65536 (rounds to inf), inf or NaN
    o = u > 0x7F800000u ? (0x7E00u | ((u >> 13) & 0x3FFu)) : 0x7C00u;
  } else if (u < 0x38800000u) {  // result is subnormal or zero
    // Adding 0.5 aligns the 10 result bits at the bottom; the FPU rounds (RNE).
    float v = BitsFloat(u) + 0.5f;
    o = FloatBits(v) - 0x3F000000u;
  } else {
    uint32_t odd = (u >> 13) & 1u;
    u += 0xC8000FFFu + odd;  // rebias exponent (-112 << 23) and round
    o = u >> 13;
  }
  return static_cast<uint16_t>(o | sign);
}

// ---- bf16 --------------------------------------------------------------------
KVMESH_HD float Bf16ToFloat(uint16_t b) { return BitsFloat(static_cast<uint32_t>(b) << 16); }
KVMESH_HD uint16_t FloatToBf16(float f) {
  uint32_t u = FloatBits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// ---- fp8 ---------------------------------------------------------------------
// e4m3 (OCP "fn"): bias 7, no inf, 0x7F = NaN, max 448. e5m2: bias 15, max 57344.
// Encoding saturates finite values to the largest finite code and rounds to
// nearest even; NaN encodes as the format's NaN.
template <int kExpBits, int kMantBits, int kBias, uint32_t kMaxCode>
KVMESH_HD uint8_t FloatToFp8(float f) {
  uint32_t u = FloatBits(f);
  uint32_t sign = (u >> 24) & 0x80u;
  uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint8_t>(sign | 0x7Fu);  // NaN
  uint32_t code;
  // Smallest normal: 2^(1 - bias).
  const uint32_t min_normal_bits = static_cast<uint32_t>(127 + 1 - kBias) << 23;
  if (a < min_normal_bits) {
    // Subnormal: a / 2^(1-bias-mant), rounded to nearest even; 2^mant means
    // "rounded up to the smallest normal", whose code is also 2^mant.
    float scaled = BitsFloat(a) * BitsFloat(static_cast<uint32_t>(127 + kBias - 1 + kMantBits) << 23);
    code = static_cast<uint32_t>(rintf(scaled));
  } else {
    const int shift = 23 - kMantBits;
    uint32_t odd = (a >> shift) & 1u;
    uint64_t v = static_cast<uint64_t>(a) - (static_cast<uint64_t>(127 - kBias) << 23) +
                 ((1u << (shift - 1)) - 1u) + odd;
    code = static_cast<uint32_t>(v >> shift);
  }
  if (code > kMaxCode) code = kMaxCode;
  return static_cast<uint8_t>(sign | code);
}

template <int kExpBits, int kMantBits, int kBias, bool kHasInf>
KVMESH_HD float Fp8ToFloat(uint8_t c) {
  uint32_t sign = (c & 0x80u) ? 0x80000000u : 0u;
  uint32_t exp = (c >> kMantBits) & ((1u << kExpBits) - 1u);
  uint32_t mant = c & ((1u << kMantBits) - 1u);
  const uint32_t exp_max = (1u << kExpBits) - 1u;
  if (kHasInf && exp == exp_max) return BitsFloat(sign | 0x7F800000u | (mant ? 0x400000u : 0u));
  if (!kHasInf && exp == exp_max && mant == (1u << kMantBits) - 1u) return BitsFloat(sign | 0x7FC00000u);
  if (exp == 0) {
    float v = static_cast<float>(mant) * BitsFloat(static_cast<uint32_t>(127 + 1 - kBias - kMantBits) << 23);
    return BitsFloat(FloatBits(v) | sign);
  }
  return BitsFloat(sign | ((exp + 127u - kBias) << 23) | (mant << (23 - kMantBits)));
}

KVMESH_HD uint8_t FloatToE4M3(float f) { return FloatToFp8<4, 3, 7, 0x7Eu>(f); }
KVMESH_HD uint8_t FloatToE5M2(float f) { return FloatToFp8<5, 2, 15, 0x7Bu>(f); }
KVMESH_HD float E4M3ToFloat(uint8_t c) { return Fp8ToFloat<4, 3, 7, false>(c); }
KVMESH_HD float E5M2ToFloat(uint8_t c) { return Fp8ToFloat<5, 2, 15, true>(c); }

// ---- Element load/store -------------------------------------------------------
KVMESH_HD float LoadElem(const uint8_t* base, size_t i, uint8_t type) {
  if (type == kElemFp32) {
    float f;
    memcpy(&f, base + 4 * i, 4);
    return f;
  }
  uint16_t h;
  memcpy(&h, base + 2 * i, 2);
  return type == kElemFp16 ? HalfToFloat(h) : Bf16ToFloat(h);
}
KVMESH_HD void StoreElem(uint8_t* base, size_t i, uint8_t type, float v) {
  if (type == kElemFp32) {
    memcpy(base + 4 * i, &v, 4);
    return;
  }
  uint16_t h = type == kElemFp16 ? FloatToHalf(v) : FloatToBf16(v);
  memcpy(base + 2 * i, &h, 2);
}
KVMESH_HD uint16_t LoadU16(const uint8_t* p, size_t i) {
  uint16_t h;
  memcpy(&h, p + 2 * i, 2);
  return h;
}
KVMESH_HD void StoreU16(uint8_t* p, size_t i, uint16_t v) { memcpy(p + 2 * i, &v, 2); }

// ---- Plane geometry -------------------------------------------------------------
// A plane is one [token][dim] matrix of one (layer, k|v, head). Its encoded form:
//   [scales: fp16 x groups][zeros: fp16 x groups, int4 only][codes], padded to 16 bytes.
// Codes follow the plane's element order t*dim + d: one byte per element
// (int8, fp8) or two per byte for int4 (even element in the low nibble).
// Group g: per token, g = t * groups_per_row + j covers dims [j*G, min(D,(j+1)*G))
// of token t; per channel, g = j * dim + d covers tokens [j*G, min(T,(j+1)*G)) of dim d.
inline constexpr size_t kPlaneAlign = 16;

KVMESH_HD constexpr size_t AlignUp(size_t n, size_t a) { return (n + a - 1) / a * a; }

struct PlaneGeom {
  uint8_t codec = kCodecRaw;
  uint8_t axis = kPerToken;
  uint8_t in_type = kElemFp16;
  uint32_t group = 0;   // effective group length (clamped to the axis length)
  uint32_t tokens = 0;
  uint32_t dim = 0;
  uint32_t rank = 0;    // lowrank only
  uint32_t groups_per_line = 0;  // per token: groups per row; per channel: token groups
  size_t groups = 0;
  size_t scales_off = 0, zeros_off = 0, codes_off = 0;
  size_t bytes = 0;     // padded encoded size of the plane
};

KVMESH_HD PlaneGeom MakePlaneGeom(uint8_t codec, uint8_t axis, uint32_t group, uint32_t tokens,
                                  uint32_t dim, uint8_t in_type, uint32_t rank) {
  PlaneGeom g;
  g.codec = codec;
  g.axis = axis;
  g.in_type = in_type;
  g.tokens = tokens;
  g.dim = dim;
  g.rank = rank;
  const size_t elems = static_cast<size_t>(tokens) * dim;
  switch (codec) {
    case kCodecRaw:
      g.bytes = AlignUp(elems * ElemSize(in_type), kPlaneAlign);
      return g;
    case kCodecFp16:
    case kCodecBf16:
      g.bytes = AlignUp(elems * 2, kPlaneAlign);
      return g;
    case kCodecLowRank:
      g.codes_off = 0;
      g.bytes = AlignUp(static_cast<size_t>(tokens) * rank * 2, kPlaneAlign);
      return g;
    default:
      break;
  }
  const uint32_t line = axis == kPerToken ? dim : tokens;
  g.group = group < line ? group : line;
  if (g.group == 0) g.group = 1;
  g.groups_per_line = (line + g.group - 1) / g.group;
  g.groups = static_cast<size_t>(g.groups_per_line) * (axis == kPerToken ? tokens : dim);
  g.scales_off = 0;
  g.zeros_off = g.groups * 2;
  g.codes_off = g.zeros_off + (codec == kCodecInt4 ? g.groups * 2 : 0);
  const size_t code_bytes = codec == kCodecInt4 ? (elems + 1) / 2 : elems;
  g.bytes = AlignUp(g.codes_off + code_bytes, kPlaneAlign);
  return g;
}

// Group index of element (t, d).
KVMESH_HD size_t GroupOf(const PlaneGeom& g, uint32_t t, uint32_t d) {
  if (g.axis == kPerToken) return static_cast<size_t>(t) * g.groups_per_line + d / g.group;
  return static_cast<size_t>(t / g.group) * g.dim + d;
}

// ---- Group statistics -> scale (and zero point) ---------------------------------
inline constexpr float kFp16Max = 65504.0f;

KVMESH_HD float ClampF(float x, float lo, float hi) {
  x = x > lo ? x : lo;  // NaN -> lo
  return x < hi ? x : hi;
}

// 1/s, or 0 for a zero scale (an all-zero group).
KVMESH_HD float SafeInv(float s) { return s != 0.0f ? 1.0f / s : 0.0f; }

// Largest finite magnitude of each quantiser's code range.
KVMESH_HD float CodeMax(uint8_t codec) {
  return codec == kCodecInt8 ? 127.0f : codec == kCodecFp8E4M3 ? 448.0f : 57344.0f;
}

// Symmetric quantisers (int8, fp8): scale = min(absmax, fp16 max) / code max, rounded to fp16.
KVMESH_HD uint16_t SymmetricScale(float absmax, uint8_t codec) {
  absmax = absmax < kFp16Max ? absmax : kFp16Max;
  return FloatToHalf(absmax / CodeMax(codec));
}

// Asymmetric uint4: zero = fp16(min); scale = fp16((max - zero) / 15).
KVMESH_HD void AsymmetricScale(float mn, float mx, uint16_t* scale, uint16_t* zero) {
  mn = ClampF(mn, -kFp16Max, kFp16Max);
  mx = ClampF(mx, -kFp16Max, kFp16Max);
  if (mx < mn) mx = mn;  // an all-NaN group
  *zero = FloatToHalf(mn);
  float range = mx - HalfToFloat(*zero);
  range = range > 0.0f ? range : 0.0f;
  *scale = FloatToHalf(range / 15.0f);
}

// ---- Per-element quantise / dequantise --------------------------------------------
KVMESH_HD uint8_t QuantInt8(float x, float inv) {
  float q = ClampF(x * inv, -127.0f, 127.0f);
  return static_cast<uint8_t>(static_cast<int8_t>(rintf(q)));
}
KVMESH_HD float DequantInt8(uint8_t c, float scale) {
  return static_cast<float>(static_cast<int8_t>(c)) * scale;
}
KVMESH_HD uint8_t QuantInt4(float x, float zero, float inv) {
  float q = ClampF((x - zero) * inv, 0.0f, 15.0f);
  return static_cast<uint8_t>(rintf(q));
}
KVMESH_HD float DequantInt4(uint8_t q, float scale, float zero) {
  float a = static_cast<float>(q) * scale;
  return a + zero;
}
KVMESH_HD uint8_t QuantFp8(float x, float inv, uint8_t codec) {
  float v = x * inv;
  return codec == kCodecFp8E4M3 ? FloatToE4M3(v) : FloatToE5M2(v);
}
KVMESH_HD float DequantFp8(uint8_t c, float scale, uint8_t codec) {
  float v = codec == kCodecFp8E4M3 ? E4M3ToFloat(c) : E5M2ToFloat(c);
  return v * scale;
}

// ---- Reference encode of one work unit ----------------------------------------------
// Encoding runs in two passes that parallelise without write conflicts:
// EncodeGroupStats computes and stores one group's scale (and zero point);
// EncodeCodeByte then writes one code byte (one element, or an element pair
// for int4, which may straddle two groups) from the stored scales.

KVMESH_HD void GroupBounds(const PlaneGeom& g, size_t gi, uint32_t* t0, uint32_t* t1, uint32_t* d0,
                           uint32_t* d1) {
  if (g.axis == kPerToken) {
    uint32_t t = static_cast<uint32_t>(gi / g.groups_per_line);
    uint32_t j = static_cast<uint32_t>(gi % g.groups_per_line);
    *t0 = t;
    *t1 = t + 1;
    *d0 = j * g.group;
    *d1 = *d0 + g.group < g.dim ? *d0 + g.group : g.dim;
  } else {
    uint32_t j = static_cast<uint32_t>(gi / g.dim);
    uint32_t d = static_cast<uint32_t>(gi % g.dim);
    *d0 = d;
    *d1 = d + 1;
    *t0 = j * g.group;
    *t1 = *t0 + g.group < g.tokens ? *t0 + g.group : g.tokens;
  }
}

// Computes and stores group gi's scale (and zero point for int4).
KVMESH_HD void EncodeGroupStats(const PlaneGeom& g, const uint8_t* in, uint8_t* out, size_t gi) {
  uint32_t t0, t1, d0, d1;
  GroupBounds(g, gi, &t0, &t1, &d0, &d1);
  if (g.codec == kCodecInt4) {
    float mn = 3.0e38f, mx = -3.0e38f;
    for (uint32_t t = t0; t < t1; ++t)
      for (uint32_t d = d0; d < d1; ++d) {
        float x = LoadElem(in, static_cast<size_t>(t) * g.dim + d, g.in_type);
        mn = x < mn ? x : mn;
        mx = x > mx ? x : mx;
      }
    uint16_t s, z;
    AsymmetricScale(mn, mx, &s, &z);
    StoreU16(out + g.scales_off, gi, s);
    StoreU16(out + g.zeros_off, gi, z);
    return;
  }
  float amax = 0.0f;
  for (uint32_t t = t0; t < t1; ++t)
    for (uint32_t d = d0; d < d1; ++d) {
      float a = fabsf(LoadElem(in, static_cast<size_t>(t) * g.dim + d, g.in_type));
      amax = a > amax ? a : amax;
    }
  StoreU16(out + g.scales_off, gi, SymmetricScale(amax, g.codec));
}

// The code of element e (= t*dim + d), given the group stats already stored in `out`.
KVMESH_HD uint8_t EncodeElement(const PlaneGeom& g, const uint8_t* in, const uint8_t* out, size_t e) {
  uint32_t t = static_cast<uint32_t>(e / g.dim), d = static_cast<uint32_t>(e % g.dim);
  size_t gi = GroupOf(g, t, d);
  float x = LoadElem(in, e, g.in_type);
  float scale = HalfToFloat(LoadU16(out + g.scales_off, gi));
  float inv = SafeInv(scale);
  if (g.codec == kCodecInt8) return QuantInt8(x, inv);
  if (g.codec == kCodecInt4) return QuantInt4(x, HalfToFloat(LoadU16(out + g.zeros_off, gi)), inv);
  return QuantFp8(x, inv, g.codec);
}

// Writes code byte b of the plane (one element, or two for int4).
KVMESH_HD void EncodeCodeByte(const PlaneGeom& g, const uint8_t* in, uint8_t* out, size_t b) {
  const size_t elems = static_cast<size_t>(g.tokens) * g.dim;
  if (g.codec == kCodecInt4) {
    uint8_t lo = EncodeElement(g, in, out, 2 * b);
    uint8_t hi = 2 * b + 1 < elems ? EncodeElement(g, in, out, 2 * b + 1) : 0;
    out[g.codes_off + b] = static_cast<uint8_t>(lo | (hi << 4));
  } else {
    out[g.codes_off + b] = EncodeElement(g, in, out, b);
  }
}

KVMESH_HD size_t CodeBytes(const PlaneGeom& g) {
  const size_t elems = static_cast<size_t>(g.tokens) * g.dim;
  return g.codec == kCodecInt4 ? (elems + 1) / 2 : elems;
}

// Decodes element e of a quantised plane to float.
KVMESH_HD float DecodeElement(const PlaneGeom& g, const uint8_t* enc, size_t e) {
  uint32_t t = static_cast<uint32_t>(e / g.dim), d = static_cast<uint32_t>(e % g.dim);
  size_t gi = GroupOf(g, t, d);
  float scale = HalfToFloat(LoadU16(enc + g.scales_off, gi));
  if (g.codec == kCodecInt8) return DequantInt8(enc[g.codes_off + e], scale);
  if (g.codec == kCodecInt4) {
    uint8_t byte = enc[g.codes_off + e / 2];
    uint8_t q = (e & 1) ? static_cast<uint8_t>(byte >> 4) : static_cast<uint8_t>(byte & 0xF);
    return DequantInt4(q, scale, HalfToFloat(LoadU16(enc + g.zeros_off, gi)));
  }
  return DequantFp8(enc[g.codes_off + e], scale, g.codec);
}

}  // namespace kvmesh::kernels

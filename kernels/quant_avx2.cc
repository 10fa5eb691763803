// AVX2 + F16C plane kernels. This file is built with -mavx2 -mf16c and is
// only entered after runtime detection (quant_cpu.cc). Every step mirrors the
// scalar reference in codec_math.h lane by lane:
//   max_ps(x, acc) == (x > acc ? x : acc), min_ps(x, acc) == (x < acc ? x : acc),
//   round_ps(nearest) == rintf, cvtps_ph(RNE) == FloatToHalf on finite values,
// so both paths write the same bytes. Shapes not covered here return false.
#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/codec_math.h"
#include "kernels/quant_cpu.h"

namespace kvmesh::kernels {
namespace {

constexpr int kRne = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

template <uint8_t type>
inline __m256 Load8(const uint8_t* base, size_t e) {
  if constexpr (type == kElemFp16)
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(base + 2 * e)));
  if constexpr (type == kElemBf16) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(base + 2 * e)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  return _mm256_loadu_ps(reinterpret_cast<const float*>(base + 4 * e));
}

// |x| of 16 fp16/bf16 elements as integer bits, NaN -> 0. For these formats
// the order of |x| equals the unsigned order of its bits, so max_epu16 over
// these equals the scalar reference's NaN-ignoring float max, at a fraction
// of the cost of converting to float first.
template <uint8_t type>
inline __m256i AbsBits16(const uint8_t* base, size_t e) {
  __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + 2 * e));
  v = _mm256_and_si256(v, _mm256_set1_epi16(0x7FFF));
  const __m256i nan = _mm256_cmpgt_epi16(v, _mm256_set1_epi16(type == kElemFp16 ? 0x7C00 : 0x7F80));
  return _mm256_andnot_si256(nan, v);
}

// 8 fp16/bf16 bit patterns -> floats.
template <uint8_t type>
inline __m256 BitsToFloat8(__m128i h) {
  if constexpr (type == kElemFp16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

inline uint16_t HMaxU16(__m256i v) {
  __m128i m = _mm_max_epu16(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  m = _mm_max_epu16(m, _mm_srli_si128(m, 8));
  m = _mm_max_epu16(m, _mm_srli_si128(m, 4));
  m = _mm_max_epu16(m, _mm_srli_si128(m, 2));
  return static_cast<uint16_t>(_mm_extract_epi16(m, 0));
}

inline __m256 Abs(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }

inline float HMax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}
inline float HMin(__m256 v) {
  __m128 m = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_min_ps(m, _mm_movehl_ps(m, m));
  m = _mm_min_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

// x * inv clamped to [-127, 127] and rounded (cvtps_epi32 rounds in the
// current mode, nearest-even by default, as rintf does on the scalar path).
inline __m256i QuantInt8x8(__m256 x, __m256 inv) {
  __m256 q = _mm256_mul_ps(x, inv);
  q = _mm256_max_ps(q, _mm256_set1_ps(-127.0f));
  q = _mm256_min_ps(q, _mm256_set1_ps(127.0f));
  return _mm256_cvtps_epi32(q);
}

// The same codes with one float clamp: min(127, q) sends +inf and large
// values to 127 and keeps NaN (which converts to INT_MIN); the signed
// saturating packs then bring everything below -128 to -128, and a final
// max_epi8(-127) gives the scalar path's -127 for NaN and for q <= -127.5.
inline __m256i QuantInt8x8Loose(__m256 x, __m256 inv) {
  __m256 q = _mm256_min_ps(_mm256_set1_ps(127.0f), _mm256_mul_ps(x, inv));
  return _mm256_cvtps_epi32(q);
}

// 8 int8 codes.
inline void StoreInt8x8(uint8_t* dst, __m256 x, __m256 inv) {
  __m256i i = QuantInt8x8(x, inv);
  __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(dst), _mm_packs_epi16(w, w));
}

// 32 int8 codes from 4 vectors of 8, in element order.
inline void StoreInt8x32(uint8_t* dst, __m256 x0, __m256 x1, __m256 x2, __m256 x3, __m256 inv0, __m256 inv1,
                         __m256 inv2, __m256 inv3) {
  __m256i a = _mm256_packs_epi32(QuantInt8x8Loose(x0, inv0), QuantInt8x8Loose(x1, inv1));
  __m256i b = _mm256_packs_epi32(QuantInt8x8Loose(x2, inv2), QuantInt8x8Loose(x3, inv3));
  __m256i c = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(a, b), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  c = _mm256_max_epi8(c, _mm256_set1_epi8(-127));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), c);
}

// FloatToFp8 (codec_math.h) on 8 lanes: the same integer steps, with the
// subnormal / normal / NaN cases computed side by side and blended.
template <int kMant, int kBias, uint32_t kMaxCode>
inline __m256i Fp8x8(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(u, 24), _mm256_set1_epi32(0x80));
  const __m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF));
  const __m256i nan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7F800000));
  const __m256i sub = _mm256_cmpgt_epi32(_mm256_set1_epi32((127 + 1 - kBias) << 23), a);
  const __m256 scaled = _mm256_mul_ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(_mm256_set1_epi32((127 + kBias - 1 + kMant) << 23)));
  const __m256i sub_code = _mm256_cvtps_epi32(scaled);
  constexpr int kShift = 23 - kMant;
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(a, kShift), _mm256_set1_epi32(1));
  __m256i n = _mm256_sub_epi32(a, _mm256_set1_epi32((127 - kBias) << 23));
  n = _mm256_add_epi32(n, _mm256_add_epi32(_mm256_set1_epi32((1 << (kShift - 1)) - 1), odd));
  __m256i code = _mm256_blendv_epi8(_mm256_srli_epi32(n, kShift), sub_code, sub);
  code = _mm256_min_epu32(code, _mm256_set1_epi32(kMaxCode));
  code = _mm256_or_si256(code, sign);
  return _mm256_blendv_epi8(code, _mm256_or_si256(sign, _mm256_set1_epi32(0x7F)), nan);
}

template <uint8_t kCodec>
inline __m256i QuantFp8x8(__m256 x, __m256 inv) {
  const __m256 v = _mm256_mul_ps(x, inv);
  if constexpr (kCodec == kCodecFp8E4M3) return Fp8x8<3, 7, 0x7Eu>(v);
  return Fp8x8<2, 15, 0x7Bu>(v);
}

// Codes of a symmetric quantiser (int8 or fp8), 8 and 32 at a time; the
// codec is a template parameter so the inner loops carry no dispatch.
template <uint8_t kCodec>
inline void StoreSym8(uint8_t* dst, __m256 x, __m256 inv) {
  if constexpr (kCodec == kCodecInt8) return StoreInt8x8(dst, x, inv);
  __m256i c = QuantFp8x8<kCodec>(x, inv);
  __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(dst), _mm_packus_epi16(w, w));
}
template <uint8_t kCodec>
inline void StoreSym32(uint8_t* dst, __m256 x0, __m256 x1, __m256 x2, __m256 x3, __m256 i0, __m256 i1, __m256 i2,
                       __m256 i3) {
  if constexpr (kCodec == kCodecInt8) return StoreInt8x32(dst, x0, x1, x2, x3, i0, i1, i2, i3);
  __m256i a = _mm256_packus_epi32(QuantFp8x8<kCodec>(x0, i0), QuantFp8x8<kCodec>(x1, i1));
  __m256i b = _mm256_packus_epi32(QuantFp8x8<kCodec>(x2, i2), QuantFp8x8<kCodec>(x3, i3));
  __m256i c = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(a, b), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), c);
}

// 8 codes of a symmetric quantiser -> floats (before the scale). fp8 codes
// become floats by placing exponent and mantissa in a float's top bits and
// multiplying by 2^(127 - bias), which is exact for normals and subnormals
// alike; NaN (and e5m2 inf) lanes are patched to Fp8ToFloat's bits.
inline __m256 SymCodes8(uint8_t codec, const uint8_t* p) {
  __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  if (codec == kCodecInt8) return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
  const __m256i c = _mm256_cvtepu8_epi32(b);
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(c, _mm256_set1_epi32(0x80)), 24);
  const __m256i mag = _mm256_and_si256(c, _mm256_set1_epi32(0x7F));
  const bool e4m3 = codec == kCodecFp8E4M3;
  const __m256 m = _mm256_castsi256_ps(_mm256_slli_epi32(mag, e4m3 ? 20 : 21));
  const __m256 f = _mm256_mul_ps(m, _mm256_castsi256_ps(_mm256_set1_epi32((e4m3 ? 127 + 120 : 127 + 112) << 23)));
  __m256i v = _mm256_or_si256(_mm256_castps_si256(f), sign);
  if (e4m3) {
    const __m256i nan = _mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7F));
    v = _mm256_blendv_epi8(v, _mm256_or_si256(sign, _mm256_set1_epi32(0x7FC00000)), nan);
  } else {
    const __m256i special = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7B));
    const __m256i inf = _mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7C));
    const __m256i bits = _mm256_blendv_epi8(_mm256_set1_epi32(0x7FC00000), _mm256_set1_epi32(0x7F800000), inf);
    v = _mm256_blendv_epi8(v, _mm256_or_si256(sign, bits), special);
  }
  return _mm256_castsi256_ps(v);
}

// (x - zero) * inv clamped to [0, 15], rounded, as 8 int32 lanes.
inline __m256i QuantInt4x8(__m256 x, __m256 zero, __m256 inv) {
  __m256 q = _mm256_mul_ps(_mm256_sub_ps(x, zero), inv);
  q = _mm256_max_ps(q, _mm256_setzero_ps());
  q = _mm256_min_ps(q, _mm256_set1_ps(15.0f));
  return _mm256_cvtps_epi32(q);
}

// 8 nibble lanes (element order) -> 4 bytes, even element in the low nibble,
// returned in the low 32 bits... as the 4 low 32-bit lanes of an __m128i.
inline __m128i PairNibbles(__m256i q) {
  __m256i odd = _mm256_srli_epi64(q, 32);
  __m256i both = _mm256_or_si256(q, _mm256_slli_epi32(odd, 4));
  __m256i packed = _mm256_permutevar8x32_epi32(both, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
  return _mm256_castsi256_si128(packed);
}

// 16 nibbles -> 8 bytes.
inline void StoreInt4x16(uint8_t* dst, __m256i q0, __m256i q1) {
  __m128i w = _mm_packs_epi32(PairNibbles(q0), PairNibbles(q1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(dst), _mm_packus_epi16(w, w));
}
// 8 nibbles -> 4 bytes.
inline void StoreInt4x8(uint8_t* dst, __m256i q) {
  __m128i w = _mm_packs_epi32(PairNibbles(q), _mm_setzero_si128());
  w = _mm_packus_epi16(w, w);
  int v = _mm_cvtsi128_si32(w);
  std::memcpy(dst, &v, 4);
}

// Stores 8 floats as out_type (fp16 or fp32 only).
inline void Store8(uint8_t* base, size_t e, uint8_t type, __m256 v) {
  if (type == kElemFp16) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(base + 2 * e), _mm256_cvtps_ph(v, kRne));
  } else {
    _mm256_storeu_ps(reinterpret_cast<float*>(base + 4 * e), v);
  }
}

inline __m256 SafeInv8(__m256 s) {
  __m256 inv = _mm256_div_ps(_mm256_set1_ps(1.0f), s);
  return _mm256_and_ps(inv, _mm256_cmp_ps(s, _mm256_setzero_ps(), _CMP_NEQ_OQ));
}

inline __m256 LoadHalf8(const uint8_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// int8 per token in three passes, so that no group waits on the latency of
// its own scale (two divisions and two conversions): 1) every group's absmax,
// 2) all scales and inverses, 8 groups per vector, 3) the codes.
template <uint8_t kType, uint8_t kCodec>
void EncodePerTokenSymmetric(const PlaneGeom& g, const uint8_t* in, uint8_t* out) {
  thread_local std::vector<float> amax, inv;
  amax.resize(g.groups + 8);
  inv.resize(g.groups + 8);
  for (size_t gi = 0; gi < g.groups; ++gi) {
    const size_t e0 = gi * g.group;  // groups tile the plane in element order
    if constexpr (kType == kElemFp32) {
      // Two accumulators halve the max dependency chain (max is order-free).
      __m256 acc = _mm256_setzero_ps(), acc2 = acc;
      for (uint32_t k = 0; k < g.group; k += 16) {
        acc = _mm256_max_ps(Abs(Load8<kType>(in, e0 + k)), acc);
        acc2 = _mm256_max_ps(Abs(Load8<kType>(in, e0 + k + 8)), acc2);
      }
      amax[gi] = HMax(_mm256_max_ps(acc, acc2));
    } else {
      __m256i acc = _mm256_setzero_si256();
      for (uint32_t k = 0; k < g.group; k += 16) acc = _mm256_max_epu16(AbsBits16<kType>(in, e0 + k), acc);
      const uint16_t bits = HMaxU16(acc);
      amax[gi] = kType == kElemFp16 ? HalfToFloat(bits) : Bf16ToFloat(bits);
    }
  }
  // SymmetricScale and SafeInv, lane-wise (same roundings as the scalar path).
  const __m256 cmax = _mm256_set1_ps(CodeMax(g.codec));
  size_t gi = 0;
  for (; gi + 8 <= g.groups; gi += 8) {
    __m256 a = _mm256_min_ps(_mm256_loadu_ps(&amax[gi]), _mm256_set1_ps(kFp16Max));
    __m128i s16 = _mm256_cvtps_ph(_mm256_div_ps(a, cmax), kRne);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + g.scales_off + 2 * gi), s16);
    _mm256_storeu_ps(&inv[gi], SafeInv8(_mm256_cvtph_ps(s16)));
  }
  for (; gi < g.groups; ++gi) {
    const uint16_t s16 = SymmetricScale(amax[gi], g.codec);
    StoreU16(out + g.scales_off, gi, s16);
    inv[gi] = SafeInv(HalfToFloat(s16));
  }
  for (gi = 0; gi < g.groups; ++gi) {
    const size_t e0 = gi * g.group;
    const __m256 v = _mm256_set1_ps(inv[gi]);
    uint8_t* codes = out + g.codes_off + e0;
    uint32_t k = 0;
    for (; k + 32 <= g.group; k += 32)
      StoreSym32<kCodec>(codes + k, Load8<kType>(in, e0 + k), Load8<kType>(in, e0 + k + 8),
                 Load8<kType>(in, e0 + k + 16), Load8<kType>(in, e0 + k + 24), v, v, v, v);
    for (; k < g.group; k += 8) StoreSym8<kCodec>(codes + k, Load8<kType>(in, e0 + k), v);
  }
}

// ---- per token ---------------------------------------------------------------
// REQUIRES: g.group % 16 == 0 and g.dim % g.group == 0.
// g by value: `out` may alias a reference, which forces reloads in the loops.
template <uint8_t kType, uint8_t kCodec>
void EncodePerToken(const PlaneGeom g, const uint8_t* in, uint8_t* out) {
  constexpr bool int4 = kCodec == kCodecInt4;
  for (size_t gi = 0; int4 && gi < g.groups; ++gi) {
    const size_t e0 = gi * g.group;  // groups tile the plane in element order
    {
      __m256 mn = _mm256_set1_ps(3.0e38f), mx = _mm256_set1_ps(-3.0e38f);
      for (uint32_t k = 0; k < g.group; k += 8) {
        __m256 x = Load8<kType>(in, e0 + k);
        mn = _mm256_min_ps(x, mn);
        mx = _mm256_max_ps(x, mx);
      }
      uint16_t s16, z16;
      AsymmetricScale(HMin(mn), HMax(mx), &s16, &z16);
      StoreU16(out + g.scales_off, gi, s16);
      StoreU16(out + g.zeros_off, gi, z16);
      const __m256 inv = _mm256_set1_ps(SafeInv(HalfToFloat(s16)));
      const __m256 zero = _mm256_set1_ps(HalfToFloat(z16));
      uint8_t* codes = out + g.codes_off + e0 / 2;
      for (uint32_t k = 0; k < g.group; k += 16) {
        __m256i q0 = QuantInt4x8(Load8<kType>(in, e0 + k), zero, inv);
        __m256i q1 = QuantInt4x8(Load8<kType>(in, e0 + k + 8), zero, inv);
        StoreInt4x16(codes + k / 2, q0, q1);
      }
    }
  }
  if constexpr (kCodec != kCodecInt4) EncodePerTokenSymmetric<kType, kCodec>(g, in, out);
}

void DecodePerToken(const PlaneGeom g, const uint8_t* enc, uint8_t* out, uint8_t out_type) {
  const bool int4 = g.codec == kCodecInt4;
  const __m128i nib = _mm_set1_epi16(0x0F);
  for (size_t gi = 0; gi < g.groups; ++gi) {
    const size_t e0 = gi * g.group;
    const __m256 scale = _mm256_set1_ps(HalfToFloat(LoadU16(enc + g.scales_off, gi)));
    if (int4) {
      const __m256 zero = _mm256_set1_ps(HalfToFloat(LoadU16(enc + g.zeros_off, gi)));
      const uint8_t* codes = enc + g.codes_off + e0 / 2;
      for (uint32_t k = 0; k < g.group; k += 16) {
        __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + k / 2)));
        __m128i v = _mm_or_si128(_mm_and_si128(b, nib), _mm_slli_epi16(_mm_srli_epi16(b, 4), 8));
        __m256 f0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
        __m256 f1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8)));
        Store8(out, e0 + k, out_type, _mm256_add_ps(_mm256_mul_ps(f0, scale), zero));
        Store8(out, e0 + k + 8, out_type, _mm256_add_ps(_mm256_mul_ps(f1, scale), zero));
      }
    } else {
      const uint8_t* codes = enc + g.codes_off + e0;
      for (uint32_t k = 0; k < g.group; k += 8)
        Store8(out, e0 + k, out_type, _mm256_mul_ps(SymCodes8(g.codec, codes + k), scale));
    }
  }
}

// ---- per channel -------------------------------------------------------------
// Channels in chunks of 8 lanes; the remaining dim % 8 channels go through the
// scalar reference functions. REQUIRES (int4): g.dim even.
// Per-channel symmetric encode for 16-bit inputs with dim % 32 == 0 and
// dim <= kMaxRowDim, walking the plane row by row (both passes read memory
// sequentially, which the hardware prefetchers follow): 1) absmax of every
// channel over the token group, as integer bits; 2) scales and inverses,
// 8 channels per vector; 3) codes, 32 per store. Same values as the
// chunked loops (max is order-free).
constexpr uint32_t kMaxRowDim = 512;

template <uint8_t kType, uint8_t kCodec>
void EncodePerChannelRows(const PlaneGeom& g, const uint8_t* in, uint8_t* out) {
  alignas(32) uint16_t amax_bits[kMaxRowDim];
  alignas(32) float inv[kMaxRowDim];
  const uint32_t D = g.dim;
  for (uint32_t j = 0; j < g.groups_per_line; ++j) {
    const uint32_t t0 = j * g.group;
    const uint32_t t1 = t0 + g.group < g.tokens ? t0 + g.group : g.tokens;
    for (uint32_t c = 0; c < D; c += 16)
      _mm256_store_si256(reinterpret_cast<__m256i*>(amax_bits + c), _mm256_setzero_si256());
    for (uint32_t t = t0; t < t1; ++t) {
      const size_t e = static_cast<size_t>(t) * D;
      for (uint32_t c = 0; c < D; c += 32) {
        __m256i* a = reinterpret_cast<__m256i*>(amax_bits + c);
        a[0] = _mm256_max_epu16(AbsBits16<kType>(in, e + c), a[0]);
        a[1] = _mm256_max_epu16(AbsBits16<kType>(in, e + c + 16), a[1]);
      }
    }
    const size_t g0 = static_cast<size_t>(j) * D;
    for (uint32_t c = 0; c < D; c += 8) {
      __m256 a = BitsToFloat8<kType>(_mm_load_si128(reinterpret_cast<const __m128i*>(amax_bits + c)));
      a = _mm256_min_ps(a, _mm256_set1_ps(kFp16Max));
      __m128i s16 = _mm256_cvtps_ph(_mm256_div_ps(a, _mm256_set1_ps(CodeMax(kCodec))), kRne);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + g.scales_off + 2 * (g0 + c)), s16);
      _mm256_store_ps(inv + c, SafeInv8(_mm256_cvtph_ps(s16)));
    }
    for (uint32_t t = t0; t < t1; ++t) {
      const size_t e = static_cast<size_t>(t) * D;
      for (uint32_t c = 0; c < D; c += 32)
        StoreSym32<kCodec>(out + g.codes_off + e + c, Load8<kType>(in, e + c), Load8<kType>(in, e + c + 8),
                           Load8<kType>(in, e + c + 16), Load8<kType>(in, e + c + 24), _mm256_load_ps(inv + c),
                           _mm256_load_ps(inv + c + 8), _mm256_load_ps(inv + c + 16), _mm256_load_ps(inv + c + 24));
    }
  }
}

// Order-preserving int16 key of 16 fp16/bf16 bit patterns (-|x| for
// negatives), with NaN replaced by `nan_key`, and back.
template <uint8_t type>
inline __m256i Key16(const uint8_t* base, size_t e, __m256i nan_key) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + 2 * e));
  const __m256i neg = _mm256_srai_epi16(h, 15);
  const __m256i mag = _mm256_and_si256(h, _mm256_set1_epi16(0x7FFF));
  const __m256i key = _mm256_sub_epi16(_mm256_xor_si256(mag, neg), neg);
  const __m256i nan = _mm256_cmpgt_epi16(mag, _mm256_set1_epi16(type == kElemFp16 ? 0x7C00 : 0x7F80));
  return _mm256_blendv_epi8(key, nan_key, nan);
}
inline __m256i KeyToBits16(__m256i k) {
  const __m256i neg = _mm256_srai_epi16(k, 15);
  const __m256i mag = _mm256_sub_epi16(_mm256_xor_si256(k, neg), neg);
  return _mm256_or_si256(mag, _mm256_and_si256(neg, _mm256_set1_epi16(static_cast<short>(0x8000))));
}

// Per-channel int4 for 16-bit inputs with dim % 32 == 0, row by row (as
// EncodePerChannelRows). Min and max run on order-preserving integer keys;
// NaN and the start values are +-inf, which AsymmetricScale's clamp to
// +-65504 treats exactly like the scalar path's NaN-skipping +-3e38 starts.
template <uint8_t kType>
void EncodePerChannelRowsInt4(const PlaneGeom& g, const uint8_t* in, uint8_t* out) {
  alignas(32) int16_t kmin[kMaxRowDim], kmax[kMaxRowDim];
  alignas(32) float zero[kMaxRowDim], inv[kMaxRowDim];
  const short inf = kType == kElemFp16 ? 0x7C00 : 0x7F80;
  const __m256i pos_inf = _mm256_set1_epi16(inf), neg_inf = _mm256_set1_epi16(static_cast<short>(-inf));
  const uint32_t D = g.dim;
  for (uint32_t j = 0; j < g.groups_per_line; ++j) {
    const uint32_t t0 = j * g.group;
    const uint32_t t1 = t0 + g.group < g.tokens ? t0 + g.group : g.tokens;
    for (uint32_t c = 0; c < D; c += 16) {
      _mm256_store_si256(reinterpret_cast<__m256i*>(kmin + c), pos_inf);
      _mm256_store_si256(reinterpret_cast<__m256i*>(kmax + c), neg_inf);
    }
    for (uint32_t t = t0; t < t1; ++t) {
      const size_t e = static_cast<size_t>(t) * D;
      for (uint32_t c = 0; c < D; c += 16) {
        __m256i* lo = reinterpret_cast<__m256i*>(kmin + c);
        __m256i* hi = reinterpret_cast<__m256i*>(kmax + c);
        *lo = _mm256_min_epi16(Key16<kType>(in, e + c, pos_inf), *lo);
        *hi = _mm256_max_epi16(Key16<kType>(in, e + c, neg_inf), *hi);
      }
    }
    const size_t g0 = static_cast<size_t>(j) * D;
    const __m256 lo = _mm256_set1_ps(-kFp16Max), hi = _mm256_set1_ps(kFp16Max);
    for (uint32_t c = 0; c < D; c += 16) {
      const __m256i bmin = KeyToBits16(_mm256_load_si256(reinterpret_cast<const __m256i*>(kmin + c)));
      const __m256i bmax = KeyToBits16(_mm256_load_si256(reinterpret_cast<const __m256i*>(kmax + c)));
      for (int half = 0; half < 2; ++half) {
        __m256 mn = BitsToFloat8<kType>(half ? _mm256_extracti128_si256(bmin, 1) : _mm256_castsi256_si128(bmin));
        __m256 mx = BitsToFloat8<kType>(half ? _mm256_extracti128_si256(bmax, 1) : _mm256_castsi256_si128(bmax));
        // AsymmetricScale, lane-wise.
        mn = _mm256_min_ps(_mm256_max_ps(mn, lo), hi);
        mx = _mm256_min_ps(_mm256_max_ps(mx, lo), hi);
        mx = _mm256_blendv_ps(mx, mn, _mm256_cmp_ps(mx, mn, _CMP_LT_OQ));
        const __m128i z16 = _mm256_cvtps_ph(mn, kRne);
        const __m256 zf = _mm256_cvtph_ps(z16);
        const __m256 range = _mm256_max_ps(_mm256_sub_ps(mx, zf), _mm256_setzero_ps());
        const __m128i s16 = _mm256_cvtps_ph(_mm256_div_ps(range, _mm256_set1_ps(15.0f)), kRne);
        const size_t gi = g0 + c + 8 * half;
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + g.scales_off + 2 * gi), s16);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + g.zeros_off + 2 * gi), z16);
        _mm256_store_ps(zero + c + 8 * half, zf);
        _mm256_store_ps(inv + c + 8 * half, SafeInv8(_mm256_cvtph_ps(s16)));
      }
    }
    for (uint32_t t = t0; t < t1; ++t) {
      const size_t e = static_cast<size_t>(t) * D;
      for (uint32_t c = 0; c < D; c += 16) {
        const __m256i q0 = QuantInt4x8(Load8<kType>(in, e + c), _mm256_load_ps(zero + c), _mm256_load_ps(inv + c));
        const __m256i q1 =
            QuantInt4x8(Load8<kType>(in, e + c + 8), _mm256_load_ps(zero + c + 8), _mm256_load_ps(inv + c + 8));
        StoreInt4x16(out + g.codes_off + (e + c) / 2, q0, q1);
      }
    }
  }
}

template <uint8_t kType, uint8_t kCodec>
void EncodePerChannel(const PlaneGeom g, const uint8_t* in, uint8_t* out) {
  constexpr bool int4 = kCodec == kCodecInt4;
  if constexpr (kType != kElemFp32) {
    if (g.dim % 32 == 0 && g.dim <= kMaxRowDim) {
      if constexpr (kCodec == kCodecInt4) return EncodePerChannelRowsInt4<kType>(g, in, out);
      else return EncodePerChannelRows<kType, kCodec>(g, in, out);
    }
  }
  const uint32_t d_vec = g.dim / 8 * 8;
  for (uint32_t j = 0; j < g.groups_per_line; ++j) {
    const uint32_t t0 = j * g.group;
    const uint32_t t1 = t0 + g.group < g.tokens ? t0 + g.group : g.tokens;
    uint32_t c = 0;
    if (!int4) {  // 32 channels at a time: whole cache lines per token
      for (; c + 32 <= d_vec; c += 32) {
        const size_t gi = static_cast<size_t>(j) * g.dim + c;
        // Named accumulators (an array would live on the stack).
        __m256 a0, a1, a2, a3;
        if constexpr (kType == kElemFp32) {
          a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
          for (uint32_t t = t0; t < t1; ++t) {
            const size_t e = static_cast<size_t>(t) * g.dim + c;
            a0 = _mm256_max_ps(Abs(Load8<kType>(in, e)), a0);
            a1 = _mm256_max_ps(Abs(Load8<kType>(in, e + 8)), a1);
            a2 = _mm256_max_ps(Abs(Load8<kType>(in, e + 16)), a2);
            a3 = _mm256_max_ps(Abs(Load8<kType>(in, e + 24)), a3);
          }
        } else {
          __m256i b0 = _mm256_setzero_si256(), b1 = b0;
          for (uint32_t t = t0; t < t1; ++t) {
            const size_t e = static_cast<size_t>(t) * g.dim + c;
            b0 = _mm256_max_epu16(AbsBits16<kType>(in, e), b0);
            b1 = _mm256_max_epu16(AbsBits16<kType>(in, e + 16), b1);
          }
          a0 = BitsToFloat8<kType>(_mm256_castsi256_si128(b0));
          a1 = BitsToFloat8<kType>(_mm256_extracti128_si256(b0, 1));
          a2 = BitsToFloat8<kType>(_mm256_castsi256_si128(b1));
          a3 = BitsToFloat8<kType>(_mm256_extracti128_si256(b1, 1));
        }
        auto scale_inv = [&](__m256 a, size_t g8) {
          a = _mm256_min_ps(a, _mm256_set1_ps(kFp16Max));
          __m128i s16 = _mm256_cvtps_ph(_mm256_div_ps(a, _mm256_set1_ps(CodeMax(g.codec))), kRne);
          _mm_storeu_si128(reinterpret_cast<__m128i*>(out + g.scales_off + 2 * g8), s16);
          return SafeInv8(_mm256_cvtph_ps(s16));
        };
        const __m256 i0 = scale_inv(a0, gi), i1 = scale_inv(a1, gi + 8), i2 = scale_inv(a2, gi + 16),
                     i3 = scale_inv(a3, gi + 24);
        for (uint32_t t = t0; t < t1; ++t) {
          const size_t e = static_cast<size_t>(t) * g.dim + c;
          StoreSym32<kCodec>(out + g.codes_off + e, Load8<kType>(in, e), Load8<kType>(in, e + 8),
                     Load8<kType>(in, e + 16), Load8<kType>(in, e + 24), i0, i1, i2, i3);
        }
      }
    }
    for (; c < d_vec; c += 8) {
      const size_t gi = static_cast<size_t>(j) * g.dim + c;
      if (int4) {
        __m256 mn = _mm256_set1_ps(3.0e38f), mx = _mm256_set1_ps(-3.0e38f);
        for (uint32_t t = t0; t < t1; ++t) {
          __m256 x = Load8<kType>(in, static_cast<size_t>(t) * g.dim + c);
          mn = _mm256_min_ps(x, mn);
          mx = _mm256_max_ps(x, mx);
        }
        // AsymmetricScale, lane-wise.
        const __m256 lo = _mm256_set1_ps(-kFp16Max), hi = _mm256_set1_ps(kFp16Max);
        mn = _mm256_min_ps(_mm256_max_ps(mn, lo), hi);
        mx = _mm256_min_ps(_mm256_max_ps(mx, lo), hi);
        mx = _mm256_blendv_ps(mx, mn, _mm256_cmp_ps(mx, mn, _CMP_LT_OQ));
        __m128i z16 = _mm256_cvtps_ph(mn, kRne);
        __m256 zero = _mm256_cvtph_ps(z16);
        __m256 range = _mm256_max_ps(_mm256_sub_ps(mx, zero), _mm256_setzero_ps());
        __m128i s16 = _mm256_cvtps_ph(_mm256_div_ps(range, _mm256_set1_ps(15.0f)), kRne);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + g.scales_off + 2 * gi), s16);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + g.zeros_off + 2 * gi), z16);
        const __m256 inv = SafeInv8(_mm256_cvtph_ps(s16));
        for (uint32_t t = t0; t < t1; ++t) {
          const size_t e = static_cast<size_t>(t) * g.dim + c;
          StoreInt4x8(out + g.codes_off + e / 2, QuantInt4x8(Load8<kType>(in, e), zero, inv));
        }
      } else {
        __m256 acc = _mm256_setzero_ps();
        for (uint32_t t = t0; t < t1; ++t)
          acc = _mm256_max_ps(Abs(Load8<kType>(in, static_cast<size_t>(t) * g.dim + c)), acc);
        acc = _mm256_min_ps(acc, _mm256_set1_ps(kFp16Max));
        __m128i s16 = _mm256_cvtps_ph(_mm256_div_ps(acc, _mm256_set1_ps(CodeMax(g.codec))), kRne);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + g.scales_off + 2 * gi), s16);
        const __m256 inv = SafeInv8(_mm256_cvtph_ps(s16));
        for (uint32_t t = t0; t < t1; ++t) {
          const size_t e = static_cast<size_t>(t) * g.dim + c;
          StoreSym8<kCodec>(out + g.codes_off + e, Load8<kType>(in, e), inv);
        }
      }
    }
    // Tail channels: the scalar reference.
    for (uint32_t c = d_vec; c < g.dim; ++c) EncodeGroupStats(g, in, out, static_cast<size_t>(j) * g.dim + c);
  }
  if (d_vec < g.dim) {
    for (uint32_t t = 0; t < g.tokens; ++t)
      for (uint32_t c = d_vec; c < g.dim; c += (int4 ? 2 : 1)) {
        const size_t e = static_cast<size_t>(t) * g.dim + c;
        EncodeCodeByte(g, in, out, int4 ? e / 2 : e);
      }
  }
}

void DecodePerChannel(const PlaneGeom g, const uint8_t* enc, uint8_t* out, uint8_t out_type) {
  const bool int4 = g.codec == kCodecInt4;
  const uint32_t d_vec = g.dim / 8 * 8;
  for (uint32_t t = 0; t < g.tokens; ++t) {
    const size_t jd = static_cast<size_t>(t / g.group) * g.dim;
    for (uint32_t c = 0; c < d_vec; c += 8) {
      const size_t e = static_cast<size_t>(t) * g.dim + c;
      const __m256 scale = LoadHalf8(enc + g.scales_off + 2 * (jd + c));
      __m256 f;
      if (int4) {
        uint32_t w;
        std::memcpy(&w, enc + g.codes_off + e / 2, 4);
        __m128i b = _mm_cvtepu8_epi16(_mm_cvtsi32_si128(static_cast<int>(w)));
        __m128i v = _mm_or_si128(_mm_and_si128(b, _mm_set1_epi16(0x0F)), _mm_slli_epi16(_mm_srli_epi16(b, 4), 8));
        f = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
        f = _mm256_add_ps(_mm256_mul_ps(f, scale), LoadHalf8(enc + g.zeros_off + 2 * (jd + c)));
      } else {
        f = _mm256_mul_ps(SymCodes8(g.codec, enc + g.codes_off + e), scale);
      }
      Store8(out, e, out_type, f);
    }
    for (uint32_t c = d_vec; c < g.dim; ++c) {
      const size_t e = static_cast<size_t>(t) * g.dim + c;
      StoreElem(out, e, out_type, DecodeElement(g, enc, e));
    }
  }
}

// Calls fn(integral_constant<type>, integral_constant<codec>) for g's input
// type and quantiser, so each combination gets its own loops.
template <uint8_t kType, typename Fn>
void DispatchCodec(const PlaneGeom& g, Fn&& fn) {
  using T = std::integral_constant<uint8_t, kType>;
  switch (g.codec) {
    case kCodecInt8: fn(T{}, std::integral_constant<uint8_t, kCodecInt8>{}); break;
    case kCodecInt4: fn(T{}, std::integral_constant<uint8_t, kCodecInt4>{}); break;
    case kCodecFp8E4M3: fn(T{}, std::integral_constant<uint8_t, kCodecFp8E4M3>{}); break;
    default: fn(T{}, std::integral_constant<uint8_t, kCodecFp8E5M2>{}); break;
  }
}
template <typename Fn>
void Dispatch(const PlaneGeom& g, Fn&& fn) {
  switch (g.in_type) {
    case kElemFp16: DispatchCodec<kElemFp16>(g, fn); break;
    case kElemBf16: DispatchCodec<kElemBf16>(g, fn); break;
    default: DispatchCodec<kElemFp32>(g, fn); break;
  }
}

}  // namespace

void LowRankProjectAvx2(const float* row, uint32_t n, const float* bt, uint32_t ld, uint32_t rank, float* coef) {
  uint32_t r = 0;
  for (; r + 16 <= rank; r += 16) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    for (uint32_t d = 0; d < n; ++d) {
      const __m256 x = _mm256_set1_ps(row[d]);
      const float* v = bt + size_t{d} * ld + r;
      a0 = _mm256_add_ps(a0, _mm256_mul_ps(x, _mm256_loadu_ps(v)));
      a1 = _mm256_add_ps(a1, _mm256_mul_ps(x, _mm256_loadu_ps(v + 8)));
    }
    _mm256_storeu_ps(coef + r, a0);
    _mm256_storeu_ps(coef + r + 8, a1);
  }
  for (; r < rank; ++r) {
    float s = 0;
    for (uint32_t d = 0; d < n; ++d) s += row[d] * bt[size_t{d} * ld + r];
    coef[r] = s;
  }
}

void LowRankReconstructAvx2(const float* coef, uint32_t rank, const float* b, const float* mean, uint32_t n,
                            float* out) {
  uint32_t d = 0;
  for (; d + 16 <= n; d += 16) {
    __m256 a0 = _mm256_loadu_ps(mean + d), a1 = _mm256_loadu_ps(mean + d + 8);
    for (uint32_t r = 0; r < rank; ++r) {
      const __m256 c = _mm256_set1_ps(coef[r]);
      const float* v = b + size_t{r} * n + d;
      a0 = _mm256_add_ps(a0, _mm256_mul_ps(c, _mm256_loadu_ps(v)));
      a1 = _mm256_add_ps(a1, _mm256_mul_ps(c, _mm256_loadu_ps(v + 8)));
    }
    _mm256_storeu_ps(out + d, a0);
    _mm256_storeu_ps(out + d + 8, a1);
  }
  for (; d < n; ++d) {
    float a = mean[d];
    for (uint32_t r = 0; r < rank; ++r) a += coef[r] * b[size_t{r} * n + d];
    out[d] = a;
  }
}

namespace {

// FloatToBf16 on 8 lanes: round to nearest even, NaN quieted.
inline __m128i FloatToBf16x8(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF)), _mm256_set1_epi32(0x7F800000));
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), odd)), 16);
  r = _mm256_blendv_epi8(r, _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40)), nan);
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

template <uint8_t kSrc>
void ConvertTo(const uint8_t* src, uint8_t* dst, uint8_t dst_type, size_t n) {
  size_t e = 0;
  for (; e + 8 <= n; e += 8) {
    const __m256 v = Load8<kSrc>(src, e);
    if (dst_type == kElemFp32) {
      _mm256_storeu_ps(reinterpret_cast<float*>(dst + 4 * e), v);
    } else {
      // cvtps_ph equals FloatToHalf on every input, NaN payloads included.
      const __m128i h = dst_type == kElemFp16 ? _mm256_cvtps_ph(v, kRne) : FloatToBf16x8(v);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * e), h);
    }
  }
  for (; e < n; ++e) StoreElem(dst, e, dst_type, LoadElem(src, e, kSrc));
}

// Converts n elements between fp16/bf16/fp32; false when the types match (a copy).
bool ConvertElems(const uint8_t* src, uint8_t src_type, uint8_t* dst, uint8_t dst_type, size_t n) {
  if (src_type == dst_type) return false;
  switch (src_type) {
    case kElemFp16: ConvertTo<kElemFp16>(src, dst, dst_type, n); break;
    case kElemBf16: ConvertTo<kElemBf16>(src, dst, dst_type, n); break;
    default: ConvertTo<kElemFp32>(src, dst, dst_type, n); break;
  }
  return true;
}

}  // namespace

bool EncodePlaneAvx2(const PlaneGeom& g, const uint8_t* in, uint8_t* out) {
  if (g.codec == kCodecFp16 || g.codec == kCodecBf16) {
    const size_t elems = static_cast<size_t>(g.tokens) * g.dim;
    if (!ConvertElems(in, g.in_type, out, g.codec == kCodecFp16 ? kElemFp16 : kElemBf16, elems)) return false;
    std::memset(out + elems * 2, 0, g.bytes - elems * 2);
    return true;
  }
  if (!IsQuantising(g.codec)) return false;
  if (g.axis == kPerToken) {
    if (g.group % 16 != 0 || g.dim % g.group != 0) return false;
    Dispatch(g, [&](auto type, auto codec) { EncodePerToken<type(), codec()>(g, in, out); });
  } else {
    if (g.codec == kCodecInt4 && g.dim % 2 != 0) return false;
    Dispatch(g, [&](auto type, auto codec) { EncodePerChannel<type(), codec()>(g, in, out); });
  }
  const size_t used = g.codes_off + CodeBytes(g);
  std::memset(out + used, 0, g.bytes - used);
  return true;
}

bool DecodePlaneAvx2(const PlaneGeom& g, const uint8_t* enc, uint8_t* out, uint8_t out_type) {
  if (g.codec == kCodecFp16 || g.codec == kCodecBf16)
    return ConvertElems(enc, g.codec == kCodecFp16 ? kElemFp16 : kElemBf16, out, out_type,
                        static_cast<size_t>(g.tokens) * g.dim);
  if (!IsQuantising(g.codec)) return false;
  if (out_type != kElemFp16 && out_type != kElemFp32) return false;
  if (g.axis == kPerToken) {
    if (g.group % 16 != 0 || g.dim % g.group != 0) return false;
    DecodePerToken(g, enc, out, out_type);
  } else {
    if (g.codec == kCodecInt4 && g.dim % 2 != 0) return false;
    DecodePerChannel(g, enc, out, out_type);
  }
  return true;
}

}  // namespace kvmesh::kernels

#endif  // x86

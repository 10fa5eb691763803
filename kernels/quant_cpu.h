// kernels/quant_cpu.h — CPU plane kernels (internal to kernels/).
//
// A plane is one [token][dim] matrix of one (layer, k|v, head); its geometry
// (codec, axis, group, offsets) comes from MakePlaneGeom in codec_math.h.
// EncodePlane/DecodePlane pick the AVX2+F16C path when the CPU has it and the
// shape suits it, else the scalar path; both produce identical bytes.
// All functions are thread-safe and allocation-free.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/codec_math.h"

namespace kvmesh::kernels {

enum class CpuPath : uint8_t { kAuto = 0, kScalar = 1, kAvx2 = 2 };

// Encodes the raw plane `in` (g.tokens*g.dim elements of g.in_type) into
// `out` (g.bytes, padding zeroed). REQUIRES: g.codec is not kCodecLowRank.
void EncodePlane(const PlaneGeom& g, const uint8_t* in, uint8_t* out, CpuPath path = CpuPath::kAuto);
// Decodes `enc` (g.bytes) into `out` (g.tokens*g.dim elements of `out_type`).
void DecodePlane(const PlaneGeom& g, const uint8_t* enc, uint8_t* out, uint8_t out_type,
                 CpuPath path = CpuPath::kAuto);

// The scalar reference (what the CUDA kernels reproduce).
void EncodePlaneScalar(const PlaneGeom& g, const uint8_t* in, uint8_t* out);
void DecodePlaneScalar(const PlaneGeom& g, const uint8_t* enc, uint8_t* out, uint8_t out_type);

// AVX2+F16C versions: return false (writing nothing) when the shape or types
// are not covered, so the caller falls back to scalar. Defined only on x86-64.
bool EncodePlaneAvx2(const PlaneGeom& g, const uint8_t* in, uint8_t* out);
bool DecodePlaneAvx2(const PlaneGeom& g, const uint8_t* enc, uint8_t* out, uint8_t out_type);

// True when the AVX2 path is usable on this CPU (and not forced off).
bool HaveAvx2Path();

// Lowrank inner loops with 8 lanes, each lane doing exactly the scalar
// sequence of separate multiplies and adds (so results equal the scalar
// loops in kernels/lowrank.cc):
//   coef[r] = sum over d in order of row[d] * bt[d * ld + r], r < rank;
//   out[d] = mean[d] + sum over r in order of coef[r] * b[r * n + d], d < n.
void LowRankProjectAvx2(const float* row, uint32_t n, const float* bt, uint32_t ld, uint32_t rank, float* coef);
void LowRankReconstructAvx2(const float* coef, uint32_t rank, const float* b, const float* mean, uint32_t n,
                            float* out);

}  // namespace kvmesh::kernels

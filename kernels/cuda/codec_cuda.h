// kernels/cuda/codec_cuda.h — CUDA encode/decode of the quantising codecs
// (int8, int4, fp8 e4m3/e5m2) and the fp16/bf16/raw conversions.
//
// The kernels evaluate the very functions of kernels/codec_math.h that the
// CPU scalar path uses (built with --fmad=false so nothing is fused), so a
// plane encoded here is byte-identical to the CPU's, and either decodes
// anywhere. They write plane bodies; the block header and its checksum are
// written by the host (kernels/block_format.h), which is what makes a block
// encoded on a GPU indistinguishable from one encoded on a CPU.
//
// Shape after CUTLASS's adapters: check the arguments, run on the caller's
// stream and buffers. Nothing here allocates, synchronises or owns a stream.
// Header-only dependencies (C++17, CUDA runtime), so it builds on a bare GPU
// machine (kernels/cuda/CMakeLists.txt also works as a top-level project).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/codec_math.h"

namespace kvmesh::kernels::cuda {

// Planes of one geometry inside caller-owned device buffers. Plane (i, j),
// i < outer, j < inner, lives at
//   raw + i * raw_outer_stride + j * raw_inner_stride   (geom.tokens x geom.dim elements)
//   enc + i * enc_outer_stride + j * enc_inner_stride   (geom.bytes bytes)
// For one segment of a block: outer = its layers, inner = heads; see SegmentPlaneSets.
struct PlaneSet {
  PlaneGeom geom;
  uint32_t outer = 1, inner = 1;
  size_t raw_outer_stride = 0, raw_inner_stride = 0;
  size_t enc_outer_stride = 0, enc_inner_stride = 0;
};

// The K and V plane sets of a block segment of `layers` layers x `heads`
// heads whose K/V plane geometries are k and v. raw_base/enc_base receive the
// offsets of each set's first plane relative to the segment's first raw byte
// and its body offset.
inline void SegmentPlaneSets(const PlaneGeom& k, const PlaneGeom& v, uint32_t layers, uint32_t heads,
                             PlaneSet sets[2], size_t raw_base[2], size_t enc_base[2]) {
  const size_t raw_plane = static_cast<size_t>(k.tokens) * k.dim * ElemSize(k.in_type);
  const PlaneGeom g[2] = {k, v};
  for (int kv = 0; kv < 2; ++kv) {
    sets[kv].geom = g[kv];
    sets[kv].outer = layers;
    sets[kv].inner = heads;
    sets[kv].raw_outer_stride = 2 * static_cast<size_t>(heads) * raw_plane;
    sets[kv].raw_inner_stride = raw_plane;
    sets[kv].enc_outer_stride = static_cast<size_t>(heads) * (k.bytes + v.bytes);
    sets[kv].enc_inner_stride = g[kv].bytes;
    raw_base[kv] = kv * static_cast<size_t>(heads) * raw_plane;
    enc_base[kv] = kv * static_cast<size_t>(heads) * k.bytes;
  }
}

// Encodes every plane of `set` (raw -> enc), padding included.
// cudaErrorInvalidValue for lowrank, an empty set or null pointers; else the launch status.
cudaError_t EncodePlanes(const PlaneSet& set, const void* raw, void* enc, cudaStream_t stream);
// Decodes every plane of `set` (enc -> raw elements of out_type).
cudaError_t DecodePlanes(const PlaneSet& set, const void* enc, void* raw, uint8_t out_type, cudaStream_t stream);

}  // namespace kvmesh::kernels::cuda

// kernels/cuda/codec_cuda_threads.h — what one CUDA thread of each codec
// kernel does, as host/device functions of its flat thread index. The
// __global__ kernels in codec_cuda.cu only compute the index and call these;
// tests/test_codec.cc runs them on the CPU over every index, so the GPU's
// index math, strides and padding are checked on machines without a GPU.
#pragma once

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

namespace threads {

// Plane p of a set (layers x heads, or any outer x inner grid).
template <typename Set>
KVMESH_HD size_t RawOff(const Set& s, size_t p) {
  return (p / s.inner) * s.raw_outer_stride + (p % s.inner) * s.raw_inner_stride;
}
template <typename Set>
KVMESH_HD size_t EncOff(const Set& s, size_t p) {
  return (p / s.inner) * s.enc_outer_stride + (p % s.inner) * s.enc_inner_stride;
}

// Encode pass 1 (quantisers): thread i < planes * groups computes one group's scale.
template <typename Set>
KVMESH_HD void GroupStats(const Set& s, const uint8_t* raw, uint8_t* enc, size_t i) {
  const size_t p = i / s.geom.groups, gi = i % s.geom.groups;
  EncodeGroupStats(s.geom, raw + RawOff(s, p), enc + EncOff(s, p), gi);
}

// Encode pass 2 (quantisers): thread i < planes * CodesPerPlane writes one code byte or padding byte.
KVMESH_HD size_t CodesPerPlane(const PlaneGeom& g) { return g.bytes - g.codes_off; }
template <typename Set>
KVMESH_HD void Codes(const Set& s, const uint8_t* raw, uint8_t* enc, size_t i) {
  const size_t per_plane = CodesPerPlane(s.geom);
  const size_t p = i / per_plane, b = i % per_plane;
  uint8_t* out = enc + EncOff(s, p);
  if (b < CodeBytes(s.geom)) {
    EncodeCodeByte(s.geom, raw + RawOff(s, p), out, b);
  } else {
    out[s.geom.codes_off + b] = 0;
  }
}

// Encode of fp16 / bf16 / raw planes: thread i < planes * ConvertPerPlane
// writes one element (or one element-sized run of padding).
KVMESH_HD uint32_t ConvertElemSize(const PlaneGeom& g) { return g.codec == kCodecRaw ? ElemSize(g.in_type) : 2u; }
KVMESH_HD size_t ConvertPerPlane(const PlaneGeom& g) {
  return (g.bytes + ConvertElemSize(g) - 1) / ConvertElemSize(g);
}
template <typename Set>
KVMESH_HD void Convert(const Set& s, const uint8_t* raw, uint8_t* enc, size_t i) {
  const PlaneGeom& g = s.geom;
  const size_t per_plane = ConvertPerPlane(g);
  const size_t p = i / per_plane, e = i % per_plane;
  const size_t elems = static_cast<size_t>(g.tokens) * g.dim;
  const uint8_t* in = raw + RawOff(s, p);
  uint8_t* out = enc + EncOff(s, p);
  const uint32_t esize = ConvertElemSize(g);
  const uint8_t t = g.codec == kCodecFp16 ? kElemFp16 : kElemBf16;
  if (e < elems) {
    if (g.codec == kCodecRaw || t == g.in_type) {  // bytes as they are (like the CPU's memcpy, NaN payloads too)
      for (uint32_t k = 0; k < esize; ++k) out[e * esize + k] = in[e * esize + k];
    } else {
      StoreElem(out, e, t, LoadElem(in, e, g.in_type));
    }
  } else {
    for (uint32_t k = 0; k < esize && e * esize + k < g.bytes; ++k) out[e * esize + k] = 0;
  }
}

// Decode: thread i < planes * DecodePerPlane writes one element (two for int4).
KVMESH_HD size_t DecodePerPlane(const PlaneGeom& g) {
  return IsQuantising(g.codec) ? CodeBytes(g) : static_cast<size_t>(g.tokens) * g.dim;
}
template <typename Set>
KVMESH_HD void Decode(const Set& s, const uint8_t* enc, uint8_t* raw, uint8_t out_type, size_t i) {
  const PlaneGeom& g = s.geom;
  const size_t per_plane = DecodePerPlane(g);
  const size_t p = i / per_plane, b = i % per_plane;
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
  const uint8_t t = g.codec == kCodecRaw ? g.in_type : static_cast<uint8_t>(g.codec == kCodecFp16 ? kElemFp16 : kElemBf16);
  if (t == out_type) {  // bytes as they are, like the CPU's memcpy
    for (uint32_t k = 0; k < ElemSize(t); ++k) out[b * ElemSize(t) + k] = in[b * ElemSize(t) + k];
  } else {
    StoreElem(out, b, out_type, LoadElem(in, b, t));
  }
}

}  // namespace threads
}  // namespace kvmesh::kernels::cuda

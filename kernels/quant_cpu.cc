#include "kernels/quant_cpu.h"

#include <cstring>

#include "kernels/cpu_features.h"

namespace kvmesh::kernels {

bool HaveAvx2Path() {
  const CpuFeatures& f = GetCpuFeatures();
  return f.avx2 && f.f16c;
}

void EncodePlaneScalar(const PlaneGeom& g, const uint8_t* in, uint8_t* out) {
  const size_t elems = static_cast<size_t>(g.tokens) * g.dim;
  size_t used = 0;
  switch (g.codec) {
    case kCodecRaw:
      used = elems * ElemSize(g.in_type);
      std::memcpy(out, in, used);
      break;
    case kCodecFp16:
    case kCodecBf16: {
      const uint8_t t = g.codec == kCodecFp16 ? kElemFp16 : kElemBf16;
      if (t == g.in_type) {
        std::memcpy(out, in, elems * 2);
      } else {
        for (size_t e = 0; e < elems; ++e) StoreElem(out, e, t, LoadElem(in, e, g.in_type));
      }
      used = elems * 2;
      break;
    }
    default:
      for (size_t gi = 0; gi < g.groups; ++gi) EncodeGroupStats(g, in, out, gi);
      for (size_t b = 0, n = CodeBytes(g); b < n; ++b) EncodeCodeByte(g, in, out, b);
      used = g.codes_off + CodeBytes(g);
      break;
  }
  std::memset(out + used, 0, g.bytes - used);
}

void DecodePlaneScalar(const PlaneGeom& g, const uint8_t* enc, uint8_t* out, uint8_t out_type) {
  const size_t elems = static_cast<size_t>(g.tokens) * g.dim;
  switch (g.codec) {
    case kCodecRaw:
      if (g.in_type == out_type) {
        std::memcpy(out, enc, elems * ElemSize(out_type));
      } else {
        for (size_t e = 0; e < elems; ++e) StoreElem(out, e, out_type, LoadElem(enc, e, g.in_type));
      }
      return;
    case kCodecFp16:
    case kCodecBf16: {
      const uint8_t t = g.codec == kCodecFp16 ? kElemFp16 : kElemBf16;
      if (t == out_type) {
        std::memcpy(out, enc, elems * 2);
      } else {
        for (size_t e = 0; e < elems; ++e) StoreElem(out, e, out_type, LoadElem(enc, e, t));
      }
      return;
    }
    default:
      for (size_t e = 0; e < elems; ++e) StoreElem(out, e, out_type, DecodeElement(g, enc, e));
      return;
  }
}

void EncodePlane(const PlaneGeom& g, const uint8_t* in, uint8_t* out, CpuPath path) {
  if (path != CpuPath::kScalar && HaveAvx2Path() && EncodePlaneAvx2(g, in, out)) return;
  EncodePlaneScalar(g, in, out);
}

void DecodePlane(const PlaneGeom& g, const uint8_t* enc, uint8_t* out, uint8_t out_type, CpuPath path) {
  if (path != CpuPath::kScalar && HaveAvx2Path() && DecodePlaneAvx2(g, enc, out, out_type)) return;
  DecodePlaneScalar(g, enc, out, out_type);
}

#if !(defined(__x86_64__) || defined(__i386__))
void LowRankProjectAvx2(const float*, uint32_t, const float*, uint32_t, uint32_t, float*) {}
void LowRankReconstructAvx2(const float*, uint32_t, const float*, const float*, uint32_t, float*) {}
bool EncodePlaneAvx2(const PlaneGeom&, const uint8_t*, uint8_t*) { return false; }
bool DecodePlaneAvx2(const PlaneGeom&, const uint8_t*, uint8_t*, uint8_t) { return false; }
#endif

}  // namespace kvmesh::kernels

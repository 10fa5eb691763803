// kernels/cpu_features.h — runtime CPU feature detection for kernel dispatch.
// Codecs pick their vector path once, from these flags; KVMESH_FORCE_SCALAR=1
// in the environment forces the scalar paths (tests compare both).
#pragma once

namespace kvmesh::kernels {

struct CpuFeatures {
  bool avx2 = false;
  bool f16c = false;
  bool fma = false;
  bool avx512f = false;
  bool avx512bw = false;
};

// Detected once, thread-safe.
const CpuFeatures& GetCpuFeatures();

}  // namespace kvmesh::kernels

#include "kernels/cpu_features.h"

#include <cstdlib>
#include <cstring>

namespace kvmesh::kernels {

const CpuFeatures& GetCpuFeatures() {
  static const CpuFeatures f = [] {
    CpuFeatures c;
    const char* force = std::getenv("KVMESH_FORCE_SCALAR");
    if (force && std::strcmp(force, "0") != 0 && *force) return c;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    c.avx2 = __builtin_cpu_supports("avx2");
    c.fma = __builtin_cpu_supports("fma");
    c.avx512f = __builtin_cpu_supports("avx512f");
    c.avx512bw = __builtin_cpu_supports("avx512bw");
    unsigned a, b, cc, d;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(cc), "=d"(d) : "a"(1), "c"(0));
    c.f16c = (cc >> 29) & 1u;
#endif
    return c;
  }();
  return f;
}

}  // namespace kvmesh::kernels

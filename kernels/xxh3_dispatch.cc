#include "kernels/xxh3_dispatch.h"

#include <xxhash.h>

#include "kernels/quant_cpu.h"

namespace kvmesh::kernels {

// xxh3_avx2.cc (x86-64 builds only).
uint64_t Xxh3SeededAvx2(const void* p, size_t n, uint64_t seed);
void* Xxh3StreamCreateAvx2(uint64_t seed);
void Xxh3StreamUpdateAvx2(void* st, const void* p, size_t n);
uint64_t Xxh3StreamDigestAvx2(const void* st);
void Xxh3StreamFreeAvx2(void* st);

namespace {
bool UseAvx2() {
#if defined(__x86_64__)
  static const bool avx2 = HaveAvx2Path();
  return avx2;
#else
  return false;
#endif
}
}  // namespace

uint64_t Xxh3Seeded(const void* p, size_t n, uint64_t seed) {
  return UseAvx2() ? Xxh3SeededAvx2(p, n, seed) : XXH3_64bits_withSeed(p, n, seed);
}
uint64_t Xxh3(const void* p, size_t n) { return Xxh3Seeded(p, n, 0); }

Xxh3Stream::Xxh3Stream(uint64_t seed) : avx2_(UseAvx2()) {
  if (avx2_) {
    state_ = Xxh3StreamCreateAvx2(seed);
  } else {
    XXH3_state_t* st = XXH3_createState();
    XXH3_64bits_reset_withSeed(st, seed);
    state_ = st;
  }
}
Xxh3Stream::~Xxh3Stream() {
  if (avx2_) Xxh3StreamFreeAvx2(state_);
  else XXH3_freeState(static_cast<XXH3_state_t*>(state_));
}
void Xxh3Stream::Update(const void* p, size_t n) {
  if (avx2_) Xxh3StreamUpdateAvx2(state_, p, n);
  else XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), p, n);
}
uint64_t Xxh3Stream::Digest() const {
  return avx2_ ? Xxh3StreamDigestAvx2(state_) : XXH3_64bits_digest(static_cast<XXH3_state_t*>(state_));
}

}  // namespace kvmesh::kernels

// Built with -mavx2 (x86-64 only): the inlined xxHash (XXH_INLINE_ALL) uses
// its AVX2 accumulate loop here. Entered only through xxh3_dispatch.cc after
// runtime detection.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cstddef>
#include <cstdint>

namespace kvmesh::kernels {

uint64_t Xxh3SeededAvx2(const void* p, size_t n, uint64_t seed) { return XXH3_64bits_withSeed(p, n, seed); }

void* Xxh3StreamCreateAvx2(uint64_t seed) {
  XXH3_state_t* st = XXH3_createState();
  if (st) XXH3_64bits_reset_withSeed(st, seed);
  return st;
}
void Xxh3StreamUpdateAvx2(void* st, const void* p, size_t n) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(st), p, n);
}
uint64_t Xxh3StreamDigestAvx2(const void* st) { return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(st)); }
void Xxh3StreamFreeAvx2(void* st) { XXH3_freeState(static_cast<XXH3_state_t*>(st)); }

}  // namespace kvmesh::kernels

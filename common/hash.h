// common/hash.h — the 64-bit integer mixer used wherever kvmesh needs a cheap,
// well-spread hash of an integer (placement scores, frequency sketches,
// seeded test and workload data). Not for anything that is stored: block keys
// and checksums are xxHash3 (kvmesh/block_key.h, common/checksum.h).
#pragma once

#include <cstdint>

namespace kvmesh {

// The splitmix64 finaliser: a bijection on 64-bit values with full avalanche.
constexpr uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

// The next value of a splitmix64 stream whose state is *state.
constexpr uint64_t SplitMix64(uint64_t* state) {
  *state += 0x9E3779B97F4A7C15ull;
  return Mix64(*state);
}

}  // namespace kvmesh

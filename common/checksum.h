// common/checksum.h — the payload checksum used by stores, tiers and frames.
// xxHash3-64, seed 0. Thread-safe, allocation-free.
#pragma once

#include <cstddef>
#include <cstdint>

#include <xxhash.h>

namespace kvmesh {

inline uint64_t Checksum64(const void* data, size_t n) { return XXH3_64bits(data, n); }

}  // namespace kvmesh

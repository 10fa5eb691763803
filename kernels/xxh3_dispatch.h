// kernels/xxh3_dispatch.h — XXH3-64 with the AVX2 implementation when the CPU
// has it (the system libxxhash is built for baseline x86-64 only). Same
// values as XXH3_64bits*: xxHash3 is defined independently of the vector path.
// Internal to kernels/. Thread-safe; the streaming state is single-owner.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace kvmesh::kernels {

uint64_t Xxh3(const void* p, size_t n);
uint64_t Xxh3Seeded(const void* p, size_t n, uint64_t seed);

class Xxh3Stream {
 public:
  explicit Xxh3Stream(uint64_t seed);
  ~Xxh3Stream();
  Xxh3Stream(const Xxh3Stream&) = delete;
  Xxh3Stream& operator=(const Xxh3Stream&) = delete;
  void Update(const void* p, size_t n);
  uint64_t Digest() const;

 private:
  void* state_;
  bool avx2_;
};

}  // namespace kvmesh::kernels

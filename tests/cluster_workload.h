// tests/cluster_workload.h — the blocks the multi-process tests put through a
// router and read back: sequences of consecutive tokens, each with `per` full
// blocks of seeded random bytes.
#pragma once

#include <cstddef>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include "kvmesh/router.h"
#include "kvmesh/status.h"

namespace kvmesh::testing {

inline std::vector<TokenId> Tokens(size_t n, TokenId base) {
  std::vector<TokenId> t(n);
  std::iota(t.begin(), t.end(), base);
  return t;
}

inline std::vector<std::vector<std::byte>> Blocks(size_t n, size_t bytes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<std::byte>> v(n, std::vector<std::byte>(bytes));
  for (auto& b : v)
    for (auto& x : b) x = static_cast<std::byte>(rng());
  return v;
}

// The blocks of `seqs` sequences (each `per` full blocks) and their payloads.
struct Workload {
  std::vector<std::vector<TokenId>> seqs;
  std::vector<std::vector<std::vector<std::byte>>> blocks;
};
inline Workload MakeWorkload(size_t seqs, size_t per, uint32_t block_tokens, size_t block_bytes, uint64_t seed) {
  Workload w;
  for (size_t s = 0; s < seqs; ++s) {
    w.seqs.push_back(Tokens(per * block_tokens, static_cast<TokenId>(seed * 100000 + s * 1000)));
    w.blocks.push_back(Blocks(per, block_bytes, seed * 7919 + s));
  }
  return w;
}
inline Status PutAll(Router& r, const Workload& w) {
  for (size_t s = 0; s < w.seqs.size(); ++s) {
    std::vector<std::span<const std::byte>> spans(w.blocks[s].begin(), w.blocks[s].end());
    KVMESH_RETURN_IF_ERROR(r.Put(w.seqs[s], spans));
  }
  return Status::Ok();
}

}  // namespace kvmesh::testing

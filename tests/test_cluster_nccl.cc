// The NCCL block mover: blocks sent and received in one NCCL group arrive
// byte-for-byte. Runs only on a GPU machine ([gpu]); reports Skipped elsewhere.
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <random>
#include <vector>

#include "transport/nccl_mover.h"

using namespace kvmesh;

TEST_CASE("NCCL mover: a unique id can be made without a GPU", "[nccl]") {
  auto id = NcclBlockMover::NewUniqueId();
  REQUIRE(id.ok());
  bool nonzero = false;
  for (std::byte b : *id) nonzero |= b != std::byte{0};
  CHECK(nonzero);
  if (!CudaDeviceAvailable()) {
    CHECK(NcclBlockMover::Create(*id, 0, 1, 0).status().code() == StatusCode::kUnavailable);
  }
}

TEST_CASE("NCCL mover: blocks sent to self in one group arrive byte-for-byte", "[gpu][nccl]") {
  if (!CudaDeviceAvailable()) {
    WARN("SKIP: no GPU");
    return;
  }
  auto id = NcclBlockMover::NewUniqueId();
  REQUIRE(id.ok());
  auto mover = NcclBlockMover::Create(*id, 0, 1, 0);
  REQUIRE(mover.ok());
  const size_t n = 4, bytes = 256 << 10;
  std::vector<std::byte> host(n * bytes), back(n * bytes);
  std::mt19937_64 rng(11);
  for (auto& b : host) b = static_cast<std::byte>(rng());
  std::byte *src = nullptr, *dst = nullptr;
  REQUIRE(cudaMalloc(&src, n * bytes) == cudaSuccess);
  REQUIRE(cudaMalloc(&dst, n * bytes) == cudaSuccess);
  REQUIRE(cudaMemcpy(src, host.data(), n * bytes, cudaMemcpyHostToDevice) == cudaSuccess);
  std::vector<BlockTransfer> sends, recvs;
  for (size_t i = 0; i < n; ++i) {
    sends.push_back({0, src + i * bytes, bytes});
    recvs.push_back({0, dst + i * bytes, bytes});
  }
  REQUIRE((*mover)->Exchange(sends, recvs).ok());
  REQUIRE(cudaMemcpy(back.data(), dst, n * bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(back == host);
  cudaFree(src);
  cudaFree(dst);
}

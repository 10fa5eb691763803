// kvmesh/request.h — per-call options and batch items shared by the router
// API and every transport (in-process, TCP, UCX).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "kvmesh/status.h"
#include "kvmesh/types.h"

namespace kvmesh {

struct RequestOptions {
  Priority priority = kDefaultPriority;  // eviction class of blocks this call stores or touches
  Affinity affinity;                     // placement hint (expert / layer group / rank)
  Range layers;                          // slice the blocks hold; empty = all layers
  Range heads;                           // empty = all KV heads
  float score = 0.0f;                    // importance hint for score-based policies
  int64_t timeout_ms = 0;                // network calls; 0 = the router's default
  // Put: replace a block already stored under the same key (RESP SET
  // semantics). Default: the stored block stays, since a key names its content.
  bool replace = false;
};

// Where a region of caller memory lives (Router::RegisterMemory).
enum class MemoryKind : uint8_t {
  kHost = 0,    // CPU memory
  kDevice = 1,  // CUDA device memory (builds with CUDA only)
};

// A region of the caller's memory registered once with every transport, so
// block bytes move straight between it and the nodes' pools
// (Router::RegisterMemory). A value; `id` names it in UnregisterMemory.
struct MemoryRegion {
  uint64_t id = 0;
  std::byte* base = nullptr;
  size_t bytes = 0;
  MemoryKind kind = MemoryKind::kHost;

  // True when [p, p + n) lies inside the region.
  bool Contains(const void* p, size_t n) const {
    const auto a = reinterpret_cast<uintptr_t>(p), b = reinterpret_cast<uintptr_t>(base);
    return a >= b && n <= bytes && a - b <= bytes - n;
  }
};

// One block to store. The router fills `status`.
struct PutItem {
  BlockKey key;
  std::span<const std::byte> data;
  Status status;
};

// One block to read into caller memory. On success `size` is the block's size;
// a miss leaves status NotFound (or DataLoss/Unavailable: see IsMiss()).
// A dst smaller than the block gives ResourceExhausted with `size` set to the
// size needed.
struct GetItem {
  BlockKey key;
  std::span<std::byte> dst;
  size_t size = 0;
  Status status;
};

}  // namespace kvmesh

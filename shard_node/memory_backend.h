// shard_node/memory_backend.h — where a store's pool memory comes from.
//
// A backend hands out one region, allocated once at start-up (no allocation
// per request), and copies bytes into and out of it. Host memory now; a CUDA
// device pool (cudaMalloc once, cudaMemcpy in/out) implements the same
// interface when CUDA is present, so the store does not change.
#pragma once

#include <cstddef>
#include <memory>
#include <string_view>

#include "kvmesh/status.h"

namespace kvmesh {

class MemoryBackend {
 public:
  virtual ~MemoryBackend() = default;
  virtual std::string_view name() const = 0;
  // True when the CPU may read and write the region directly (memcpy, checksums).
  virtual bool host_accessible() const = 0;
  // The region: valid from Create until the backend is destroyed.
  virtual std::byte* base() const = 0;
  virtual size_t size() const = 0;
  // Copies between the region and host memory. Thread-safe for disjoint ranges.
  virtual void CopyIn(std::byte* dst, const std::byte* src, size_t n) = 0;
  virtual void CopyOut(std::byte* dst, const std::byte* src, size_t n) = 0;
  // A file descriptor of the region when it is shared memory that another
  // process on this host may map (a memfd: local reads,
  // transport/local_index.h); -1 otherwise.
  virtual int shared_fd() const { return -1; }
};

struct HostMemoryOptions {
  bool prefault = false;   // touch every page at start-up (no page faults on the hot path)
  bool hugepages = true;   // madvise(MADV_HUGEPAGE)
  // A memfd mapped shared (shared_fd()), for local reads, instead of
  // anonymous private memory.
  bool shared = false;
};

// Anonymous mmap of `bytes` (rounded up to the page size), or a shared memfd.
Result<std::unique_ptr<MemoryBackend>> MakeHostMemory(size_t bytes, const HostMemoryOptions& o = {});

}  // namespace kvmesh

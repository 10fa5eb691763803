// shard_node/tier_internal.h — helpers shared by tiered_store.cc (request
// path, demotion, promotion) and tier_maintenance.cc (offload, pressure,
// observability). Internal to shard_node/.
#pragma once

#include <cstddef>
#include <cstring>
#include <span>
#include <vector>

#include "shard_node/block_store.h"

namespace kvmesh::tier_internal {

inline constexpr size_t kMaxEvents = 64;  // TieredStore::RecentEvents

// Per-thread staging buffers for moving a block between tiers. Promotion
// (kPromote) and device copy-out (kCopyOut) use different buffers, because a
// promoting Put may evict, and the eviction listener copies out on the same
// thread before the Put has copied its payload in.
enum StagingUse { kPromote = 0, kCopyOut = 1 };
inline std::span<std::byte> Staging(size_t n, StagingUse use) {
  thread_local std::vector<std::byte> bufs[2];
  std::vector<std::byte>& buf = bufs[use];
  if (buf.size() < n) buf.resize(n);
  return {buf.data(), n};
}

// Copies a block out of a store's memory (which may be device memory).
inline std::span<const std::byte> HostCopy(BlockStore& store, std::span<const std::byte> data) {
  if (store.backend().host_accessible()) return data;
  std::span<std::byte> tmp = Staging(data.size(), kCopyOut);
  store.backend().CopyOut(tmp.data(), data.data(), data.size());
  return tmp;
}

inline PutOptions PutOptionsOf(const BlockMeta& m) {
  PutOptions p;
  p.priority = m.priority;
  p.codec = m.codec;
  p.logical_size = m.logical_size;
  return p;
}

}  // namespace kvmesh::tier_internal

// shard_node/tenant_view.h — a ShardNode as one tenant sees it: every key is
// scoped to the tenant's namespace before it reaches the store, and its puts
// are counted against its quota (shard_node/tenants.h). The servers build one
// per connection (or UCX session) from the identity its HELLO proved; for
// the cluster identity (index 0) every call is the node's own.
//
//   TenantView v(node, tenant);            // tenant from TenantRegistry::Authenticate
//   v.Put(key, payload, po);               // stored under ScopeKey(ns, key)
//   bool mine = v.Exists(key, false);      // another namespace's block with the same key bytes: false
//
// Thread-safety: a view is a value (a node pointer and an index); its calls
// are as thread-safe as ShardNode's. REQUIRES: the node outlives the view.
#pragma once

#include <cstdint>
#include <span>

#include "shard_node/block_store.h"
#include "shard_node/block_store_ops.h"

namespace kvmesh {

class ShardNode;

class TenantView {
 public:
  TenantView(ShardNode* node, uint32_t tenant) : node_(node), tenant_(tenant) {}

  uint32_t tenant() const { return tenant_; }
  // The stored key of `key` for this tenant.
  BlockKey Key(const BlockKey& key) const;

  // ShardNode's operations on the tenant's keys. Put and CommitPut count the
  // block against the tenant's quota and erase its least recently used blocks
  // past it; a block larger than the whole quota is ResourceExhausted.
  Status Put(const BlockKey& key, std::span<const std::byte> payload, const PutOptions& o);
  Result<BlockRef> Get(const BlockKey& key);
  Result<BlockRef> GetForTransfer(const BlockKey& key);
  Result<size_t> GetInto(const BlockKey& key, std::span<std::byte> dst);
  bool Exists(const BlockKey& key, bool touch);
  Status Erase(const BlockKey& key);
  Status Pin(const BlockKey& key);
  Status Unpin(const BlockKey& key);
  Status Release(const BlockKey& key);
  // The reservation holds the stored (scoped) key.
  Result<BlockReservation> ReservePut(const BlockKey& key, size_t size, const PutOptions& o);
  Status CommitPut(BlockReservation& r, uint64_t checksum, bool verify = true);

 private:
  // After a successful put of `bytes` under stored key `stored`: account and
  // enforce the quota.
  void Admitted(const BlockKey& stored, uint64_t bytes);
  template <typename T>
  T Counted(const BlockKey& stored, T result);

  ShardNode* node_;
  uint32_t tenant_;
};

}  // namespace kvmesh

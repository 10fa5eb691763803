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

  // The PUT ladder: one block of a PUT frame, the same steps on every path
  // (a frame whose body is here, TCP reading its socket, UCX reading the
  // client's memory one-sided):
  //
  //   TenantView::PutLanding p = v.StartPut(key, size, checksum, po);  // reserve a chunk
  //   land the bytes: in p.chunk() when p.reserved(); in a buffer of the
  //     caller's when p.staged(); otherwise read and drop them
  //   Status s = v.FinishPut(p, staged);                               // verify and commit
  //
  // StartPut reserves a chunk (ReservePut). A key stored already is OK, with
  // nothing to land (keys name their content); a node that changes blocks on
  // the way in (a codec, a device pool: FailedPrecondition) has the caller
  // stage the bytes; any other refusal is the block's answer. FinishPut
  // verifies the checksum where the bytes landed (one pass) and commits the
  // chunk, or verifies the staged bytes and Puts them: a mismatch is DataLoss
  // and stores nothing (a block stored before stays as it was).
  // Move-only; an unfinished landing frees its chunk.
  class PutLanding {
   public:
    bool reserved() const { return res_.valid(); }
    bool staged() const { return staged_; }
    // The reserved chunk (pool memory, exactly the block's size).
    std::span<std::byte> chunk() const { return res_.data(); }

   private:
    friend class TenantView;
    BlockKey key_;
    PutOptions options_;
    uint64_t checksum_ = 0;
    BlockReservation res_;
    bool staged_ = false;
    Status status_;  // neither reserved nor staged: the block's answer
  };
  PutLanding StartPut(const BlockKey& key, size_t size, uint64_t checksum, const PutOptions& o);
  // `staged`: the landed bytes when p.staged() (ignored otherwise).
  Status FinishPut(PutLanding& p, std::span<const std::byte> staged = {});

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

// shard_node/tenants.h — the tenants of one node ($.auth.tenants): who a
// connection proved to be, the namespace its blocks live in, and its byte
// quota (docs/security.md, "Tenants").
//
// Identity. Index 0 is the cluster's own identity (the cluster secret, or
// anyone when the cluster has none); tenants are 1..n in config order. A
// HELLO (or RESP AUTH) proves one with Authenticate.
//
// Namespaces. The node never trusts the key bytes a tenant sends to say
// whose block it is: every key of tenant t is stored as
//   ScopeKey(ns_t, key) = xxHash3-128(ns_t.hi | ns_t.lo | key.hi | key.lo)
// where ns_t = xxHash3-128("kvmesh-namespace-v1" | node secret | namespace
// name) and the node secret is 16 random bytes drawn at start-up. Tenants
// of different namespaces therefore meet different stored keys for the same
// key bytes, and nobody can compute another namespace's stored keys (the
// secret never leaves the process). A grouped key (kvmesh/block_key.h) is
// scoped in its group alone: GroupedKey(H64(ns | group), member) with the
// same kind (co-evicted or not) and member bits, so a tenant's group stays
// one group on the node (co-evicted together, shard_node/key_groups.h) and
// different namespaces' groups are different groups. Tenants naming the same namespace share
// their blocks on purpose. Index 0 is unscoped (keys as sent), so embedded
// use, the RESP port and the cluster identity see the store as before.
//
// Quotas. Per tenant, the node keeps a ledger of the blocks the tenant put
// (stored key, bytes charged) in recency order. A block is charged what the
// store holds for it: the larger of its stored size and 7/8 of its chunk
// (SetCharge; a small value in a large size class costs its chunk, while the
// size classes' built-in 1/8 of rounding, there for codec output, is not
// charged). Besides its blocks, a tenant's quota also holds what its live
// sequences hold (ReserveSequence: their sealed and open blocks and their
// heap). A put that takes the tenant past its quota returns the tenant's
// least recently used blocks to erase, so the tenant never holds more than its
// quota and never evicts another tenant's blocks to stay within it. Blocks
// the node drops on its own (the pool's eviction under memory pressure,
// checksum failures) leave the ledger lazily: on a miss, when they come up as
// quota victims, or at Reconcile, so `bytes` may briefly count blocks already
// gone, never fewer than held. Explicit pins (PIN frames) are bounded
// separately: the chunk bytes a tenant's connections pin, at most its quota
// (ReservePin), whether or not the pinned blocks are still in the ledger.
//
// Thread-safety: all methods are thread-safe. Each tenant's ledger has its
// own mutex (a leaf: no store lock is ever taken under it).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kvmesh/config.h"
#include "kvmesh/status.h"
#include "kvmesh/types.h"

namespace kvmesh {

inline constexpr uint32_t kClusterTenant = 0;

// The stored key of `key` in namespace `ns`; `ns` all zero: `key` itself.
BlockKey ScopeKey(const BlockKey& ns, const BlockKey& key);

struct TenantStats {
  std::string name;
  std::string ns;                // namespace name
  uint64_t quota_bytes = 0;      // 0: none
  uint64_t bytes = 0;            // bytes charged for its blocks on this node (see the file comment)
  uint64_t blocks = 0;
  uint64_t sequence_bytes = 0;   // what its live sequences hold (counts against the quota too)
  uint64_t pinned_bytes = 0;     // chunk bytes its connections hold explicit pins on
  uint64_t puts = 0, put_bytes = 0;
  uint64_t hits = 0, misses = 0;
  uint64_t erases = 0;
  uint64_t quota_evictions = 0;  // its blocks erased to keep it within its quota
  uint64_t quota_refused = 0;    // puts of a block that cannot fit the quota (beside its sequences)
  uint64_t sequence_refused = 0; // sequence growth refused: its sequences would pass the quota
  uint64_t pin_refused = 0;      // PINs refused: its pins would pass the quota
};

// What the store holds for a block of `payload` bytes stored under `stored`
// (null: a key not known yet, as for CheckFits). See SetCharge.
using BlockCharge = std::function<uint64_t(const BlockKey* stored, uint64_t payload)>;

class TenantRegistry {
 public:
  explicit TenantRegistry(const AuthConfig& auth);
  ~TenantRegistry();
  TenantRegistry(const TenantRegistry&) = delete;
  TenantRegistry& operator=(const TenantRegistry&) = delete;

  bool has_tenants() const;
  size_t size() const;  // tenants, not counting index 0

  // The identity a connection proves with (tenant name, token). An empty
  // name is the cluster identity: the cluster secret, or anything when the
  // cluster has none. When the cluster has no tenants a name is ignored (as
  // before tenants existed). PermissionDenied otherwise, with the same
  // message whether the name or the token is wrong; secrets are compared in
  // constant time.
  Result<uint32_t> Authenticate(std::string_view tenant, std::string_view token) const;

  const std::string& name(uint32_t t) const;  // "" for index 0
  // ScopeKey with the namespace of tenant t (the key itself for index 0).
  BlockKey Scope(uint32_t t, const BlockKey& key) const;
  // The namespace of tenant t (all zero for index 0), for code that scopes many keys.
  const BlockKey& Namespace(uint32_t t) const;

  // ---- accounting (index 0 is not accounted; calls with it do nothing) ----
  // What a block is charged: `charge` (the node sets the larger of the stored
  // size and 7/8 of its chunk). Unset: the payload bytes. Call before the
  // registry is shared (not thread-safe).
  void SetCharge(BlockCharge charge);
  // What a block of `payload` bytes under `stored` (may be null) is charged.
  uint64_t Charge(const BlockKey* stored, uint64_t payload) const;
  // ResourceExhausted when one block of `bytes` (payload) does not fit t's
  // quota beside what t's live sequences hold.
  Status CheckFits(uint32_t t, uint64_t bytes);
  // A put of `bytes` (payload) under stored key `key` succeeded: counts it,
  // charged, as t's most recent block and appends to *victims the stored keys
  // of t's least recently used blocks that must go for t to fit its quota
  // (never `key`). The caller erases them, then reports with QuotaEvicted.
  void Admitted(uint32_t t, const BlockKey& key, uint64_t bytes, std::vector<BlockKey>* victims);
  // t's live sequences grow by `bytes`: ResourceExhausted (nothing charged)
  // when its sequences alone would pass its quota; otherwise charged, with
  // the least recently used blocks that must go for t to fit appended to
  // *victims (the caller erases them, then reports with QuotaEvicted).
  Status ReserveSequence(uint32_t t, uint64_t bytes, std::vector<BlockKey>* victims);
  void ReleaseSequence(uint32_t t, uint64_t bytes);  // they shrank or went
  // One of t's connections pins a block holding `bytes`: ResourceExhausted
  // (nothing charged) when t's pins would pass its quota. No quota: counted only.
  Status ReservePin(uint32_t t, uint64_t bytes);
  void ReleasePin(uint32_t t, uint64_t bytes);
  void QuotaEvicted(uint32_t t, uint64_t n);
  void Hit(uint32_t t, const BlockKey& key);   // a read found it: most recent
  void Miss(uint32_t t, const BlockKey& key);  // the node does not have it (forgotten)
  void Erased(uint32_t t, const BlockKey& key);
  // The node dropped t's block `key` along with a quota victim (the rest of
  // a co-evicted group): forgotten, counted as a quota eviction.
  void Dropped(uint32_t t, const BlockKey& key);
  // Forgets the blocks `exists` says the node no longer holds (probes run
  // outside the ledger locks).
  void Reconcile(const std::function<bool(const BlockKey&)>& exists);

  TenantStats Stats(uint32_t t) const;
  std::vector<TenantStats> AllStats() const;  // tenants 1..n
  // Prometheus lines kvmesh_tenant_*{tenant="..."} (none without tenants).
  std::string PrometheusText() const;

 private:
  struct Tenant;
  std::vector<std::unique_ptr<Tenant>> tenants_;  // [0] is the cluster identity
  std::string cluster_token_;
  BlockCharge charge_;  // set before the registry is shared
};

}  // namespace kvmesh

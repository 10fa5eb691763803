// shard_node/sequence_service.h — a node's live sequences, served to remote
// clients (SEQ_* frames) and in-process channels alike.
//
// A ShardNode owns one SequenceService over its primary BlockStore. The
// service keeps one SequenceTable per slice (layer range, KV-head range,
// tenant salt, priority), created on first use, and hands out node-local
// sequence ids (never reused while the service lives, counted from a random
// start so a restarted node does not hand out its previous run's ids again:
// a client's handle from before the restart then answers NotFound instead of
// reaching another client's new sequence). Because clients can
// die without releasing, every sequence has a last-use time: sequences idle
// for longer than idle_timeout are released (unpinning their blocks) by the
// next call that looks, at most about every idle_timeout / 4; ReapIdle()
// forces a pass. The number of live sequences is bounded: Create / Fork past
// max_sequences gives ResourceExhausted.
//
// Tenants (SeqCaller::tenant != 0, with SequenceServiceOptions::tenants set):
// each tenant may hold at most a share of the node's sequences and slices,
// max(1, limit / max(2, tenants)) of max_sequences and of max_slices, so no
// tenant takes them all; and what a tenant's sequences hold (their sealed and
// open blocks, their decoded copies and token lists: Holds() below) counts
// against its quota (SequenceServiceOptions::charge): a Create, Append or
// Fork that would take the tenant's sequences past it is refused with
// ResourceExhausted and changes nothing.
//
//   SequenceService& s = node->sequences();
//   SeqCreateArgs a;  a.layers = {0, 32};  a.prefix = prompt;
//   SeqCreated c = s.Create(a).value();            // attaches cached prefix blocks
//   uint32_t pos = s.Append(c.id, toks, k, v).value();
//   s.Read(c.id, 0, n, SIZE_MAX, &kout, &vout);    // [layer][n][heads][head_dim]
//   s.Release(c.id);
//
// Thread-safety: all methods are thread-safe. Calls on one sequence are
// serialised by a per-sequence lock (so two clients of the same id never
// overlap a write); calls on different sequences run in parallel. No call
// blocks on I/O.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvmesh/clock.h"
#include "shard_node/sequence_table.h"
#include "kvmesh/status.h"
#include "kvmesh/types.h"

namespace kvmesh {

class BlockStore;

struct SequenceServiceOptions {
  int64_t idle_timeout_ms = 10 * 60 * 1000;  // release sequences untouched this long
  uint32_t max_sequences = 4096;             // live sequences per node
  uint32_t max_slices = 64;                  // distinct (slice, salt, priority) tables
  uint32_t max_sequence_tokens = 1u << 20;   // length bound of one sequence
  // KV codec of the blocks the sequences seal ($.codec): stored encoded,
  // read back dequantised (SequenceOptions::codec). "none": raw.
  CodecConfig codec;
  // The node's tiers over the store (ShardNode sets it): demoted prefix
  // blocks are promoted back on create (SequenceOptions::tiers).
  TieredStore* tiers = nullptr;
  // The tenants besides the cluster identity ($.auth.tenants; ShardNode sets
  // it). With n > 0, each tenant may hold at most max(1, limit / max(2, n))
  // of max_sequences and of max_slices; the cluster identity is bound by the
  // node-wide limits only. 0: no shares.
  uint32_t tenants = 0;
  // What a tenant's live sequences hold counts against its quota (ShardNode
  // sets these from its TenantRegistry): charge(t, bytes) before a sequence
  // of tenant t (t != 0) grows by `bytes` (an error: refused, nothing
  // charged), uncharge(t, bytes) when it shrinks or goes. Called under the
  // sequence's own lock. Empty: not counted.
  std::function<Status(uint32_t tenant, uint64_t bytes)> charge;
  std::function<void(uint32_t tenant, uint64_t bytes)> uncharge;
};

// Who makes a call (a SEQ frame of some connection). A sequence answers only
// calls of the tenant that created it (any other gets NotFound, as for an
// unknown id), and the blocks it attaches and seals live in that caller's
// namespace (shard_node/tenants.h ScopeKey). The default is the cluster's own
// identity with unscoped keys (in-process callers, embedded clusters).
struct SeqCaller {
  uint32_t tenant = 0;  // kClusterTenant
  BlockKey ns{};        // all zero: keys as derived
};

// Shape of a Read: n positions of `layers` layers, row_bytes per (layer, position).
struct SeqRows {
  uint32_t n = 0;
  uint32_t layers = 0;
  uint32_t row_bytes = 0;  // heads x head_dim x dtype size
};

struct SequenceServiceStats {
  uint64_t live = 0;
  uint64_t created = 0;
  uint64_t reaped = 0;   // released for idleness
  uint64_t refused = 0;  // creates / forks refused at max_sequences (or a tenant's share of it)
  uint64_t tables = 0;
  uint64_t refused_quota = 0;  // creates / appends / forks refused by a tenant's quota
};

class SequenceService {
 public:
  // REQUIRES: store and clock outlive the service (clock may be null: system clock).
  SequenceService(BlockStore* store, const ModelSpec& model, SequenceServiceOptions options = {},
                  Clock* clock = nullptr);
  ~SequenceService();  // releases every sequence

  const SequenceServiceOptions& options() const;

  // A new sequence for the slice, holding the leading full blocks of
  // a.prefix the store has. InvalidArgument for a slice outside the model
  // (or one whose block does not fit a store slot), ResourceExhausted past
  // max_sequences or max_slices.
  Result<SeqCreated> Create(const SeqCreateArgs& a, const SeqCaller& caller = {});
  // Appends tokens with their K and V ([layer][n][heads][head_dim] over the
  // slice); returns the position of the first. Full blocks are sealed.
  // InvalidArgument when k/v are not exactly that size (nothing appended).
  Result<uint32_t> Append(SeqId id, std::span<const TokenId> tokens, std::span<const std::byte> k,
                          std::span<const std::byte> v, const SeqCaller& caller = {});
  Status Truncate(SeqId id, uint32_t n, const SeqCaller& caller = {});
  Result<SeqId> Fork(SeqId id, const SeqCaller& caller = {});
  Status Release(SeqId id, const SeqCaller& caller = {});
  Result<SequenceState> Info(SeqId id, const SeqCaller& caller = {});
  // K and V of positions [from, from + rows.n) in the Append layout, where
  // rows.n is the most of n whose K plus V fit max_bytes (at least 1 when
  // n > 0). InvalidArgument when [from, from + n) is not inside the sequence.
  Result<SeqRows> Read(SeqId id, uint32_t from, uint32_t n, size_t max_bytes, std::vector<std::byte>* k,
                       std::vector<std::byte>* v, const SeqCaller& caller = {});

  // Releases every sequence idle longer than idle_timeout now; returns how many.
  size_t ReapIdle();
  // What a sequence of `length` tokens of a table of this service holds
  // (what its tenant's quota is charged): per block, the chunk a sealed block
  // takes in the store (an open block's buffer is no larger), plus the
  // decoded copy with a codec; plus its token list.
  uint64_t Holds(uint64_t block_bytes, uint32_t block_tokens, uint64_t length) const;
  SequenceServiceStats Stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvmesh

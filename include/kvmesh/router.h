// kvmesh/router.h — the client API an inference server embeds.
//
// The router turns token sequences into chained block keys, places each key on
// a shard node (expert-aware groups + weighted rendezvous hashing), and batches
// calls per node. The same API serves the embedded cluster (shards in this
// process) and, later, daemons over the network.
//
//   auto cluster = kvmesh::EmbeddedCluster::Start(config).value();
//   kvmesh::Router& r = cluster->router();
//   size_t cached = r.MatchPrefix(prompt).value();        // leading cached blocks
//   ... compute KV for blocks [cached, n) ...
//   r.Put(prompt, blocks);                                // store them for next time
//
// Blocks are the KV of block_tokens consecutive tokens in the layout of
// kvmesh/types.h (BlockLayout). Only full blocks have keys: a trailing partial
// block is ignored by Put and MatchPrefix.
//
// Live sequences (kvmesh/sequence.h) work the same way embedded and over the
// network: CreateSequence places the sequence on one node and returns a
// handle; the other sequence calls go to that node only.
//
//   auto h = r.CreateSequence(prompt, ro).value();   // attaches the cached prefix
//   r.AppendSequence(h, prompt.subspan(h.prefix_tokens), k, v);
//   r.ReadSequence(h, 0, n, &k, &v);                 // [layer][n][heads][head_dim]
//   r.ReleaseSequence(h);
//
// Prefix-affinity placement: the node is chosen inside the request's
// affinity group by rendezvous hashing on the stored key of the prefix's
// first full block (the same rule that places that block on Put), so
// requests sharing a prompt land on the same node and reuse the blocks its
// sequences sealed there. A prefix shorter than one block is spread over the
// group. When the chosen node is unreachable the next node in rendezvous
// order is tried. Sequences are node-local: calls on a handle whose node died
// (or left the shard map) answer Unavailable (or DeadlineExceeded); a node
// releases sequences left idle (a client that died) after its idle timeout.
//
// Thread-safety: every method is thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvmesh/block_key.h"
#include "kvmesh/config.h"
#include "kvmesh/request.h"
#include "kvmesh/sequence.h"
#include "kvmesh/status.h"

namespace kvmesh {

class ShardMap;
class ShardChannel;

class Router;

struct RouterOptions {
  std::string tenant_salt;  // keys of different salts never meet
  int64_t timeout_ms = 2000;
  // Called when a node answers StaleEpoch: fetch the new map and call
  // UpdateMap; the call is then retried once. Unset: StaleEpoch is a miss.
  std::function<Status(Router&)> refresh;
  // Fan-out: the per-node calls of one operation (PutBatch, GetBatch,
  // ExistsBatch, MatchPrefix, Erase) are in flight together (a TCP channel
  // writes every node's frame before awaiting any answer), so an operation
  // spanning N nodes costs the slowest node, not the sum of N round trips.
  // The whole operation (its replica rounds and a StaleEpoch retry) is then
  // bounded by one timeout: RequestOptions::timeout_ms, else timeout_ms above.
  // Calls to a single node, and calls when no target channel is asynchronous
  // (in-process), run directly either way. A node that refuses or drops
  // the connection fails at once (its items miss, replicas are asked); one
  // that stalls holds the operation to the timeout, so with replicas its
  // items miss rather than wait a second timeout for the next replica.
  // false: one node after another, each call with its own timeout (the
  // benchmarks' baseline).
  bool parallel_fanout = true;
  // Where AllocateMemory gets its memory: the transport's best memory (the
  // networked client over UCX: a shared-memory segment the nodes of this host
  // map themselves, so a one-sided put or get costs no work in this process).
  // Unset, or a null result: page-aligned anonymous memory. Returns the
  // memory and its owner.
  std::function<Result<std::shared_ptr<std::byte>>(size_t bytes)> allocate_memory;
};

struct RouterStats {
  uint64_t puts = 0, put_blocks = 0;
  uint64_t gets = 0, get_blocks = 0, get_hits = 0;
  uint64_t match_calls = 0, match_blocks_asked = 0, match_blocks_hit = 0;
  uint64_t node_errors = 0;  // calls a node could not answer (counted as misses)
};

// A live sequence on one node. A value: copy it freely (to another thread, too).
struct SequenceHandle {
  uint32_t node = 0;        // index of the node in the shard map of `epoch`
  uint64_t id = 0;          // the node's sequence id (SeqId)
  uint64_t epoch = 0;       // shard-map epoch the handle was made under
  std::string node_id;      // finds the node again after the map changes
  Range layers, heads;      // the slice the sequence holds (never empty)
  uint32_t prefix_tokens = 0;  // tokens attached from the prefix at creation (0 for a fork)
};

class Router {
 public:
  // A router over `map`, reaching node i through channels[i].
  // REQUIRES: channels.size() == map->nodes().size().
  static Result<std::unique_ptr<Router>> Create(const ModelSpec& model,
                                                std::shared_ptr<const ShardMap> map,
                                                std::vector<std::shared_ptr<ShardChannel>> channels,
                                                RouterOptions options = {});
  ~Router();

  const ModelSpec& model() const;
  uint32_t block_tokens() const;

  // Stored keys of the full blocks of `tokens` for the options' slice.
  std::vector<BlockKey> Keys(std::span<const TokenId> tokens, const RequestOptions& o = {}) const;

  // Number of leading full blocks of `tokens` that are cached (0..n). A block
  // on an unreachable node counts as a miss. Hits are refreshed, deepest
  // first, so the chain's first block is the most recent and its deepest the
  // first to leave under recency-based eviction.
  Result<size_t> MatchPrefix(std::span<const TokenId> tokens, const RequestOptions& o = {});

  // Stores blocks[i] as full block `first_block + i` of `tokens`, deepest
  // first (as MatchPrefix refreshes). REQUIRES: first_block + blocks.size()
  // <= full blocks of tokens. Returns the error of the deepest block that
  // failed (every block is still attempted).
  Status Put(std::span<const TokenId> tokens, std::span<const std::span<const std::byte>> blocks,
             const RequestOptions& o = {}, size_t first_block = 0);

  // Batch forms over explicit keys; per-item results in the items.
  Status PutBatch(std::span<PutItem> items, const RequestOptions& o = {});
  Status GetBatch(std::span<GetItem> items, const RequestOptions& o = {});
  // found[i] = 1 when keys[i] is cached.
  Status ExistsBatch(std::span<const BlockKey> keys, std::span<uint8_t> found, const RequestOptions& o = {});
  Status Erase(std::span<const BlockKey> keys, const RequestOptions& o = {});
  // An eviction hint: the caller's readers are done with these blocks (say,
  // the blocks of a session that just closed that no other session read).
  // Each stored block, on every replica, becomes the next to leave its node's
  // cache, before blocks not released, until something reads it again;
  // nothing is erased. Keys not stored are fine. docs/eviction.md "Session
  // closes" measures what it is worth.
  Status Release(std::span<const BlockKey> keys, const RequestOptions& o = {});

  // One block, copied out. NotFound (or another miss code) on a miss.
  Result<std::vector<std::byte>> Get(const BlockKey& key, const RequestOptions& o = {});

  // ---- registered memory: zero-copy transfers -----------------------------------
  // An inference engine registers the memory its KV blocks live in (its host
  // KV pool; device memory in builds with CUDA) once. GetInto and PutFrom
  // then move block bytes between that memory and the nodes' pools with no
  // intermediate copy where the transport allows: over UCX the node writes a
  // block straight into the destination (one-sided put) and reads a stored
  // block straight from the source (one-sided get); over TCP the socket reads
  // into the destination and sends from the source; in process, one copy
  // between pool and caller memory. Every block is still checksummed once
  // per direction and verified where its bytes land: a corrupt block is a miss.
  //
  // Memory that is not registered works with every call too, through a
  // bounce buffer (UCX) or directly (TCP, in process). Device memory always
  // goes through a host bounce buffer: no transport here moves GPU memory.
  //
  // RegisterMemory returns the region (its id for UnregisterMemory).
  // InvalidArgument for an empty range or one overlapping a registered region,
  // Unimplemented for device memory without CUDA. A transport that cannot
  // register it (a node whose UCX registration fails) serves the region
  // through a bounce buffer instead; the call still succeeds.
  Result<MemoryRegion> RegisterMemory(void* base, size_t bytes, MemoryKind kind = MemoryKind::kHost);
  // Allocates `bytes` of host memory the transport reaches best and registers
  // it (RouterOptions::allocate_memory): the region's base is the memory, owned
  // by the router until UnregisterMemory (or the router's end). Engines that
  // can choose where their host KV pool lives should take it from here: over
  // UCX on one host a GetInto into it is a one-sided write by the node through
  // shared memory, while memory from malloc is written through CMA or active
  // messages (correct, and several times slower).
  // owner, when not null, receives a co-owner of the memory: it is then freed
  // once UnregisterMemory (or the router's end) and the caller have both let
  // go, so memory the caller hands on (a language binding's buffer) outlives
  // the router safely.
  Result<MemoryRegion> AllocateMemory(size_t bytes, std::shared_ptr<std::byte>* owner = nullptr);
  // Forgets the region (and frees it, for AllocateMemory's). REQUIRES: no
  // call in flight reads or writes it. NotFound for an unknown id.
  Status UnregisterMemory(uint64_t id);
  // GetBatch and PutBatch under the names engines look for: items[i].dst /
  // items[i].data may lie in registered memory (zero copy) or anywhere else.
  Status GetInto(std::span<GetItem> items, const RequestOptions& o = {}) { return GetBatch(items, o); }
  Status PutFrom(std::span<PutItem> items, const RequestOptions& o = {}) { return PutBatch(items, o); }

  // ---- live sequences (see the top of this file) --------------------------------
  // A new sequence for the options' slice (layers, heads; empty = all) with
  // eviction class o.priority, placed by prefix affinity. It holds the longest
  // run of leading full blocks of `prefix` that its node has (pinned, shared),
  // at most max_blocks of them; h.prefix_tokens says how many tokens that is.
  Result<SequenceHandle> CreateSequence(std::span<const TokenId> prefix, const RequestOptions& o = {},
                                        size_t max_blocks = SIZE_MAX);
  // Appends tokens with their K and V, each [layer][n][heads][head_dim] over
  // the sequence's slice in the model dtype; full blocks are sealed into the
  // node's store. Returns the position of the first token.
  Result<uint32_t> AppendSequence(const SequenceHandle& s, std::span<const TokenId> tokens,
                                  std::span<const std::byte> k, std::span<const std::byte> v,
                                  const RequestOptions& o = {});
  // Drops the last n tokens.
  Status TruncateSequence(const SequenceHandle& s, uint32_t n, const RequestOptions& o = {});
  // A new sequence on the same node with the same tokens (sealed blocks shared).
  Result<SequenceHandle> ForkSequence(const SequenceHandle& s, const RequestOptions& o = {});
  // Unpins and forgets the sequence (its sealed blocks stay cached).
  Status ReleaseSequence(const SequenceHandle& s, const RequestOptions& o = {});
  Result<SequenceState> SequenceInfo(const SequenceHandle& s, const RequestOptions& o = {});
  // K and V of positions [from, from + n), in the AppendSequence layout.
  Status ReadSequence(const SequenceHandle& s, uint32_t from, uint32_t n, std::vector<std::byte>* k,
                      std::vector<std::byte>* v, const RequestOptions& o = {});

  // Swaps in a newer shard map (epoch must grow) with its channels.
  Status UpdateMap(std::shared_ptr<const ShardMap> map,
                   std::vector<std::shared_ptr<ShardChannel>> channels);
  uint64_t epoch() const;
  // The shard map in use now (replaced whole by UpdateMap): for fronts that
  // place keys and drive the nodes themselves (router/proxy/resp_proxy.h).
  std::shared_ptr<const ShardMap> map() const;

  RouterStats Stats() const;

 private:
  struct Impl;
  explicit Router(std::unique_ptr<Impl> impl);
  // PutBatch / GetBatch once every item's bytes are in host memory.
  Status PutBatchHost(std::span<PutItem> items, const RequestOptions& o);
  Status GetBatchHost(std::span<GetItem> items, const RequestOptions& o);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvmesh

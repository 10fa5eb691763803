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
// Thread-safety: every method is thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvmesh/block_key.h"
#include "kvmesh/config.h"
#include "kvmesh/request.h"
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
};

struct RouterStats {
  uint64_t puts = 0, put_blocks = 0;
  uint64_t gets = 0, get_blocks = 0, get_hits = 0;
  uint64_t match_calls = 0, match_blocks_asked = 0, match_blocks_hit = 0;
  uint64_t node_errors = 0;  // calls a node could not answer (counted as misses)
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
  // on an unreachable node counts as a miss. Hits are refreshed.
  Result<size_t> MatchPrefix(std::span<const TokenId> tokens, const RequestOptions& o = {});

  // Stores blocks[i] as full block `first_block + i` of `tokens`.
  // REQUIRES: first_block + blocks.size() <= full blocks of tokens.
  // Returns the first per-block error (every block is still attempted).
  Status Put(std::span<const TokenId> tokens, std::span<const std::span<const std::byte>> blocks,
             const RequestOptions& o = {}, size_t first_block = 0);

  // Batch forms over explicit keys; per-item results in the items.
  Status PutBatch(std::span<PutItem> items, const RequestOptions& o = {});
  Status GetBatch(std::span<GetItem> items, const RequestOptions& o = {});
  // found[i] = 1 when keys[i] is cached.
  Status ExistsBatch(std::span<const BlockKey> keys, std::span<uint8_t> found, const RequestOptions& o = {});
  Status Erase(std::span<const BlockKey> keys, const RequestOptions& o = {});

  // One block, copied out. NotFound (or another miss code) on a miss.
  Result<std::vector<std::byte>> Get(const BlockKey& key, const RequestOptions& o = {});

  // Swaps in a newer shard map (epoch must grow) with its channels.
  Status UpdateMap(std::shared_ptr<const ShardMap> map,
                   std::vector<std::shared_ptr<ShardChannel>> channels);
  uint64_t epoch() const;

  RouterStats Stats() const;

 private:
  struct Impl;
  explicit Router(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvmesh

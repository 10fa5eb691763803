// transport/shard_channel.h — the client side of one shard node, whatever
// carries the bytes: in-process calls (embedded mode, tests), Asio TCP or UCX.
//
// Calls are batches: one call per node per router operation, per-item results
// in the items. The returned Status is about the call as a whole: OK when the
// node answered (items then hold their own results), Unavailable / DeadlineExceeded
// when it could not be reached in time (items untouched), StaleEpoch when the
// node refused the caller's shard-map epoch.
//
// Thread-safety: implementations are thread-safe (a router shares one channel
// per node among its callers).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include <vector>

#include "kvmesh/request.h"
#include "kvmesh/status.h"
#include "shard_node/sequence_service.h"

namespace kvmesh {

class ShardNode;

class ShardChannel {
 public:
  virtual ~ShardChannel() = default;
  virtual std::string_view transport() const = 0;

  virtual Status Put(std::span<PutItem> items, const RequestOptions& o) = 0;
  virtual Status Get(std::span<GetItem> items, const RequestOptions& o) = 0;
  // found[i] = 1 when keys[i] is stored. With touch, hits refresh recency.
  virtual Status Exists(std::span<const BlockKey> keys, std::span<uint8_t> found, bool touch,
                        const RequestOptions& o) = 0;
  // statuses[i]: OK or NotFound.
  virtual Status Erase(std::span<const BlockKey> keys, std::span<Status> statuses) = 0;
  virtual Status Pin(std::span<const BlockKey> keys, std::span<Status> statuses) = 0;
  virtual Status Unpin(std::span<const BlockKey> keys, std::span<Status> statuses) = 0;
  // The node's statistics as a JSON object (text).
  virtual Result<std::string> StatsJson() = 0;

  // Live sequences on this node (SequenceService semantics; ids are the
  // node's). A call-level failure (node unreachable: Unavailable /
  // DeadlineExceeded) and the node's refusal (NotFound, InvalidArgument,
  // ResourceExhausted, DataLoss in transit) are both the returned Status.
  // Backends without sequences answer Unimplemented.
  virtual Result<SeqCreated> SeqCreate(const SeqCreateArgs& a, const RequestOptions& o) {
    (void)a, (void)o;
    return NoSequences();
  }
  // k and v: [layer][n][heads][head_dim] over the sequence's `layers` layers.
  // A backend may send a large append as several frames (then a failure part
  // way leaves the earlier tokens appended: SeqInfo tells the length).
  virtual Result<uint32_t> SeqAppend(SeqId id, std::span<const TokenId> tokens, std::span<const std::byte> k,
                                     std::span<const std::byte> v, uint32_t layers, const RequestOptions& o) {
    (void)id, (void)tokens, (void)k, (void)v, (void)layers, (void)o;
    return NoSequences();
  }
  virtual Status SeqTruncate(SeqId id, uint32_t n, const RequestOptions& o) {
    (void)id, (void)n, (void)o;
    return NoSequences();
  }
  virtual Result<SeqId> SeqFork(SeqId id, const RequestOptions& o) {
    (void)id, (void)o;
    return NoSequences();
  }
  virtual Status SeqRelease(SeqId id, const RequestOptions& o) {
    (void)id, (void)o;
    return NoSequences();
  }
  virtual Result<SeqState> SeqInfo(SeqId id, const RequestOptions& o) {
    (void)id, (void)o;
    return NoSequences();
  }
  // K and V of positions [from, from + n) in the SeqAppend layout (resized).
  virtual Status SeqRead(SeqId id, uint32_t from, uint32_t n, std::vector<std::byte>* k, std::vector<std::byte>* v,
                         const RequestOptions& o) {
    (void)id, (void)from, (void)n, (void)k, (void)v, (void)o;
    return NoSequences();
  }

 private:
  Status NoSequences() const {
    return Unimplemented("the " + std::string(transport()) + " transport does not carry live sequences");
  }
};

// A channel that calls `node` directly (embedded mode). REQUIRES: node outlives it.
std::unique_ptr<ShardChannel> MakeInProcessChannel(ShardNode* node);

}  // namespace kvmesh

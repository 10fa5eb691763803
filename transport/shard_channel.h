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

#include "kvmesh/request.h"
#include "kvmesh/status.h"

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
};

// A channel that calls `node` directly (embedded mode). REQUIRES: node outlives it.
std::unique_ptr<ShardChannel> MakeInProcessChannel(ShardNode* node);

}  // namespace kvmesh

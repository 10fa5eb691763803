// transport/sync_over_async.h — the synchronous batch calls of a channel
// whose asynchronous ones really leave the call in flight (TCP, UCX): each
// starts the asynchronous form on a ChannelCall of its own and waits for it,
// so a backend writes one path per operation and both forms behave the same
// (same frames, same per-item results, same call-level Status and timeout).
//
//   class MyChannel : public SyncOverAsync<ShardChannel> {
//     bool async_calls() const override { return true; }
//     void StartPut(...) override;  // and StartGet, StartExists, StartErase
//   };
//
// Erase has no options, so its asynchronous form gets the defaults: the
// channel's own timeout.
//
// Thread-safety: as the Start* methods (each call uses its own ChannelCall).
#pragma once

#include <cstdint>
#include <span>

#include "kvmesh/request.h"
#include "kvmesh/status.h"
#include "transport/shard_channel.h"

namespace kvmesh {

// Put, Get, Exists and Erase of a ShardChannel subclass Base as Start* +
// ChannelCall::Wait(). REQUIRES: Base's Start* are overridden (the defaults
// call back into these methods).
template <typename Base>
class SyncOverAsync : public Base {
 public:
  Status Put(std::span<PutItem> items, const RequestOptions& o) override {
    ChannelCall call;
    this->StartPut(items, o, &call);
    return call.Wait();
  }
  Status Get(std::span<GetItem> items, const RequestOptions& o) override {
    ChannelCall call;
    this->StartGet(items, o, &call);
    return call.Wait();
  }
  Status Exists(std::span<const BlockKey> keys, std::span<uint8_t> found, bool touch,
                const RequestOptions& o) override {
    ChannelCall call;
    this->StartExists(keys, found, touch, o, &call);
    return call.Wait();
  }
  Status Erase(std::span<const BlockKey> keys, std::span<Status> statuses) override {
    ChannelCall call;
    this->StartErase(keys, statuses, RequestOptions{}, &call);
    return call.Wait();
  }
};

}  // namespace kvmesh

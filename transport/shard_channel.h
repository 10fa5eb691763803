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
#include "kvmesh/sequence.h"
#include "kvmesh/status.h"

namespace kvmesh {

// ---- asynchronous calls (the router's fan-out) ----------------------------------
//
// Why start/wait instead of router threads: over TCP a call is "write a frame,
// read the answer" on a pooled, pipelined connection, so the caller can write
// its frames to every node first and then collect the answers; the operation
// then costs the slowest node's round trip, with no thread hand-off and no
// extra threads competing with the nodes for cores. Backends that cannot have
// a call in flight (in-process, UCX today) run the synchronous call inside
// Start*, which makes a fan-out over them serial.

// What a backend keeps for one call in flight. Reused from call to call.
class ChannelCallState {
 public:
  virtual ~ChannelCallState() = default;
  // Collects the answer (bounded by the call's timeout) into the call's items
  // and returns the call-level Status (ShardChannel contract). Called once
  // per started call.
  virtual Status Wait() = 0;
};

// One call started by a ShardChannel::Start* method; Wait() ends it.
// REQUIRES: the spans handed to Start* stay valid, and are neither read nor
// written by the caller, until Wait() returns; Wait() once per Start*, before
// the next Start* on the same ChannelCall. A call destroyed in flight is
// waited for first (so no answer lands in freed memory).
// Reusable: the backend's state object stays with the ChannelCall, so a warm
// ChannelCall allocates nothing of its own.
// Thread-safety: one thread at a time; different ChannelCalls are independent.
class ChannelCall {
 public:
  ChannelCall() = default;
  ChannelCall(const ChannelCall&) = delete;
  ChannelCall& operator=(const ChannelCall&) = delete;
  ChannelCall(ChannelCall&& o) noexcept = default;
  ChannelCall& operator=(ChannelCall&&) = delete;
  ~ChannelCall() {
    if (in_flight_) (void)Wait();
  }

  Status Wait() {
    if (!in_flight_) return std::move(result_);
    in_flight_ = false;
    return state_->Wait();
  }

  // ---- for backends ----
  // The call finished inside Start* with `s`.
  void Finish(Status s) {
    in_flight_ = false;
    result_ = std::move(s);
  }
  // This call's state as a T (made on first use, or when the call last
  // served another backend), marked in flight: Wait() will ask it.
  template <typename T>
  T* StartAs() {
    T* t = dynamic_cast<T*>(state_.get());
    if (t == nullptr) {
      auto fresh = std::make_unique<T>();
      t = fresh.get();
      state_ = std::move(fresh);
    }
    in_flight_ = true;
    return t;
  }

 private:
  bool in_flight_ = false;
  Status result_;
  std::unique_ptr<ChannelCallState> state_;
};

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
  // statuses[i]: OK or NotFound (BlockStoreOps::Release: an eviction hint).
  virtual Status Release(std::span<const BlockKey> keys, std::span<Status> statuses) = 0;
  // The node's statistics as a JSON object (text).
  virtual Result<std::string> StatsJson() = 0;

  // Caller memory registered for zero-copy transfers (Router::RegisterMemory):
  // a backend that moves bytes with one-sided operations registers the region
  // with its transport and tells the node; Put/Get items whose bytes lie in
  // it then need no bounce copy. A failure leaves the region unregistered
  // here (its items take the bounce path). The defaults do nothing: TCP and
  // in-process channels read and write any host memory directly.
  // REQUIRES: host memory; an id registered once per channel.
  virtual Status RegisterMemory(const MemoryRegion& region) {
    (void)region;
    return Status::Ok();
  }
  virtual void UnregisterMemory(uint64_t id) { (void)id; }

  // Asynchronous forms of Put, Get, Exists and Erase (see ChannelCall): the
  // same items, results and call-level Status as the synchronous call, the
  // answer collected by call->Wait(). Erase takes options here for its
  // timeout. A backend whose Start* really leaves the call in flight says so
  // with async_calls(); the defaults run the synchronous call in Start*.
  virtual bool async_calls() const { return false; }
  virtual void StartPut(std::span<PutItem> items, const RequestOptions& o, ChannelCall* call) {
    call->Finish(Put(items, o));
  }
  virtual void StartGet(std::span<GetItem> items, const RequestOptions& o, ChannelCall* call) {
    call->Finish(Get(items, o));
  }
  virtual void StartExists(std::span<const BlockKey> keys, std::span<uint8_t> found, bool touch,
                           const RequestOptions& o, ChannelCall* call) {
    call->Finish(Exists(keys, found, touch, o));
  }
  virtual void StartErase(std::span<const BlockKey> keys, std::span<Status> statuses, const RequestOptions& o,
                          ChannelCall* call) {
    (void)o;
    call->Finish(Erase(keys, statuses));
  }

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
  virtual Result<SequenceState> SeqInfo(SeqId id, const RequestOptions& o) {
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

}  // namespace kvmesh

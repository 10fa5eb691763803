// shard_node/kv_events.h — a node's KV events: the blocks its tiers store and
// remove, published on a ZMQ PUB socket in vLLM's KV-event wire format, with
// a ROUTER socket that replays recent batches or sends a snapshot of the
// node's contents (docs/kv-events.md has the format, its source and the
// subscriber's protocol).
//
// The stores call OnBlock (shard_node/block_events.h) under their own locks:
// it only appends the event to a bounded ring (a short critical section, no
// allocation, no I/O). One publisher thread drains the ring into batches
// (EventBatch), numbers them, sends them and keeps the last `replay_buffer`
// for replay. When the ring is full the event is dropped and the sequence
// number skips one at that point: subscribers see the gap, find that replay
// cannot fill it and ask for a snapshot. Removals are therefore never lost
// silently.
//
// Thread-safety: OnBlock from any thread; the rest from the owner.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "kvmesh/config.h"
#include "kvmesh/status.h"
#include "shard_node/block_events.h"

namespace kvmesh {

struct KvEventStats {
  uint64_t events = 0;     // events published (each stored or removed block counts one)
  uint64_t batches = 0;    // batches published (sequence numbers used, gaps excluded)
  uint64_t dropped = 0;    // events dropped because the ring was full
  uint64_t gaps = 0;       // sequence numbers skipped for them
  uint64_t replays = 0;    // replay requests served
  uint64_t snapshots = 0;  // snapshot requests served
};

class KvEventPublisher final : public BlockObserver {
 public:
  // Calls add(medium, key) for every block the node holds (a snapshot).
  using Lister = std::function<void(const std::function<void(BlockMedium, const BlockKey&)>& add)>;

  // Binds both sockets and starts the publisher thread; its first batch
  // (sequence 0) is AllBlocksCleared: the node starts empty. `block_size` is
  // the model's tokens per block (BlockStored.block_size).
  static Result<std::unique_ptr<KvEventPublisher>> Start(const EventsConfig& config, uint32_t block_size);
  ~KvEventPublisher() override;  // Stop()

  // Sets the snapshot lister (before any snapshot request can be served well;
  // until then a snapshot is AllBlocksCleared alone). The lister's stores
  // must outlive Stop().
  void SetLister(Lister lister);
  // Publishes what is queued and stops the thread. Idempotent.
  void Stop();

  void OnBlock(BlockChange change, BlockMedium medium, const BlockKey& key) noexcept override;

  uint16_t port() const { return port_; }
  uint16_t replay_port() const { return replay_port_; }
  KvEventStats Stats() const;

  // The third frame of a snapshot request on the replay socket (a replay
  // request's is an 8-byte big-endian sequence number); a continuation is
  // kSnapshotRequest followed by the cursor the previous answer ended with.
  static constexpr std::string_view kSnapshotRequest = "kvmesh-snapshot";
  // An answer to a snapshot request lists at most this many batches of
  // max_batch_events blocks; a longer listing ends with a cursor instead of
  // the empty end payload (docs/kv-events.md), so neither side ever holds a
  // whole node's listing in one answer.
  static constexpr size_t kSnapshotBatchesPerAnswer = 64;
  // The cursor: the last block of an answer, as medium (1 byte), then its
  // key's high and low halves (8 bytes each, big-endian); the listing runs in
  // that order.
  static constexpr size_t kSnapshotCursorBytes = 17;

 private:
  struct Event {
    BlockKey key;
    BlockChange change;
    BlockMedium medium;
  };
  KvEventPublisher() = default;
  void Loop();
  static bool ListedBefore(const Event& a, const Event& b);
  static std::string CursorBytes(const Event& e);
  static Event CursorEvent(std::string_view cursor);  // cursor: kSnapshotCursorBytes

  EventsConfig config_;
  uint32_t block_size_ = 0;
  uint16_t port_ = 0, replay_port_ = 0;
  struct Sockets;
  std::unique_ptr<Sockets> sockets_;  // used by the publisher thread only

  mutable std::mutex ring_mu_;
  std::vector<Event> ring_;    // guarded by ring_mu_; capacity queue_events, allocated once
  size_t head_ = 0, count_ = 0;  // guarded by ring_mu_
  uint64_t dropped_pending_ = 0;  // guarded by ring_mu_: drops not yet turned into a gap

  std::mutex lister_mu_;
  Lister lister_;  // guarded by lister_mu_

  std::atomic<bool> stop_{false};
  std::thread thread_;
  struct Counters {
    std::atomic<uint64_t> events{0}, batches{0}, dropped{0}, gaps{0}, replays{0}, snapshots{0};
  };
  Counters c_;
};

}  // namespace kvmesh

// shard_node/kv_events.cc — the KV-event publisher (kv_events.h); the wire
// format is written down in docs/kv-events.md.
#include "shard_node/kv_events.h"

#include "shard_node/kv_event_wire.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <string_view>

#include <msgpack.hpp>
#include <zmq.hpp>
#include <zmq_addon.hpp>

namespace kvmesh {

namespace {

constexpr auto kPollInterval = std::chrono::milliseconds(2);

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

using Packer = msgpack::packer<msgpack::sbuffer>;

void PackStr(Packer& pk, std::string_view s) {
  pk.pack_str(static_cast<uint32_t>(s.size()));
  pk.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

// One block hash as ExternalBlockHash (bytes | int): the 16-byte key, hi
// first (BlockKey::ToHex order), or its low 64 bits.
void PackHash(Packer& pk, const BlockKey& k, bool as_int) {
  if (as_int) {
    pk.pack_uint64(k.lo);
    return;
  }
  char b[16];
  for (int i = 0; i < 8; ++i) {
    b[i] = static_cast<char>(k.hi >> (56 - 8 * i));
    b[8 + i] = static_cast<char>(k.lo >> (56 - 8 * i));
  }
  pk.pack_bin(16);
  pk.pack_bin_body(b, 16);
}

struct Run {
  BlockChange change;
  BlockMedium medium;
  size_t begin, end;  // [begin, end) of the keys
};

// EventBatch(ts, events) as a msgpack array; events are the tagged,
// array-like structs AllBlocksCleared, BlockStored, BlockRemoved.
std::string EncodeBatch(bool cleared, const std::vector<Run>& runs, const std::vector<BlockKey>& keys,
                        uint32_t block_size, bool as_int) {
  msgpack::sbuffer buf;
  Packer pk(buf);
  pk.pack_array(2);
  pk.pack_double(NowSeconds());
  pk.pack_array(static_cast<uint32_t>(runs.size() + (cleared ? 1 : 0)));
  if (cleared) {
    pk.pack_array(1);
    PackStr(pk, "AllBlocksCleared");
  }
  for (const Run& r : runs) {
    const uint32_t n = static_cast<uint32_t>(r.end - r.begin);
    if (r.change == BlockChange::kStored) {
      // BlockStored(block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name)
      pk.pack_array(8);
      PackStr(pk, "BlockStored");
      pk.pack_array(n);
      for (size_t i = r.begin; i < r.end; ++i) PackHash(pk, keys[i], as_int);
      pk.pack_nil();         // parent_block_hash: a node does not know a block's parent
      pk.pack_array(0);      // token_ids: a node holds keys, not tokens
      pk.pack_uint32(block_size);
      pk.pack_nil();         // lora_id
      PackStr(pk, BlockMediumName(r.medium));
      pk.pack_nil();         // lora_name
    } else {
      // BlockRemoved(block_hashes, medium)
      pk.pack_array(3);
      PackStr(pk, "BlockRemoved");
      pk.pack_array(n);
      for (size_t i = r.begin; i < r.end; ++i) PackHash(pk, keys[i], as_int);
      PackStr(pk, BlockMediumName(r.medium));
    }
  }
  return std::string(buf.data(), buf.size());
}

Result<uint16_t> BoundPort(zmq::socket_t& s) {
  const std::string ep = s.get(zmq::sockopt::last_endpoint);
  const size_t colon = ep.rfind(':');
  if (colon == std::string::npos) return Internal("zmq endpoint without a port: " + ep);
  return static_cast<uint16_t>(std::stoul(ep.substr(colon + 1)));
}

}  // namespace

// A snapshot's listing order: medium, then key.
bool KvEventPublisher::ListedBefore(const Event& a, const Event& b) {
  if (a.medium != b.medium) return a.medium < b.medium;
  if (a.key.hi != b.key.hi) return a.key.hi < b.key.hi;
  return a.key.lo < b.key.lo;
}

std::string KvEventPublisher::CursorBytes(const Event& e) {
  std::string c(1, static_cast<char>(e.medium));
  c += KvEventSeqBytes(static_cast<int64_t>(e.key.hi));
  c += KvEventSeqBytes(static_cast<int64_t>(e.key.lo));
  return c;
}

KvEventPublisher::Event KvEventPublisher::CursorEvent(std::string_view c) {
  Event e{};
  e.medium = static_cast<BlockMedium>(static_cast<unsigned char>(c[0]));
  e.key.hi = static_cast<uint64_t>(KvEventSeqOf(c.substr(1, 8)));
  e.key.lo = static_cast<uint64_t>(KvEventSeqOf(c.substr(9, 8)));
  return e;
}

struct KvEventPublisher::Sockets {
  zmq::context_t ctx{1};
  zmq::socket_t pub{ctx, zmq::socket_type::pub};
  zmq::socket_t replay{ctx, zmq::socket_type::router};
  std::deque<std::pair<int64_t, std::string>> buffer;  // (seq, payload), the last replay_buffer batches
  int64_t next_seq = 0;
};

Result<std::unique_ptr<KvEventPublisher>> KvEventPublisher::Start(const EventsConfig& config, uint32_t block_size) {
  std::unique_ptr<KvEventPublisher> p(new KvEventPublisher());
  p->config_ = config;
  p->block_size_ = block_size;
  p->ring_.resize(config.queue_events);
  p->sockets_ = std::make_unique<Sockets>();
  Sockets& s = *p->sockets_;
  auto endpoint = [&](uint16_t port) {
    return "tcp://" + config.host + ":" + (port == 0 ? std::string("*") : std::to_string(port));
  };
  try {
    s.pub.set(zmq::sockopt::sndhwm, 100000);
    s.pub.set(zmq::sockopt::linger, 0);
    s.replay.set(zmq::sockopt::linger, 0);
    s.replay.set(zmq::sockopt::sndhwm, 0);  // a snapshot is many messages: never drop replay answers
    s.pub.bind(endpoint(config.port));
    s.replay.bind(endpoint(config.replay_port));
  } catch (const zmq::error_t& e) {
    return Unavailable("$.events: cannot bind " + config.host + ": " + e.what());
  }
  KVMESH_ASSIGN_OR_RETURN(p->port_, BoundPort(s.pub));
  KVMESH_ASSIGN_OR_RETURN(p->replay_port_, BoundPort(s.replay));
  KvEventPublisher* self = p.get();
  p->thread_ = std::thread([self] { self->Loop(); });
  return p;
}

KvEventPublisher::~KvEventPublisher() { Stop(); }

void KvEventPublisher::Stop() {
  if (stop_.exchange(true)) return;
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(lister_mu_);
  lister_ = nullptr;
}

void KvEventPublisher::SetLister(Lister lister) {
  std::lock_guard<std::mutex> lock(lister_mu_);
  lister_ = std::move(lister);
}

void KvEventPublisher::OnBlock(BlockChange change, BlockMedium medium, const BlockKey& key) noexcept {
  std::lock_guard<std::mutex> lock(ring_mu_);
  if (count_ == ring_.size()) {
    ++dropped_pending_;
    return;
  }
  ring_[(head_ + count_) % ring_.size()] = Event{key, change, medium};
  ++count_;
}

KvEventStats KvEventPublisher::Stats() const {
  KvEventStats s;
  s.events = c_.events.load();
  s.batches = c_.batches.load();
  s.dropped = c_.dropped.load();
  s.gaps = c_.gaps.load();
  s.replays = c_.replays.load();
  s.snapshots = c_.snapshots.load();
  return s;
}

void KvEventPublisher::Loop() {
  Sockets& s = *sockets_;
  const bool as_int = config_.hash == "int";
  const size_t max_batch = config_.max_batch_events;
  std::vector<Event> taken;
  taken.reserve(ring_.size());
  std::vector<BlockKey> keys;
  keys.reserve(ring_.size());
  std::vector<Run> runs;

  auto publish = [&](const std::string& payload) {
    const int64_t seq = s.next_seq++;
    try {
      s.pub.send(zmq::buffer(config_.topic), zmq::send_flags::sndmore);
      s.pub.send(zmq::buffer(KvEventSeqBytes(seq)), zmq::send_flags::sndmore);
      s.pub.send(zmq::buffer(payload), zmq::send_flags::none);
    } catch (const zmq::error_t&) {
      // PUB does not block and drops on its high-water mark; the batch is
      // still numbered and kept for replay.
    }
    s.buffer.emplace_back(seq, payload);
    while (s.buffer.size() > config_.replay_buffer) s.buffer.pop_front();
    c_.batches.fetch_add(1, std::memory_order_relaxed);
  };
  // Groups `events` (in order) into runs of one change and medium and
  // publishes them max_batch keys per batch.
  auto publish_events = [&](const std::vector<Event>& events) {
    size_t i = 0;
    while (i < events.size()) {
      const size_t end = std::min(events.size(), i + max_batch);
      keys.clear();
      runs.clear();
      for (size_t j = i; j < end; ++j) {
        const Event& e = events[j];
        if (runs.empty() || runs.back().change != e.change || runs.back().medium != e.medium)
          runs.push_back(Run{e.change, e.medium, keys.size(), keys.size()});
        keys.push_back(e.key);
        runs.back().end = keys.size();
      }
      publish(EncodeBatch(false, runs, keys, block_size_, as_int));
      c_.events.fetch_add(end - i, std::memory_order_relaxed);
      i = end;
    }
  };
  // Publishes what the ring holds; drops become one skipped sequence number
  // after the events that were queued before them, then an empty batch.
  auto drain = [&] {
    uint64_t dropped = 0;
    taken.clear();
    {
      std::lock_guard<std::mutex> lock(ring_mu_);
      for (size_t i = 0; i < count_; ++i) taken.push_back(ring_[(head_ + i) % ring_.size()]);
      head_ = (head_ + count_) % ring_.size();
      count_ = 0;
      dropped = dropped_pending_;
      dropped_pending_ = 0;
    }
    publish_events(taken);
    if (dropped > 0) {
      ++s.next_seq;
      c_.dropped.fetch_add(dropped, std::memory_order_relaxed);
      c_.gaps.fetch_add(1, std::memory_order_relaxed);
      // An empty batch right after the skipped number: a subscriber sees
      // the gap even when nothing changes after the drop.
      publish(EncodeBatch(false, {}, {}, block_size_, as_int));
    }
  };
  auto answer = [&](const zmq::message_t& id, int64_t seq, std::string_view payload) {
    s.replay.send(zmq::buffer(id.data(), id.size()), zmq::send_flags::sndmore);
    s.replay.send(zmq::message_t(), zmq::send_flags::sndmore);
    s.replay.send(zmq::buffer(KvEventSeqBytes(seq)), zmq::send_flags::sndmore);
    s.replay.send(zmq::buffer(payload.data(), payload.size()), zmq::send_flags::none);
  };
  // A request is [identity, empty, body]: body is an 8-byte big-endian start
  // sequence (replay) or kSnapshotRequest. The answer ends with seq -1 and an
  // empty payload, as vLLM's publisher ends a replay.
  auto serve = [&] {
    std::vector<zmq::message_t> req;
    if (!zmq::recv_multipart(s.replay, std::back_inserter(req), zmq::recv_flags::dontwait)) return;
    if (req.size() != 3) return;
    const std::string_view body(static_cast<const char*>(req[2].data()), req[2].size());
    std::string end_payload;  // empty: the answer is complete
    const bool snapshot = body.substr(0, kSnapshotRequest.size()) == kSnapshotRequest &&
                          (body.size() == kSnapshotRequest.size() ||
                           body.size() == kSnapshotRequest.size() + kSnapshotCursorBytes);
    if (snapshot) {
      // The listing runs in (medium, key) order; a continuation starts after
      // its cursor. At most `cap` blocks an answer: while listing, only the
      // 2 x cap smallest after the cursor are kept (cut back to cap when full).
      const bool first = body.size() == kSnapshotRequest.size();
      Event from{};
      if (!first) from = CursorEvent(body.substr(kSnapshotRequest.size()));
      if (first) c_.snapshots.fetch_add(1, std::memory_order_relaxed);
      drain();  // everything before the listing is numbered first
      const int64_t at = s.next_seq - 1;
      const size_t cap = max_batch * kSnapshotBatchesPerAnswer;
      std::vector<Event> all;
      bool more = false;
      {
        std::lock_guard<std::mutex> lock(lister_mu_);
        if (lister_)
          lister_([&](BlockMedium m, const BlockKey& k) {
            const Event e{k, BlockChange::kStored, m};
            if (!first && !ListedBefore(from, e)) return;
            all.push_back(e);
            if (all.size() == 2 * cap) {
              std::nth_element(all.begin(), all.begin() + cap, all.end(), ListedBefore);
              all.resize(cap);
              more = true;
            }
          });
      }
      std::sort(all.begin(), all.end(), ListedBefore);
      if (all.size() > cap) {
        all.resize(cap);
        more = true;
      }
      if (more) end_payload = CursorBytes(all.back());
      // Batches of the snapshot all carry `at`: the state after batch `at`
      // (a continuation's: after the batch its listing followed).
      if (first) answer(req[0], at, EncodeBatch(true, {}, {}, block_size_, as_int));
      std::vector<Run> snap_runs;
      std::vector<BlockKey> snap_keys;
      for (size_t i = 0; i < all.size();) {
        const size_t end = std::min(all.size(), i + max_batch);
        snap_runs.clear();
        snap_keys.clear();
        for (size_t j = i; j < end; ++j) {
          if (snap_runs.empty() || snap_runs.back().medium != all[j].medium)
            snap_runs.push_back(Run{BlockChange::kStored, all[j].medium, snap_keys.size(), snap_keys.size()});
          snap_keys.push_back(all[j].key);
          snap_runs.back().end = snap_keys.size();
        }
        answer(req[0], at, EncodeBatch(false, snap_runs, snap_keys, block_size_, as_int));
        i = end;
      }
    } else if (body.size() == 8) {
      c_.replays.fetch_add(1, std::memory_order_relaxed);
      const int64_t start = KvEventSeqOf(body);
      for (const auto& [seq, payload] : s.buffer)
        if (seq >= start) answer(req[0], seq, payload);
    }
    answer(req[0], -1, end_payload);
  };

  publish(EncodeBatch(true, {}, {}, block_size_, as_int));  // seq 0: the node starts empty
  while (true) {
    const bool stopping = stop_.load(std::memory_order_acquire);
    zmq::pollitem_t item{s.replay.handle(), 0, ZMQ_POLLIN, 0};
    try {
      zmq::poll(&item, 1, stopping ? std::chrono::milliseconds(0) : kPollInterval);
      if (item.revents & ZMQ_POLLIN) serve();
    } catch (const zmq::error_t& e) {
      std::fprintf(stderr, "{\"event\":\"kv_events_error\",\"reason\":\"%s\"}\n", e.what());
    }
    drain();
    if (stopping) break;
  }
}

}  // namespace kvmesh

// coordinator/kv_subscriber.cc — KvEventSubscriber (kv_subscriber.h).
#include "coordinator/kv_subscriber.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string_view>

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "shard_node/kv_event_wire.h"
#include "shard_node/kv_events.h"

namespace kvmesh {

namespace {
constexpr auto kPoll = std::chrono::milliseconds(20);
constexpr auto kReplayWait = std::chrono::milliseconds(2000);  // per answer message of a replay or snapshot
// A source asked for what follows its last batch this often: a subscriber
// that joined (or fell behind) after a publisher's last batch learns of it
// without waiting for the next one.
constexpr auto kProbeEvery = std::chrono::milliseconds(500);

int64_t SeqOf(const zmq::message_t& m) {
  return KvEventSeqOf({static_cast<const char*>(m.data()), m.size()});
}

std::span<const std::byte> BytesOf(const zmq::message_t& m) {
  return {static_cast<const std::byte*>(m.data()), m.size()};
}
}  // namespace

struct KvEventSubscriber::Impl {
  KvIndex* index = nullptr;
  std::vector<KvEventSource> sources;
  zmq::context_t ctx{1};
  std::vector<zmq::socket_t> subs;
  mutable std::mutex mu;
  std::vector<int64_t> last;  // guarded by mu
  // Per source: a snapshot broke off part way, so the index holds part of a
  // listing: the next gap takes a snapshot, never a replay (subscriber thread only).
  std::vector<bool> need_snapshot;
  KvSubscriberStats stats;    // guarded by mu
  std::atomic<bool> stop{false};
  std::thread thread;

  void Apply(size_t s, const zmq::message_t& payload) {
    Status st = index->ApplyBatch(sources[s].instance, BytesOf(payload));
    std::lock_guard<std::mutex> lock(mu);
    if (st.ok()) ++stats.batches;
    else ++stats.bad_batches;
  }

  // Sends `body` to source s's replay socket; returns the (seq, payload)
  // answers up to the end marker and, in *end, the end marker's payload (a
  // snapshot's continuation cursor; empty: complete); false when it did not
  // answer in time.
  bool Ask(size_t s, std::string_view body, std::vector<std::pair<int64_t, zmq::message_t>>* out,
           std::string* end = nullptr) {
    zmq::socket_t d(ctx, zmq::socket_type::dealer);
    d.set(zmq::sockopt::linger, 0);
    d.connect(sources[s].replay_endpoint);
    d.send(zmq::message_t(), zmq::send_flags::sndmore);
    d.send(zmq::buffer(body.data(), body.size()), zmq::send_flags::none);
    while (!stop.load()) {
      zmq::pollitem_t item{d.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, kReplayWait);
      if (!(item.revents & ZMQ_POLLIN)) return false;
      std::vector<zmq::message_t> parts;
      if (!zmq::recv_multipart(d, std::back_inserter(parts))) return false;
      if (parts.size() != 3) return false;
      const int64_t seq = SeqOf(parts[1]);
      if (seq == -1) {
        if (end) end->assign(static_cast<const char*>(parts[2].data()), parts[2].size());
        return true;
      }
      out->emplace_back(seq, std::move(parts[2]));
    }
    return false;
  }

  // Fills the gap after last[s]: replay, else a snapshot. Returns the last
  // sequence applied. A probe (no gap seen) that finds nothing newer does nothing.
  int64_t Recover(size_t s, int64_t last_applied, bool probe = false) {
    if (sources[s].replay_endpoint.empty()) return -3;  // no replay: take the batch as it comes
    std::vector<std::pair<int64_t, zmq::message_t>> got;
    if (need_snapshot[s]) return Snapshot(s, last_applied);
    if (!Ask(s, KvEventSeqBytes(last_applied + 1), &got)) return last_applied;  // try again later
    if (probe && got.empty()) return last_applied;
    {
      std::lock_guard<std::mutex> lock(mu);
      ++stats.gaps;
    }
    if (!got.empty() && got.front().first == last_applied + 1) {
      {
        std::lock_guard<std::mutex> lock(mu);
        ++stats.replays;
      }
      for (auto& [seq, payload] : got) {
        if (seq != last_applied + 1) continue;
        Apply(s, payload);
        last_applied = seq;
      }
      return last_applied;
    }
    return Snapshot(s, last_applied);
  }

  // Replaces source s's state with a snapshot, answer by answer (each ends
  // with the cursor of the next one, or empty). Returns the sequence number
  // the snapshot stands at (its first answer's), or last_applied when the
  // first answer did not come (try again at the next batch). A snapshot
  // broken off after its first answer returns last_applied too and marks the
  // source: the next gap starts a new snapshot.
  int64_t Snapshot(size_t s, int64_t last_applied) {
    std::vector<std::pair<int64_t, zmq::message_t>> got;
    std::string cursor;
    int64_t at = -1;
    for (bool first = true;; first = false) {
      got.clear();
      std::string next;
      const std::string body = std::string(KvEventPublisher::kSnapshotRequest) + cursor;
      if (!Ask(s, body, &got, &next) || (first && got.empty())) {
        if (!first) need_snapshot[s] = true;
        return last_applied;
      }
      if (first) {
        {
          std::lock_guard<std::mutex> lock(mu);
          ++stats.snapshots;
        }
        (void)index->Cleared(sources[s].instance);
        at = got.front().first;
      }
      for (auto& [seq, payload] : got) Apply(s, payload);
      if (next.empty()) break;
      {
        std::lock_guard<std::mutex> lock(mu);
        ++stats.snapshot_continuations;
      }
      cursor = std::move(next);
    }
    need_snapshot[s] = false;
    return at;
  }

  void Loop() {
    std::vector<zmq::pollitem_t> items(subs.size());
    auto next_probe = std::chrono::steady_clock::now() + kProbeEvery;
    while (!stop.load()) {
      if (std::chrono::steady_clock::now() >= next_probe) {
        for (size_t s = 0; s < subs.size(); ++s) {
          int64_t l;
          {
            std::lock_guard<std::mutex> lock(mu);
            l = last[s];
          }
          try {
            const int64_t r = Recover(s, l, /*probe=*/true);
            if (r >= 0) {
              std::lock_guard<std::mutex> lock(mu);
              last[s] = std::max(last[s], r);
            }
          } catch (const zmq::error_t&) {
          }
        }
        next_probe = std::chrono::steady_clock::now() + kProbeEvery;
      }
      for (size_t i = 0; i < subs.size(); ++i) items[i] = {subs[i].handle(), 0, ZMQ_POLLIN, 0};
      try {
        zmq::poll(items.data(), items.size(), kPoll);
        for (size_t s = 0; s < subs.size(); ++s) {
          if (!(items[s].revents & ZMQ_POLLIN)) continue;
          std::vector<zmq::message_t> parts;
          while (zmq::recv_multipart(subs[s], std::back_inserter(parts), zmq::recv_flags::dontwait)) {
            if (parts.size() == 3) Take(s, SeqOf(parts[1]), parts[2]);
            parts.clear();
          }
        }
      } catch (const zmq::error_t& e) {
        std::fprintf(stderr, "{\"event\":\"kv_subscriber_error\",\"reason\":\"%s\"}\n", e.what());
      }
    }
  }

  void Take(size_t s, int64_t seq, const zmq::message_t& payload) {
    int64_t l;
    {
      std::lock_guard<std::mutex> lock(mu);
      l = last[s];
    }
    if (seq < 0 || seq <= l) return;  // applied already (through replay or a snapshot)
    if (seq != l + 1) {
      const int64_t r = Recover(s, l);
      if (r != -3) {
        l = r;
        std::lock_guard<std::mutex> lock(mu);
        last[s] = l;
        if (seq <= l) return;
        if (seq != l + 1) return;  // still a gap: the next batch tries again
      }
    }
    Apply(s, payload);
    std::lock_guard<std::mutex> lock(mu);
    last[s] = seq;
  }
};

KvEventSubscriber::KvEventSubscriber(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<KvEventSubscriber>> KvEventSubscriber::Start(KvIndex* index, std::vector<KvEventSource> sources) {
  auto impl = std::make_unique<Impl>();
  impl->index = index;
  impl->sources = std::move(sources);
  impl->last.assign(impl->sources.size(), -1);
  impl->need_snapshot.assign(impl->sources.size(), false);
  try {
    for (const KvEventSource& src : impl->sources) {
      zmq::socket_t s(impl->ctx, zmq::socket_type::sub);
      s.set(zmq::sockopt::linger, 0);
      s.set(zmq::sockopt::subscribe, src.topic);
      s.connect(src.endpoint);
      impl->subs.push_back(std::move(s));
    }
  } catch (const zmq::error_t& e) {
    return InvalidArgument(std::string("KV event source: ") + e.what());
  }
  Impl* p = impl.get();
  impl->thread = std::thread([p] { p->Loop(); });
  return std::unique_ptr<KvEventSubscriber>(new KvEventSubscriber(std::move(impl)));
}

KvEventSubscriber::~KvEventSubscriber() { Stop(); }

void KvEventSubscriber::Stop() {
  if (impl_->stop.exchange(true)) return;
  if (impl_->thread.joinable()) impl_->thread.join();
}

int64_t KvEventSubscriber::last_seq(const std::string& instance) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  for (size_t i = 0; i < impl_->sources.size(); ++i)
    if (impl_->sources[i].instance == instance) return impl_->last[i];
  return -1;
}

KvSubscriberStats KvEventSubscriber::Stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->stats;
}

}  // namespace kvmesh

// TieredStore's maintenance tick (offload by watermarks, pressure levels and
// their actions) and its observability (stats, events, Prometheus text).
#include <algorithm>
#include <cstring>
#include <deque>

#include <nlohmann/json.hpp>

#include "kernels/codec.h"
#include "shard_node/codec_stage.h"
#include "shard_node/tier_internal.h"
#include "shard_node/tiered_store.h"

namespace kvmesh {

using namespace tier_internal;

// ---- Maintenance -------------------------------------------------------------------

uint64_t TieredStore::PrimaryLimit() const {
  const uint64_t cap = primary_->Stats().capacity_bytes;
  const uint64_t lim = limit_bytes_.load(std::memory_order_acquire);
  return lim == 0 ? cap : std::min(lim, cap);
}

void TieredStore::SetPrimaryLimit(uint64_t bytes) { limit_bytes_.store(bytes, std::memory_order_release); }

// Blocks of tier `t`, in offload order: idle (>= offload_idle_s) first, then
// lower priority, then least recently used.
std::vector<TieredStore::Candidate> TieredStore::CandidatesIn(Tier t) const {
  const int64_t now = clock_->NowNanos();
  const int64_t idle_ns = static_cast<int64_t>(o_.offload_idle_s * 1e9);
  std::vector<Candidate> out;
  {
    std::lock_guard<std::mutex> lock(shadow_mu_);
    for (const auto& [k, s] : shadow_)
      if (s.tier == t) out.push_back({k, s});
  }
  std::sort(out.begin(), out.end(), [&](const Candidate& a, const Candidate& b) {
    const bool ia = now - a.s.last_ns >= idle_ns, ib = now - b.s.last_ns >= idle_ns;
    if (ia != ib) return ia;
    if (a.s.priority != b.s.priority) return a.s.priority < b.s.priority;
    return a.s.last_ns < b.s.last_ns;
  });
  return out;
}

// "Used" is the chunk bytes blocks hold (StoreStats::bytes_held), not their
// payload bytes: that is the memory a smaller (re-encoded) block gives back.
uint64_t TieredStore::OffloadPrimary(uint64_t limit) {
  uint64_t used = primary_->Stats().bytes_held;
  if (!host_ && !ssd_) return used;
  const uint64_t high = static_cast<uint64_t>(o_.high_watermark * static_cast<double>(limit));
  const uint64_t low = static_cast<uint64_t>(o_.low_watermark * static_cast<double>(limit));
  if (used <= high) return used;
  const uint64_t before = used;
  uint64_t moved = 0;
  for (const Candidate& c : CandidatesIn(Tier::kPrimary)) {
    if (used <= low) break;
    bool dropped = false;
    if (DemoteFromPrimary(c.key, /*allow_drop=*/false, &dropped)) {
      ++moved;
      used = primary_->Stats().bytes_held;
    }
  }
  c_.offload_runs.fetch_add(1, std::memory_order_relaxed);
  c_.demoted_offload.fetch_add(moved, std::memory_order_relaxed);
  Emit(nlohmann::json{{"event", "offload"}, {"tier", "primary"}, {"blocks", moved},
                      {"bytes_before", before}, {"bytes_after", used}, {"limit_bytes", limit}}
           .dump(),
       /*to_sink=*/false);
  return used;
}

void TieredStore::OffloadHost() {
  if (!host_ || !ssd_) return;
  const StoreStats hs = host_->Stats();
  const uint64_t high = static_cast<uint64_t>(o_.high_watermark * static_cast<double>(hs.capacity_bytes));
  const uint64_t low = static_cast<uint64_t>(o_.low_watermark * static_cast<double>(hs.capacity_bytes));
  uint64_t used = hs.bytes_held;
  if (used <= high) return;
  const uint64_t before = used;
  uint64_t moved = 0;
  for (const Candidate& c : CandidatesIn(Tier::kHost)) {
    if (used <= low) break;
    if (DemoteFromHost(c.key)) {
      ++moved;
      used = host_->Stats().bytes_held;
    }
  }
  c_.offload_runs.fetch_add(1, std::memory_order_relaxed);
  c_.demoted_offload.fetch_add(moved, std::memory_order_relaxed);
  Emit(nlohmann::json{{"event", "offload"}, {"tier", "host"}, {"blocks", moved},
                      {"bytes_before", before}, {"bytes_after", used}}
           .dump(),
       /*to_sink=*/false);
}

namespace {

// Codecs above the lower-precision ones: a block stored with only these is
// decoded and re-encoded at level 2; int8/int4/fp8/lowrank blocks are left.
bool HigherPrecision(const kernels::BlockInfo& info) {
  for (const kernels::SegmentInfo& seg : info.segments)
    if (seg.spec.kind != kernels::kCodecRaw && seg.spec.kind != kernels::kCodecFp16 &&
        seg.spec.kind != kernels::kCodecBf16)
      return false;
  return !info.segments.empty();
}

}  // namespace

// Level 2: each primary block that is raw (a full raw block of the model) or
// stored with a higher-precision codec (fp16/bf16/raw segments, e.g. by the
// node's codec stage) is re-encoded with the pressure codec when that makes
// it smaller, and replaced: erased, then stored again in a smaller chunk.
// Blocks are taken page by page (BlockStore::PlacementOf), and an encoded
// block is put without evicting, waiting in `pending` until the erases have
// emptied a page. Otherwise, in a full store, every put would make room by
// evicting other blocks before their turn to shrink.
void TieredStore::ReencodePrimary() {
  if (!reencoder_) return;
  const kernels::BlockShape model_shape = kernels::BlockShape::FromLayout(BlockLayout::Full(o_.model));
  const bool model_ok = o_.model.Validate().ok() && model_shape.Validate().ok();
  const uint8_t codec_id = kernels::PrimaryCodecId(reencoder_->policy());
  struct Pending {
    BlockKey key;
    PutOptions po;
    std::vector<std::byte> bytes;
    uint32_t was_size;
  };
  constexpr size_t kMaxPending = 64;  // then put with eviction (bounds the staging memory)
  std::deque<Pending> pending;
  std::vector<std::byte> stored, raw, enc;
  uint64_t blocks = 0, saved = 0, skipped = 0;
  // Stores pending blocks in order; `evict`: may make room by evicting.
  auto flush = [&](bool evict) {
    while (!pending.empty()) {
      Pending& p = pending.front();
      p.po.may_evict = evict;
      Status st = primary_->Put(p.key, p.bytes, p.po);
      if (!evict && st.code() == StatusCode::kResourceExhausted) return;
      if (st.ok()) {
        ++blocks;
        saved += p.was_size - p.bytes.size();
      } else {
        DropShadow(p.key);
      }
      pending.pop_front();
    }
  };
  std::vector<Candidate> todo = CandidatesIn(Tier::kPrimary);
  std::vector<std::pair<uint64_t, size_t>> order;  // (placement, offload rank)
  for (size_t i = 0; i < todo.size(); ++i) order.emplace_back(primary_->PlacementOf(todo[i].key), i);
  std::sort(order.begin(), order.end());
  for (const auto& [placement, i] : order) {
    const Candidate& c = todo[i];
    BlockMeta meta;
    {
      Result<BlockRef> ref = primary_->Get(c.key);
      if (!ref.ok()) continue;
      meta = ref->meta();
      std::span<const std::byte> d = HostCopy(*primary_, ref->data());
      stored.assign(d.begin(), d.end());
    }
    kernels::BlockShape shape = model_shape;
    if (meta.codec == 0) {  // raw bytes: must be one full KV block of the model
      if (!model_ok || meta.size != model_shape.bytes() || !CodecMayEncode(c.key)) {
        ++skipped;
        continue;
      }
      raw.swap(stored);
    } else {  // a self-describing block: re-encode only from higher precision
      Result<kernels::BlockInfo> info = kernels::InspectBlock(stored);
      if (!info.ok() || !HigherPrecision(*info)) {
        ++skipped;
        continue;
      }
      shape = info->shape;
      raw.resize(shape.bytes());
      if (!kernels::DecodeBlock(stored, raw).ok()) {
        ++skipped;
        continue;
      }
    }
    Result<size_t> max = reencoder_->MaxEncodedSize(shape);
    if (!max.ok()) {
      ++skipped;
      continue;
    }
    enc.resize(*max);
    Result<size_t> n = reencoder_->Encode(shape, raw, enc);
    if (!n.ok() || *n >= meta.size) {
      ++skipped;
      continue;
    }
    PutOptions po;
    po.priority = meta.priority;
    po.codec = codec_id;
    po.logical_size = meta.logical_size;
    // Replace: content-addressed, so readers until the put lands just miss.
    if (!primary_->Erase(c.key).ok()) continue;
    pending.push_back({c.key, po, std::vector<std::byte>(enc.begin(), enc.begin() + *n), meta.size});
    flush(/*evict=*/pending.size() > kMaxPending);
  }
  flush(/*evict=*/true);
  c_.reencoded_blocks.fetch_add(blocks, std::memory_order_relaxed);
  c_.reencode_bytes_saved.fetch_add(saved, std::memory_order_relaxed);
  c_.reencode_skipped.fetch_add(skipped, std::memory_order_relaxed);
  Emit(nlohmann::json{{"event", "reencode"}, {"codec", reencoder_->name()}, {"blocks", blocks},
                      {"bytes_saved", saved}, {"skipped", skipped}}
           .dump());
}

void TieredStore::EnterLevel(int level, double ratio) {
  if (level == 1) {
    std::vector<Candidate> all = CandidatesIn(Tier::kPrimary);
    // Oldest first, regardless of priority: level 1 is about age.
    std::sort(all.begin(), all.end(), [](const Candidate& a, const Candidate& b) { return a.s.last_ns < b.s.last_ns; });
    const size_t n = static_cast<size_t>(static_cast<double>(all.size()) * o_.pressure_evict_fraction + 0.5);
    uint64_t demoted = 0, dropped_n = 0;
    for (size_t i = 0; i < n && i < all.size(); ++i) {
      bool dropped = false;
      if (DemoteFromPrimary(all[i].key, /*allow_drop=*/true, &dropped)) (dropped ? dropped_n : demoted)++;
    }
    c_.demoted_pressure.fetch_add(demoted, std::memory_order_relaxed);
    c_.dropped_pressure.fetch_add(dropped_n, std::memory_order_relaxed);
    Emit(nlohmann::json{{"event", "pressure_evict"}, {"demoted", demoted}, {"dropped", dropped_n}}.dump());
  } else if (level == 2) {
    ReencodePrimary();
  }
  (void)ratio;
}

void TieredStore::RunMaintenance() {
  std::lock_guard<std::mutex> lock(maint_mu_);
  c_.ticks.fetch_add(1, std::memory_order_relaxed);
  std::deque<BlockKey> todo;
  {
    std::lock_guard<std::mutex> q(queue_mu_);
    todo.swap(prefetch_);
  }
  if (pressure_level() < 3)
    for (const BlockKey& k : todo)
      if (!primary_->Exists(k, false) && Promote(k).ok()) c_.prefetch_promoted.fetch_add(1, std::memory_order_relaxed);

  const uint64_t limit = PrimaryLimit();
  const uint64_t used = OffloadPrimary(limit);
  OffloadHost();

  // A node full at its own budget is a normal cache: the store evicts on put
  // (demoting when it can). Pressure counts only while the engine holds the
  // limit below the budget, measured where this tick's offload left it (so a
  // client refilling the tier between ticks does not count as pressure).
  const bool limited = limit < primary_->Stats().capacity_bytes;
  const double ratio = limited && limit ? static_cast<double>(used) / static_cast<double>(limit) : 0;
  const int before = pressure_.level();
  const int after = pressure_.Update(ratio);
  if (after != before) {
    level_.store(after, std::memory_order_release);
    c_.entered[after].fetch_add(1, std::memory_order_relaxed);
    Emit(nlohmann::json{{"event", "pressure_level"}, {"from", before}, {"to", after},
                        {"name", PressureController::LevelName(after)}, {"usage_ratio", ratio},
                        {"limit_bytes", limit}}
             .dump());
    if (after > before) EnterLevel(after, ratio);
  }
}

// ---- Observability -----------------------------------------------------------------

void TieredStore::Emit(std::string json, bool to_sink) {
  nlohmann::json j = nlohmann::json::parse(json);
  j["node"] = o_.node_id;
  j["ts_ns"] = clock_->NowNanos();
  std::string line = j.dump();
  if (to_sink && o_.event_sink) o_.event_sink(line);
  std::lock_guard<std::mutex> lock(events_mu_);
  events_.push_back(std::move(line));
  while (events_.size() > kMaxEvents) events_.pop_front();
}

std::vector<std::string> TieredStore::RecentEvents() const {
  std::lock_guard<std::mutex> lock(events_mu_);
  return {events_.begin(), events_.end()};
}

TierStats TieredStore::Stats() const {
  TierStats s;
  s.pressure_level = pressure_level();
  for (int i = 0; i < 4; ++i) s.pressure_entered[i] = c_.entered[i].load(std::memory_order_relaxed);
  s.primary_limit_bytes = PrimaryLimit();
  s.primary_used_bytes = primary_->Stats().bytes_held;
  s.has_host = host_ != nullptr;
  s.has_ssd = ssd_ != nullptr;
  if (host_) s.host = host_->Stats();
  if (ssd_) s.ssd = ssd_->Stats();
  auto ld = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  s.demoted_on_evict = ld(c_.demoted_on_evict);
  s.demoted_offload = ld(c_.demoted_offload);
  s.demoted_pressure = ld(c_.demoted_pressure);
  s.dropped_pressure = ld(c_.dropped_pressure);
  s.demote_failed = ld(c_.demote_failed);
  s.promotions = ld(c_.promotions);
  s.served_in_place = ld(c_.served_in_place);
  s.host_hits = ld(c_.host_hits);
  s.ssd_hits = ld(c_.ssd_hits);
  s.ssd_corrupt = ld(c_.ssd_corrupt);
  s.prefetch_requested = ld(c_.prefetch_requested);
  s.prefetch_promoted = ld(c_.prefetch_promoted);
  s.offload_runs = ld(c_.offload_runs);
  s.reencoded_blocks = ld(c_.reencoded_blocks);
  s.reencode_bytes_saved = ld(c_.reencode_bytes_saved);
  s.reencode_skipped = ld(c_.reencode_skipped);
  s.busy_refusals = ld(c_.busy_refusals);
  s.stored_below = ld(c_.stored_below);
  s.maintenance_ticks = ld(c_.ticks);
  return s;
}

std::string TieredStore::StatsJson() const {
  const TierStats s = Stats();
  nlohmann::json j = {
      {"pressure_level", s.pressure_level},
      {"pressure_level_name", PressureController::LevelName(s.pressure_level)},
      {"pressure_entered", s.pressure_entered},
      {"primary_limit_bytes", s.primary_limit_bytes},
      {"primary_used_bytes", s.primary_used_bytes},
      {"demoted_on_evict", s.demoted_on_evict},
      {"demoted_offload", s.demoted_offload},
      {"demoted_pressure", s.demoted_pressure},
      {"dropped_pressure", s.dropped_pressure},
      {"demote_failed", s.demote_failed},
      {"promotions", s.promotions},
      {"served_in_place", s.served_in_place},
      {"host_hits", s.host_hits},
      {"ssd_hits", s.ssd_hits},
      {"ssd_corrupt", s.ssd_corrupt},
      {"prefetch_requested", s.prefetch_requested},
      {"prefetch_promoted", s.prefetch_promoted},
      {"offload_runs", s.offload_runs},
      {"reencoded_blocks", s.reencoded_blocks},
      {"reencode_bytes_saved", s.reencode_bytes_saved},
      {"busy_refusals", s.busy_refusals},
      {"stored_below", s.stored_below},
  };
  if (s.has_host)
    j["host"] = {{"capacity_bytes", s.host.capacity_bytes}, {"blocks", s.host.blocks},
                 {"bytes_stored", s.host.bytes_stored}, {"bytes_held", s.host.bytes_held},
                 {"evictions", s.host.evictions}};
  if (s.has_ssd)
    j["ssd"] = {{"capacity_bytes", s.ssd.capacity_bytes}, {"blocks", s.ssd.blocks},
                {"bytes_stored", s.ssd.bytes_stored}, {"reads", s.ssd.reads}, {"writes", s.ssd.writes},
                {"corrupt", s.ssd.corrupt}, {"evictions", s.ssd.evictions}};
  return j.dump();
}

std::string TieredStore::PrometheusText() const {
  const TierStats s = Stats();
  std::string out;
  auto metric = [&](const std::string& name, const char* type, const char* help) {
    out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  };
  auto sample = [&](const std::string& name, const std::string& labels, uint64_t v) {
    out += name + (labels.empty() ? "" : "{" + labels + "}") + " " + std::to_string(v) + "\n";
  };
  metric("kvmesh_pressure_level", "gauge", "Memory pressure level: 0 normal, 1 evict-oldest, 2 reencode, 3 refuse-admissions");
  sample("kvmesh_pressure_level", "", static_cast<uint64_t>(s.pressure_level));
  metric("kvmesh_pressure_level_entered_total", "counter", "Times each pressure level was entered");
  for (int l = 0; l < 4; ++l) sample("kvmesh_pressure_level_entered_total", "level=\"" + std::to_string(l) + "\"", s.pressure_entered[l]);
  metric("kvmesh_tier_bytes", "gauge", "Bytes used per tier (memory tiers: chunk bytes held)");
  sample("kvmesh_tier_bytes", "tier=\"primary\"", s.primary_used_bytes);
  if (s.has_host) sample("kvmesh_tier_bytes", "tier=\"host\"", s.host.bytes_held);
  if (s.has_ssd) sample("kvmesh_tier_bytes", "tier=\"ssd\"", s.ssd.bytes_stored);
  metric("kvmesh_tier_limit_bytes", "gauge", "Current byte limit of the primary tier");
  sample("kvmesh_tier_limit_bytes", "tier=\"primary\"", s.primary_limit_bytes);
  metric("kvmesh_tier_demotions_total", "counter", "Blocks moved to a lower tier, by reason");
  sample("kvmesh_tier_demotions_total", "reason=\"evicted\"", s.demoted_on_evict);
  sample("kvmesh_tier_demotions_total", "reason=\"offload\"", s.demoted_offload);
  sample("kvmesh_tier_demotions_total", "reason=\"pressure\"", s.demoted_pressure);
  metric("kvmesh_tier_dropped_total", "counter", "Blocks deleted by pressure level 1 (no lower tier)");
  sample("kvmesh_tier_dropped_total", "", s.dropped_pressure);
  metric("kvmesh_tier_promotions_total", "counter", "Blocks moved up into the primary tier");
  sample("kvmesh_tier_promotions_total", "", s.promotions);
  metric("kvmesh_tier_hits_total", "counter", "Hits served from a lower tier");
  sample("kvmesh_tier_hits_total", "tier=\"host\"", s.host_hits);
  sample("kvmesh_tier_hits_total", "tier=\"ssd\"", s.ssd_hits);
  metric("kvmesh_tier_ssd_corrupt_total", "counter", "SSD blocks that failed verification (read as misses)");
  sample("kvmesh_tier_ssd_corrupt_total", "", s.ssd_corrupt);
  metric("kvmesh_tier_prefetch_promoted_total", "counter", "Blocks promoted ahead of use by prefetch hints");
  sample("kvmesh_tier_prefetch_promoted_total", "", s.prefetch_promoted);
  metric("kvmesh_pressure_reencoded_blocks_total", "counter", "Blocks re-encoded at lower precision (level 2)");
  sample("kvmesh_pressure_reencoded_blocks_total", "", s.reencoded_blocks);
  metric("kvmesh_pressure_busy_refusals_total", "counter", "Puts refused with Busy at level 3");
  sample("kvmesh_pressure_busy_refusals_total", "", s.busy_refusals);
  metric("kvmesh_tier_stored_below_total", "counter", "Puts stored in the host tier because every primary slot was pinned");
  sample("kvmesh_tier_stored_below_total", "", s.stored_below);
  return out;
}

}  // namespace kvmesh

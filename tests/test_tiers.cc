// Tiers: SSD round trip and corrupt-is-a-miss, demotion and
// promotion, watermark offload idle-first with an injected clock, prefetch,
// and pressure levels 1 -> 2 -> 3 and back.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "kernels/codec.h"
#include "kernels/codec_math.h"
#include "kvmesh/config.h"
#include "shard_node/pressure.h"
#include "shard_node/shard_node.h"
#include "shard_node/ssd_tier.h"
#include "shard_node/tiered_store.h"
#include "tests/test_data.h"

using namespace kvmesh;

namespace {

// A tier stack for a test on a manual clock: no background thread, no level-2
// codec, and a one-stripe host tier of host_bytes.
TieredStoreOptions ManualTiers(ManualClock& clock, uint64_t host_bytes) {
  TieredStoreOptions o;
  o.host_bytes = host_bytes;
  o.host_stripes = 1;
  o.background = false;
  o.clock = &clock;
  o.reencode_codec = "";
  return o;
}

// The tiered store over `primary` with `o`; REQUIREs that it starts.
std::unique_ptr<TieredStore> StartTiers(BlockStore* primary, const TieredStoreOptions& o) {
  auto t = TieredStore::Create(primary, o);
  REQUIRE(t.ok());
  return std::move(*t);
}

using testing::TempDir;

BlockKey Key(uint64_t i) { return BlockKey{0x1000 + i, i * 0x9E3779B97F4A7C15ull + 7}; }

std::vector<std::byte> Payload(uint64_t seed, size_t n) { return testing::RandomBytes(seed, n); }

// A raw fp16 block with values in [-1, 1] (so lower-precision codecs apply).
std::vector<std::byte> Fp16Block(uint64_t seed, size_t bytes) {
  std::vector<std::byte> v(bytes);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  for (size_t i = 0; i + 1 < bytes; i += 2) {
    uint16_t h = kernels::FloatToHalf(d(rng));
    std::memcpy(&v[i], &h, 2);
  }
  return v;
}

// Puts blocks 0..n-1 (Key(i), Payload(i, bytes)) through `ts`, a second apart
// on `clock` when one is given; returns their bytes.
std::vector<std::vector<std::byte>> PutSeries(TieredStore& ts, uint64_t n, size_t bytes, ManualClock* clock) {
  std::vector<std::vector<std::byte>> data;
  for (uint64_t i = 0; i < n; ++i) {
    data.push_back(Payload(i, bytes));
    REQUIRE(ts.Put(Key(i), data.back(), {}).ok());
    if (clock) clock->AdvanceSeconds(1);
  }
  return data;
}

std::unique_ptr<BlockStore> MakeStore(uint64_t slots, uint64_t slot_bytes, Clock* clock,
                                      uint32_t size_classes = kDefaultSizeClasses) {
  StoreOptions so;
  so.capacity_bytes = slots * slot_bytes;
  so.slot_bytes = slot_bytes;
  so.size_classes = size_classes;
  so.stripes = 1;
  so.policy = "lru";
  so.clock = clock;
  auto s = BlockStore::Create(std::move(so));
  REQUIRE(s.ok());
  return std::move(s).value();
}

std::vector<uint8_t> Read(TieredStore& t, const BlockKey& k, size_t n) {
  std::vector<std::byte> buf(n);
  auto r = t.GetInto(k, buf);
  if (!r.ok()) return {};
  std::vector<uint8_t> out(*r);
  std::memcpy(out.data(), buf.data(), *r);
  return out;
}

std::vector<uint8_t> Bytes(const std::vector<std::byte>& v) {
  std::vector<uint8_t> out(v.size());
  std::memcpy(out.data(), v.data(), v.size());
  return out;
}

}  // namespace

TEST_CASE("SSD tier: round trip, and a corrupt or torn block is a miss", "[tiers]") {
  TempDir dir;
  ManualClock clock;
  SsdTierOptions o;
  o.path = dir.path.string();
  o.capacity_bytes = 4 * 8192;
  o.slot_bytes = 4096;  // stride 8192 (header + payload rounded to 4 KiB)
  o.clock = &clock;
  auto t = SsdTier::Create(o);
  REQUIRE(t.ok());
  SsdTier& ssd = **t;
  CHECK(ssd.Stats().slots_total == 4);

  auto a = Payload(1, 3000);
  REQUIRE(ssd.Put(Key(1), a, {3000, 6000, 3, 2}).ok());
  std::vector<std::byte> buf(4096);
  auto m = ssd.Read(Key(1), buf);
  REQUIRE(m.ok());
  CHECK(m->size == 3000);
  CHECK(m->logical_size == 6000);
  CHECK(m->codec == 3);
  CHECK(m->priority == 2);
  CHECK(std::memcmp(buf.data(), a.data(), 3000) == 0);

  // Flip one payload byte on disk: the read is DataLoss, then the block is gone.
  auto off = ssd.PayloadOffsetForTest(Key(1));
  REQUIRE(off.ok());
  int fd = ::open(ssd.file().c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  uint8_t byte = 0;
  REQUIRE(::pread(fd, &byte, 1, static_cast<off_t>(*off + 100)) == 1);
  byte ^= 0x40;
  REQUIRE(::pwrite(fd, &byte, 1, static_cast<off_t>(*off + 100)) == 1);
  CHECK(ssd.Read(Key(1), buf).status().code() == StatusCode::kDataLoss);
  CHECK(ssd.Read(Key(1), buf).status().code() == StatusCode::kNotFound);
  CHECK_FALSE(ssd.Contains(Key(1)));

  // A torn write (header intact, second half of the payload never written).
  auto b = Payload(2, 4096);
  REQUIRE(ssd.Put(Key(2), b, {4096, 0, 0, 1}).ok());
  off = ssd.PayloadOffsetForTest(Key(2));
  REQUIRE(off.ok());
  std::vector<char> zeros(2048, 0);
  REQUIRE(::pwrite(fd, zeros.data(), zeros.size(), static_cast<off_t>(*off + 2048)) == 2048);
  CHECK(ssd.Read(Key(2), buf).status().code() == StatusCode::kDataLoss);
  // A corrupt header.
  REQUIRE(ssd.Put(Key(3), b, {4096, 0, 0, 1}).ok());
  off = ssd.PayloadOffsetForTest(Key(3));
  REQUIRE(::pwrite(fd, zeros.data(), 8, static_cast<off_t>(*off - 48)) == 8);
  CHECK(ssd.Read(Key(3), buf).status().code() == StatusCode::kDataLoss);
  ::close(fd);
  CHECK(ssd.Stats().corrupt == 3);

  // Full: LRU inside the tier.
  for (uint64_t i = 10; i < 14; ++i) REQUIRE(ssd.Put(Key(i), Payload(i, 100), {100, 0, 0, 1}).ok());
  REQUIRE(ssd.Read(Key(10), buf).ok());  // 11 is now the least recently used
  REQUIRE(ssd.Put(Key(14), Payload(14, 100), {100, 0, 0, 1}).ok());
  CHECK_FALSE(ssd.Contains(Key(11)));
  CHECK(ssd.Contains(Key(10)));
  CHECK(ssd.Stats().evictions == 1);
  CHECK(ssd.Put(Key(99), Payload(99, 5000), {5000, 0, 0, 1}).code() == StatusCode::kInvalidArgument);
}

TEST_CASE("Tiers: evicted blocks are demoted device -> host -> SSD and promoted on a hit", "[tiers]") {
  TempDir dir;
  ManualClock clock;
  const uint64_t slot = 4096;
  auto primary = MakeStore(4, slot, &clock);
  TieredStoreOptions o = ManualTiers(clock, 4 * slot);
  o.node_id = "n0";
  o.ssd_bytes = 8 * 8192;
  o.ssd_path = dir.path.string();
  auto t = StartTiers(primary.get(), o);
  TieredStore& ts = *t;

  const std::vector<std::vector<std::byte>> data = PutSeries(ts, 10, slot, &clock);
  // 10 blocks: the 4 newest in the primary tier, the next 4 on host, the 2 oldest on SSD.
  for (uint64_t i = 0; i < 10; ++i) {
    INFO(i);
    Tier want = i >= 6 ? Tier::kPrimary : i >= 2 ? Tier::kHost : Tier::kSsd;
    CHECK(ts.Locate(Key(i)) == want);
  }
  CHECK(ts.Stats().demoted_on_evict == 6 + 2);  // 6 primary evictions, 2 host evictions
  CHECK(ts.Stats().ssd.blocks == 2);

  // A hit on the SSD promotes the block (its bytes intact) into the primary tier.
  CHECK(Read(ts, Key(0), slot) == Bytes(data[0]));
  CHECK(ts.Locate(Key(0)) == Tier::kPrimary);
  CHECK_FALSE(ts.ssd()->Contains(Key(0)));
  // A host hit through Get (a pinned view) promotes as well.
  {
    auto ref = ts.Get(Key(5));
    REQUIRE(ref.ok());
    CHECK(std::memcmp(ref->data().data(), data[5].data(), slot) == 0);
  }
  CHECK(ts.Locate(Key(5)) == Tier::kPrimary);
  const TierStats s = ts.Stats();
  CHECK(s.promotions == 2);
  CHECK(s.ssd_hits == 1);
  CHECK(s.host_hits == 1);
  // Every block is still somewhere, byte for byte.
  for (uint64_t i = 0; i < 10; ++i) CHECK(Read(ts, Key(i), slot) == Bytes(data[i]));
  // Erase removes it from whichever tier holds it.
  REQUIRE(ts.Erase(Key(3)).ok());
  CHECK_FALSE(ts.Exists(Key(3), false));
  CHECK_FALSE(ts.Locate(Key(3)).has_value());
  // Blocks the SSD evicts are gone from every tier (and from the tier map).
  for (uint64_t i = 20; i < 40; ++i) REQUIRE(ts.Put(Key(i), Payload(i, slot), {}).ok());
  CHECK(ts.Stats().ssd.evictions > 0);
  size_t located = 0;
  for (uint64_t i = 0; i < 40; ++i) located += ts.Locate(Key(i)).has_value();
  CHECK(located == 4 + 4 + 8);  // exactly what the three tiers hold
}

TEST_CASE("Tiers: a corrupt SSD block is a miss through the tiered store too", "[tiers]") {
  TempDir dir;
  ManualClock clock;
  auto primary = MakeStore(1, 4096, &clock);
  TieredStoreOptions o;
  o.ssd_bytes = 4 * 8192;
  o.ssd_path = (dir.path / "tier.bin").string();
  o.background = false;
  o.clock = &clock;
  o.reencode_codec = "";
  auto t = StartTiers(primary.get(), o);
  TieredStore& ts = *t;
  REQUIRE(ts.Put(Key(1), Payload(1, 4096), {}).ok());
  REQUIRE(ts.Put(Key(2), Payload(2, 4096), {}).ok());  // demotes 1 straight to SSD
  REQUIRE(ts.Locate(Key(1)) == Tier::kSsd);
  auto off = ts.ssd()->PayloadOffsetForTest(Key(1));
  REQUIRE(off.ok());
  int fd = ::open(ts.ssd()->file().c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  const char junk[4] = {1, 2, 3, 4};
  REQUIRE(::pwrite(fd, junk, 4, static_cast<off_t>(*off)) == 4);
  ::close(fd);
  std::vector<std::byte> buf(4096);
  auto r = ts.GetInto(Key(1), buf);
  CHECK(IsMiss(r.status()));
  CHECK_FALSE(ts.Exists(Key(1), false));
  CHECK(ts.Stats().ssd_corrupt == 1);
}

TEST_CASE("Watermarks: offload starts above 80%, stops at 70%, idle blocks first", "[tiers]") {
  ManualClock clock;
  const uint64_t slot = 4096;
  auto primary = MakeStore(10, slot, &clock);
  TieredStoreOptions o = ManualTiers(clock, 20 * slot);
  o.offload_idle_s = 10;
  auto t = StartTiers(primary.get(), o);
  TieredStore& ts = *t;

  for (uint64_t i = 0; i < 8; ++i) {  // 80%: not above the high watermark
    PutOptions po;
    po.priority = i == 6 ? 0 : 2;
    REQUIRE(ts.Put(Key(i), Payload(i, slot), po).ok());
    clock.AdvanceSeconds(1);
  }
  ts.RunMaintenance();
  CHECK(ts.Stats().demoted_offload == 0);
  PutOptions p2;
  p2.priority = 2;
  REQUIRE(ts.Put(Key(8), Payload(8, slot), p2).ok());  // 90%
  clock.AdvanceSeconds(30);
  // 0, 1 and 2 are the oldest puts but were just read: not idle.
  for (uint64_t i : {0, 1, 2}) REQUIRE(ts.Get(Key(i)).ok());
  ts.RunMaintenance();
  // Down to 70% = 7 blocks: two moved. Idle first; among the idle, the
  // low-priority block 6 before the oldest (3).
  CHECK(ts.Stats().demoted_offload == 2);
  CHECK(ts.Locate(Key(6)) == Tier::kHost);
  CHECK(ts.Locate(Key(3)) == Tier::kHost);
  for (uint64_t i : {0, 1, 2, 4, 5, 7, 8}) CHECK(ts.Locate(Key(i)) == Tier::kPrimary);
  CHECK(primary->Stats().blocks == 7);
  // Between the watermarks nothing moves.
  ts.RunMaintenance();
  CHECK(ts.Stats().demoted_offload == 2);
  CHECK(ts.Stats().offload_runs == 1);
  bool logged = false;
  for (const std::string& e : ts.RecentEvents()) {
    auto j = nlohmann::json::parse(e);
    if (j["event"] == "offload") logged = j["blocks"] == 2 && j["tier"] == "primary";
  }
  CHECK(logged);
}

TEST_CASE("Prefetch promotes ahead of use in the maintenance tick", "[tiers]") {
  ManualClock clock;
  const uint64_t slot = 4096;
  auto primary = MakeStore(4, slot, &clock);
  TieredStoreOptions o = ManualTiers(clock, 8 * slot);
  auto t = StartTiers(primary.get(), o);
  TieredStore& ts = *t;
  for (uint64_t i = 0; i < 5; ++i) {
    REQUIRE(ts.Put(Key(i), Payload(i, slot), {}).ok());
    clock.AdvanceSeconds(1);
  }
  REQUIRE(ts.Locate(Key(0)) == Tier::kHost);
  const BlockKey want[] = {Key(0)};
  ts.Prefetch(want);
  CHECK(ts.Locate(Key(0)) == Tier::kHost);  // nothing on the caller's path
  ts.RunMaintenance();
  // Promoted; the full primary tier then offloads its least recently used
  // blocks (1 went down when 0 came up, then 2 and 3 by the watermark).
  CHECK(ts.Locate(Key(0)) == Tier::kPrimary);
  CHECK(ts.Locate(Key(4)) == Tier::kPrimary);
  for (uint64_t i : {1, 2, 3}) CHECK(ts.Locate(Key(i)) == Tier::kHost);
  CHECK(ts.Stats().prefetch_requested == 1);
  CHECK(ts.Stats().prefetch_promoted == 1);
}

TEST_CASE("At pressure level 3 reads from every tier keep working", "[tiers]") {
  ManualClock clock;
  const uint64_t slot = 4096;
  auto primary = MakeStore(4, slot, &clock);
  TieredStoreOptions o = ManualTiers(clock, 4 * slot);
  auto t = StartTiers(primary.get(), o);
  TieredStore& ts = *t;
  const std::vector<std::vector<std::byte>> data = PutSeries(ts, 8, slot, &clock);
  // 0-3 on host, pinned there by clients: the host tier cannot take offload,
  // so a shrunken limit cannot be relieved and the levels climb to 3.
  for (uint64_t i = 0; i < 4; ++i) {
    REQUIRE(ts.Locate(Key(i)) == Tier::kHost);
    REQUIRE(ts.host()->Pin(Key(i)).ok());
  }
  ts.SetPrimaryLimit(2 * slot);
  for (int i = 0; i < 3; ++i) ts.RunMaintenance();
  REQUIRE(ts.pressure_level() == 3);
  CHECK(ts.Stats().dropped_pressure == 1);  // level 1: the oldest primary block (4) had nowhere to go
  CHECK(ts.Put(Key(50), data[0], {}).code() == StatusCode::kBusy);
  std::vector<std::byte> buf(slot);
  for (uint64_t i : {0, 2, 5, 7}) {  // host blocks (served in place) and primary blocks
    INFO(i);
    auto ref = ts.Get(Key(i));
    REQUIRE(ref.ok());
    CHECK(std::memcmp(ref->data().data(), data[i].data(), slot) == 0);
    auto r = ts.GetInto(Key(i), buf);
    REQUIRE(r.ok());
    CHECK(std::memcmp(buf.data(), data[i].data(), slot) == 0);
  }
  CHECK(ts.Locate(Key(0)) == Tier::kHost);  // not promoted at level 3
  CHECK(ts.Stats().served_in_place >= 4);
}

TEST_CASE("Serving in place: an SSD block read through Get is staged in the host tier", "[tiers]") {
  TempDir dir;
  ManualClock clock;
  const uint64_t slot = 4096;
  auto primary = MakeStore(2, slot, &clock);
  TieredStoreOptions o = ManualTiers(clock, 2 * slot);
  o.ssd_bytes = 8 * 8192;
  o.ssd_path = dir.path.string();
  o.promote_on_hit = false;
  auto t = StartTiers(primary.get(), o);
  TieredStore& ts = *t;
  const std::vector<std::vector<std::byte>> data = PutSeries(ts, 6, slot, nullptr);
  REQUIRE(ts.Locate(Key(0)) == Tier::kSsd);
  {
    auto ref = ts.Get(Key(0));
    REQUIRE(ref.ok());
    CHECK(std::memcmp(ref->data().data(), data[0].data(), slot) == 0);
  }
  CHECK(ts.Locate(Key(0)) == Tier::kHost);
  CHECK(ts.Stats().promotions == 0);
  CHECK(ts.Stats().served_in_place == 1);
  std::vector<std::byte> buf(slot);
  auto r = ts.GetInto(Key(1), buf);  // GetInto goes the same way (staged on host, not promoted)
  REQUIRE(r.ok());
  CHECK(std::memcmp(buf.data(), data[1].data(), slot) == 0);
  CHECK(ts.Locate(Key(1)) == Tier::kHost);
  CHECK(ts.Stats().promotions == 0);
}

TEST_CASE("Pressure controller: one level per tick up, hysteresis, one level per tick down", "[tiers]") {
  PressureController p(PressureOptions{});
  CHECK(p.Update(0.85) == 1);
  CHECK(p.Update(0.90) == 2);
  CHECK(p.Update(0.75) == 2);  // between the watermarks: hold
  CHECK(p.Update(0.81) == 3);
  CHECK(p.Update(2.00) == 3);  // the top
  CHECK(p.Update(0.60) == 2);
  CHECK(p.Update(0.60) == 1);
  CHECK(p.Update(0.60) == 0);
  CHECK(p.Update(0.10) == 0);
  CHECK(p.entered() == std::array<uint64_t, 4>{1, 2, 2, 1});
  PressureOptions off;
  off.enabled = false;
  PressureController q(off);
  CHECK(q.Update(5.0) == 0);
}

TEST_CASE("A node under pressure walks through levels 1, 2 and 3 and back", "[tiers]") {
  ManualClock clock;
  ModelSpec model;
  model.model_id = "tiny";
  model.num_layers = 2;
  model.num_kv_heads = 2;
  model.head_dim = 64;
  model.block_tokens = 16;
  model.dtype = DType::kFp16;
  const uint64_t block = model.FullBlockBytes();  // 16 KiB
  REQUIRE(block == 16384);
  auto primary = MakeStore(16, block, &clock);
  TieredStoreOptions o;
  o.node_id = "n0";
  o.model = model;
  o.background = false;
  o.clock = &clock;
  std::vector<std::string> sink;
  std::mutex sink_mu;
  o.event_sink = [&](const std::string& e) {
    std::lock_guard<std::mutex> l(sink_mu);
    sink.push_back(e);
  };
  auto t = StartTiers(primary.get(), o);
  TieredStore& ts = *t;

  std::vector<std::vector<std::byte>> raw;
  for (uint64_t i = 0; i < 16; ++i) {
    raw.push_back(Fp16Block(i, block));
    REQUIRE(ts.Put(Key(i), raw.back(), {}).ok());
    clock.AdvanceSeconds(1);
  }
  ts.RunMaintenance();
  CHECK(ts.pressure_level() == 0);  // full at its own budget: a normal cache, no pressure

  // The engine takes half of the memory back: 16 blocks against a limit of 8.
  ts.SetPrimaryLimit(8 * block);
  ts.RunMaintenance();
  CHECK(ts.pressure_level() == 1);  // level 1: the oldest 25% (4 blocks) leave
  CHECK(ts.Stats().dropped_pressure == 4);
  for (uint64_t i = 0; i < 4; ++i) CHECK_FALSE(ts.Exists(Key(i), false));
  CHECK(primary->Stats().blocks == 12);

  ts.RunMaintenance();              // 12 raw blocks = 150% of the limit
  CHECK(ts.pressure_level() == 2);  // level 2: re-encode at int8
  TierStats s = ts.Stats();
  CHECK(s.reencoded_blocks == 12);
  CHECK(s.reencode_bytes_saved > 12 * block * 4 / 10);
  CHECK(primary->Stats().bytes_stored < 12 * block * 6 / 10);
  {
    // Re-encoded blocks are self-describing and decode close to the original.
    auto ref = ts.Get(Key(10));
    REQUIRE(ref.ok());
    CHECK(ref->meta().logical_size == block);
    CHECK(ref->meta().codec != 0);
    auto info = kernels::InspectBlock(ref->data());
    REQUIRE(info.ok());
    REQUIRE(info->segments.size() == 1);
    CHECK(info->segments[0].spec.kind == kernels::kCodecInt8);
    std::vector<std::byte> back(block);
    REQUIRE(kernels::DecodeBlock(ref->data(), back).ok());
    double worst = 0;
    for (size_t i = 0; i < block; i += 2) {
      uint16_t a, b;
      std::memcpy(&a, &raw[10][i], 2);
      std::memcpy(&b, &back[i], 2);
      worst = std::max(worst, static_cast<double>(std::fabs(kernels::HalfToFloat(a) - kernels::HalfToFloat(b))));
    }
    CHECK(worst < 0.02);
  }

  const uint64_t used = ts.Stats().primary_used_bytes;  // chunk bytes held
  ts.SetPrimaryLimit(static_cast<uint64_t>(used / 0.75));  // between the watermarks: hold
  ts.RunMaintenance();
  CHECK(ts.pressure_level() == 2);
  ts.SetPrimaryLimit(used / 2);     // the engine needs even more
  ts.RunMaintenance();
  CHECK(ts.pressure_level() == 3);  // level 3: admissions refused, reads work
  CHECK(ts.Put(Key(100), raw[0], {}).code() == StatusCode::kBusy);
  CHECK(ts.Get(Key(12)).ok());
  CHECK(ts.Stats().busy_refusals == 1);

  ts.SetPrimaryLimit(0);            // memory is back: step down one level per tick
  ts.RunMaintenance();
  CHECK(ts.pressure_level() == 2);
  CHECK(ts.Put(Key(100), raw[0], {}).ok());  // admissions resume below level 3
  ts.RunMaintenance();
  CHECK(ts.pressure_level() == 1);
  ts.RunMaintenance();
  CHECK(ts.pressure_level() == 0);

  s = ts.Stats();
  CHECK(s.pressure_entered == std::array<uint64_t, 4>{1, 2, 2, 1});
  std::vector<std::pair<int, int>> steps;
  for (const std::string& e : sink) {
    auto j = nlohmann::json::parse(e);
    CHECK(j["node"] == "n0");
    CHECK(j.contains("ts_ns"));
    if (j["event"] == "pressure_level") steps.emplace_back(j["from"].get<int>(), j["to"].get<int>());
  }
  CHECK(steps == std::vector<std::pair<int, int>>{{0, 1}, {1, 2}, {2, 3}, {3, 2}, {2, 1}, {1, 0}});
  auto stats = nlohmann::json::parse(ts.StatsJson());
  CHECK(stats["pressure_level"] == 0);
  CHECK(stats["pressure_entered"][3] == 1);
  const std::string prom = ts.PrometheusText();
  CHECK(prom.find("kvmesh_pressure_level 0\n") != std::string::npos);
  CHECK(prom.find("kvmesh_pressure_level_entered_total{level=\"3\"} 1\n") != std::string::npos);
  CHECK(prom.find("kvmesh_pressure_busy_refusals_total 1\n") != std::string::npos);
  CHECK(prom.find("kvmesh_pressure_reencoded_blocks_total 12\n") != std::string::npos);
}

namespace {
std::string TieredConfig(const std::string& ssd_dir, const std::string& tiers_extra = "") {
  // Blocks of 2x2x16x64 fp16 = 16 KiB; device 8 blocks, host 8, SSD 16 (+ headers).
  return R"({
    "model": {"model_id": "m", "num_layers": 2, "num_kv_heads": 2, "head_dim": 64, "dtype": "fp16",
              "block_tokens": 16},
    "nodes": [{"id": "n0", "memory": {"device": "128KiB", "host": "128KiB", "ssd": "640KiB",
                                     "ssd_path": ")" +
         ssd_dir + R"("}}],
    "store": {"stripes": 1},
    "eviction": {"policy": "lru-priority",
                 "tiers": {"high_watermark": 0.8, "low_watermark": 0.7, "offload_idle_s": 10,
                           "interval_ms": 5)" +
         tiers_extra + R"(},
                 "pressure": {"enabled": true, "reencode_codec": "int8"}}
  })";
}
}  // namespace

TEST_CASE("Config: eviction.tiers and eviction.pressure are parsed strictly", "[tiers]") {
  auto c = ParseConfig(TieredConfig("/tmp"));
  REQUIRE(c.ok());
  CHECK(c->eviction.tiers.high_watermark == 0.8);
  CHECK(c->eviction.tiers.interval_ms == 5);
  CHECK(c->eviction.pressure.reencode_codec == "int8");
  CHECK(c->eviction.pressure.max_level == 3);
  auto bad = ParseConfig(TieredConfig("/tmp", R"(, "low_watermark": 0.9)"));
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("$.eviction.tiers.low_watermark") != std::string::npos);
  bad = ParseConfig(TieredConfig("/tmp", R"(, "high_mark": 0.9)"));
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("$.eviction.tiers.high_mark") != std::string::npos);
  bad = ParseConfig(TieredConfig("/tmp", R"(, "offload_idle_s": "ten")"));
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("$.eviction.tiers.offload_idle_s") != std::string::npos);
}

TEST_CASE("A shard node with tiers demotes, promotes and offloads in the background", "[tiers]") {
  TempDir dir;
  auto c = ParseConfig(TieredConfig(dir.path.string()));
  REQUIRE(c.ok());
  auto node = ShardNode::Create(*c, "n0");
  REQUIRE(node.ok());
  ShardNode& n = **node;
  REQUIRE(n.tiers() != nullptr);
  const size_t block = c->model.FullBlockBytes();
  std::vector<std::vector<std::byte>> raw;
  for (uint64_t i = 0; i < 20; ++i) {
    raw.push_back(Fp16Block(100 + i, block));
    PutOptions po;
    REQUIRE(n.Put(Key(i), raw.back(), po).ok());
  }
  // The background worker keeps the device tier at or under the high watermark.
  for (int i = 0; i < 400 && n.tiers()->Stats().primary_used_bytes > 0.8 * 8 * block; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  TierStats s = n.tiers()->Stats();
  CHECK(s.primary_used_bytes <= 0.8 * 8 * block);
  CHECK(s.demoted_on_evict + s.demoted_offload >= 12);
  CHECK(s.ssd.blocks > 0);
  // Every block reads back intact from whichever tier holds it.
  std::vector<std::byte> buf(block);
  for (uint64_t i = 0; i < 20; ++i) {
    INFO(i);
    auto r = n.GetInto(Key(i), buf);
    REQUIRE(r.ok());
    CHECK(*r == block);
    CHECK(std::memcmp(buf.data(), raw[i].data(), block) == 0);
  }
  CHECK(n.tiers()->Stats().promotions > 0);
  auto j = nlohmann::json::parse(n.StatsJson());
  REQUIRE(j.contains("tiers"));
  CHECK(j["tiers"]["pressure_level"] == 0);
  CHECK(j["tiers"]["ssd"]["blocks"].get<uint64_t>() > 0);
}

TEST_CASE("Tiers under concurrent puts, gets and erases with the background worker", "[tiers]") {
  TempDir dir;
  const uint64_t slot = 4096;
  auto primary = MakeStore(16, slot, nullptr);
  TieredStoreOptions o;
  o.host_bytes = 16 * slot;
  o.host_stripes = 1;
  o.ssd_bytes = 32 * 8192;
  o.ssd_path = dir.path.string();
  o.interval_ms = 1;
  o.offload_idle_s = 0;
  o.reencode_codec = "";
  auto t = StartTiers(primary.get(), o);
  TieredStore& ts = *t;
  std::atomic<uint64_t> wrong{0}, reads{0};
  auto worker = [&](uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<std::byte> buf(slot);
    for (int i = 0; i < 3000; ++i) {
      const uint64_t k = rng() % 96;
      const int op = static_cast<int>(rng() % 10);
      if (op < 4) {
        (void)ts.Put(Key(k), Payload(k, slot), {});
      } else if (op < 9) {
        auto r = ts.GetInto(Key(k), buf);
        if (r.ok()) {
          reads.fetch_add(1);
          if (*r != slot || std::memcmp(buf.data(), Payload(k, slot).data(), slot) != 0) wrong.fetch_add(1);
        }
      } else {
        (void)ts.Erase(Key(k));
      }
    }
  };
  std::vector<std::thread> threads;
  for (uint64_t s = 0; s < 4; ++s) threads.emplace_back(worker, s + 1);
  for (auto& th : threads) th.join();
  CHECK(wrong.load() == 0);
  CHECK(reads.load() > 1000);
  const TierStats s = ts.Stats();
  CHECK(s.maintenance_ticks > 0);
  CHECK(s.ssd.corrupt == 0);
}

TEST_CASE("A GPU node keeps its device budget in a CUDA pool, or falls back to host memory", "[tiers]") {
  TempDir dir;
  std::string cfg = TieredConfig(dir.path.string());
  const std::string mem = R"("memory": {"device")";
  cfg.replace(cfg.find(mem), mem.size(), R"("gpu": 0, "memory": {"device")");
  auto c = ParseConfig(cfg);
  REQUIRE(c.ok());
  REQUIRE(c->nodes[0].gpu == 0);
  auto node = ShardNode::Create(*c, "n0");
  REQUIRE(node.ok());
  ShardNode& n = **node;
  const std::string backend(n.store().backend().name());
  INFO("primary backend: " << backend);
  CHECK((backend == "cuda-device" || backend == "host"));
  // Either way blocks round-trip through the primary tier and through
  // demotion (which copies out of device memory when it is device memory).
  const size_t block = c->model.FullBlockBytes();
  std::vector<std::vector<std::byte>> raw;
  for (uint64_t i = 0; i < 12; ++i) {
    raw.push_back(Fp16Block(500 + i, block));
    REQUIRE(n.Put(Key(i), raw.back(), {}).ok());
  }
  std::vector<std::byte> buf(block);
  for (uint64_t i = 0; i < 12; ++i) {
    INFO(i);
    auto r = n.GetInto(Key(i), buf);
    REQUIRE(r.ok());
    CHECK(std::memcmp(buf.data(), raw[i].data(), block) == 0);
  }
}

TEST_CASE("Pressure level 2 re-encodes fp16-codec blocks at int8 and leaves int8 blocks alone", "[tiers]") {
  ManualClock clock;
  ModelSpec model;
  model.model_id = "tiny";
  model.num_layers = 2;
  model.num_kv_heads = 2;
  model.head_dim = 64;
  model.block_tokens = 16;
  const kernels::BlockShape shape = kernels::BlockShape::FromLayout(BlockLayout::Full(model));
  auto make_codec = [](const char* spec) {
    kernels::CodecPolicy p;
    p.base = *kernels::ParseCodecSpec(spec);
    p.threads = 1;
    return std::move(kernels::MakeCodec(p)).value();
  };
  auto fp16 = make_codec("fp16");
  auto int8 = make_codec("int8");
  auto primary = MakeStore(16, model.FullBlockBytes() + 4096, &clock);
  TieredStoreOptions o;
  o.model = model;
  o.background = false;
  o.clock = &clock;
  auto t = StartTiers(primary.get(), o);
  TieredStore& ts = *t;
  std::vector<std::vector<std::byte>> raw;
  for (uint64_t i = 0; i < 8; ++i) {
    raw.push_back(Fp16Block(900 + i, shape.bytes()));
    auto& codec = i < 6 ? fp16 : int8;  // 6 blocks at fp16, 2 already at int8
    std::vector<std::byte> enc(*codec->MaxEncodedSize(shape));
    auto n = codec->Encode(shape, raw.back(), enc);
    REQUIRE(n.ok());
    PutOptions po;
    po.codec = kernels::PrimaryCodecId(codec->policy());
    po.logical_size = static_cast<uint32_t>(shape.bytes());
    REQUIRE(ts.Put(Key(i), std::span<const std::byte>(enc.data(), *n), po).ok());
    clock.AdvanceSeconds(1);
  }
  const uint64_t before = primary->Stats().bytes_stored;
  ts.SetPrimaryLimit(before / 2);
  ts.RunMaintenance();  // level 1: the oldest 2 blocks (fp16) leave
  ts.RunMaintenance();  // level 2
  REQUIRE(ts.pressure_level() == 2);
  const TierStats s = ts.Stats();
  CHECK(s.reencoded_blocks == 4);
  CHECK(s.reencode_skipped == 2);
  std::vector<std::byte> back(shape.bytes());
  for (uint64_t i = 2; i < 8; ++i) {
    INFO(i);
    auto r = ts.GetInto(Key(i), back);  // decoded to raw fp16
    REQUIRE(r.ok());
    CHECK(*r == shape.bytes());
    double worst = 0;
    for (size_t b = 0; b < back.size(); b += 2) {
      uint16_t x, y;
      std::memcpy(&x, &raw[i][b], 2);
      std::memcpy(&y, &back[b], 2);
      worst = std::max(worst, static_cast<double>(std::fabs(kernels::HalfToFloat(x) - kernels::HalfToFloat(y))));
    }
    CHECK(worst < 0.02);
    auto ref = ts.Get(Key(i));
    REQUIRE(ref.ok());
    auto info = kernels::InspectBlock(ref->data());
    REQUIRE(info.ok());
    CHECK(info->segments[0].spec.kind == kernels::kCodecInt8);
  }
}

TEST_CASE("SSD tier: a file named in a directory is per node and removed on close", "[tiers]") {
  TempDir dir;
  SsdTierOptions o;
  o.path = dir.path.string();
  o.name = "node/7";
  o.capacity_bytes = 2 * 8192;
  o.slot_bytes = 4096;
  std::string file;
  {
    auto t = SsdTier::Create(o);
    REQUIRE(t.ok());
    file = (*t)->file();
    CHECK(file == (dir.path / "kvmesh-node_7.ssd").string());
    CHECK(std::filesystem::exists(file));
  }
  CHECK_FALSE(std::filesystem::exists(file));
  // A file path given explicitly is the operator's: kept.
  o.path = (dir.path / "mine.ssd").string();
  { REQUIRE(SsdTier::Create(o).ok()); }
  CHECK(std::filesystem::exists(o.path));
}

TEST_CASE("Tiers: with every primary slot pinned, a Put is stored in the host tier instead of refused", "[tiers]") {
  ManualClock clock;
  const uint64_t slot = 4096;
  auto primary = MakeStore(4, slot, &clock);
  TieredStoreOptions o = ManualTiers(clock, 8 * slot);
  o.node_id = "n0";
  auto t = StartTiers(primary.get(), o);
  TieredStore& ts = *t;
  std::vector<BlockRef> pins;  // a running batch pins the whole primary tier
  for (uint64_t i = 0; i < 4; ++i) {
    REQUIRE(ts.Put(Key(i), Payload(i, slot), {}).ok());
    pins.push_back(ts.Get(Key(i)).value());
  }
  auto extra = Payload(100, slot);
  REQUIRE(ts.Put(Key(100), extra, {}).ok());  // before: ResourceExhausted, the block lost
  CHECK(ts.Locate(Key(100)) == Tier::kHost);
  CHECK(ts.Stats().stored_below == 1);
  CHECK(ts.Exists(Key(100), false));
  CHECK(Read(ts, Key(100), slot) == Bytes(extra));
  // A pinned view works too (served in place: the primary has no free slot).
  {
    Result<BlockRef> r = ts.Get(Key(100));
    REQUIRE(r.ok());
    CHECK(std::memcmp(r->data().data(), extra.data(), slot) == 0);
  }
  // Once the batch lets go, a Get promotes it back into the primary tier.
  pins.clear();
  REQUIRE(ts.Get(Key(100)).ok());
  CHECK(ts.Locate(Key(100)) == Tier::kPrimary);
  CHECK(Read(ts, Key(100), slot) == Bytes(extra));
  // Without a host tier the refusal stands (nothing below to hold it).
  auto lone = MakeStore(1, slot, &clock);
  TieredStoreOptions no_host = o;
  no_host.host_bytes = 0;
  auto t2 = TieredStore::Create(lone.get(), no_host).value();
  REQUIRE(t2->Put(Key(1), Payload(1, slot), {}).ok());
  BlockRef pin = t2->Get(Key(1)).value();
  CHECK(t2->Put(Key(2), Payload(2, slot), {}).code() == StatusCode::kResourceExhausted);
}

namespace {
ModelSpec TinyModel() {  // full blocks of 2x2x16x64 fp16 = 16 KiB
  ModelSpec model;
  model.model_id = "tiny";
  model.num_layers = 2;
  model.num_kv_heads = 2;
  model.head_dim = 64;
  model.block_tokens = 16;
  model.dtype = DType::kFp16;
  return model;
}

struct LevelTwoRun {
  uint64_t held_before = 0, held_after = 0, stored_after = 0;
  uint64_t reencoded = 0, evictions_during = 0;
  uint64_t accepted_without_evicting = 0;  // raw puts after level 2 before the first eviction
};

// 16 raw blocks fill a 16-slot primary tier (no lower tier); the engine takes
// memory back so that level 1 evicts `level1_fraction` and level 2 re-encodes
// the rest at int8; then memory comes back and raw blocks are put until the
// store evicts.
// Tiers over `primary` for TinyModel whose maintenance the test runs itself.
std::unique_ptr<TieredStore> ManualTiers(BlockStore* primary, ManualClock* clock,
                                         double level1_fraction = TieredStoreOptions{}.pressure_evict_fraction) {
  TieredStoreOptions o;
  o.node_id = "n0";
  o.model = TinyModel();
  o.background = false;
  o.clock = clock;
  o.pressure_evict_fraction = level1_fraction;
  return StartTiers(primary, o);
}

LevelTwoRun RunLevelTwo(uint32_t size_classes, double level1_fraction) {
  ManualClock clock;
  const uint64_t block = TinyModel().FullBlockBytes();
  auto primary = MakeStore(16, block, &clock, size_classes);
  auto tiers = ManualTiers(primary.get(), &clock, level1_fraction);
  TieredStore& ts = *tiers;
  std::vector<std::vector<std::byte>> raw;
  for (uint64_t i = 0; i < 16; ++i) {
    raw.push_back(Fp16Block(i, block));
    REQUIRE(ts.Put(Key(i), raw.back(), {}).ok());
    clock.AdvanceSeconds(1);
  }
  REQUIRE(primary->Stats().evictions == 0);
  ts.SetPrimaryLimit(8 * block);
  ts.RunMaintenance();
  REQUIRE(ts.pressure_level() == 1);
  LevelTwoRun r;
  r.held_before = ts.Stats().primary_used_bytes;
  const uint64_t evictions0 = primary->Stats().evictions;
  ts.RunMaintenance();
  REQUIRE(ts.pressure_level() == 2);
  const StoreStats after = primary->Stats();
  r.held_after = ts.Stats().primary_used_bytes;
  r.stored_after = after.bytes_stored;
  r.reencoded = ts.Stats().reencoded_blocks;
  r.evictions_during = after.evictions - evictions0;
  // Every surviving block still decodes close to what was put.
  std::vector<std::byte> back(block);
  for (uint64_t i = 0; i < 16; ++i) {
    auto n = ts.GetInto(Key(i), back);
    if (!n.ok()) continue;
    REQUIRE(*n == block);
    double worst = 0;
    for (size_t b = 0; b < block; b += 2) {
      uint16_t x, y;
      std::memcpy(&x, &raw[i][b], 2);
      std::memcpy(&y, &back[b], 2);
      worst = std::max(worst, static_cast<double>(std::fabs(kernels::HalfToFloat(x) - kernels::HalfToFloat(y))));
    }
    CHECK(worst < 0.02);
  }
  ts.SetPrimaryLimit(0);  // memory is back; pressure steps down, admissions continue
  for (uint64_t i = 100; i < 140; ++i) {
    REQUIRE(ts.Put(Key(i), Fp16Block(i, block), {}).ok());
    if (primary->Stats().evictions != after.evictions) break;
    ++r.accepted_without_evicting;
  }
  return r;
}
}  // namespace

TEST_CASE("Pressure level 2 frees capacity: re-encoded blocks hold smaller chunks", "[tiers][slab]") {
  const uint64_t block = TinyModel().FullBlockBytes();
  const LevelTwoRun slab = RunLevelTwo(kDefaultSizeClasses, 0.25);
  const LevelTwoRun fixed = RunLevelTwo(1, 0.25);
  INFO("slab held " << slab.held_before << " -> " << slab.held_after << ", then " << slab.accepted_without_evicting
                    << " raw puts without evicting; fixed held " << fixed.held_before << " -> " << fixed.held_after
                    << ", then " << fixed.accepted_without_evicting);
  // Both re-encode the 12 blocks level 1 left, to about half their bytes.
  CHECK(slab.reencoded == 12);
  CHECK(fixed.reencoded == 12);
  CHECK(slab.stored_after < 12 * block * 6 / 10);
  CHECK(fixed.stored_after == slab.stored_after);
  // Fixed slots: every re-encoded block still holds a whole slot.
  CHECK(fixed.held_before == 12 * block);
  CHECK(fixed.held_after == 12 * block);
  // Size classes: each holds a 4/7-slot chunk (int8 of fp16 is 0.51 of a slot).
  CHECK(slab.held_before == 12 * block);
  CHECK(slab.held_after == 12 * 9216);
  CHECK(slab.evictions_during == 0);
  // The memory comes back as capacity: 2 of 4 pages are free, 8 raw blocks fit
  // where the fixed store takes only the 4 slots level 1 freed.
  CHECK(fixed.accepted_without_evicting == 4);
  CHECK(slab.accepted_without_evicting == 8);
}

TEST_CASE("Pressure level 2 leaves grouped keys' blocks (RESP values) as they are, whatever their size", "[tiers]") {
  // A RESP value's part is opaque bytes: one the size of a raw KV block must
  // not be re-encoded as if it were one (int8 would change its bytes).
  ManualClock clock;
  const uint64_t block = TinyModel().FullBlockBytes();
  auto primary = MakeStore(16, block, &clock);
  auto tiers = ManualTiers(primary.get(), &clock);
  TieredStore& ts = *tiers;
  std::vector<std::vector<std::byte>> raw;
  auto grouped = [](uint64_t i) { return GroupedKey(0x77 + i, i, /*co_evict=*/false); };
  for (uint64_t i = 0; i < 16; ++i) {
    raw.push_back(Fp16Block(i, block));
    REQUIRE(ts.Put(grouped(i), raw.back(), {}).ok());
    clock.AdvanceSeconds(1);
  }
  ts.SetPrimaryLimit(8 * block);
  ts.RunMaintenance();  // level 1
  ts.RunMaintenance();  // level 2
  REQUIRE(ts.pressure_level() == 2);
  CHECK(ts.Stats().reencoded_blocks == 0);
  std::vector<std::byte> back(block);
  size_t survivors = 0;
  for (uint64_t i = 0; i < 16; ++i) {
    auto n = ts.GetInto(grouped(i), back);
    if (!n.ok()) continue;
    ++survivors;
    CHECK(*n == block);
    CHECK(back == raw[i]);
  }
  CHECK(survivors > 0);
}

TEST_CASE("Pressure level 2 on a full store re-encodes page by page without evicting", "[tiers][slab]") {
  // Level 1 evicts a single block, so no page is free when level 2 starts:
  // each encoded block waits until its page's other blocks are erased.
  const uint64_t block = TinyModel().FullBlockBytes();
  const LevelTwoRun r = RunLevelTwo(kDefaultSizeClasses, 1.0 / 16);
  CHECK(r.held_before == 15 * block);
  CHECK(r.reencoded == 15);
  CHECK(r.evictions_during == 0);
  CHECK(r.held_after == 15 * 9216);
  // 15 chunks of 7 per page use 3 pages; the 4th is free for 4 raw blocks
  // (fixed slots: the 1 slot level 1 freed).
  CHECK(r.accepted_without_evicting == 4);
  CHECK(RunLevelTwo(1, 1.0 / 16).accepted_without_evicting == 1);
}

TEST_CASE("Config: $.store.size_classes reaches the node's stores, bad values name the path", "[tiers][slab]") {
  TempDir dir;
  std::string cfg = TieredConfig(dir.path.string());
  const std::string stripes = R"("store": {"stripes": 1})";
  auto with = [&](const std::string& store) {
    std::string c = cfg;
    c.replace(c.find(stripes), stripes.size(), store);
    return ParseConfig(c);
  };
  auto def = with(R"("store": {"stripes": 1})");
  REQUIRE(def.ok());
  CHECK(def->store.size_classes == kDefaultSizeClasses);
  auto one = with(R"("store": {"stripes": 1, "size_classes": 1})");
  REQUIRE(one.ok());
  auto node = ShardNode::Create(*one, "n0");
  REQUIRE(node.ok());
  CHECK((*node)->store().size_classes() == 1);
  CHECK((*node)->tiers()->host()->size_classes() == 1);
  auto multi = ShardNode::Create(*def, "n0");
  REQUIRE(multi.ok());
  CHECK((*multi)->store().size_classes() == 3);  // 16 KiB slots: 16, 9, 4.5 KiB (4 KiB minimum chunk)
  for (const char* bad : {R"("store": {"size_classes": 0})", R"("store": {"size_classes": 9})",
                          R"("store": {"size_classes": "four"})"}) {
    INFO(bad);
    auto r = with(bad);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().message().find("$.store.size_classes") != std::string::npos);
  }
}

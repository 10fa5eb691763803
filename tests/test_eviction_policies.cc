// Eviction order of each policy on hand-built sequences.
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <set>

#include "eviction/eviction_policy.h"
#include "eviction/retention.h"
#include "tests/eviction_contract.h"

using namespace kvmesh;

namespace {

using testing::Drain;
using testing::MakePolicy;


// testing::OwnerAccess: true on a hit; appends evicted ids to *evicted.
bool Access(EvictionPolicy& p, EntryId id, size_t capacity, std::vector<EntryId>* evicted = nullptr,
            AccessInfo info = {}) {
  return testing::OwnerAccess(p, id, capacity, info, evicted);
}

AccessInfo Hint(Priority pr, float score) {
  AccessInfo i;
  i.priority = pr;
  i.score = score;
  return i;
}

}  // namespace

TEST_CASE("LFU-DA evicts the least frequent, and dynamic aging lets newcomers catch up", "[eviction]") {
  auto p = MakePolicy("lfu", 0);
  for (EntryId i = 1; i <= 3; ++i) p->Insert(i, {});
  p->Touch(1, {});
  p->Touch(1, {});  // key(1) = 3
  p->Touch(2, {});  // key(2) = 2, key(3) = 1
  REQUIRE(*p->Victim() == 3);
  p->Remove(3, RemoveReason::kEvicted);  // the cache ages to L = 1
  p->Insert(4, {});                      // key(4) = 1 + L = 2, newer than 2
  REQUIRE(*p->Victim() == 2);            // tie on key 2: the older one goes
  p->Remove(2, RemoveReason::kEvicted);  // L = 2
  p->Insert(5, {});                      // key(5) = 3: a one-hit newcomer now ties with 1's three hits
  CHECK(Drain(*p) == std::vector<EntryId>{4, 1, 5});
}

TEST_CASE("LFU-DA: erasing does not age the cache", "[eviction]") {
  auto p = MakePolicy("lfu", 0);
  p->Insert(1, {});
  p->Touch(1, {});  // key 2
  p->Insert(2, {});
  p->Remove(2, RemoveReason::kErased);  // L stays 0
  p->Insert(3, {});                     // key 1
  CHECK(*p->Victim() == 3);
}

TEST_CASE("ARC keeps re-used entries through a scan that flushes LRU", "[eviction]") {
  for (const char* name : {"arc", "lru"}) {
    INFO(name);
    auto p = MakePolicy(name, 3);
    for (EntryId id : {1, 1, 2, 2}) Access(*p, id, 3);  // 1 and 2 are used twice: T2
    for (EntryId id = 100; id < 110; ++id) Access(*p, id, 3);
    const bool kept = p->Contains(1) && p->Contains(2);
    CHECK(kept == (std::string(name) == "arc"));
  }
}

TEST_CASE("ARC follows REPLACE on a hand-traced sequence with ghost hits", "[eviction]") {
  // c = 2. Traced by hand from Megiddo & Modha's pseudo-code:
  // 1 2 1 -> T1=[2] T2=[1]; 3 evicts 2 (T1 over p=0) -> B1=[2];
  // 2 is a B1 ghost: p=1, T1 no longer over p, so 1 leaves T2 -> B2=[1], 2 enters T2;
  // 1 is a B2 ghost: p=0, 3 leaves T1 -> B1=[3], 1 enters T2;
  // 4 is new: T1 is empty, so T2's LRU (2) goes.
  auto p = MakePolicy("arc", 2);
  std::vector<EntryId> evicted;
  std::vector<bool> hits;
  for (EntryId id : {1, 2, 1, 3, 2, 1, 4}) hits.push_back(Access(*p, id, 2, &evicted));
  CHECK(hits == std::vector<bool>{false, false, true, false, false, false, false});
  CHECK(evicted == std::vector<EntryId>{2, 1, 3, 2});
  CHECK(p->Contains(1));
  CHECK(p->Contains(4));
  // 3 comes back from B1: p grows to 1; T1 (=[4]) is not over p and 3 is not a
  // B2 ghost, so T2's LRU (1) is the victim.
  evicted.clear();
  Access(*p, 3, 2, &evicted);
  CHECK(evicted == std::vector<EntryId>{1});
}

TEST_CASE("ARC and S3-FIFO remember ghosts by key hash, not by reused slot ids", "[eviction]") {
  for (const char* name : {"arc", "s3-fifo"}) {
    INFO(name);
    auto p = MakePolicy(name, 10);
    AccessInfo a;
    a.key_hash = 0xAAAA;
    AccessInfo b;
    b.key_hash = 0xBBBB;
    p->Insert(7, a);  // slot 7 holds key A
    p->Remove(7, RemoveReason::kEvicted);
    p->Insert(7, b);  // slot 7 now holds key B: not a ghost hit
    p->Insert(8, {});
    // If B had been taken for A's ghost it would sit in the protected list
    // (T2 / M) and 8 would be evicted first.
    CHECK(*p->Victim() == 7);
  }
}

TEST_CASE("S3-FIFO: one-hit wonders leave through the small queue, reused entries stay", "[eviction]") {
  auto p = MakePolicy("s3-fifo", 10);
  for (EntryId id = 1; id <= 9; ++id) Access(*p, id, 10);
  for (EntryId id = 1; id <= 9; ++id) Access(*p, id, 10);  // each hit once: counter 1
  std::vector<EntryId> evicted;
  for (EntryId id = 100; id < 106; ++id) Access(*p, id, 10, &evicted);
  for (EntryId id = 1; id <= 9; ++id) CHECK(p->Contains(id));
  // The scan entries evict each other in FIFO order through S.
  CHECK(evicted == std::vector<EntryId>{100, 101, 102, 103, 104});
  // 100 is a ghost now: re-admitted, it goes straight to M (evicting 105 from S)...
  evicted.clear();
  Access(*p, 100, 10, &evicted);
  CHECK(evicted == std::vector<EntryId>{105});
  // ...so with S empty the next victim is M's oldest (1), not 100.
  evicted.clear();
  Access(*p, 200, 10, &evicted);
  CHECK(evicted == std::vector<EntryId>{1});
  CHECK(p->Contains(100));
}

TEST_CASE("S3-FIFO: main-queue entries get one more round per hit", "[eviction]") {
  auto p = MakePolicy("s3-fifo", 10);
  for (EntryId id = 1; id <= 10; ++id) Access(*p, id, 10);
  for (EntryId id = 1; id <= 10; ++id) p->Touch(id, {});
  // First victim search moves all ten (hit once) to M with counter 0, M's oldest is 1.
  CHECK(*p->Victim() == 1);
  CHECK(*p->Victim() == 1);  // stable without changes
  p->Touch(1, {});           // 1 gets another round
  CHECK(*p->Victim() == 2);
}

TEST_CASE("TinyLFU admits a new block only when it is more frequent than the victim", "[eviction]") {
  auto p = MakePolicy("tinylfu-lru", 2);
  CHECK(p->name() == "tinylfu-lru");
  for (int i = 0; i < 6; ++i) {
    Access(*p, 1, 2);
    Access(*p, 2, 2);
  }
  Access(*p, 3, 2);  // seen once: less frequent than 1 (the LRU victim)
  CHECK_FALSE(p->Contains(3));
  CHECK(p->Contains(1));
  CHECK(p->Contains(2));
  int tries = 1;
  while (!p->Contains(3) && tries < 20) {
    Access(*p, 3, 2);
    ++tries;
  }
  CHECK(p->Contains(3));  // once it is more popular than 1 it gets in
  CHECK(tries > 2);
  CHECK(tries <= 8);
}

TEST_CASE("TinyLFU wraps any policy and admits everything while there is room", "[eviction]") {
  for (std::string inner : {"lru-priority", "arc", "s3-fifo", "lfu", "score"}) {
    INFO(inner);
    auto p = MakePolicy("tinylfu-" + inner, 4);
    CHECK(p->name() == "tinylfu-" + inner);
    for (EntryId id = 1; id <= 4; ++id) CHECK_FALSE(Access(*p, id, 4));
    CHECK(p->size() == 4);
  }
  CHECK_FALSE(MakeEvictionPolicy("tinylfu-tinylfu-lru", {}).ok());
  CHECK_FALSE(MakeEvictionPolicy("tinylfu-nope", {}).ok());
}

TEST_CASE("Score policy: class first, then accumulated importance, then LRU", "[eviction]") {
  ManualClock clock;
  auto p = MakePolicy("score", 0, &clock);
  p->Insert(1, Hint(1, 5.0f));
  p->Insert(2, Hint(1, 1.0f));
  p->Insert(3, Hint(1, 3.0f));
  p->Insert(4, Hint(0, 100.0f));  // explicit low priority beats any importance
  p->Insert(5, Hint(1, 3.0f));    // ties with 3 on importance: 3 is older
  p->Touch(2, Hint(1, 10.0f));    // H2O-style accumulation: 2 now has 11
  CHECK(p->EffectiveClass(4) == 0);
  CHECK(Drain(*p) == std::vector<EntryId>{4, 3, 5, 1, 2});
}

TEST_CASE("Score policy: importance decays with the configured half-life", "[eviction]") {
  ManualClock clock;
  const int64_t half_life = 10'000'000'000;  // 10 s
  auto p = MakePolicy("score", 0, &clock, half_life);
  p->Insert(1, Hint(1, 5.0f));
  clock.AdvanceSeconds(20);       // 1's 5 is now worth 1.25 against fresh hints
  p->Insert(2, Hint(1, 2.0f));
  CHECK(*p->Victim() == 1);
  p->Touch(1, Hint(1, 2.0f));     // 1.25 + 2 > 2
  CHECK(*p->Victim() == 2);
  // Far in the future the stored scales are rebased without changing the order.
  clock.AdvanceSeconds(10 * 70);
  p->Insert(3, Hint(1, 1.0f));
  p->Insert(4, Hint(1, 0.5f));
  CHECK(Drain(*p) == std::vector<EntryId>{2, 1, 4, 3});
}

TEST_CASE("Every policy is consistent under random operations", "[eviction]") {
  // Contract checks: size matches a reference set, Victim is tracked, Contains agrees.
  for (const std::string& name : EvictionPolicyNames()) {
    INFO(name);
    ManualClock clock;
    auto p = MakePolicy(name, 64, &clock, 1'000'000'000);
    testing::ContractRun run;
    run.clock = &clock;
    run.tick_ns = 10'000'000;
    testing::CheckContract(*p, run, [&](EntryId id, const AccessInfo& info) {
      return Access(*p, id, 64, nullptr, info);
    });
  }
}

TEST_CASE("StreamingLLM retention keeps sinks and the recent window", "[eviction]") {
  StreamingRetention r{.sink_blocks = 2, .window_blocks = 3};
  // A sequence of 10 blocks keeps 0, 1 (sinks) and 7, 8, 9 (window).
  std::vector<uint32_t> kept;
  for (uint32_t i = 0; i < 10; ++i)
    if (r.Keeps(i, 10)) kept.push_back(i);
  CHECK(kept == std::vector<uint32_t>{0, 1, 7, 8, 9});
  CHECK(r.ClassFor(1, 3, 1) == 3);
  CHECK(r.ClassFor(8, 3, 1) == 1);
  // Growing from 6 to 9 blocks drops 3..5 (at 6 blocks the window was 3..5; 2 left earlier).
  CHECK(r.Dropped(6, 9) == Range{3, 6});
  CHECK(r.Dropped(4, 5) == Range{});  // the window still reaches the sinks
  CHECK(r.Dropped(5, 6) == Range{2, 3});
  StreamingRetention off{.sink_blocks = 1, .window_blocks = 0};
  CHECK(off.Keeps(5, 100));
  CHECK(off.Dropped(10, 20).empty());
}

TEST_CASE("Release makes an entry the next victim until it is read again", "[eviction]") {
  for (const std::string name : {"lru", "lru-priority", "turnover-priority", "freq-class", "freq-class-turnover",
                                 "s3-fifo", "tinylfu-lru", "adaptive", "adaptive-cost"}) {
    INFO(name);
    ManualClock clock;
    auto p = MakePolicy(name, 8, &clock, 1'000'000'000);
    for (EntryId id = 1; id <= 5; ++id) {
      clock.Advance(1'000'000);
      AccessInfo info;
      info.key_hash = id;
      Access(*p, id, 8, nullptr, info);
    }
    p->Release(3);
    CHECK(*p->Victim() == 3);
    p->Release(2);
    CHECK(*p->Victim() == 2);  // the latest released leaves first
    p->Release(99);            // not tracked: nothing happens
    CHECK(p->size() == 5);
    p->Remove(2, RemoveReason::kEvicted);
    CHECK(*p->Victim() == 3);
    AccessInfo again;
    again.key_hash = 3;
    p->Touch(3, again);  // read again: an ordinary entry
    const std::vector<EntryId> order = Drain(*p);
    REQUIRE(order.size() == 4);
    CHECK(order.back() == 3);  // the most recently used leaves last
  }
  // Policies with no order to change ignore it.
  for (const std::string name : {"lfu", "arc", "score"}) {
    INFO(name);
    auto p = MakePolicy(name, 8);
    for (EntryId id = 1; id <= 3; ++id) Access(*p, id, 8);
    p->Release(2);
    CHECK(p->size() == 3);
    CHECK(p->Contains(2));
  }
}

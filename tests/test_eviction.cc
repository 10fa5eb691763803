#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <random>

#include "eviction/eviction_policy.h"
#include "tests/eviction_contract.h"

using namespace kvmesh;

namespace {
using testing::Drain;
std::unique_ptr<EvictionPolicy> Make(const char* name, Clock* clock, int64_t aging_ns = 0) {
  return testing::MakePolicy(name, {.priority_classes = 4, .aging_ns = aging_ns, .clock = clock});
}
AccessInfo Pri(Priority p) { return AccessInfo{p, 0, 0}; }
}  // namespace

TEST_CASE("LRU evicts least recently used first", "[eviction]") {
  ManualClock clock;
  auto p = Make("lru", &clock);
  for (EntryId i = 1; i <= 4; ++i) p->Insert(i, {});
  p->Touch(2, {});
  p->Touch(1, {});
  p->Remove(3, RemoveReason::kErased);
  CHECK(p->size() == 3);
  CHECK(Drain(*p) == std::vector<EntryId>{4, 2, 1});
  CHECK_FALSE(p->Victim().has_value());
}

TEST_CASE("LRU-with-priority evicts the oldest of the lowest class", "[eviction]") {
  ManualClock clock;
  auto p = Make("lru-priority", &clock);
  // Insertion order interleaves classes; time advances between inserts.
  p->Insert(10, Pri(2)); clock.Advance(1);
  p->Insert(11, Pri(0)); clock.Advance(1);
  p->Insert(12, Pri(1)); clock.Advance(1);
  p->Insert(13, Pri(0)); clock.Advance(1);
  p->Insert(14, Pri(2)); clock.Advance(1);
  p->Insert(15, Pri(1)); clock.Advance(1);
  p->Touch(11, Pri(0));  // 11 becomes the newest of class 0
  CHECK(p->EffectiveClass(14) == 2);
  CHECK(Drain(*p) == std::vector<EntryId>{13, 11, 12, 15, 10, 14});
}

TEST_CASE("LRU-with-priority: a touch can change the class", "[eviction]") {
  ManualClock clock;
  auto p = Make("lru-priority", &clock);
  p->Insert(1, Pri(0));
  p->Insert(2, Pri(0));
  p->Touch(1, Pri(3));
  CHECK(Drain(*p) == std::vector<EntryId>{2, 1});
  // Classes above the configured count clamp to the top class.
  p->Insert(7, Pri(7));
  CHECK(p->EffectiveClass(7) == 3);
}

TEST_CASE("LRU-with-priority: untouched high-priority blocks age down a class per period", "[eviction]") {
  ManualClock clock;
  const int64_t age = 10'000'000'000;  // 10 s
  auto p = Make("lru-priority", &clock, age);
  p->Insert(1, Pri(3));  // squatter: high priority, never touched again
  clock.AdvanceSeconds(1);
  p->Insert(2, Pri(1));
  CHECK(*p->Victim() == 2);  // fresh: class 3 beats class 1
  clock.AdvanceSeconds(10);  // block 1 idle 11s -> effective 2; block 2 idle 10s -> effective 0
  CHECK(p->EffectiveClass(1) == 2);
  CHECK(p->EffectiveClass(2) == 0);
  CHECK(*p->Victim() == 2);
  p->Touch(2, Pri(1));        // block 2 is used again: back to class 1
  clock.AdvanceSeconds(15);   // block 1 idle 26s -> effective 1; block 2 idle 15s -> 0
  CHECK(*p->Victim() == 2);
  clock.AdvanceSeconds(10);   // block 1 idle 36s -> 0; block 2 idle 25s -> 0; tie -> older (1)
  CHECK(*p->Victim() == 1);
}

TEST_CASE("Removed (pinned) entries are never victims and come back on re-insert", "[eviction]") {
  ManualClock clock;
  for (const char* name : {"lru", "lru-priority"}) {
    INFO(name);
    auto p = Make(name, &clock);
    p->Insert(1, {});
    p->Insert(2, {});
    p->Remove(1, RemoveReason::kPinned);
    CHECK_FALSE(p->Contains(1));
    CHECK(*p->Victim() == 2);
    p->Insert(1, {});  // unpinned: most recently used
    CHECK(Drain(*p) == std::vector<EntryId>{2, 1});
  }
}

TEST_CASE("Policies agree with a reference model on random operations", "[eviction]") {
  // Reference: LRU-priority without aging = sort by (class, last access).
  ManualClock clock;
  auto p = Make("lru-priority", &clock);
  std::map<EntryId, std::pair<int, int64_t>> ref;
  std::mt19937_64 rng(42);
  for (int step = 0; step < 20000; ++step) {
    clock.Advance(1);
    EntryId id = rng() % 200;
    Priority pr = static_cast<Priority>(rng() % 4);
    int op = static_cast<int>(rng() % 10);
    if (op < 6) {
      if (ref.count(id)) p->Touch(id, Pri(pr)); else p->Insert(id, Pri(pr));
      ref[id] = {pr, clock.NowNanos()};
    } else if (op < 8) {
      p->Remove(id, RemoveReason::kErased);
      ref.erase(id);
    } else if (!ref.empty()) {
      auto best = std::min_element(ref.begin(), ref.end(), [](auto& a, auto& b) { return a.second < b.second; });
      REQUIRE(p->Victim().has_value());
      REQUIRE(*p->Victim() == best->first);
      p->Remove(best->first, RemoveReason::kEvicted);
      ref.erase(best);
    }
    REQUIRE(p->size() == ref.size());
  }
}

TEST_CASE("Unknown policy names are rejected with the list of known ones", "[eviction]") {
  auto r = MakeEvictionPolicy("fifo-ish", {});
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message().find("known: lru-priority, lru") != std::string::npos);
}

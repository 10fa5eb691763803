// The adaptive default and its experts: eviction order on hand-built
// sequences, following the best expert, and the owner's real capacity.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <random>
#include <set>

#include "eviction/eviction_policy.h"
#include "eviction/list_pool.h"
#include "eviction/policies.h"
#include "eviction/score_exchange.h"
#include "tests/eviction_contract.h"

using namespace kvmesh;

namespace {

using testing::Drain;
using testing::MakePolicy;


AccessInfo Info(Priority pr, float score = 0.0f, uint32_t depth = 0) {
  AccessInfo i;
  i.priority = pr;
  i.score = score;
  i.depth = depth;
  return i;
}

std::unique_ptr<EvictionPolicy> MakeLeafFirst(const std::string& name, size_t capacity, bool leaf_first) {
  return testing::MakePolicy(name, {.aging_ns = 0, .capacity_hint = capacity, .leaf_first = leaf_first});
}

// testing::OwnerAccess: true on a hit; appends victims to *evicted.
bool Access(EvictionPolicy& p, EntryId id, size_t capacity, const AccessInfo& info = {},
            std::vector<EntryId>* evicted = nullptr) {
  return testing::OwnerAccess(p, id, capacity, info, evicted);
}

// `n` reads, half of a hot set of `hot` blocks, half of one-time blocks
// numbered from `first_scan`: LRU (and every class policy, the classes being
// equal) loses hot blocks to the scan; S3-FIFO keeps them.
std::vector<EntryId> HotAndScan(uint64_t hot, int n, EntryId first_scan) {
  std::mt19937_64 rng(5);
  std::vector<EntryId> seq;
  for (int i = 0; i < n; ++i) seq.push_back(rng() % 2 ? rng() % hot : first_scan++);
  return seq;
}

// The hits of the second half of `seq` (after an adaptive policy settled);
// *following: the expert it follows at the end.
uint64_t SecondHalfHits(EvictionPolicy& p, const std::vector<EntryId>& seq, size_t capacity,
                        std::string* following = nullptr) {
  uint64_t hits = 0;
  for (size_t i = 0; i < seq.size(); ++i) {
    const bool hit = Access(p, seq[i], capacity);
    if (i >= seq.size() / 2) hits += hit;
  }
  if (following) *following = std::string(p.following());
  return hits;
}

}  // namespace

TEST_CASE("The default eviction policy is adaptive, and the config and store defaults agree", "[eviction]") {
  CHECK(kDefaultEvictionPolicy == "adaptive");
  auto p = MakePolicy(std::string(kDefaultEvictionPolicy), 16);
  CHECK(p->name() == "adaptive");
  CHECK(p->following() == "lru-priority");  // the first expert leads until another does better
  CHECK(MakePolicy("adaptive-cost", 16)->name() == "adaptive-cost");
  CHECK(MakePolicy("lru", 16)->following().empty());
}

TEST_CASE("turnover-priority: classes first until the first eviction, then one class per turnover time",
          "[eviction]") {
  ManualClock clock(0);
  auto p = MakePolicy("turnover-priority", 8, &clock);
  p->Insert(1, Info(2));  // t = 0 s
  clock.AdvanceSeconds(1);
  p->Insert(2, Info(0));  // t = 1 s
  clock.AdvanceSeconds(1);
  p->Insert(3, Info(1));  // t = 2 s
  clock.AdvanceSeconds(1);
  // No eviction yet, so no aging: plain class order.
  REQUIRE(*p->Victim() == 2);
  p->Remove(2, RemoveReason::kEvicted);  // idle 2 s: the turnover time T is 2 s
  // At t = 3 s: block 1 is class 2 idle 3 s (2 - 3/2 = 0.5), block 3 class 1 idle 1 s
  // (1 - 1/2 = 0.5): a tie, and the older goes.
  CHECK(*p->Victim() == 1);
  CHECK(p->EffectiveClass(1) == 1);  // 0.5 rounds up
  p->Touch(1, Info(2));
  CHECK(*p->Victim() == 3);
  // Erasing does not count as turnover.
  clock.AdvanceSeconds(100);
  p->Remove(1, RemoveReason::kErased);
  p->Insert(4, Info(3));
  clock.AdvanceSeconds(1);
  // Block 3 (class 1, idle 101 s) is far below block 4 (class 3, idle 1 s).
  CHECK(*p->Victim() == 3);
  p->Remove(3, RemoveReason::kEvicted);  // T moves 1/64 of the way to 101 s
  CHECK(*p->Victim() == 4);
}

TEST_CASE("freq-class: strict class, then accumulated score hints, then LRU", "[eviction]") {
  auto p = MakePolicy("freq-class", 8);  // aging 0: importance never decays
  p->Insert(1, Info(1, 1.0f));
  p->Insert(2, Info(1, 1.0f));
  p->Touch(1, Info(1, 3.0f));        // importance 4: log2(5) = bucket 2; block 2 stays at 1
  p->Insert(3, Info(0, 100.0f));     // class 0 goes first whatever its importance
  p->Insert(4, Info(1, 1.0f));       // same class and bucket as 2, newer
  std::vector<EntryId> order;
  while (auto v = p->Victim()) {
    order.push_back(*v);
    p->Remove(*v, RemoveReason::kEvicted);
  }
  CHECK(order == std::vector<EntryId>{3, 2, 4, 1});
}

TEST_CASE("freq-class: importance halves per aging period of idleness", "[eviction]") {
  ManualClock clock(0);
  auto p = MakePolicy("freq-class", 8, &clock, 10'000'000'000);  // half-life 10 s
  p->Insert(1, Info(1, 7.0f));  // log2(8) = 3
  p->Insert(2, Info(1, 1.0f));  // log2(2) = 1
  CHECK(*p->Victim() == 2);
  clock.AdvanceSeconds(40);     // block 1: 3 - 4 = -1
  p->Touch(2, Info(1, 1.0f));   // block 2: 1 * 2^-4 + 1, log2 = 1.04
  CHECK(*p->Victim() == 1);
}

TEST_CASE("adaptive: with no hits yet it evicts exactly what lru-priority evicts", "[eviction]") {
  ManualClock clock(0);
  auto a = MakePolicy("adaptive", 6, &clock, 60'000'000'000);
  auto l = MakePolicy("lru-priority", 6, &clock, 60'000'000'000);
  std::mt19937_64 rng(3);
  std::vector<EntryId> ea, el;
  for (EntryId id = 1; id <= 40; ++id) {  // every access a miss: no expert scores
    clock.AdvanceSeconds(1);
    const AccessInfo info = Info(static_cast<Priority>(rng() % 4));
    Access(*a, id, 6, info, &ea);
    Access(*l, id, 6, info, &el);
  }
  CHECK(a->following() == "lru-priority");
  CHECK(ea.size() == 34);
  CHECK(ea == el);
}

TEST_CASE("adaptive: follows the expert that hits most, and hits like it", "[eviction]") {
  // A hot set of 80 blocks read between one-time blocks, in a 100-block cache.
  constexpr size_t kCap = 100;
  const std::vector<EntryId> seq = HotAndScan(80, 40000, 1000);
  auto run = [&](const std::string& name, std::string* following = nullptr) {
    return SecondHalfHits(*MakePolicy(name, kCap), seq, kCap, following);
  };
  std::string leader;
  const uint64_t adaptive = run("adaptive", &leader);
  const uint64_t lru = run("lru"), s3 = run("s3-fifo");
  INFO("adaptive " << adaptive << " following " << leader << ", lru " << lru << ", s3-fifo " << s3);
  CHECK(leader == "s3-fifo");
  CHECK(s3 > lru + lru / 4);
  CHECK(adaptive >= s3 * 97 / 100);
}

TEST_CASE("adaptive: an owner whose real capacity is below the hint still gets the leader's victims",
          "[eviction]") {
  // A store class whose capacity hint is 8 chunks but which holds 4 (its pages
  // went to other classes): the leader (lru-priority) still decides.
  auto p = MakePolicy("adaptive", 8);
  const Priority cls[] = {3, 0, 3, 1};
  for (EntryId id = 1; id <= 4; ++id) Access(*p, id, 4, Info(cls[id - 1]));
  REQUIRE(p->size() == 4);
  std::vector<EntryId> evicted;
  Access(*p, 5, 4, Info(1), &evicted);  // the class-0 block goes, as lru-priority would
  Access(*p, 6, 4, Info(3), &evicted);  // then the older class-1 block
  CHECK(evicted == std::vector<EntryId>{2, 4});
  CHECK(p->size() == 4);
  CHECK(p->Contains(5));
  CHECK(p->Contains(6));
}

TEST_CASE("adaptive: pinned entries leave and return, erased ones leave the experts too", "[eviction]") {
  auto p = MakePolicy("adaptive", 4);
  for (EntryId id = 1; id <= 4; ++id) Access(*p, id, 4);
  p->Remove(1, RemoveReason::kPinned);  // a reader pins it: not evictable
  CHECK_FALSE(p->Contains(1));
  for (int i = 0; i < 8; ++i) {
    auto v = p->Victim();
    REQUIRE(v.has_value());
    CHECK(*v != 1);
    p->Touch(*v, {});
  }
  p->Insert(1, {});  // the last unpin: evictable again (and an access for the experts)
  CHECK(p->Contains(1));
  CHECK(*p->Victim() != 1);  // just used
  p->Remove(2, RemoveReason::kErased);
  CHECK(p->size() == 3);
  CHECK_FALSE(Access(*p, 2, 4));  // gone for the experts as well: a miss, not a ghost hit
}

TEST_CASE("leaf_first: a request's chain leaves deepest block first; without it, its parent first",
          "[eviction]") {
  // Request A reads chain 1 -> 2 -> 3, request B reads 1 (a hit) -> 4 -> 5.
  const std::vector<std::pair<EntryId, uint32_t>> accesses{{1, 0}, {2, 1}, {3, 2}, {1, 0}, {4, 1}, {5, 2}};
  for (const std::string name : {"lru", "lru-priority", "turnover-priority", "freq-class"}) {
    INFO(name);
    auto on = MakeLeafFirst(name, 8, true);
    auto off = MakeLeafFirst(name, 8, false);
    for (auto [id, depth] : accesses) {
      Access(*on, id, 8, Info(1, 1.0f, depth));
      Access(*off, id, 8, Info(1, 1.0f, depth));
    }
    // Oldest request first, deepest block first inside it; the shared root last.
    CHECK(Drain(*on) == std::vector<EntryId>{3, 2, 5, 4, 1});
    CHECK(Drain(*off) == std::vector<EntryId>{2, 3, 1, 4, 5});
  }
}

TEST_CASE("leaf_first: without chain positions (a block store) the order is plain recency", "[eviction]") {
  auto on = MakeLeafFirst("lru", 8, true);
  for (EntryId id = 1; id <= 4; ++id) Access(*on, id, 8, Info(1));
  Access(*on, 2, 8, Info(1));
  CHECK(Drain(*on) == std::vector<EntryId>{1, 3, 4, 2});
  // A chain placed across classes keeps each class's own recency.
  auto pr = MakeLeafFirst("lru-priority", 8, true);
  Access(*pr, 1, 8, Info(3, 0, 0));
  Access(*pr, 2, 8, Info(1, 0, 1));
  Access(*pr, 3, 8, Info(3, 0, 2));  // its parent is on another list: front of class 3
  CHECK(Drain(*pr) == std::vector<EntryId>{2, 1, 3});
}

TEST_CASE("adaptive: with no hits yet it evicts chains as leaf-first lru-priority does", "[eviction]") {
  ManualClock clock(0);
  PolicyOptions o;
  o.capacity_hint = 6;
  o.clock = &clock;
  o.aging_ns = 60'000'000'000;
  auto a = MakeEvictionPolicy("adaptive", o).value();
  o.leaf_first = true;
  auto l = MakeEvictionPolicy("lru-priority", o).value();
  std::mt19937_64 rng(7);
  std::vector<EntryId> ea, el;
  EntryId id = 1;
  for (int request = 0; request < 12; ++request) {  // chains of 1-4 new blocks: every access a miss
    clock.AdvanceSeconds(1);
    const uint32_t len = 1 + static_cast<uint32_t>(rng() % 4);
    for (uint32_t d = 0; d < len; ++d, ++id) {
      const AccessInfo info = Info(static_cast<Priority>(rng() % 4), 0.0f, d);
      Access(*a, id, 6, info, &ea);
      Access(*l, id, 6, info, &el);
    }
  }
  CHECK(a->following() == "lru-priority");
  CHECK(ea.size() == id - 1 - 6);
  CHECK(ea == el);
}

TEST_CASE("turnover-freq: two classes per doubling of a block's accesses", "[eviction]") {
  ManualClock clock(0);
  PolicyOptions o;
  o.capacity_hint = 8;
  o.clock = &clock;
  auto p = eviction_internal::MakeTurnoverFreq(o);
  CHECK(p->name() == "turnover-freq");
  p->Insert(1, Info(1));
  for (int i = 0; i < 3; ++i) p->Touch(1, Info(1));  // 4 accesses: class 1 + 2 x log2(4) = 5
  p->Insert(2, Info(3));                              // 1 access: class 3
  clock.AdvanceSeconds(1);
  p->Insert(3, Info(1));
  p->Touch(3, Info(1));                               // 2 accesses: class 1 + 2 = 3, newer than 2
  CHECK(p->EffectiveClass(1) == 1);                   // never above the client's class
  CHECK(Drain(*p) == std::vector<EntryId>{2, 3, 1});  // evictions idle 1, 0 and 1 s: T is about 1 s
  // The bonus ages like a class: one per T of idleness.
  p->Insert(4, Info(1));
  for (int i = 0; i < 3; ++i) p->Touch(4, Info(1));   // 5
  p->Insert(5, Info(3));                              // 3
  clock.AdvanceSeconds(3);
  CHECK(*p->Victim() == 5);                           // both idle 3 s: about 2 and 0
  p->Touch(5, Info(3));
  CHECK(*p->Victim() == 4);                           // 5 is back at 3
}

TEST_CASE("PolicyGroup: members publish scores, sums skip members that left, a full group refuses", "[eviction]") {
  PolicyGroup g;
  const int a = g.Join(), b = g.Join();
  CHECK(a == 0);
  CHECK(b == 1);
  const double sa[3] = {1, 2, 3}, sb[3] = {10, 0, 5};
  g.Publish(a, sa, 3);
  g.Publish(b, sb, 3);
  double sum[3];
  g.Sum(sum, 3);
  CHECK(sum[0] == 11);
  CHECK(sum[1] == 2);
  CHECK(sum[2] == 8);
  g.Leave(a);
  g.Sum(sum, 3);
  CHECK(sum[0] == 10);
  CHECK(g.Join() == a);  // the slot comes back with no scores
  g.Sum(sum, 3);
  CHECK(sum[0] == 10);
  g.set_leader(2);
  CHECK(g.leader() == 2);
  PolicyGroup full;
  for (size_t i = 0; i < PolicyGroup::kMaxMembers; ++i) REQUIRE(full.Join() >= 0);
  CHECK(full.Join() == -1);
}

TEST_CASE("adaptive: members of a group follow one expert, chosen on their summed scores", "[eviction]") {
  // Two stripes of one store: member A sees the scan-and-hot-set traffic on
  // which s3-fifo wins, member B sees nothing that favours anyone. B follows
  // the group's choice, and A evicts as it would alone; an adaptive policy
  // outside the group, fed B's traffic, keeps its first expert.
  constexpr size_t kCap = 100;
  auto group = std::make_shared<PolicyGroup>();
  auto make = [&](std::shared_ptr<PolicyGroup> g) {
    PolicyOptions o;
    o.capacity_hint = kCap;
    o.group = std::move(g);
    auto r = MakeEvictionPolicy("adaptive", o);
    REQUIRE(r.ok());
    return std::move(r).value();
  };
  auto a = make(group), b = make(group), alone = make(nullptr);
  std::mt19937_64 rng(5);
  EntryId next_scan = 1000;
  for (int i = 0; i < 40000; ++i) Access(*a, rng() % 2 ? rng() % 80 : next_scan++, kCap);
  for (EntryId i = 0; i < 50; ++i) {
    Access(*b, 100000 + i, kCap);
    Access(*alone, 100000 + i, kCap);
  }
  CHECK(a->following() == "s3-fifo");
  CHECK(b->following() == "s3-fifo");
  CHECK(alone->following() == "lru-priority");
  // A member that leaves no longer counts: a new member's group is what is left.
  a.reset();
  b.reset();
  auto c = make(group);
  CHECK(c->following() == "s3-fifo");  // the choice stays until the sums say otherwise
}

TEST_CASE("PolicyGroup: peers' scores add to every sum until replaced; names come from the first member", "[eviction]") {
  PolicyGroup g;
  const int a = g.Join({"lru", "s3-fifo"});
  (void)g.Join({"x", "y"});
  CHECK(g.name(0) == "lru");
  CHECK(g.name(1) == "s3-fifo");
  CHECK(g.name(2).empty());
  double own[2] = {-1, -1};
  CHECK(g.Own(own, 2) == 0);  // nothing published yet
  const double sa[2] = {3, 4};
  g.Publish(a, sa, 2);
  const double peers[2] = {10, 20};
  g.SetPeers(peers, 2);
  double sum[2], p[2];
  g.Sum(sum, 2);
  CHECK(sum[0] == 13);
  CHECK(sum[1] == 24);
  CHECK(g.Own(own, 2) == 2);
  CHECK(own[0] == 3);
  CHECK(own[1] == 4);
  CHECK(g.Peers(p, 2) == 2);
  g.SetPeers(nullptr, 0);
  g.Sum(sum, 2);
  CHECK(sum[0] == 3);
  CHECK(g.Peers(p, 2) == 0);
  const double zeros[2] = {0, 0};  // peers whose scores are all zero are still peers
  g.SetPeers(zeros, 2);
  CHECK(g.Peers(p, 2) == 2);
}

TEST_CASE("adaptive: peers' scores from other nodes move a group's leader", "[eviction]") {
  // One member sees traffic that favours nobody (distinct ids): alone it keeps
  // its first expert. Told that the rest of the cluster scores s3-fifo far
  // above the others, it follows s3-fifo at its next decision; with the peers
  // cleared it stays there (the margin keeps a leader until a challenger wins).
  constexpr size_t kCap = 100;
  auto groups = std::make_shared<PolicyGroups>();
  PolicyOptions o;
  o.capacity_hint = kCap;
  o.group = groups->Get("primary/adaptive/256");
  auto p = MakeEvictionPolicy("adaptive", o).value();
  for (EntryId i = 0; i < 64; ++i) Access(*p, 1000 + i, kCap);
  CHECK(p->following() == "lru-priority");
  std::vector<PolicyGroups::Entry> snap = groups->Snapshot();
  REQUIRE(snap.size() == 1);
  CHECK(snap[0].key == "primary/adaptive/256");
  CHECK(snap[0].following == "lru-priority");
  CHECK(snap[0].peers.empty());
  const size_t n = snap[0].own.size();
  REQUIRE(n >= 2);
  size_t s3 = n;
  for (size_t i = 0; i < n; ++i)
    if (o.group->name(static_cast<uint32_t>(i)) == "s3-fifo") s3 = i;
  REQUIRE(s3 < n);
  std::vector<double> peer(n, 1.0);
  peer[s3] = 5000.0;
  groups->SetPeers({{"primary/adaptive/256", peer}, {"host/lru/256", {1.0}}});
  for (EntryId i = 0; i < 64; ++i) Access(*p, 2000 + i, kCap);
  CHECK(p->following() == "s3-fifo");
  snap = groups->Snapshot();
  REQUIRE(snap.size() == 1);
  CHECK(snap[0].following == "s3-fifo");
  CHECK(snap[0].peers == peer);
  groups->SetPeers({});  // a group not named loses its peers
  CHECK(groups->Snapshot()[0].peers.empty());
  CHECK(groups->Get("primary/adaptive/256") == o.group);  // one group per key
  p.reset();  // its last member gone (a policy switch): the group reports nothing
  CHECK(groups->Snapshot().empty());
}

TEST_CASE("score exchange: a node's scores are read strictly, peers are summed per key and width", "[eviction]") {
  using nlohmann::json;
  auto ok = ParseScores(json::parse(R"({"primary/adaptive/256": [1, 2.5, 0], "host/adaptive/256": [4]})"), "$.eviction");
  REQUIRE(ok.ok());
  CHECK(ok->size() == 2);
  struct Bad {
    const char* body;
    const char* message;
  };
  for (const Bad& b : {Bad{R"([1, 2])", "$.eviction: must be an object"},
                       Bad{R"({"k": 3})", "$.eviction.k: must be an array of 1..8 numbers"},
                       Bad{R"({"k": []})", "$.eviction.k: must be an array of 1..8 numbers"},
                       Bad{R"({"k": [1,2,3,4,5,6,7,8,9]})", "$.eviction.k: must be an array of 1..8 numbers"},
                       Bad{R"({"k": [1, "2"]})", "$.eviction.k: scores must be finite numbers >= 0"},
                       Bad{R"({"k": [1, -2]})", "$.eviction.k: scores must be finite numbers >= 0"},
                       Bad{R"({"": [1]})", "$.eviction: a group key must have 1..200 bytes"}}) {
    auto r = ParseScores(json::parse(b.body), "$.eviction");
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(), Catch::Contains(b.message));
  }
  json many = json::object();
  for (int i = 0; i <= 64; ++i) many["k" + std::to_string(i)] = {1};
  CHECK_FALSE(ParseScores(many, "$.eviction").ok());
  CHECK(ParsePeerScores(json::parse(R"({"k": [-1]})")).empty());  // a bad answer: no peers

  const PeerScores self = {{"a", {1, 1}}, {"b", {1}}, {"c", {1}}};
  const PeerScores n1 = {{"a", {2, 3}}, {"b", {1, 2}}};  // b: another width, not summed
  const PeerScores n2 = {{"a", {10, 0}}, {"b", {7}}};
  const PeerScores sum = SumPeers(self, {&n1, &n2});
  REQUIRE(sum.size() == 2);  // c: nobody else has it
  CHECK(sum[0] == std::pair<std::string, std::vector<double>>{"a", {12, 3}});
  CHECK(sum[1] == std::pair<std::string, std::vector<double>>{"b", {7}});
  CHECK(ScoresToJson(sum).dump() == R"({"a":[12.0,3.0],"b":[7.0]})");
}

namespace {

std::unique_ptr<EvictionPolicy> MakeSampled(const std::string& name, size_t capacity, size_t floor) {
  return testing::MakePolicy(name, {.aging_ns = 0, .capacity_hint = capacity, .shadow_sample_floor = floor});
}

}  // namespace

TEST_CASE("adaptive: sampled shadows keep the owner's contract, also far below the capacity hint", "[eviction]") {
  // A floor of 16 under a hint of 4096: the experts see one key in 64 beside
  // a full copy of the leader. The owner holds only 64 (a store class whose
  // pages went elsewhere), and pins and erases leave it fewer still, so the
  // experts' capacity shrinks and the rate falls on the way (to 1 here). Pins,
  // erases and releases go through both the experts and the full copy.
  for (const size_t hint : {size_t{4096}, size_t{64}}) {
    INFO("hint " << hint);
    auto p = MakeSampled("adaptive", hint, 16);
    testing::ContractRun run;
    run.keys = 300;
    run.steps = 40000;
    run.seed = 11;
    run.access_weight = 17;
    const uint64_t hits =
        testing::CheckContract(*p, run, [&](EntryId id, const AccessInfo& info) { return Access(*p, id, 64, info); });
    CHECK(hits > 5000);  // 64 of 300 keys resident: about a fifth of the accesses hit
  }
}

TEST_CASE("adaptive: sampled shadows follow the expert full shadows follow, and hit as much", "[eviction]") {
  // The scan of "follows the expert that hits most", 20x larger: a hot set of
  // 1600 blocks between one-time blocks in a 2000-block cache, where s3-fifo
  // keeps the hot set and recency policies lose it. A floor of 128 makes the
  // experts sample one key in 8 (2000 / 8 = 250 entries each).
  constexpr size_t kCap = 2000;
  const std::vector<EntryId> seq = HotAndScan(1600, 200000, 100000);
  auto run = [&](const std::string& name, size_t floor, std::string* following = nullptr) {
    return SecondHalfHits(*MakeSampled(name, kCap, floor), seq, kCap, following);
  };
  std::string sampled_leader, full_leader;
  const uint64_t sampled = run("adaptive", 128, &sampled_leader);
  const uint64_t full = run("adaptive", 0, &full_leader);
  const uint64_t s3 = run("s3-fifo", 0), lru = run("lru", 0);
  INFO("sampled " << sampled << " following " << sampled_leader << ", full " << full << " following "
                  << full_leader << ", s3-fifo " << s3 << ", lru " << lru);
  CHECK(full_leader == "s3-fifo");
  CHECK(sampled_leader == "s3-fifo");
  CHECK(s3 > lru + lru / 4);
  CHECK(sampled >= full * 98 / 100);
  CHECK(sampled >= s3 * 97 / 100);
}

TEST_CASE("adaptive: queued hits replay as immediate ones did, each at the time it happened", "[eviction]") {
  // Adaptive policies see the same owner's operations with a clock that moves
  // on every step and one-second aging. The `a` policies queue their hits
  // (Touch only records them); the `b` policies are made to replay each one at
  // once (following() replays the queue), as Touch did before it queued.
  // Alone, victims, sizes, classes and the expert followed must agree at
  // every step, with full and with sampled shadows. As two members of a group
  // (a store's stripes: the keys split between them by id) a queued member
  // publishes its scores when its queue replays, not at the Touch, so the
  // group's leader may move a few accesses later: there the two groups must
  // follow more than one expert alike and hit within 3% of each other.
  for (const size_t floor : {size_t{0}, size_t{8}}) {
    for (const size_t members : {size_t{1}, size_t{2}}) {
      const bool exact = members == 1;
      INFO("shadow_sample_floor " << floor << ", members " << members);
      constexpr size_t kCap = 96;  // each member's
      ManualClock clock(0);
      PolicyOptions o{.aging_ns = 1'000'000'000, .capacity_hint = kCap, .clock = &clock,
                      .shadow_sample_floor = floor};
      std::vector<std::unique_ptr<EvictionPolicy>> a, b;
      const auto ga = std::make_shared<PolicyGroup>(), gb = std::make_shared<PolicyGroup>();
      for (size_t m = 0; m < members; ++m) {
        if (members > 1) o.group = ga;
        a.push_back(testing::MakePolicy("adaptive", o));
        if (members > 1) o.group = gb;
        b.push_back(testing::MakePolicy("adaptive", o));
      }
      std::mt19937_64 rng(17);
      std::vector<EntryId> pinned;
      std::set<std::string> leaders, leaders_b;
      uint64_t hits = 0, hits_b = 0;
      for (int step = 0; step < 60000; ++step) {
        clock.Advance(static_cast<int64_t>(rng() % 200'000'000));
        const uint64_t op = rng() % 100;
        // Half of the keys from a hot set of 80 per member (s3-fifo's workload
        // above), then a scan: the lead moves at least once.
        const EntryId id = rng() % 2 ? rng() % (80 * members) : 1000 + rng() % (step < 30000 ? 100 : 100000);
        const AccessInfo info = Info(static_cast<Priority>(rng() % 4), 0.0f, static_cast<uint32_t>(rng() % 3));
        if (std::find(pinned.begin(), pinned.end(), id) != pinned.end()) continue;  // the owner holds it aside
        EvictionPolicy& pa = *a[id % members];
        EvictionPolicy& pb = *b[id % members];
        if (op < 90) {
          std::vector<EntryId> ea, eb;
          const bool ha = Access(pa, id, kCap, info, &ea);
          const bool hb = Access(pb, id, kCap, info, &eb);
          if (hb) (void)pb.following();  // b: the hit replayed now
          if (exact) {
            REQUIRE(ha == hb);
            REQUIRE(ea == eb);
          }
          hits += ha;
          hits_b += hb;
        } else if (op < 94 && pa.Contains(id) && (!exact || pb.Contains(id)) && pinned.size() < 8) {
          pa.Remove(id, RemoveReason::kPinned);  // a reader pins it
          pb.Remove(id, RemoveReason::kPinned);
          pinned.push_back(id);
        } else if (op < 97 && !pinned.empty()) {  // the last unpin
          a[pinned.back() % members]->Insert(pinned.back(), info);
          b[pinned.back() % members]->Insert(pinned.back(), info);
          pinned.pop_back();
        } else if (op < 98) {
          pa.Remove(id, RemoveReason::kErased);
          pb.Remove(id, RemoveReason::kErased);
        } else {
          pa.Release(id);
          pb.Release(id);
        }
        if (exact) REQUIRE(pa.size() == pb.size());
        if (step % 101 == 0) {
          for (size_t m = 0; m < members; ++m) {
            if (exact) {
              REQUIRE(a[m]->Victim() == b[m]->Victim());
              for (EntryId k = m; k < 80 * members; k += members)
                if (a[m]->Contains(k)) REQUIRE(a[m]->EffectiveClass(k) == b[m]->EffectiveClass(k));
              REQUIRE(a[m]->following() == b[m]->following());
            }
            leaders.insert(std::string(a[m]->following()));
            leaders_b.insert(std::string(b[m]->following()));
          }
        }
      }
      INFO("hits " << hits << " / " << hits_b << ", leaders " << leaders.size());
      CHECK(hits > 10000);
      CHECK(leaders.size() >= 2);
      CHECK(leaders == leaders_b);
      CHECK(hits * 100 >= hits_b * 97);
      CHECK(hits_b * 100 >= hits * 97);
      if (exact) CHECK(testing::Drain(*a[0]) == testing::Drain(*b[0]));
    }
  }
}

TEST_CASE("adaptive: a group member's Touch only queues, and it publishes when its queue replays", "[eviction]") {
  // A store's lookup (Exists with touch) calls Touch alone, so Touch must not
  // replay the experts at a group member's publishing access (every 64th).
  // Member `a` gets 90 hits, past one publishing access: its group sees
  // nothing until a call that replays the queue; then it holds exactly what
  // `b`, the same member whose every hit was replayed at once, published. A
  // member that only hits still publishes: its queue replays once it holds a
  // publication kPublishEvery (64) accesses old.
  ManualClock clock(0);
  PolicyOptions o{.capacity_hint = 64, .clock = &clock};
  const auto ga = std::make_shared<PolicyGroup>(), gb = std::make_shared<PolicyGroup>();
  o.group = ga;
  auto a = testing::MakePolicy("adaptive", o);
  o.group = gb;
  auto b = testing::MakePolicy("adaptive", o);
  for (EntryId id = 0; id < 32; ++id) {  // 32 accesses, no publishing one yet
    Access(*a, id, 64);
    Access(*b, id, 64);
  }
  std::array<double, PolicyGroup::kMaxScores> sa{}, sb{};
  REQUIRE(ga->Own(sa.data(), sa.size()) == 0);
  auto hit = [&](int i) {
    clock.Advance(1'000'000);
    a->Touch(static_cast<EntryId>(i % 32), AccessInfo{});
    b->Touch(static_cast<EntryId>(i % 32), AccessInfo{});
    (void)b->following();  // b: replayed now
  };
  for (int i = 0; i < 90; ++i) hit(i);
  CHECK(ga->Own(sa.data(), sa.size()) == 0);  // a's Touches published nothing
  REQUIRE(gb->Own(sb.data(), sb.size()) == 7);
  CHECK(sb[0] > 0);
  (void)a->following();  // replays a's queue: its publication
  CHECK(ga->Own(sa.data(), sa.size()) == 7);
  CHECK(sa == sb);
  CHECK(a->Victim() == b->Victim());
  // Hits alone from here (no call of a's replays its queue): a's scores
  // still move within 2 x 64 accesses.
  const std::array<double, PolicyGroup::kMaxScores> before = sa;
  for (int i = 0; i < 130; ++i) hit(i);
  REQUIRE(ga->Own(sa.data(), sa.size()) == 7);
  CHECK(sa != before);
}

TEST_CASE("SharedIndex: list policies indexed in one shared index evict as with a map each", "[eviction]") {
  // adaptive's experts index their entries in one SharedIndex
  // (eviction/list_pool.h). Each policy here is made twice: `a` all share one
  // index (s3-fifo takes two slots, pool and ghosts; with a second lru that
  // makes all nine; a tenth pool finds no slot left and keeps a map of its
  // own), `b` with a map each. They see the
  // same owner's operations on the same keys, with evictions, pins, erases
  // and releases, so records are made, shared, dropped and reused; victims,
  // membership, sizes and classes must agree at every step.
  using MakeFn = std::unique_ptr<EvictionPolicy> (*)(const PolicyOptions&);
  const std::vector<MakeFn> makers{&eviction_internal::MakeLruPriority,      &eviction_internal::MakeS3Fifo,
                                   &eviction_internal::MakeTurnoverPriority, &eviction_internal::MakeFreqClass,
                                   &eviction_internal::MakeFreqClassTurnover, &eviction_internal::MakeLru,
                                   &eviction_internal::MakeTurnoverFreq,     &eviction_internal::MakeLru,
                                   &eviction_internal::MakeLruPriority};
  constexpr size_t kCap = 64;
  ManualClock clock(0);
  eviction_internal::SharedIndex index;
  PolicyOptions o{.aging_ns = 1'000'000'000, .capacity_hint = kCap, .clock = &clock};
  std::vector<std::unique_ptr<EvictionPolicy>> a, b;
  for (const MakeFn make : makers) {
    PolicyOptions shared = o;
    shared.shared_index = &index;
    a.push_back(make(shared));
    b.push_back(make(o));
  }
  std::mt19937_64 rng(23);
  uint64_t hits = 0, evictions = 0;
  for (int step = 0; step < 40000; ++step) {
    clock.Advance(static_cast<int64_t>(rng() % 100'000'000));
    const EntryId id = rng() % 2 ? rng() % 60 : 100 + rng() % 400;
    const AccessInfo info = Info(static_cast<Priority>(rng() % 4), static_cast<float>(rng() % 4));
    const uint64_t op = rng() % 100;
    for (size_t p = 0; p < makers.size(); ++p) {
      INFO("step " << step << ", policy " << p << " " << a[p]->name());
      EvictionPolicy& pa = *a[p];
      EvictionPolicy& pb = *b[p];
      if (op < 92) {
        std::vector<EntryId> ea, eb;
        const bool ha = Access(pa, id, kCap, info, &ea);
        REQUIRE(ha == Access(pb, id, kCap, info, &eb));
        REQUIRE(ea == eb);
        hits += ha;
        evictions += ea.size();
      } else if (op < 96) {
        pa.Remove(id, RemoveReason::kErased);
        pb.Remove(id, RemoveReason::kErased);
      } else if (op < 98) {
        pa.Remove(id, RemoveReason::kPinned);
        pb.Remove(id, RemoveReason::kPinned);
      } else {
        pa.Release(id);
        pb.Release(id);
      }
      REQUIRE(pa.size() == pb.size());
      REQUIRE(pa.Contains(id) == pb.Contains(id));
      if (pa.Contains(id)) REQUIRE(pa.EffectiveClass(id) == pb.EffectiveClass(id));
      REQUIRE(pa.Victim() == pb.Victim());
    }
  }
  CHECK(hits > 10000);
  CHECK(evictions > 10000);
  for (size_t p = 0; p < makers.size(); ++p) CHECK(Drain(*a[p]) == Drain(*b[p]));
}

// Trace replay: hand-checked numbers on a small trace, Belady optimality on
// random traces, the hint rule, and parse errors.
#include <catch2/catch.hpp>

#include <filesystem>
#include <random>
#include <sstream>

#include "eviction/replay.h"

using namespace kvmesh;

namespace {

Trace Parse(const std::string& text) {
  std::istringstream in(text);
  auto t = ParseMooncakeTrace(in, "test");
  REQUIRE(t.ok());
  return std::move(t).value();
}

// Requests: [A B] [A C] [A B] [C A]; 1024-token prompts (no partial block).
const char* kSmall =
    R"({"timestamp": 0, "input_length": 1024, "output_length": 5, "hash_ids": [10, 11]})"
    "\n"
    R"({"timestamp": 1, "input_length": 1024, "output_length": 5, "hash_ids": [10, 12]})"
    "\n\n"
    R"({"timestamp": 2, "input_length": 1024, "output_length": 5, "hash_ids": [10, 11]})"
    "\n"
    R"({"timestamp": 3, "input_length": 1024, "output_length": 5, "hash_ids": [12, 10]})"
    "\n";

}  // namespace

TEST_CASE("Replay of a small trace matches LRU and Belady computed by hand", "[replay]") {
  Trace t = Parse(kSmall);
  REQUIRE(t.requests() == 4);
  REQUIRE(t.lookups() == 8);
  REQUIRE(t.distinct == 3);

  // LRU, 2 blocks:  A- B- | A+ C-(evicts B) | A+ B-(evicts C) | C-(evicts A) A-(evicts B)
  auto lru = ReplayPolicy(t, "lru", 2);
  REQUIRE(lru.ok());
  CHECK(lru->hits == 2);
  CHECK(lru->prefix_hits == 2);
  CHECK(lru->evictions == 4);

  // Belady, 2 blocks: A- B- | A+ C-(next use 7 is later than B's 6: bypass) |
  // A+ B+ | C-(never used again: bypass) A+.  4 hits; C's miss breaks the last prefix.
  ReplayResult opt = ReplayBelady(t, 2);
  CHECK(opt.hits == 4);
  CHECK(opt.prefix_hits == 3);
  CHECK(opt.declined == 2);
  CHECK(opt.evictions == 0);

  ReplayResult inf = ReplayInfinite(t);
  CHECK(inf.hits == 5);
  CHECK(inf.prefix_hits == 5);
  CHECK(inf.hit_rate() == Approx(5.0 / 8));

  // With room for everything every policy reaches the infinite cache.
  for (const char* p : {"lru", "lru-priority", "lfu", "arc", "s3-fifo", "score", "tinylfu-lru"}) {
    INFO(p);
    auto r = ReplayPolicy(t, p, 3);
    REQUIRE(r.ok());
    CHECK(r->hits == inf.hits);
    CHECK(r->prefix_hits == inf.prefix_hits);
  }
  CHECK(ReplayBelady(t, 3).hits == inf.hits);
}

TEST_CASE("Belady with bypass is never beaten on block hits", "[replay]") {
  std::mt19937_64 rng(11);
  std::string text;
  // Conversations that grow turn by turn plus a shared system-prompt block.
  std::vector<std::vector<int>> convs(40);
  int next_id = 1;
  for (int r = 0; r < 600; ++r) {
    auto& c = convs[rng() % convs.size()];
    if (c.empty() || rng() % 5 == 0) c = {0};
    int grow = 1 + static_cast<int>(rng() % 3);
    for (int g = 0; g < grow; ++g) c.push_back(next_id++);
    std::string ids;
    for (int id : c) ids += (ids.empty() ? "" : ",") + std::to_string(id);
    text += "{\"timestamp\": " + std::to_string(r * 100) + ", \"input_length\": " + std::to_string(c.size() * 512) +
            ", \"output_length\": 1, \"hash_ids\": [" + ids + "]}\n";
  }
  Trace t = Parse(text);
  for (size_t cap : {5, 20, 80}) {
    ReplayResult opt = ReplayBelady(t, cap);
    for (const std::string& p : EvictionPolicyNames()) {
      INFO(p << " at " << cap);
      auto r = ReplayPolicy(t, p, cap);
      REQUIRE(r.ok());
      CHECK(r->hits <= opt.hits);
      CHECK(r->prefix_hits <= r->hits);
    }
  }
}

TEST_CASE("Replay hints use only request-time knowledge", "[replay]") {
  // 3 blocks, 1300 tokens: the last block is partial.
  Trace t = Parse(R"({"timestamp": 0, "input_length": 1300, "output_length": 1, "hash_ids": [1, 2, 3]})"
                  "\n");
  HintOptions o;
  CHECK(DeriveHints(t, 0, 0, 0, o).priority == 3);  // first block of a prompt
  CHECK(DeriveHints(t, 0, 1, 0, o).priority == 1);  // new, private
  CHECK(DeriveHints(t, 0, 1, 1, o).priority == 2);  // carried by one earlier request
  CHECK(DeriveHints(t, 0, 1, 9, o).priority == 3);  // widely shared
  CHECK(DeriveHints(t, 0, 2, 9, o).priority == 0);  // partial last block
  o.priority_classes = 8;                           // classes scale: 1 + min(shares, K-2)
  CHECK(DeriveHints(t, 0, 0, 0, o).priority == 7);
  CHECK(DeriveHints(t, 0, 1, 3, o).priority == 4);
  CHECK(DeriveHints(t, 0, 1, 5, o).priority == 6);
  CHECK(DeriveHints(t, 0, 1, 9, o).priority == 7);
  CHECK(DeriveHints(t, 0, 2, 9, o).priority == 0);
  o.priority_classes = 2;
  CHECK(DeriveHints(t, 0, 1, 9, o).priority == 1);  // clamped to the top class
}

TEST_CASE("Replay rejects bad traces with the line, and bad policy specs", "[replay]") {
  std::istringstream bad("{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 1, \"hash_ids\": [1]}\n"
                         "{\"timestamp\": 1, \"input_length\": 5, \"hash_ids\": [1]}\n");
  auto r = ParseMooncakeTrace(bad, "t.jsonl");
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message() == "t.jsonl:2: missing 'output_length'");
  std::istringstream junk("not json\n");
  CHECK(ParseMooncakeTrace(junk, "j").status().message() == "j:1: not a JSON object");

  Trace t = Parse(kSmall);
  CHECK_FALSE(ReplayPolicy(t, "nope", 2).ok());
  CHECK_FALSE(ReplayPolicy(t, "lru", 0).ok());
  CHECK_FALSE(ReplayPolicy(t, "lru-priority@x", 2).ok());
  auto spec = ParsePolicySpec("lru-priority@120");
  REQUIRE(spec.ok());
  CHECK(spec->name == "lru-priority");
  CHECK(*spec->aging_ns == 120'000'000'000);
  CHECK_FALSE(spec->classes.has_value());
  spec = ParsePolicySpec("lru-priority@30/8");
  REQUIRE(spec.ok());
  CHECK(*spec->classes == 8);
  CHECK_FALSE(ParsePolicySpec("lru-priority@30/9").ok());
  CHECK_FALSE(ParsePolicySpec("lru-priority@30/").ok());
}

TEST_CASE("Mooncake trace: the default policy's prefix hit rate is at least LRU's at 1-10% capacity",
          "[replay][trace]") {
  // The public trace is checked in (tests/data/traces/README.md).
  const std::string path = std::string(KVMESH_TRACE_DIR) + "/conversation_trace.jsonl";
  REQUIRE(std::filesystem::exists(path));
  auto t = LoadMooncakeTrace(path);
  REQUIRE(t.ok());
  CHECK(t->requests() == 12031);
  CHECK(t->lookups() == 288500);
  CHECK(t->distinct == 182790);
  CHECK(ReplayInfinite(*t).hit_rate() == Approx(0.3664).epsilon(0.001));
  for (double f : {0.01, 0.02, 0.05, 0.1}) {
    INFO("capacity fraction " << f);
    const size_t cap = static_cast<size_t>(f * static_cast<double>(t->distinct));
    auto lru = ReplayPolicy(*t, "lru", cap);
    auto def = ReplayPolicy(*t, "lru-priority", cap);
    REQUIRE(lru.ok());
    REQUIRE(def.ok());
    CHECK(def->prefix_hit_rate() >= lru->prefix_hit_rate());
    CHECK(ReplayBelady(*t, cap).hits >= def->hits);
  }
}

// Trace replay: hand-checked numbers on a small trace, Belady optimality on
// random traces, the hint rule, and parse errors.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
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

TEST_CASE("Prefill FLOPs of a block: dense layers plus attention over its prefix", "[replay]") {
  PrefillModel m{.layers = 1, .heads = 1, .head_dim = 2, .block_tokens = 2};  // D = 2
  // 24 D^2 t + 4 D (t p0 + t (t + 1) / 2)
  CHECK(m.BlockFlops(0, 2) == Approx(96 * 2 + 8 * (0 + 3)));  // 216
  CHECK(m.BlockFlops(1, 2) == Approx(96 * 2 + 8 * (4 + 3)));  // 248: attends to 2 more tokens
  CHECK(m.BlockFlops(1, 1) == Approx(96 * 1 + 8 * (2 + 1)));  // 120: a partial last block
  m.layers = 3;
  CHECK(m.BlockFlops(1, 2) == Approx(3 * 248));
  // Three tokens in two blocks: the second holds one token.
  Trace t = Parse(R"({"timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": [7, 8]})"
                  "\n"
                  R"({"timestamp": 0, "input_length": 9, "output_length": 1, "hash_ids": [7]})"
                  "\n");
  m.layers = 1;
  CHECK(m.LookupFlops(t) == std::vector<double>{216, 120, 216});  // 9 tokens clamp to the block's 2
}

TEST_CASE("Replay counts the FLOPs of prefix hits only", "[replay]") {
  Trace t = Parse(kSmall);
  const PrefillModel m;  // 4 layers x 4 heads x 64, 512-token blocks
  const double f0 = m.BlockFlops(0, 512), f1 = m.BlockFlops(1, 512);
  CHECK(f1 > f0);
  ReplayOptions o;
  o.model = m;
  // LRU, 2 blocks: prefix hits are A (depth 0) in requests 2 and 3.
  auto lru = ReplayPolicy(t, "lru", 2, o);
  REQUIRE(lru.ok());
  CHECK(lru->flops_total == Approx(4 * (f0 + f1)));
  CHECK(lru->flops_saved == Approx(2 * f0));
  CHECK(lru->flops_saved_fraction() == Approx(2 * f0 / (4 * (f0 + f1))));
  // Belady's 3 prefix hits: A, A B (depth 0, 0, 1).
  ReplayResult opt = ReplayBelady(t, 2, nullptr, m);
  CHECK(opt.flops_saved == Approx(2 * f0 + f1));
  ReplayResult inf = ReplayInfinite(t, m);
  CHECK(inf.flops_saved == Approx(3 * f0 + 2 * f1));  // A, A B, C A: C at depth 0, then A at depth 1
  CHECK(ReplayBeladyFlops(t, 3, m).flops_saved == Approx(inf.flops_saved));
}

TEST_CASE("Belady's hit optimum is not the FLOPs optimum; the FLOPs reference does better", "[replay]") {
  // An 8-block chain Y, then X, four one-time blocks, X again, then Y again;
  // 8 blocks of room. Belady keeps X (next used sooner than Y's deepest
  // block) and loses y7; the FLOPs reference keeps y7, which costs 3x the
  // compute of X (attention over 7 blocks of prefix): the same hits, more FLOPs.
  std::string text;
  auto req = [&](std::vector<int> ids) {
    text += R"({"timestamp": 0, "input_length": )" + std::to_string(512 * ids.size()) +
            R"(, "output_length": 1, "hash_ids": [)";
    for (size_t i = 0; i < ids.size(); ++i) text += (i ? ", " : "") + std::to_string(ids[i]);
    text += "]}\n";
  };
  const std::vector<int> y = {0, 1, 2, 3, 4, 5, 6, 7};
  req(y);
  req({100});
  for (int w = 200; w < 204; ++w) req({w});
  req({100});
  req(y);
  Trace t = Parse(text);
  const PrefillModel m;
  ReplayResult opt = ReplayBelady(t, 8, nullptr, m);
  ReplayResult ref = ReplayBeladyFlops(t, 8, m);
  CHECK(opt.prefix_hits == 8);  // X once, y0..y6
  CHECK(ref.prefix_hits == 8);  // y0..y7
  double y_all = 0;
  for (uint32_t i = 0; i < 8; ++i) y_all += m.BlockFlops(i, 512);
  CHECK(opt.flops_saved == Approx(y_all - m.BlockFlops(7, 512) + m.BlockFlops(0, 512)));
  CHECK(ref.flops_saved == Approx(y_all));
  CHECK(ref.flops_saved > opt.flops_saved * 1.1);
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
    for (const std::string& name : {std::string(kDefaultEvictionPolicy), std::string("lru-priority")}) {
      INFO(name);
      auto def = ReplayPolicy(*t, name, cap);
      REQUIRE(lru.ok());
      REQUIRE(def.ok());
      CHECK(def->prefix_hit_rate() >= lru->prefix_hit_rate());
      CHECK(ReplayBelady(*t, cap).hits >= def->hits);
    }
  }
}

TEST_CASE("Mooncake trace: sampled shadows hit as full ones do at 5% and 10% capacity", "[replay][trace]") {
  // 9139 and 18279 blocks: the default's experts sample one key in 4 and 8
  // (PolicyOptions::shadow_sample_floor 2048); with a floor of 0 every expert
  // sees every key, as before sampling. Measured: 21.81 vs 21.94% and 29.62 vs
  // 29.51% (docs/eviction.md, "The adaptive default").
  auto t = LoadMooncakeTrace(std::string(KVMESH_TRACE_DIR) + "/conversation_trace.jsonl");
  REQUIRE(t.ok());
  for (double f : {0.05, 0.1}) {
    INFO("capacity fraction " << f);
    const size_t cap = static_cast<size_t>(f * static_cast<double>(t->distinct));
    ReplayOptions full;
    full.shadow_sample_floor = 0;
    auto sampled = ReplayPolicy(*t, "adaptive", cap);
    auto unsampled = ReplayPolicy(*t, "adaptive", cap, full);
    auto lru = ReplayPolicy(*t, "lru", cap);
    REQUIRE(sampled.ok());
    REQUIRE(unsampled.ok());
    REQUIRE(lru.ok());
    INFO("sampled " << sampled->prefix_hit_rate() << ", unsampled " << unsampled->prefix_hit_rate());
    CHECK(sampled->prefix_hits != unsampled->prefix_hits);  // the experts did sample
    CHECK(std::abs(sampled->prefix_hit_rate() - unsampled->prefix_hit_rate()) < 0.003);
    CHECK(sampled->prefix_hit_rate() > lru->prefix_hit_rate());
  }
}

// The held-out generated traces (tests/data/traces/README.md): the default
// policy was not tuned on them. At 1, 2, 5 and 10% of the distinct blocks it
// must reach LRU's prefix hit rate and come within 0.01 of the best other
// policy of the factory. On chat, agent and mix it must also close, on
// average over the four capacities, a quarter of the gap from LRU to Belady
// (it closes 39-47%; RAG, at 11%, is not held to it: docs/eviction.md).
TEST_CASE("Held-out traces: the default policy is at least LRU and within 0.01 of the best other policy",
          "[replay][trace]") {
  std::vector<std::string> paths;
  for (const auto& e : std::filesystem::directory_iterator(KVMESH_TRACE_DIR))
    if (e.path().filename().string().starts_with("heldout-") && e.path().extension() == ".jsonl")
      paths.push_back(e.path().string());
  std::sort(paths.begin(), paths.end());
  REQUIRE(paths.size() == 4);
  std::vector<std::string> others;
  for (const std::string& n : EvictionPolicyNames())
    if (!n.starts_with("adaptive") && (!n.starts_with("tinylfu-") || n == "tinylfu-lru")) others.push_back(n);
  REQUIRE(others.size() == 10);
  for (const std::string& path : paths) {
    auto t = LoadMooncakeTrace(path);
    REQUIRE(t.ok());
    double gap_sum = 0;
    for (double f : {0.01, 0.02, 0.05, 0.1}) {
      INFO(path << " at capacity fraction " << f);
      const size_t cap = static_cast<size_t>(f * static_cast<double>(t->distinct));
      auto def = ReplayPolicy(*t, std::string(kDefaultEvictionPolicy), cap);
      REQUIRE(def.ok());
      double best = 0;
      std::string best_name;
      for (const std::string& n : others) {
        auto r = ReplayPolicy(*t, n, cap);
        REQUIRE(r.ok());
        if (n == "lru") {
          CHECK(def->prefix_hit_rate() >= r->prefix_hit_rate());
          const double opt = ReplayBelady(*t, cap).prefix_hit_rate();
          REQUIRE(opt > r->prefix_hit_rate());
          gap_sum += (def->prefix_hit_rate() - r->prefix_hit_rate()) / (opt - r->prefix_hit_rate());
        }
        if (r->prefix_hit_rate() > best) {
          best = r->prefix_hit_rate();
          best_name = n;
        }
      }
      INFO("best other: " << best_name << " " << best << ", default " << def->prefix_hit_rate());
      CHECK(def->prefix_hit_rate() >= best - 0.01);
    }
    INFO(path << ": mean share of the LRU-to-Belady gap closed " << gap_sum / 4);
    if (path.find("heldout-rag-") == std::string::npos) CHECK(gap_sum / 4 >= 0.25);
  }
}

TEST_CASE("Replay with session closes releases a closed session's private blocks when its answer is done",
          "[replay]") {
  // Session 1 reads block 2, session 0 reads block 1 and closes, session 2
  // reads block 3 and closes, session 1 comes back for block 2. Two blocks of
  // cache: plain LRU evicts 2 for 3; told that session 0 closed, it evicts 1.
  auto trace = [](int out_tokens) {
    return "{\"timestamp\": 0, \"input_length\": 512, \"output_length\": 1, \"hash_ids\": [2], \"session\": 1}\n"
           "{\"timestamp\": 1, \"input_length\": 512, \"output_length\": " +
           std::to_string(out_tokens) +
           ", \"hash_ids\": [1], \"session\": 0, \"closes\": true}\n"
           "{\"timestamp\": 2, \"input_length\": 512, \"output_length\": 1, \"hash_ids\": [3], \"session\": 2, "
           "\"closes\": true}\n"
           "{\"timestamp\": 3, \"input_length\": 512, \"output_length\": 1, \"hash_ids\": [2], \"session\": 1}\n";
  };
  Trace t = Parse(trace(0));
  REQUIRE(t.session == std::vector<int64_t>{1, 0, 2, 1});
  REQUIRE(t.closes == std::vector<uint8_t>{0, 1, 1, 0});
  ReplayOptions o;
  o.derive_hints = false;
  auto plain = ReplayPolicy(t, "lru", 2, o);
  REQUIRE(plain.ok());
  CHECK(plain->prefix_hits == 0);
  CHECK(plain->released == 0);
  o.session_closes = true;
  for (const char* policy : {"lru", "adaptive"}) {
    INFO(policy);
    auto told = ReplayPolicy(t, policy, 2, o);
    REQUIRE(told.ok());
    CHECK(told->prefix_hits == 1);
    CHECK(told->released == 1);  // block 1; block 3's session closes after the last request
  }
  // An answer of 100 tokens is done 2 s later (20 ms per token): too late to help.
  auto late = ReplayPolicy(Parse(trace(100)), "lru", 2, o);
  REQUIRE(late.ok());
  CHECK(late->prefix_hits == 0);
  CHECK(late->released == 0);

  // A block another session read is not private: it is not released.
  auto two = [](int other_block) {
    return "{\"timestamp\": 0, \"input_length\": 512, \"output_length\": 1, \"hash_ids\": [1], \"session\": 0}\n"
           "{\"timestamp\": 1, \"input_length\": 512, \"output_length\": 1, \"hash_ids\": [" +
           std::to_string(other_block) +
           "], \"session\": 1}\n"
           "{\"timestamp\": 2, \"input_length\": 512, \"output_length\": 0, \"hash_ids\": [1], \"session\": 0, "
           "\"closes\": true}\n"
           "{\"timestamp\": 3, \"input_length\": 512, \"output_length\": 1, \"hash_ids\": [5], \"session\": 2}\n";
  };
  auto shared = ReplayPolicy(Parse(two(1)), "lru", 4, o);
  REQUIRE(shared.ok());
  CHECK(shared->released == 0);
  auto own = ReplayPolicy(Parse(two(4)), "lru", 4, o);
  REQUIRE(own.ok());
  CHECK(own->released == 1);

  // Bad session fields name the line.
  std::istringstream bad("{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 1, \"hash_ids\": [1], "
                         "\"session\": -1}\n");
  CHECK(ParseMooncakeTrace(bad, "s").status().message() == "s:1: 'session' must be a non-negative integer");
  std::istringstream bad2("{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 1, \"hash_ids\": [1], "
                          "\"session\": 1, \"closes\": 1}\n");
  CHECK(ParseMooncakeTrace(bad2, "s").status().message() == "s:1: 'closes' must be true or false");
  // A Mooncake trace has neither.
  CHECK(Parse(kSmall).session.empty());
}

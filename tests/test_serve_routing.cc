// bench-serve's request routing (cli/serve/routing.h): KV-aware routing sends
// a session's next turn to the engine whose prefix cache holds its past (from
// the engines' own cache events, or inferred from where requests went), falls
// back to load, and forgets what an engine evicted; in a tiny open-loop run
// over four engines it finds more of each later turn in the local caches
// than round robin does.
#include <map>

#include <catch2/catch.hpp>

#include "cli/serve/bench_serve.h"
#include "cli/serve/routing.h"
#include "cli/serve/workload.h"

using namespace kvmesh::serve;

namespace {

ServeRequest Request(uint32_t session, uint32_t turn, uint32_t first, size_t n) {
  ServeRequest r;
  r.session = session;
  r.turn = turn;
  for (size_t i = 0; i < n; ++i) r.prompt.push_back(first + static_cast<uint32_t>(i));
  return r;
}

// What the engine's cache holds after serving r (its prompt; the output is empty here).
std::vector<uint64_t> Held(const ServeRequest& r) { return BlockChain(r.prompt, 16); }

}  // namespace

TEST_CASE("routing: a configuration's suffix names its routing", "[serve]") {
  CHECK(RoutingOf("kvmesh").routing == Routing::kRoundRobin);
  CHECK(RoutingOf("kvmesh-kv").base == "kvmesh");
  CHECK(RoutingOf("kvmesh-kv").routing == Routing::kKvAware);
  CHECK(RoutingOf("kvmesh-ssd-kv-approx").base == "kvmesh-ssd");
  CHECK(RoutingOf("kvmesh-ssd-kv-approx").routing == Routing::kKvApprox);
  CHECK(RoutingOf("-kv").routing == Routing::kRoundRobin);  // no configuration before the suffix
}

TEST_CASE("routing: KV-aware follows the engines' cache events, then load", "[serve]") {
  RequestRouter router(Routing::kKvAware, 4, 16, 64, 0);
  std::vector<LocalCacheListener> feed;
  for (uint32_t e = 0; e < 4; ++e) feed.push_back(router.Listener(e));
  const ServeRequest a0 = Request(1, 0, 1000, 256), b0 = Request(2, 0, 5000, 256);
  ServeRequest a1 = a0;
  a1.turn = 1;
  for (uint32_t t = 0; t < 64; ++t) a1.prompt.push_back(9000 + t);
  std::vector<uint64_t> in_flight = {3, 3, 0, 3};
  // Nothing cached anywhere: the least loaded engine.
  CHECK(router.Pick(a0, in_flight) == 2);
  feed[2](Held(a0), {});
  in_flight = {0, 1, 4, 1};
  CHECK(router.Pick(b0, in_flight) == 0);  // b shares nothing with a: load decides
  feed[0](Held(b0), {});
  // a's next turn goes where a's past is, although that engine is the busiest.
  CHECK(router.Pick(a1, in_flight) == 2);
  // Engine 2 evicted a's blocks: load decides again.
  feed[2]({}, Held(a0));
  CHECK(router.Pick(a1, in_flight) == 0);
  CHECK(router.counters().picks == 4);
  CHECK(router.counters().prefix_picks == 1);
  CHECK(router.counters().predicted_blocks == 16);
  // Round robin ignores all of it.
  RequestRouter rr(Routing::kRoundRobin, 4, 16, 64, 0);
  CHECK(!rr.Listener(0));
  CHECK(rr.Pick(a0, in_flight) == 0);
  CHECK(rr.Pick(a1, in_flight) == 1);
}

TEST_CASE("routing: approximate mode follows its own routing history", "[serve]") {
  RequestRouter router(Routing::kKvApprox, 3, 16, 64, 60);
  CHECK(!router.Listener(0));  // no engine events
  const ServeRequest a0 = Request(1, 0, 1000, 256);
  ServeRequest a1 = a0;
  a1.turn = 1;
  for (uint32_t t = 0; t < 64; ++t) a1.prompt.push_back(9000 + t);
  CHECK(router.Pick(a0, {2, 0, 2}) == 1);
  CHECK(router.Pick(a1, {0, 3, 0}) == 1);  // where a's first turn went
  CHECK(router.counters().prefix_picks == 1);
}

TEST_CASE("routing: in a tiny run KV-aware routing finds more of later turns locally than round robin",
          "[serve]") {
  BenchServeOptions o;
  o.cluster = "embedded";
  o.rates = {6};
  o.engines = 4;
  o.drain_s = 15;
  o.local_cache_blocks = 4096;  // room for every session: only the routing differs
  o.workload.duration_s = 2;
  o.workload.turns = 3;
  o.workload.think_s = 0.5;
  o.workload.system_tokens = 256;
  o.workload.agent_preamble_tokens = 512;
  o.workload.user_tokens = 64;
  o.workload.tool_tokens = 128;
  o.workload.output_tokens = 16;
  o.workload.seed = 11;
  o.configs = {"local", "local-kv", "local-kv-approx"};
  const auto results = RunBenchServe(o);
  INFO(results.status().ToString());
  REQUIRE(results.ok());
  std::map<std::string, RunResult> by;
  for (const RunResult& r : *results) by[r.config] = r;
  REQUIRE(by.size() == 3);
  for (const auto& [name, r] : by) {
    INFO(name);
    CHECK(r.finished == r.requests);
    CHECK(r.routing.picks == r.requests);
  }
  CHECK(by["local"].routing.prefix_picks == 0);
  for (const char* kv : {"local-kv", "local-kv-approx"}) {
    INFO(kv);
    CHECK(by[kv].routing.prefix_picks > 0);
    CHECK(by[kv].later_turn_hit_rate > by["local"].later_turn_hit_rate + 0.1);
  }
}

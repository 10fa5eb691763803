// kvmesh bench-serve --workload worldmodel (cli/serve/world_serve.h): the
// frame-session schedule, and a tiny open-loop run on an embedded cluster
// whose invariants hold whatever the machine's speed: wm-off holds its KV in
// the engines, the kvmesh configurations in kvmesh; exact-only reuse of noisy
// frames reuses nothing and, its context read back from kvmesh, gives wm-off's
// logits bit for bit; the gate reuses most patches of static scenes and holds
// less KV than wm-off; an engine-side copy of the referenced blocks changes
// what is read from kvmesh, not the result.
#include <unistd.h>

#include <filesystem>
#include <map>

#include <catch2/catch.hpp>

#include "cli/serve/world_serve.h"

using namespace kvmesh::serve;

TEST_CASE("world serve: sessions' frames arrive 1/fps apart, sorted, the same for the same seed", "[serve]") {
  WorldServeOptions o;
  o.duration_s = 10;
  o.session_frames = 6;
  o.fps = 5;
  o.scenes = {"static", "pan"};
  const WorldSchedule s = MakeWorldSchedule(o, 12).value();
  REQUIRE(s.sessions.size() >= 2);
  CHECK(s.frames.size() == s.sessions.size() * o.session_frames);
  std::map<uint32_t, uint32_t> next;
  for (size_t i = 0; i < s.frames.size(); ++i) {
    const WorldFrameRequest& q = s.frames[i];
    if (i > 0) CHECK(s.frames[i - 1].arrival_s <= q.arrival_s);
    CHECK(q.frame == next[q.session]++);  // a session's frames in order
    CHECK(q.arrival_s == Approx(s.sessions[q.session].start_s + q.frame / o.fps));
  }
  CHECK(s.sessions[0].scene.name == "static");
  CHECK(s.sessions[1].scene.name == "pan");
  CHECK(s.sessions[0].scene.seed != s.sessions[2 % s.sessions.size()].scene.seed);
  const WorldSchedule again = MakeWorldSchedule(o, 12).value();
  REQUIRE(again.frames.size() == s.frames.size());
  CHECK(again.frames.back().arrival_s == s.frames.back().arrival_s);
  o.scenes = {"no-such-scene"};
  CHECK_FALSE(MakeWorldSchedule(o, 12).ok());
}

TEST_CASE("world serve: a tiny run on an embedded cluster keeps its invariants", "[serve]") {
  BenchServeOptions b;
  b.cluster = "embedded";
  b.engines = 2;
  b.node_memory = 64ull << 20;
  b.drain_s = 15;
  WorldServeOptions o;
  o.rates = {16};
  o.duration_s = 2;
  o.session_frames = 8;
  o.fps = 20;
  o.scenes = {"static", "static-b"};
  o.slo_frame_s = 10;  // a loose bound: this checks the accounting, not the machine's speed
  o.configs = {"wm-off", "wm-exact", "wm-kvmesh", "wm-kvmesh-local"};
  const std::vector<WorldRunResult> runs = RunWorldServe(b, o).value();
  REQUIRE(runs.size() == 4);
  std::map<std::string, WorldRunResult> by;
  for (const WorldRunResult& r : runs) by[r.config] = r;
  for (const WorldRunResult& r : runs) {
    INFO(r.config);
    CHECK(r.frames > 0);
    CHECK(r.frames == r.sessions * o.session_frames);
    CHECK(r.finished == r.frames);
    CHECK(r.compared == r.finished);
    CHECK(r.latency.size() == r.frames);
    CHECK(r.p50 <= r.p99);
    CHECK(r.service_p50 <= r.p50 + 1e-9);
    CHECK(r.goodput <= r.offered_fps + 1e-9);
    CHECK(r.put_failures == 0);
    CHECK(r.reuse_misses == 0);
    CHECK(r.history_misses == 0);
  }
  const WorldRunResult &off = by["wm-off"], &exact = by["wm-exact"], &sim = by["wm-kvmesh"];
  // wm-off: the reference itself; its KV lives in the engines.
  CHECK(off.err_max_abs == 0);
  CHECK(off.reuse == 0);
  CHECK(off.kvmesh_kv_peak == 0);
  CHECK(off.engine_kv_peak > 0);
  CHECK(off.bytes_put == 0);
  // Sensor noise defeats exact-only reuse; every patch computed from context
  // read back from kvmesh gives the engine-memory run's logits exactly.
  CHECK(exact.reuse == 0);
  CHECK(exact.err_max_abs == 0);
  CHECK(exact.agreement == 1);
  CHECK(exact.engine_kv_peak == 0);
  CHECK(exact.kvmesh_kv_peak > 0);
  // The gate: most patches of a static scene reuse a block stored once, and
  // (with the context fingerprint, the default) only where recomputation
  // would give the same block: the logits are wm-off's up to float
  // summation order.
  CHECK(sim.reuse > 0.6);
  CHECK(sim.engine_kv_peak == 0);
  CHECK(sim.kvmesh_kv_peak > 0);
  CHECK(sim.kvmesh_kv_peak < off.engine_kv_peak);
  CHECK(sim.bytes_put < exact.bytes_put);
  CHECK(sim.blocks_read > 0);
  CHECK(sim.agreement == 1);
  CHECK(sim.err_max_abs < 1e-4);
  // The engine's copy serves the same blocks: the same matches and logits,
  // far fewer reads from kvmesh, and at most wm-off's KV in the engine.
  const WorldRunResult& local = by["wm-kvmesh-local"];
  CHECK(local.reuse == sim.reuse);
  CHECK(local.err_mean_abs == sim.err_mean_abs);
  CHECK(local.err_max_abs == sim.err_max_abs);
  CHECK(local.bytes_put == sim.bytes_put);
  CHECK(local.blocks_read < sim.blocks_read / 4);
  CHECK(local.engine_kv_peak > 0);
  CHECK(local.engine_kv_peak < off.engine_kv_peak);
  const WorldRatios q = CompareWorld(runs);
  CHECK(q.top_rate == 16);
  CHECK(q.top_kv_ratio == Approx(sim.kvmesh_kv_peak / off.engine_kv_peak));

  // The pixel gate alone reuses blocks computed from another context: more
  // reuse, and an error that is measured, not zero (docs/worldmodel.md).
  o.context_gate = false;
  o.configs = {"wm-off", "wm-kvmesh"};
  const std::vector<WorldRunResult> pixel = RunWorldServe(b, o).value();
  REQUIRE(pixel.size() == 2);
  const WorldRunResult& loose = pixel[1].config == "wm-kvmesh" ? pixel[1] : pixel[0];
  INFO("pixel gate alone: reuse " << loose.reuse << " vs " << sim.reuse << ", error " << loose.err_mean_abs);
  CHECK(loose.reuse > sim.reuse);
  CHECK(loose.err_mean_abs > 1e-4);
  CHECK(loose.agreement < 1);
}

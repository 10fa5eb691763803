// cli/serve/world_serve.h — `kvmesh bench-serve --workload worldmodel`: the
// world-model deployment case under load (issue 33), frame sessions of the
// reference world model (coordinator/decode/world_model.h) served with and
// without kvmesh (docs/serving.md, "World-model frame sessions").
//
// A session is a stream of generated frames (frame_gen.h; each session one
// scene preset, cycling through `scenes`, with its own seed); sessions start
// as a Poisson process at rate / session_frames per second and a session's
// frames arrive 1 / fps apart, whatever the engines do (open loop). Every
// frame is one request: the engine that owns the session (session % engines;
// a world-model engine keeps a session's state) computes it with the
// reference model for real on this CPU, one frame at a time, in arrival
// order. Configurations:
//   wm-off     every patch of every frame computed; the KV of the session's
//              last window - 1 frames kept in the engine's memory for
//              temporal attention (no kvmesh). Its logits are the reference.
//   wm-exact   KV in kvmesh through a FrameStream (frame_stream.h), reuse of
//              pixel-identical patches only (what exact-hash caches can do)
//   wm-kvmesh  the same with similarity-gated reuse (SSIM and change gates):
//              a matched patch reads the earlier frame's block, the others are
//              computed with their temporal context read from kvmesh
//   wm-kvmesh-local  the same gate, and the engine keeps one copy of each
//              block its sessions' windows reference (as the token engines
//              keep a local prefix cache in front of kvmesh): reads from
//              kvmesh only what the copy lacks
// The kvmesh tier is the one the token runs use (bench_serve.h: daemons or
// embedded). Per run: frame latency (arrival to logits), frames/s, goodput
// at a frame-latency SLO, KV bytes held (in the engines, in kvmesh: blocks
// the open streams reference), reuse and the logits' error against wm-off
// for the same frames.
//
// Thread-safety: RunWorldServe is a function of its options; one at a time
// per process.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/serve/bench_serve.h"
#include "coordinator/decode/frame_gen.h"
#include "coordinator/decode/world_model.h"
#include "kvmesh/frame_stream.h"
#include "kvmesh/status.h"

namespace kvmesh::serve {

struct WorldServeOptions {
  std::vector<double> rates = {10, 20, 40, 80};  // frames/s offered (all sessions together)
  std::vector<std::string> configs = {"wm-off", "wm-kvmesh", "wm-kvmesh-local"};
  double duration_s = 20;        // sessions start in [0, duration_s)
  uint32_t session_frames = 32;  // frames per session
  double fps = 10;               // a session's frames arrive this many a second
  // Scene presets (FrameGenPresets), one per session in turn: tuned and held-out ones.
  std::vector<std::string> scenes = {"static", "busy", "static-b", "drift", "pan", "cuts", "noisy"};
  uint64_t seed = 1;
  double slo_frame_s = 0.1;  // a frame meets the SLO when its latency is at most this
  // The model of `kvmesh worldmodel` (docs/worldmodel.md): 4-pixel patches
  // (256 a frame), the VQ tokenizer, K and V from the patch's embedding.
  decode::WorldModelConfig model = [] {
    decode::WorldModelConfig m;
    m.patch = 4;
    m.codes = 512;
    m.input_kv = true;
    return m;
  }();
  FrameMatchOptions gate;    // wm-kvmesh's gate (its mode is the configuration's)
  // wm-kvmesh and wm-kvmesh-local also check each block's fingerprint
  // (WorldModel::Signatures): a block is reused only where recomputation
  // would give the same block (exact reuse; off: the pixel gate alone).
  bool context_gate = true;
};

// The schedule of one rate: sessions and their frames by arrival time.
struct WorldSession {
  decode::FrameGenParams scene;
  double start_s = 0;
  uint32_t frames = 0;
};
struct WorldFrameRequest {
  uint32_t session = 0, frame = 0;
  double arrival_s = 0;
};
struct WorldSchedule {
  std::vector<WorldSession> sessions;
  std::vector<WorldFrameRequest> frames;  // sorted by arrival
};
Result<WorldSchedule> MakeWorldSchedule(const WorldServeOptions& o, double rate);

struct WorldRunResult {
  std::string config;
  double rate = 0;                  // offered frames/s, nominal
  uint64_t frames = 0, finished = 0, met_slo = 0, sessions = 0;
  double window_s = 0, offered_fps = 0;
  double p50 = 0, p99 = 0;          // frame latency, s (unfinished: time waited, a floor)
  double service_p50 = 0, service_p99 = 0;  // the engine's time on the frame alone
  double fps = 0, goodput = 0;      // finished / busy time; met SLO / arrival window
  double reuse = 0;                 // patches reused / patches computed or reused
  // KV bytes held between frames, sampled every 20 ms: in the engines (wm-off:
  // the sessions' past frames; wm-kvmesh-local: its copy) and in kvmesh (blocks the open streams
  // reference: stored once however many frames reuse them).
  double engine_kv_peak = 0, engine_kv_mean = 0, kvmesh_kv_peak = 0, kvmesh_kv_mean = 0;
  uint64_t bytes_put = 0, blocks_read = 0, reuse_misses = 0, history_misses = 0, put_failures = 0;
  // Logits of the finished frames against wm-off's for the same frames.
  double err_mean_abs = 0, err_max_abs = 0, agreement = 1;
  uint64_t compared = 0;            // frames compared
  bool sustained = false;           // every frame finished and p99 <= SLO
  std::vector<double> latency;      // per frame, schedule order
  double seconds = 0;
};

// Every configuration at every rate; the cluster, engines, drain and kvmesh
// binary come from `base`. InvalidArgument for an unknown configuration or
// scene.
Result<std::vector<WorldRunResult>> RunWorldServe(const BenchServeOptions& base, const WorldServeOptions& o,
                                                  const ServeProgress& progress = {});

// wm-kvmesh (or `a`) against wm-off (or `b`): frames/s at the SLO (the highest
// rate each sustains), and at the highest rate both sustain the ratios of p99,
// peak KV bytes (engine + kvmesh) and goodput.
struct WorldRatios {
  std::string a = "wm-kvmesh", b = "wm-off";
  double a_max_sustained = 0, b_max_sustained = 0;  // offered frames/s; 0: none
  double both_rate = 0;                             // highest rate both sustain; 0: none
  double p99_ratio = 0, kv_ratio = 0;               // a / b at both_rate
  double top_rate = 0, top_p99_ratio = 0, top_goodput_ratio = 0, top_kv_ratio = 0;  // at the highest rate run
};
WorldRatios CompareWorld(const std::vector<WorldRunResult>& results, const std::string& a = "wm-kvmesh",
                         const std::string& b = "wm-off");

void PrintWorldTable(const WorldServeOptions& o, const std::vector<WorldRunResult>& results);
nlohmann::json WorldResultsJson(const BenchServeOptions& base, const WorldServeOptions& o,
                                const std::vector<WorldRunResult>& results);
// <prefix>-frame-p99.png, <prefix>-goodput.png and <prefix>-kv.png (gnuplot).
bool WriteWorldPlots(const std::string& prefix, const WorldServeOptions& o,
                     const std::vector<WorldRunResult>& results);

}  // namespace kvmesh::serve

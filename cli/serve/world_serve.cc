#include "cli/serve/world_serve.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>

#include "cli/serve/daemons.h"
#include "cli/serve/report.h"
#include "coordinator/decode/world_run.h"
#include "kvmesh/router.h"

namespace kvmesh::serve {
namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;
using decode::WorldModel;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

Result<FrameReuse> ModeOf(const std::string& config) {
  if (config == "wm-off") return FrameReuse::kOff;
  if (config == "wm-exact") return FrameReuse::kExact;
  if (config == "wm-kvmesh" || config == "wm-kvmesh-local") return FrameReuse::kSimilar;
  return InvalidArgument("unknown world-model configuration '" + config +
                         "' (wm-off, wm-exact, wm-kvmesh, wm-kvmesh-local)");
}

struct FrameRecord {
  double arrival = 0, start = -1, finish = -1;  // s from the run's origin
  uint32_t patches = 0, reused = 0;
  uint64_t blocks_read = 0, history_misses = 0;
};

// What the engines of one run share, read-only (records and logits: each
// frame's slot is written by the engine that owns its session only).
struct RunShared {
  const WorldServeOptions* o = nullptr;
  const WorldSchedule* sched = nullptr;
  const std::vector<std::vector<uint8_t>>* pixels = nullptr;  // per frame request
  const std::vector<uint32_t>* actions = nullptr;
  const WorldModel* model = nullptr;
  FrameReuse mode = FrameReuse::kOff;
  bool local_copy = false;  // wm-kvmesh-local: the engine keeps the blocks its sessions' windows reference
  Clock::time_point origin;
  std::vector<FrameRecord>* recs = nullptr;
  std::vector<std::vector<float>>* logits = nullptr;
};

// One world-model engine: a thread serving the frames of its sessions in
// arrival order, one at a time. wm-off keeps each open session's last
// window - 1 frames of KV in its own memory; the kvmesh configurations keep a
// FrameStream per open session and read reused blocks and temporal context
// into one registered region of the engine.
class WorldEngine {
 public:
  WorldEngine(const RunShared& s, Router* router) : s_(s), router_(router), step_(*s.model, s.o->gate.window) {
    const auto& c = s.model->config();
    N_ = c.num_patches();
    BF_ = c.BlockFloats();
    BB_ = c.BlockBytes();
    reused_.assign(N_, nullptr);
    history_.resize(N_);
    missed_.resize(N_);
  }
  ~WorldEngine() {
    Abort();
    Join();
    sessions_.clear();  // ends the streams before the region goes
    if (router_ && region_.base) (void)router_->UnregisterMemory(region_.id);
  }

  Status Open() {
    if (!router_) return Status::Ok();
    KVMESH_ASSIGN_OR_RETURN(region_, router_->AllocateMemory(step_.RegionBytes()));
    step_.SetRegion(region_.base);
    return Status::Ok();
  }
  void Start() { thread_ = std::thread([this] { Loop(); }); }
  void Submit(size_t i) {
    std::lock_guard<std::mutex> l(mu_);
    queue_.push_back(i);
    cv_.notify_one();
  }
  void Finish() {
    std::lock_guard<std::mutex> l(mu_);
    finishing_ = true;
    cv_.notify_one();
  }
  void Abort() {
    std::lock_guard<std::mutex> l(mu_);
    abort_ = true;
    cv_.notify_one();
  }
  void Join() {
    if (thread_.joinable()) thread_.join();
  }
  // Serves frame i on the caller's thread (the reference logits, untimed).
  Status ServeNow(size_t i) { return Serve(i); }

  uint64_t finished() const { return finished_.load(); }
  uint64_t errors() const { return errors_.load(); }
  uint64_t engine_kv() const { return engine_kv_.load(); }
  uint64_t kvmesh_kv() const { return kvmesh_kv_.load(); }
  const Status& first_error() const { return first_error_; }  // after Join
  FrameStreamStats stream_stats() const { return stats_; }    // after Join: ended streams and open ones

 private:
  struct Session {
    std::deque<std::vector<float>> past;  // wm-off: the last window - 1 frames' blocks, oldest first
    std::unique_ptr<FrameStream> stream;  // kvmesh configurations
    // Tokens (every configuration) and, with the context gate, fingerprints.
    std::unique_ptr<decode::WorldStreamContext> ctx;
    uint64_t held = 0;                    // bytes this session holds in kvmesh (wm-off: in the engine)
    // wm-kvmesh-local: the blocks the stream's window references, one copy each.
    std::map<BlockKey, std::vector<float>> copy;
    uint64_t copy_held = 0;
  };

  void Loop() {
    for (;;) {
      size_t i;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return abort_ || finishing_ || !queue_.empty(); });
        if (abort_ || queue_.empty()) break;
        i = queue_.front();
        queue_.pop_front();
      }
      const Status st = Serve(i);
      if (!st.ok()) {
        if (errors_.fetch_add(1) == 0) first_error_ = st;
      } else {
        finished_.fetch_add(1);
      }
    }
  }

  Status Serve(size_t i) {
    const WorldFrameRequest& q = s_.sched->frames[i];
    FrameRecord& rec = (*s_.recs)[i];
    const auto t0 = Clock::now();
    rec.start = Seconds(t0 - s_.origin);
    Session& ss = sessions_[q.session];
    const std::vector<uint8_t>& pixels = (*s_.pixels)[i];
    rec.patches = N_;
    if (!ss.ctx)
      ss.ctx = std::make_unique<decode::WorldStreamContext>(
          *s_.model, s_.o->gate.window, s_.o->context_gate && s_.mode == FrameReuse::kSimilar && router_);
    KVMESH_RETURN_IF_ERROR(ss.ctx->Begin(pixels));
    if (s_.mode == FrameReuse::kOff || !router_) {
      KVMESH_RETURN_IF_ERROR(ComputeLocal(ss, pixels, (*s_.actions)[i]));
    } else {
      KVMESH_RETURN_IF_ERROR(ComputeKvmesh(ss, q, pixels, (*s_.actions)[i], rec));
    }
    rec.finish = Seconds(Clock::now() - s_.origin);
    (*s_.logits)[i].assign(step_.logits().begin(), step_.logits().end());
    if (q.frame + 1 == s_.sched->sessions[q.session].frames) {  // the session's last frame: it ends
      KVMESH_RETURN_IF_ERROR(EndSession(q.session));
    }
    return Status::Ok();
  }

  // Every patch computed, temporal context from the engine's own copy of the
  // session's past frames.
  Status ComputeLocal(Session& ss, const std::vector<uint8_t>& pixels, uint32_t action) {
    for (uint32_t p = 0; p < N_; ++p) {
      reused_[p] = nullptr;
      history_[p].clear();
      for (const std::vector<float>& f : ss.past) history_[p].push_back(f.data() + size_t{p} * BF_);
    }
    decode::WorldFrameInput in{pixels, action, reused_, history_};
    in.tokens = ss.ctx->tokens();
    KVMESH_RETURN_IF_ERROR(s_.model->ComputeFrame(in, step_.blocks(), step_.logits()));
    ss.ctx->End();
    const uint32_t keep = std::max<uint32_t>(s_.model->config().window, 1) - 1;
    if (keep == 0) return Status::Ok();
    std::vector<float> f;
    if (ss.past.size() >= keep) {  // recycle the oldest frame's buffer
      f = std::move(ss.past.front());
      ss.past.pop_front();
    }
    f.assign(step_.blocks().begin(), step_.blocks().end());
    ss.past.push_back(std::move(f));
    SetHeld(ss, uint64_t(ss.past.size()) * N_ * BB_, engine_kv_);
    return Status::Ok();
  }

  // The frame through its session's FrameStream: match, read the reused
  // blocks and the computed patches' temporal context, compute, put.
  Status ComputeKvmesh(Session& ss, const WorldFrameRequest& q, const std::vector<uint8_t>& pixels,
                       uint32_t action, FrameRecord& rec) {
    const auto& c = s_.model->config();
    if (!ss.stream) {
      FrameStreamOptions so;
      so.stream_id = q.session + 1;
      so.width = c.width;
      so.height = c.height;
      so.patch = c.patch;
      so.match = s_.o->gate;
      so.match.mode = s_.mode;
      KVMESH_ASSIGN_OR_RETURN(ss.stream, FrameStream::Open(*router_, so));
    }
    FrameStream& st = *ss.stream;
    decode::WorldStreamContext& ctx = *ss.ctx;
    KVMESH_ASSIGN_OR_RETURN(FrameMatch m, st.Match(pixels, nullptr, ctx.tags()));
    // The engine's copy serves what it holds (wm-kvmesh-local); kvmesh the rest.
    decode::WorldFrameStep::Held held;
    if (s_.local_copy)
      held = [&ss](const BlockKey& k) -> const float* {
        auto it = ss.copy.find(k);
        return it == ss.copy.end() ? nullptr : it->second.data();
      };
    decode::WorldFrameStep::Counts counts;
    decode::WorldFrameInput in{pixels, action, {}, {}};
    in.tokens = ctx.tokens();
    KVMESH_RETURN_IF_ERROR(step_.Run(*router_, st, m, in, held, counts, missed_));
    rec.blocks_read = counts.blocks_read;
    rec.history_misses += counts.history_misses;
    for (uint32_t p = 0; p < N_; ++p)
      if (missed_[p]) ctx.Missed(p);
    KVMESH_RETURN_IF_ERROR(st.Commit(m, pixels, step_.put_src(), ctx.tags()));
    ctx.End();
    rec.reused = static_cast<uint32_t>(m.reused());
    const FrameStreamStats& x = st.stats();
    SetHeld(ss, (x.blocks_put - std::min(x.blocks_put, x.released)) * BB_, kvmesh_kv_);
    if (s_.local_copy) UpdateCopy(ss, m);
    return Status::Ok();
  }

  // wm-kvmesh-local: the frame's blocks join the engine's copy (computed ones
  // and reused ones read from kvmesh), blocks the window no longer references
  // leave it.
  void UpdateCopy(Session& ss, const FrameMatch& m) {
    for (uint32_t p = 0; p < N_; ++p) {
      const BlockKey& k = m.patches[p].key;
      if (ss.copy.count(k)) continue;
      const float* src = step_.used(p);
      ss.copy.emplace(k, std::vector<float>(src, src + BF_));
    }
    for (auto it = ss.copy.begin(); it != ss.copy.end();)
      it = ss.stream->References(it->first) == 0 ? ss.copy.erase(it) : std::next(it);
    const uint64_t bytes = uint64_t(ss.copy.size()) * BB_;
    engine_kv_.fetch_add(bytes - ss.copy_held);
    ss.copy_held = bytes;
  }

  void SetHeld(Session& ss, uint64_t bytes, std::atomic<uint64_t>& total) {
    total.fetch_add(bytes - ss.held);  // unsigned wrap-around adds a decrease correctly
    ss.held = bytes;
  }

  Status EndSession(uint32_t id) {
    auto it = sessions_.find(id);
    if (it == sessions_.end()) return Status::Ok();
    Session& ss = it->second;
    Status st = Status::Ok();
    if (ss.stream) {
      st = ss.stream->End();
      Add(ss.stream->stats());
      SetHeld(ss, 0, kvmesh_kv_);
      engine_kv_.fetch_sub(ss.copy_held);
    } else {
      SetHeld(ss, 0, engine_kv_);
    }
    sessions_.erase(it);
    return st;
  }

  void Add(const FrameStreamStats& x) {
    stats_.frames += x.frames;
    stats_.patches += x.patches;
    stats_.reused += x.reused;
    stats_.blocks_put += x.blocks_put;
    stats_.bytes_put += x.bytes_put;
    stats_.put_failures += x.put_failures;
    stats_.reuse_misses += x.reuse_misses;
    stats_.released += x.released;
  }

 public:
  // Adds the streams still open (an aborted run) to stream_stats(). After Join.
  void CollectOpen() {
    for (auto& [id, ss] : sessions_)
      if (ss.stream) Add(ss.stream->stats());
  }

 private:
  RunShared s_;
  Router* router_;
  uint32_t N_ = 0;
  size_t BF_ = 0, BB_ = 0;
  MemoryRegion region_;
  decode::WorldFrameStep step_;           // kvmesh configurations' frames; its blocks and logits serve wm-off too
  std::vector<uint8_t> missed_;               // kvmesh configurations: 1 where a context block missed
  std::vector<const float*> reused_;          // wm-off: every patch computed
  std::vector<std::vector<const float*>> history_;  // wm-off: the session's past frames
  std::unordered_map<uint32_t, Session> sessions_;
  FrameStreamStats stats_;

  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<size_t> queue_;
  bool finishing_ = false, abort_ = false;
  std::atomic<uint64_t> finished_{0}, errors_{0}, engine_kv_{0}, kvmesh_kv_{0};
  Status first_error_ = Status::Ok();
};

// The cluster of the world model's KV block (one patch a block, fp32).
Roofline WorldShape(const decode::WorldModelConfig& c) {
  const ModelSpec spec = c.Spec();
  ModelShape m;
  m.name = spec.model_id;
  m.layers = spec.num_layers;
  m.kv_heads = spec.num_kv_heads;
  m.head_dim = spec.head_dim;
  m.heads = spec.num_kv_heads;
  m.hidden = c.hidden;
  m.dtype_bytes = 4;
  return Roofline(m, GpuSpec{"cpu", 1, 1, 0});
}

// Latency, throughput, goodput, reuse and KV of one run.
WorldRunResult Summarise(const std::string& config, double rate, const WorldServeOptions& o,
                         const WorldSchedule& sched, const std::vector<FrameRecord>& recs, double end_s) {
  WorldRunResult r;
  r.config = config;
  r.rate = rate;
  r.frames = recs.size();
  r.sessions = sched.sessions.size();
  if (recs.empty()) return r;
  r.window_s = std::max(sched.frames.back().arrival_s - sched.frames.front().arrival_s, 1e-3);
  r.offered_fps = double(r.frames) / r.window_s;
  std::vector<double> service;
  double last_finish = 0;
  uint64_t patches = 0, reused = 0;
  for (const FrameRecord& x : recs) {
    const bool done = x.finish >= 0;
    const double lat = done ? x.finish - x.arrival : end_s - x.arrival;
    r.latency.push_back(lat);
    if (!done) continue;
    ++r.finished;
    if (lat <= o.slo_frame_s) ++r.met_slo;
    service.push_back(x.finish - x.start);
    last_finish = std::max(last_finish, x.finish);
    patches += x.patches;
    reused += x.reused;
    r.blocks_read += x.blocks_read;
    r.history_misses += x.history_misses;
  }
  r.p50 = Percentile(r.latency, 50);
  r.p99 = Percentile(r.latency, 99);
  r.service_p50 = Percentile(service, 50);
  r.service_p99 = Percentile(service, 99);
  r.fps = double(r.finished) / std::max(last_finish - sched.frames.front().arrival_s, 1e-3);
  r.goodput = double(r.met_slo) / r.window_s;
  r.reuse = patches ? double(reused) / double(patches) : 0;
  r.sustained = r.finished == r.frames && r.p99 <= o.slo_frame_s;
  return r;
}

// The logits' error of `runs` against `ref` (same schedule), over the frames
// both finished.
void ScoreAgainst(WorldRunResult& r, const std::vector<std::vector<float>>& mine,
                  const std::vector<std::vector<float>>& ref, uint32_t vocab) {
  double sum = 0, agree = 0;
  r.compared = 0;
  r.err_max_abs = 0;
  for (size_t i = 0; i < mine.size() && i < ref.size(); ++i) {
    if (mine[i].empty() || ref[i].empty()) continue;
    const decode::LogitError e = decode::CompareLogits(mine[i], ref[i], vocab);
    sum += e.mean_abs;
    agree += e.token_agreement;
    r.err_max_abs = std::max(r.err_max_abs, e.max_abs);
    ++r.compared;
  }
  r.err_mean_abs = r.compared ? sum / double(r.compared) : 0;
  r.agreement = r.compared ? agree / double(r.compared) : 1;
}

}  // namespace

Result<WorldSchedule> MakeWorldSchedule(const WorldServeOptions& o, double rate) {
  if (!(rate > 0)) return InvalidArgument("world model: a rate must be positive");
  if (!(o.fps > 0)) return InvalidArgument("--wm-fps must be positive");
  if (o.session_frames == 0) return InvalidArgument("--wm-frames must be at least 1");
  if (o.scenes.empty()) return InvalidArgument("--wm-scenes: empty list");
  std::vector<decode::FrameGenParams> scenes;
  for (const std::string& name : o.scenes) {
    KVMESH_ASSIGN_OR_RETURN(decode::FrameGenParams p, decode::FrameGenPresetByName(name));
    p.width = o.model.width;
    p.height = o.model.height;
    scenes.push_back(p);
  }
  WorldSchedule s;
  std::mt19937_64 rng(o.seed * 0x9e3779b97f4a7c15ull + uint64_t(rate * 1000));
  std::exponential_distribution<double> gap(rate / o.session_frames);
  for (double t = gap(rng); t < o.duration_s; t += gap(rng)) {
    WorldSession w;
    w.scene = scenes[s.sessions.size() % scenes.size()];
    w.scene.seed = w.scene.seed + 7919 * (s.sessions.size() + 1) + o.seed;  // its own background and sprites
    w.start_s = t;
    w.frames = o.session_frames;
    s.sessions.push_back(w);
  }
  for (uint32_t id = 0; id < s.sessions.size(); ++id)
    for (uint32_t f = 0; f < o.session_frames; ++f)
      s.frames.push_back(WorldFrameRequest{id, f, s.sessions[id].start_s + f / o.fps});
  std::stable_sort(s.frames.begin(), s.frames.end(),
                   [](const WorldFrameRequest& a, const WorldFrameRequest& b) { return a.arrival_s < b.arrival_s; });
  return s;
}

Result<std::vector<WorldRunResult>> RunWorldServe(const BenchServeOptions& base, const WorldServeOptions& o,
                                                  const ServeProgress& progress) {
  if (base.engines == 0) return InvalidArgument("--engines must be at least 1");
  KVMESH_RETURN_IF_ERROR(o.model.Validate());
  KVMESH_RETURN_IF_ERROR(o.gate.Validate());
  bool need_tier = false;
  for (const std::string& c : o.configs) {
    KVMESH_ASSIGN_OR_RETURN(const FrameReuse m, ModeOf(c));
    need_tier |= m != FrameReuse::kOff;
  }
  KVMESH_ASSIGN_OR_RETURN(const auto weights, decode::WorldWeights::Generate(o.model));
  const WorldModel model(weights);
  BenchServeOptions b = base;  // the world model's block: one patch, at its real size
  b.block_tokens = 1;
  b.kv_scale = 1;
  const Roofline shape = WorldShape(o.model);
  KVMESH_ASSIGN_OR_RETURN(const json cluster, ServeClusterJson(b, shape));
  std::unique_ptr<LocalDaemons> daemons;
  if (need_tier) {
    KVMESH_ASSIGN_OR_RETURN(daemons, StartServeDaemons(b, cluster));
  }

  std::vector<WorldRunResult> results;
  uint32_t run_no = 0;
  for (double rate : o.rates) {
    KVMESH_ASSIGN_OR_RETURN(const WorldSchedule sched, MakeWorldSchedule(o, rate));
    if (sched.frames.empty()) return InvalidArgument("world model: no session starts at " + std::to_string(rate) +
                                                     " frames/s in --duration; raise either");
    // The camera: every frame made before the run (not part of its time).
    std::vector<std::vector<uint8_t>> pixels(sched.frames.size());
    std::vector<uint32_t> actions(sched.frames.size());
    {
      std::vector<decode::FrameGenerator> gens;
      for (const WorldSession& w : sched.sessions) gens.emplace_back(w.scene);
      for (size_t i = 0; i < sched.frames.size(); ++i) {
        const WorldFrameRequest& q = sched.frames[i];
        pixels[i] = gens[q.session].Frame(q.frame);
        actions[i] = gens[q.session].Action(q.frame);
      }
    }
    std::map<std::string, std::vector<std::vector<float>>> logits_of;
    auto shared = [&](FrameReuse mode, bool local_copy, std::vector<FrameRecord>& recs, std::vector<std::vector<float>>& logits,
                      Clock::time_point origin) {
      RunShared sh;
      sh.o = &o;
      sh.sched = &sched;
      sh.pixels = &pixels;
      sh.actions = &actions;
      sh.model = &model;
      sh.mode = mode;
      sh.local_copy = local_copy;
      sh.origin = origin;
      sh.recs = &recs;
      sh.logits = &logits;
      return sh;
    };
    const size_t first = results.size();
    for (size_t c = 0; c < o.configs.size(); ++c, ++run_no) {
      const std::string& config = o.configs[c];
      const FrameReuse mode = ModeOf(config).value();
      const std::string label = config + " @ " + std::to_string(rate).substr(0, 5) + " fps";
      std::unique_ptr<ServeTier> tier;
      if (mode != FrameReuse::kOff) {
        KVMESH_ASSIGN_OR_RETURN(tier, OpenServeTier(b, cluster, daemons.get(),
                                                    "bench-serve-wm-" + std::to_string(::getpid()) + "-" +
                                                        std::to_string(run_no)));
      }
      std::vector<FrameRecord> recs(sched.frames.size());
      for (size_t i = 0; i < recs.size(); ++i) recs[i].arrival = sched.frames[i].arrival_s;
      std::vector<std::vector<float>> logits(sched.frames.size());
      const auto run_start = Clock::now();
      const RunShared sh = shared(mode, config == "wm-kvmesh-local", recs, logits, run_start + std::chrono::milliseconds(100));
      std::vector<std::unique_ptr<WorldEngine>> engines;
      for (uint32_t e = 0; e < b.engines; ++e) {
        engines.push_back(std::make_unique<WorldEngine>(sh, tier ? &tier->router(e) : nullptr));
        KVMESH_RETURN_IF_ERROR(engines.back()->Open());
        engines.back()->Start();
      }
      auto finished = [&] {
        uint64_t f = 0;
        for (auto& e : engines) f += e->finished() + e->errors();
        return f;
      };
      // KV held, sampled every 20 ms until the run ends.
      std::atomic<uint64_t> arrived{0};
      std::atomic<bool> stop{false};
      double eng_peak = 0, kvm_peak = 0, eng_sum = 0, kvm_sum = 0;
      uint64_t samples = 0;
      std::thread ticker([&] {
        int tick = 0;
        while (!stop.load()) {
          double eng = 0, kvm = 0;
          for (auto& e : engines) {
            eng += double(e->engine_kv());
            kvm += double(e->kvmesh_kv());
          }
          eng_peak = std::max(eng_peak, eng);
          kvm_peak = std::max(kvm_peak, kvm);
          eng_sum += eng;
          kvm_sum += kvm;
          ++samples;
          if (progress && ++tick % 12 == 0) progress(label, arrived.load(), finished(), sched.frames.size());
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
      });
      for (size_t i = 0; i < sched.frames.size(); ++i) {  // open loop
        std::this_thread::sleep_until(sh.origin + std::chrono::duration_cast<Clock::duration>(
                                                      std::chrono::duration<double>(sched.frames[i].arrival_s)));
        engines[sched.frames[i].session % engines.size()]->Submit(i);
        arrived.fetch_add(1);
      }
      for (auto& e : engines) e->Finish();
      const auto deadline =
          Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(b.drain_s));
      while (finished() < sched.frames.size() && Clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      const double end_s = Seconds(Clock::now() - sh.origin);
      for (auto& e : engines) e->Abort();
      for (auto& e : engines) e->Join();
      stop.store(true);
      ticker.join();
      if (progress) progress(label, sched.frames.size(), finished(), sched.frames.size());
      WorldRunResult r = Summarise(config, rate, o, sched, recs, end_s);
      r.engine_kv_peak = eng_peak;
      r.kvmesh_kv_peak = kvm_peak;
      r.engine_kv_mean = samples ? eng_sum / double(samples) : 0;
      r.kvmesh_kv_mean = samples ? kvm_sum / double(samples) : 0;
      for (auto& e : engines) {
        if (e->errors() > 0) return Status(e->first_error().code(), "world model, " + label + ": " +
                                                                      e->first_error().message());
        e->CollectOpen();
        const FrameStreamStats x = e->stream_stats();
        r.bytes_put += x.bytes_put;
        r.reuse_misses += x.reuse_misses;
        r.put_failures += x.put_failures;
      }
      engines.clear();  // ends open streams while the tier is up
      r.seconds = Seconds(Clock::now() - run_start);
      logits_of[config] = std::move(logits);
      results.push_back(std::move(r));
    }
    // The error against full recomputation of the same frames: wm-off's
    // logits, or (without a wm-off run) computed here, untimed.
    auto ref = logits_of.find("wm-off");
    if (ref == logits_of.end()) {
      std::vector<FrameRecord> recs(sched.frames.size());
      std::vector<std::vector<float>> logits(sched.frames.size());
      WorldEngine local(shared(FrameReuse::kOff, false, recs, logits, Clock::now()), nullptr);
      for (size_t i = 0; i < sched.frames.size(); ++i) KVMESH_RETURN_IF_ERROR(local.ServeNow(i));
      ref = logits_of.emplace("wm-off", std::move(logits)).first;
    }
    for (size_t k = first; k < results.size(); ++k)
      ScoreAgainst(results[k], logits_of[results[k].config], ref->second, o.model.vocab);
  }
  return results;
}

WorldRatios CompareWorld(const std::vector<WorldRunResult>& results, const std::string& a, const std::string& b) {
  WorldRatios q;
  q.a = a;
  q.b = b;
  std::map<double, const WorldRunResult*> ra, rb;
  for (const WorldRunResult& r : results) {
    if (r.config == a) ra[r.rate] = &r;
    if (r.config == b) rb[r.rate] = &r;
  }
  auto kv = [](const WorldRunResult& r) { return r.engine_kv_peak + r.kvmesh_kv_peak; };
  for (const auto& [rate, x] : ra)
    if (x->sustained) q.a_max_sustained = rate;
  for (const auto& [rate, y] : rb)
    if (y->sustained) q.b_max_sustained = rate;
  for (const auto& [rate, x] : ra) {
    auto y = rb.find(rate);
    if (y == rb.end()) continue;
    const WorldRunResult& yb = *y->second;
    if (x->sustained && yb.sustained) {
      q.both_rate = rate;
      q.p99_ratio = yb.p99 > 0 ? x->p99 / yb.p99 : 0;
      q.kv_ratio = kv(yb) > 0 ? kv(*x) / kv(yb) : 0;
    }
    q.top_rate = rate;
    q.top_p99_ratio = yb.p99 > 0 ? x->p99 / yb.p99 : 0;
    q.top_goodput_ratio = yb.goodput > 0 ? x->goodput / yb.goodput : 0;
    q.top_kv_ratio = kv(yb) > 0 ? kv(*x) / kv(yb) : 0;
  }
  return q;
}

void PrintWorldTable(const WorldServeOptions& o, const std::vector<WorldRunResult>& results) {
  std::printf("SLO: frame latency <= %.0f ms; sessions of %u frames at %.0f fps; times in ms; KV in MB (peak held "
              "between frames: in the engines, in kvmesh); err = mean |logit - wm-off's| of the same frames\n",
              o.slo_frame_s * 1e3, o.session_frames, o.fps);
  std::printf("%-10s %6s %7s %8s %8s %7s %7s %7s %7s %6s %8s %8s %8s %8s %8s %7s %s\n", "config", "rate", "offer",
              "p50", "p99", "svc50", "svc99", "fps", "goodput", "reuse", "eng_KV", "kvm_KV", "KV_peak", "KV_mean",
              "MB_put", "err", "agree");
  for (const WorldRunResult& r : results)
    std::printf("%-10s %6.1f %7.1f %8.1f %8.1f %7.2f %7.2f %7.1f %7.1f %5.1f%% %8.2f %8.2f %8.2f %8.2f %8.1f %7.4f "
                "%5.1f%%%s\n",
                r.config.c_str(), r.rate, r.offered_fps, r.p50 * 1e3, r.p99 * 1e3, r.service_p50 * 1e3,
                r.service_p99 * 1e3, r.fps, r.goodput, r.reuse * 100, r.engine_kv_peak / 1e6,
                r.kvmesh_kv_peak / 1e6, (r.engine_kv_peak + r.kvmesh_kv_peak) / 1e6,
                (r.engine_kv_mean + r.kvmesh_kv_mean) / 1e6, r.bytes_put / 1e6, r.err_mean_abs,
                r.agreement * 100, r.finished < r.frames ? "  (unfinished frames)" : "");
  for (const std::string a : {"wm-kvmesh", "wm-kvmesh-local", "wm-exact"}) {
    const WorldRatios q = CompareWorld(results, a, "wm-off");
    if (q.top_rate == 0) continue;
    std::printf("%s / wm-off: frames/s at P99 <= %.0f ms (highest swept rate sustained): %.1f vs %.1f", a.c_str(),
                o.slo_frame_s * 1e3, q.a_max_sustained, q.b_max_sustained);
    if (q.b_max_sustained > 0) std::printf(" (%.2fx)", q.a_max_sustained / q.b_max_sustained);
    if (q.both_rate > 0)
      std::printf("; at %.1f fps (highest both sustain): P99 %.2fx, KV peak %.2fx", q.both_rate, q.p99_ratio,
                  q.kv_ratio);
    std::printf("; at %.1f fps: P99 %.2fx, KV peak %.2fx, goodput ", q.top_rate, q.top_p99_ratio, q.top_kv_ratio);
    if (q.top_goodput_ratio > 0)
      std::printf("%.2fx\n", q.top_goodput_ratio);
    else
      std::printf("(wm-off's is 0)\n");
  }
}

json WorldResultsJson(const BenchServeOptions& base, const WorldServeOptions& o,
                      const std::vector<WorldRunResult>& results) {
  json runs = json::array();
  for (const WorldRunResult& r : results)
    runs.push_back({{"config", r.config}, {"rate", r.rate}, {"offered_fps", r.offered_fps}, {"frames", r.frames},
                    {"sessions", r.sessions}, {"finished", r.finished}, {"met_slo", r.met_slo},
                    {"frame_latency_p50_s", r.p50}, {"frame_latency_p99_s", r.p99},
                    {"service_p50_s", r.service_p50}, {"service_p99_s", r.service_p99}, {"fps", r.fps},
                    {"goodput", r.goodput}, {"sustained", r.sustained}, {"patch_reuse", r.reuse},
                    {"kv_bytes", {{"engine_peak", r.engine_kv_peak}, {"kvmesh_peak", r.kvmesh_kv_peak},
                                  {"engine_mean", r.engine_kv_mean}, {"kvmesh_mean", r.kvmesh_kv_mean},
                                  {"total_peak", r.engine_kv_peak + r.kvmesh_kv_peak}}},
                    {"bytes_put", r.bytes_put}, {"blocks_read", r.blocks_read}, {"reuse_misses", r.reuse_misses},
                    {"history_misses", r.history_misses}, {"put_failures", r.put_failures},
                    {"error", {{"mean_abs", r.err_mean_abs}, {"max_abs", r.err_max_abs},
                               {"token_agreement", r.agreement}, {"frames_compared", r.compared}}},
                    {"seconds", r.seconds}});
  json ratios = json::object();
  for (const std::string a : {"wm-kvmesh", "wm-kvmesh-local", "wm-exact"}) {
    const WorldRatios q = CompareWorld(results, a, "wm-off");
    if (q.top_rate == 0) continue;
    ratios[a + "_over_wm-off"] = {{"max_sustained_fps", q.a_max_sustained},
                                  {"base_max_sustained_fps", q.b_max_sustained},
                                  {"both_sustained_rate", q.both_rate}, {"p99_ratio", q.p99_ratio},
                                  {"kv_peak_ratio", q.kv_ratio}, {"top_rate", q.top_rate},
                                  {"top_p99_ratio", q.top_p99_ratio}, {"top_goodput_ratio", q.top_goodput_ratio},
                                  {"top_kv_peak_ratio", q.top_kv_ratio}};
  }
  const auto& m = o.model;
  return {{"workload", "worldmodel"},
          {"engines", base.engines},
          {"cluster", base.cluster},
          {"transport", base.transport},
          {"nodes", base.nodes},
          {"slo", {{"frame_latency_s", o.slo_frame_s}}},
          {"sessions", {{"frames", o.session_frames}, {"fps", o.fps}, {"duration_s", o.duration_s},
                        {"scenes", o.scenes}, {"seed", o.seed}}},
          {"gate", {{"tau", o.gate.ssim_threshold}, {"rho", o.gate.change_threshold}, {"window", o.gate.window},
                    {"pixel_delta", o.gate.pixel_delta}, {"recompute_radius", o.gate.recompute_radius},
                    {"context_gate", o.context_gate}}},
          {"model", {{"params", m.Params()}, {"hidden", m.hidden}, {"layers", m.layers}, {"heads", m.heads},
                     {"width", m.width}, {"height", m.height}, {"patch", m.patch}, {"window", m.window},
                     {"codes", m.codes}, {"input_kv", m.input_kv}, {"block_bytes", m.BlockBytes()}}},
          {"runs", runs},
          {"ratios", ratios}};
}

bool WriteWorldPlots(const std::string& prefix, const WorldServeOptions& o,
                     const std::vector<WorldRunResult>& results) {
  std::vector<std::string> configs;
  for (const WorldRunResult& r : results)
    if (std::find(configs.begin(), configs.end(), r.config) == configs.end()) configs.push_back(r.config);
  const std::string dat = prefix + ".dat";
  {
    std::ofstream f(dat);
    for (const std::string& c : configs) {
      f << "# " << c << ": offered_fps frame_p99_ms goodput kv_peak_MB\n";
      for (const WorldRunResult& r : results)
        if (r.config == c)
          f << r.offered_fps << ' ' << r.p99 * 1e3 << ' ' << r.goodput << ' '
            << (r.engine_kv_peak + r.kvmesh_kv_peak) / 1e6 << '\n';
      f << "\n\n";
    }
  }
  const std::string title = "kvmesh bench-serve --workload worldmodel: " + std::to_string(o.session_frames) +
                            "-frame sessions at " + std::to_string(int(o.fps)) + " fps";
  const std::string x = "offered load (frames/s)";
  bool ok = GnuplotCurves(prefix + "-frame-p99.png", dat, configs, 2, title, x, "frame latency p99 (ms)", true);
  ok &= GnuplotCurves(prefix + "-goodput.png", dat, configs, 3, title, x,
                      "goodput (frames/s within " + std::to_string(int(o.slo_frame_s * 1e3)) + " ms)", false);
  ok &= GnuplotCurves(prefix + "-kv.png", dat, configs, 4, title, x, "KV held, peak (MB)", false);
  return ok;
}

}  // namespace kvmesh::serve

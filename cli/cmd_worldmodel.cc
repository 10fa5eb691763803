// kvmesh worldmodel: frame sessions of the reference world model with their
// KV in kvmesh, reuse off, exact-only and similarity-gated (docs/worldmodel.md).
//
//   kvmesh worldmodel [--scene static] [--frames 64] [--tau 0.92] [--rho 0.05] [--json] [--plot PREFIX]
//   kvmesh worldmodel --sweep [--scene static]     reuse rate against error over tau x rho
//
// Every mode runs the same frames on a fresh embedded cluster (the built-in
// config or --config, its model replaced by the world model's KV block), so
// KV bytes stored are each mode's own; the errors are against the logits of
// the reuse-off run, which recomputes every patch of every frame.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/default_config.h"
#include "cli/report.h"
#include "common/progress.h"
#include "coordinator/decode/world_run.h"
#include "kvmesh/embedded.h"

namespace kvmesh::cli {
namespace {

using namespace kvmesh::decode;

struct WorldArgs {
  std::string config;
  std::string scene = "static";
  uint32_t frames = 64;
  // The gate: unset (negative) values come from the config's $.frames.
  double tau = -2, rho = -1;
  int64_t window = -1, pixel_delta = -1, recompute_radius = -1, max_age = -1, motion_radius = -1;
  double refresh_deviation = -1;
  bool json = false, progress = true, per_frame = false, sweep = false, diagnose = false;
  bool context_gate = true;  // the similar runs also check each block's fingerprint (exact reuse)
  std::string plot;
  std::string sweep_tau = "0.5,0.7,0.8,0.85,0.9,0.92,0.95,0.98";
  std::string sweep_rho = "0.02,0.05,0.1,0.2,0.5";
  // The command's model: 4-pixel patches (256 tokens per 64x64 frame), the
  // VQ tokenizer, and K, V from the embedding: the shape whose exact reuse
  // meets the targets (docs/worldmodel.md); --patch 8 --codes 0
  // --no-input-kv is the earlier one.
  WorldModelConfig model = [] {
    WorldModelConfig m;
    m.patch = 4;
    m.codes = 512;
    m.input_kv = true;
    return m;
  }();
  // Overrides of the scene's knobs (negative: the preset's value).
  double noise = -1, speed = -1, pan = -1, drift = -1;
  int64_t sprites = -1, sprite_size = -1, cut_every = -1;
};

struct ModeRun {
  std::string mode;
  FrameMatchOptions gate;
  WorldStreamResult r;
  uint64_t node_bytes = 0;  // bytes the nodes hold after the run (before End's release: blocks stay)
  LogitError err;
  std::vector<LogitError> frame_err;
};

double Pct(const std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  std::vector<double> s = v;
  std::sort(s.begin(), s.end());
  const size_t i = std::min(s.size() - 1, static_cast<size_t>(q * static_cast<double>(s.size() - 1) + 0.5));
  return s[i];
}

struct Summary {
  double reuse = 0, ms_p50 = 0, ms_p99 = 0, ms_mean = 0;
  uint64_t bytes = 0, blocks = 0;
};

Summary Summarize(const ModeRun& m) {
  Summary s;
  std::vector<double> ms;
  uint64_t reused = 0, patches = 0;
  for (const WorldFrameStats& f : m.r.frames) {
    ms.push_back(f.ms);
    reused += f.reused;
    patches += f.patches;
    s.ms_mean += f.ms;
  }
  if (!ms.empty()) s.ms_mean /= static_cast<double>(ms.size());
  s.reuse = patches ? static_cast<double>(reused) / static_cast<double>(patches) : 0;
  s.ms_p50 = Pct(ms, 0.5);
  s.ms_p99 = Pct(ms, 0.99);
  s.bytes = m.r.stats.bytes_put;
  s.blocks = m.r.stats.blocks_put;
  return s;
}

std::vector<double> ParseFloats(const std::string& s) {
  std::vector<double> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) v.push_back(std::stod(item));
  return v;
}

class Runner {
 public:
  Runner(const WorldArgs& a, ClusterConfig cfg, std::shared_ptr<const WorldWeights> w, FrameGenParams scene)
      : a_(a), cfg_(std::move(cfg)), model_(std::move(w)), gen_(std::move(scene)) {}

  Result<ModeRun> Run(const std::string& mode, FrameMatchOptions gate, bool progress, bool keep_blocks = false) {
    KVMESH_ASSIGN_OR_RETURN(auto cluster, EmbeddedCluster::Start(cfg_));
    WorldStreamOptions o;
    o.keep_blocks = keep_blocks;
    o.frames = a_.frames;
    o.stream.stream_id = 1;
    o.stream.match = gate;
    o.context_gate = a_.context_gate && gate.mode == FrameReuse::kSimilar;
    ProgressBar bar("worldmodel " + mode, a_.frames, progress);
    o.progress = [&](uint32_t d) { bar.Update(d); };
    ModeRun m;
    m.mode = mode;
    m.gate = gate;
    KVMESH_ASSIGN_OR_RETURN(m.r, RunWorldStream(cluster->router(), model_, gen_, o));
    bar.Finish();
    return m;
  }

  void Score(ModeRun& m, const ModeRun& ref) const {
    const uint32_t V = model_.config().vocab;
    m.err = CompareLogits(m.r.logits, ref.r.logits, V);
    const size_t per = size_t{model_.config().num_patches()} * V;
    for (size_t f = 0; f < m.r.frames.size(); ++f)
      m.frame_err.push_back(CompareLogits(std::span<const float>(m.r.logits).subspan(f * per, per),
                                          std::span<const float>(ref.r.logits).subspan(f * per, per), V));
  }

  const WorldModel& model() const { return model_; }
  const FrameGenerator& gen() const { return gen_; }

 private:
  const WorldArgs& a_;
  ClusterConfig cfg_;
  WorldModel model_;
  FrameGenerator gen_;
};

nlohmann::json RunJson(const ModeRun& m, const ModeRun& off, bool per_frame) {
  const Summary s = Summarize(m), b = Summarize(off);
  nlohmann::json j = {{"mode", m.mode},
                      {"tau", m.gate.ssim_threshold},
                      {"rho", m.gate.change_threshold},
                      {"window", m.gate.window},
                      {"recompute_radius", m.gate.recompute_radius},
                      {"refresh_deviation", m.gate.refresh_deviation},
                      {"max_age", m.gate.max_age},
                      {"motion_radius", m.gate.motion_radius},
                      {"patch_reuse", s.reuse},
                      {"ms_per_frame", {{"p50", s.ms_p50}, {"p99", s.ms_p99}, {"mean", s.ms_mean}}},
                      {"kv_bytes_stored", s.bytes},
                      {"kv_blocks_stored", s.blocks},
                      {"reuse_misses", m.r.stats.reuse_misses},
                      {"released", m.r.stats.released},
                      {"vs_off", {{"kv_bytes", Ratio(double(s.bytes), double(b.bytes))},
                                  {"ms_p50", Ratio(s.ms_p50, b.ms_p50)}}},
                      {"logit_error", {{"mean_abs", m.err.mean_abs}, {"max_abs", m.err.max_abs},
                                       {"token_agreement", m.err.token_agreement}}}};
  if (per_frame) {
    nlohmann::json fr = nlohmann::json::array();
    for (size_t i = 0; i < m.r.frames.size(); ++i) {
      const WorldFrameStats& f = m.r.frames[i];
      fr.push_back({{"frame", f.frame}, {"reused", f.reused}, {"patches", f.patches}, {"ms", f.ms},
                    {"bytes_put", f.bytes_put}, {"blocks_read", f.blocks_read},
                    {"mean_abs_error", m.frame_err[i].mean_abs}, {"max_abs_error", m.frame_err[i].max_abs},
                    {"token_agreement", m.frame_err[i].token_agreement}});
    }
    j["frames"] = fr;
  }
  return j;
}

bool WritePlot(const std::string& prefix, const std::vector<ModeRun>& runs, const std::string& title) {
  const std::string dat = prefix + ".dat", gp = prefix + ".gp", png = prefix + ".png";
  {
    std::ofstream f(dat);
    for (const ModeRun& m : runs) {
      f << "# " << m.mode << ": frame reuse ms mean_abs_error\n";
      for (size_t i = 0; i < m.r.frames.size(); ++i) {
        const WorldFrameStats& fr = m.r.frames[i];
        f << fr.frame << ' ' << double(fr.reused) / fr.patches << ' ' << fr.ms << ' '
          << (m.frame_err.empty() ? 0.0 : m.frame_err[i].mean_abs) << '\n';
      }
      f << "\n\n";
    }
  }
  {
    std::ofstream f(gp);
    f << "set terminal pngcairo size 900,900\nset output '" << png << "'\nset multiplot layout 3,1 title '" << title
      << "'\nset grid\nset key outside right\nset xlabel 'frame'\n";
    const char* ylabel[3] = {"patch reuse", "ms per frame", "mean |logit error|"};
    for (int c = 0; c < 3; ++c) {
      f << "set ylabel '" << ylabel[c] << "'\nplot ";
      for (size_t i = 0; i < runs.size(); ++i)
        f << (i ? ", " : "") << "'" << dat << "' index " << i << " using 1:" << (c + 2) << " with lines title '"
          << runs[i].mode << "'";
      f << "\n";
    }
    f << "unset multiplot\n";
  }
  return std::system(("gnuplot '" + gp + "' 2>/dev/null").c_str()) == 0;
}

// Where the error of a reused run comes from, against the reuse-off run of the
// same frames: by the age of the reused block, by the grid distance to the
// nearest computed patch of the frame, and per KV layer of the reused blocks.
void PrintDiagnosis(const ModeRun& m, const ModeRun& off, const WorldModelConfig& c) {
  const uint32_t N = c.num_patches(), V = c.vocab, GW = c.grid_w(), GH = c.height / c.patch;
  const size_t BF = c.BlockFloats(), H = c.hidden;
  const size_t frames = m.r.frames.size();
  auto patch_err = [&](size_t f, uint32_t p) {
    double e = 0;
    for (uint32_t v = 0; v < V; ++v)
      e += std::fabs(double(m.r.logits[(f * N + p) * V + v]) - off.r.logits[(f * N + p) * V + v]);
    return e / V;
  };
  struct Acc {
    double sum = 0;
    uint64_t n = 0;
  };
  const char* age_names[] = {"computed", "1", "2-3", "4-7", "8-15", "16+"};
  Acc by_age[6], by_dist[6];
  const uint32_t kvl = 2 * c.layers + 1;
  std::vector<Acc> layer_dev(kvl);
  for (size_t f = 0; f < frames; ++f) {
    std::vector<uint8_t> computed(N);
    for (uint32_t p = 0; p < N; ++p) computed[p] = m.r.source_frame[f * N + p] == f;
    for (uint32_t p = 0; p < N; ++p) {
      const double e = patch_err(f, p);
      const uint32_t age = static_cast<uint32_t>(f - m.r.source_frame[f * N + p]);
      const int ab = age == 0 ? 0 : age == 1 ? 1 : age < 4 ? 2 : age < 8 ? 3 : age < 16 ? 4 : 5;
      by_age[ab].sum += e;
      ++by_age[ab].n;
      uint32_t dist = 5;
      const int32_t x0 = int32_t(p % GW), y0 = int32_t(p / GW);
      for (uint32_t q = 0; q < N; ++q)
        if (computed[q])
          dist = std::min<uint32_t>(dist, static_cast<uint32_t>(std::max(std::abs(int32_t(q % GW) - x0),
                                                                         std::abs(int32_t(q / GW) - y0))));
      by_dist[std::min<uint32_t>(dist, 5)].sum += e;
      ++by_dist[std::min<uint32_t>(dist, 5)].n;
      if (computed[p]) continue;
      const float* a = m.r.blocks.data() + (f * N + p) * BF;
      const float* b = off.r.blocks.data() + (f * N + p) * BF;
      for (uint32_t l = 0; l < kvl; ++l) {
        double d = 0, r = 0;
        for (size_t i = 0; i < 2 * H; ++i) {
          d += (double(a[l * 2 * H + i]) - b[l * 2 * H + i]) * (double(a[l * 2 * H + i]) - b[l * 2 * H + i]);
          r += double(b[l * 2 * H + i]) * b[l * 2 * H + i];
        }
        layer_dev[l].sum += std::sqrt(d / std::max(r, 1e-30));
        ++layer_dev[l].n;
      }
    }
  }
  (void)GH;
  const double total = [&] {
    double s = 0;
    for (const Acc& a : by_age) s += a.sum;
    return s;
  }();
  std::printf("  error of '%s' by the age of the patch's block (frames since it was computed):\n", m.mode.c_str());
  std::printf("    %-9s %8s %10s %8s\n", "age", "patches", "mean|err|", "share");
  for (int i = 0; i < 6; ++i)
    if (by_age[i].n)
      std::printf("    %-9s %8llu %10.5f %7.1f%%\n", age_names[i], static_cast<unsigned long long>(by_age[i].n),
                  by_age[i].sum / by_age[i].n, 100 * by_age[i].sum / std::max(total, 1e-30));
  std::printf("  by grid distance to the nearest computed patch of the frame (0: computed):\n");
  std::printf("    %-9s %8s %10s %8s\n", "distance", "patches", "mean|err|", "share");
  for (int i = 0; i < 6; ++i)
    if (by_dist[i].n)
      std::printf("    %-9s %8llu %10.5f %7.1f%%\n", (i == 5 ? ">=5/none" : std::to_string(i).c_str()),
                  static_cast<unsigned long long>(by_dist[i].n), by_dist[i].sum / by_dist[i].n,
                  100 * by_dist[i].sum / std::max(total, 1e-30));
  std::printf("  reused blocks against the recomputed ones, per KV layer (mean ||reused - recomputed|| / ||recomputed||):\n   ");
  for (uint32_t l = 0; l < kvl; ++l)
    std::printf(" %s%u %.4f", l == kvl - 1 ? "out" : (l % 2 ? "t" : "s"), l == kvl - 1 ? 0 : l / 2,
                layer_dev[l].n ? layer_dev[l].sum / layer_dev[l].n : 0.0);
  std::printf("\n");
}

int Fail(const Status& s) {
  std::cerr << "kvmesh worldmodel: " << s.ToString() << "\n";
  return 1;
}

int Run(const WorldArgs& a, nlohmann::json* out = nullptr) {
  Result<ClusterConfig> base = a.config.empty()
                                   ? ParseConfig(kDefaultLocalConfig, "cluster_configs/local.json (built in)")
                                   : LoadConfigFile(a.config);
  if (!base.ok()) return Fail(base.status());
  ClusterConfig cfg = std::move(base).value();
  cfg.model = a.model.Spec();
  cfg.store.slot_bytes = 0;
  auto scene = FrameGenPresetByName(a.scene);
  if (!scene.ok()) return Fail(scene.status());
  FrameGenParams sp = std::move(scene).value();
  sp.width = a.model.width;
  sp.height = a.model.height;
  if (a.noise >= 0) sp.noise_sigma = static_cast<float>(a.noise);
  if (a.speed >= 0) sp.sprite_speed = static_cast<float>(a.speed);
  if (a.pan >= 0) sp.pan_speed = static_cast<float>(a.pan);
  if (a.drift >= 0) sp.light_drift = static_cast<float>(a.drift);
  if (a.sprites >= 0) sp.sprites = static_cast<uint32_t>(a.sprites);
  if (a.sprite_size >= 0) sp.sprite_size = static_cast<uint32_t>(a.sprite_size);
  if (a.cut_every >= 0) sp.cut_every = static_cast<uint32_t>(a.cut_every);
  if (Status s = sp.Validate(); !s.ok()) return Fail(s);
  WorldModelConfig model_cfg = a.model;
  model_cfg.window = a.window >= 0 ? static_cast<uint32_t>(a.window) : cfg.frames.window;
  cfg.model = model_cfg.Spec();
  auto w = WorldWeights::Generate(model_cfg);
  if (!w.ok()) return Fail(w.status());
  Runner runner(a, cfg, std::move(w).value(), sp);
  const bool progress = a.progress && !a.json;

  FrameMatchOptions gate = FrameMatchOptions::FromConfig(cfg.frames);
  if (a.window >= 0) gate.window = static_cast<uint32_t>(a.window);
  if (a.tau > -2) gate.ssim_threshold = static_cast<float>(a.tau);
  if (a.rho >= 0) gate.change_threshold = static_cast<float>(a.rho);
  if (a.pixel_delta >= 0) gate.pixel_delta = static_cast<uint32_t>(a.pixel_delta);
  if (a.recompute_radius >= 0) gate.recompute_radius = static_cast<uint32_t>(a.recompute_radius);
  if (a.refresh_deviation >= 0) gate.refresh_deviation = static_cast<float>(a.refresh_deviation);
  if (a.max_age >= 0) gate.max_age = static_cast<uint32_t>(a.max_age);
  if (a.motion_radius >= 0) gate.motion_radius = static_cast<uint32_t>(a.motion_radius);
  if (Status s = gate.Validate(); !s.ok()) return Fail(s);
  FrameMatchOptions off = gate, exact = gate;
  off.mode = FrameReuse::kOff;
  off.refresh_deviation = 0;  // the reference recomputes everything: nothing to refresh
  exact.mode = FrameReuse::kExact;

  auto ref = runner.Run("off", off, progress, a.diagnose);
  if (!ref.ok()) return Fail(ref.status());
  runner.Score(*ref, *ref);
  const WorldModelConfig& mc = model_cfg;
  const nlohmann::json model_json = {{"params", mc.Params()},       {"hidden", mc.hidden},   {"layers", mc.layers},
                                     {"heads", mc.heads},           {"ffn", mc.ffn},         {"vocab", mc.vocab},
                                     {"patches", mc.num_patches()}, {"patch", mc.patch},     {"width", mc.width},
                                     {"height", mc.height},         {"block_bytes", mc.BlockBytes()},
                                     {"window", mc.window},         {"macs_per_patch", mc.MacsPerPatch(mc.window)},
                                     {"spatial_radius", mc.spatial_radius}, {"pool", mc.pool},
                                     {"codes", mc.codes},           {"hysteresis", mc.hysteresis},
                                     {"context_gate", a.context_gate}};

  if (a.sweep) {
    nlohmann::json rows = nlohmann::json::array();
    const Summary b = Summarize(*ref);
    if (!a.json)
      std::printf("kvmesh worldmodel --sweep: scene %s, %u frames; errors against the reuse-off run\n"
                  "  %-6s %-6s %8s %10s %10s %10s %9s\n",
                  a.scene.c_str(), a.frames, "tau", "rho", "reuse", "bytes/off", "mean|err|", "max|err|", "tokens");
    for (double t : ParseFloats(a.sweep_tau))
      for (double r : ParseFloats(a.sweep_rho)) {
        FrameMatchOptions g = gate;
        g.ssim_threshold = static_cast<float>(t);
        g.change_threshold = static_cast<float>(r);
        auto m = runner.Run("similar", g, false);
        if (!m.ok()) return Fail(m.status());
        runner.Score(*m, *ref);
        const Summary s = Summarize(*m);
        rows.push_back({{"tau", t}, {"rho", r}, {"patch_reuse", s.reuse},
                        {"kv_bytes_vs_off", Ratio(double(s.bytes), double(b.bytes))},
                        {"mean_abs", m->err.mean_abs}, {"max_abs", m->err.max_abs},
                        {"token_agreement", m->err.token_agreement}});
        if (!a.json)
          std::printf("  %-6.2f %-6.2f %7.1f%% %9.2fx %10.5f %10.4f %8.2f%%\n", t, r, 100 * s.reuse,
                      Ratio(double(s.bytes), double(b.bytes)), m->err.mean_abs, m->err.max_abs,
                      100 * m->err.token_agreement);
      }
    if (a.json)
      std::cout << nlohmann::json({{"scene", a.scene}, {"frames", a.frames}, {"model", model_json}, {"sweep", rows}})
                       .dump(2)
                << "\n";
    return 0;
  }

  std::vector<ModeRun> runs;
  runs.push_back(std::move(ref).value());
  for (auto [name, g] : {std::pair{"exact", exact}, std::pair{"similar", gate}}) {
    auto m = runner.Run(name, g, progress, a.diagnose);
    if (!m.ok()) return Fail(m.status());
    runner.Score(*m, runs.front());
    runs.push_back(std::move(m).value());
  }

  if (a.json) {
    nlohmann::json j = {{"scene", a.scene}, {"frames", a.frames}, {"model", model_json},
                        {"logit_scale", LogitScale(runs.front().r.logits)}, {"runs", nlohmann::json::array()}};
    for (const ModeRun& m : runs) j["runs"].push_back(RunJson(m, runs.front(), a.per_frame));
    if (out)
      *out = std::move(j);
    else
      std::cout << j.dump(2) << "\n";
  } else {
    std::printf("kvmesh worldmodel: scene %s, %u frames of %ux%u (%u patches of %ux%u); model %.0fk params "
                "(hidden %u, %u layers, %u heads, spatial radius %u, %u codes), KV block %zu B per patch; tau %.2f, "
                "rho %.2f, window %u; similar: %s\n",
                a.scene.c_str(), a.frames, mc.width, mc.height, mc.num_patches(), mc.patch, mc.patch,
                double(mc.Params()) / 1e3, mc.hidden, mc.layers, mc.heads, mc.spatial_radius, mc.codes,
                mc.BlockBytes(), gate.ssim_threshold, gate.change_threshold, gate.window,
                a.context_gate ? "pixel gate and context fingerprint" : "pixel gate only");
    if (gate.refresh_deviation > 0 || gate.max_age > 0 || gate.motion_radius > 0 || gate.recompute_radius > 0)
      std::printf("  similar: refresh deviation %.3f, max age %u, motion radius %u, recompute radius %u\n",
                  gate.refresh_deviation, gate.max_age, gate.motion_radius, gate.recompute_radius);
    if (a.per_frame) {
      std::printf("  %5s | %-21s | %-21s | %-21s\n", "frame", "off: reuse ms", "exact: reuse ms",
                  "similar: reuse ms err");
      for (size_t i = 0; i < runs[0].r.frames.size(); ++i) {
        std::printf("  %5zu", i);
        for (const ModeRun& m : runs) {
          const WorldFrameStats& f = m.r.frames[i];
          std::printf(" | %5.1f%% %7.2f", 100.0 * f.reused / f.patches, f.ms);
          if (&m == &runs.back()) std::printf(" %.5f", m.frame_err[i].mean_abs);
        }
        std::printf("\n");
      }
    }
    std::printf("  %-8s %8s %9s %9s %12s %9s %10s %10s %8s\n", "mode", "reuse", "ms p50", "ms p99", "KV bytes",
                "bytes/off", "p50/off", "mean|err|", "tokens");
    const Summary b = Summarize(runs.front());
    for (const ModeRun& m : runs) {
      const Summary s = Summarize(m);
      std::printf("  %-8s %7.1f%% %9.2f %9.2f %12llu %8.2fx %9.2fx %10.5f %7.2f%%\n", m.mode.c_str(), 100 * s.reuse,
                  s.ms_p50, s.ms_p99, static_cast<unsigned long long>(s.bytes), Ratio(double(s.bytes), double(b.bytes)),
                  Ratio(s.ms_p50, b.ms_p50), m.err.mean_abs, 100 * m.err.token_agreement);
    }
    std::printf("  (errors against the reuse-off run; max |err| similar %.4f; logit scale: std of the reference logits %.3f)\n",
                runs.back().err.max_abs, LogitScale(runs.front().r.logits));
    if (a.diagnose) PrintDiagnosis(runs.back(), runs.front(), mc);
  }
  if (!a.plot.empty() && !WritePlot(a.plot, runs, "kvmesh worldmodel: scene " + a.scene))
    std::cerr << "kvmesh worldmodel: gnuplot failed; the data is in " << a.plot << ".dat\n";
  return 0;
}

}  // namespace

int RunWorldModelDemoPart(const std::string& config, uint32_t frames, nlohmann::json* json_out) {
  WorldArgs a;
  a.config = config;
  a.frames = frames;
  a.json = json_out != nullptr;
  a.progress = !a.json;
  return Run(a, json_out);
}

void AddWorldModelCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<WorldArgs>();
  CLI::App* cmd = app.add_subcommand(
      "worldmodel", "World-model frames: KV reused across frames by similarity, with its error measured");
  cmd->add_option("--config", args->config, "cluster config (default: the built-in local config)");
  cmd->add_option("--scene", args->scene, "frame generator parameter set: static, busy, static-b, drift, pan, cuts, noisy");
  cmd->add_option("--frames", args->frames, "frames per session")->check(CLI::Range(1u, 100000u));
  cmd->add_option("--tau", args->tau, "SSIM threshold: a patch reuses when SSIM >= tau (default: $.frames, 0.92)");
  cmd->add_option("--rho", args->rho, "changed-pixel share: reuse when <= rho (default: $.frames, 0.05)");
  cmd->add_option("--window", args->window, "frames a patch is matched against (default: $.frames, 16)")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--pixel-delta", args->pixel_delta, "a pixel changed when it moved by more (default: $.frames, 16)");
  cmd->add_option("--noise", args->noise, "override the scene: sensor noise sigma (gray levels)");
  cmd->add_option("--sprites", args->sprites, "override the scene: number of moving sprites");
  cmd->add_option("--sprite-size", args->sprite_size, "override the scene: sprite side (pixels)");
  cmd->add_option("--speed", args->speed, "override the scene: sprite speed (pixels per frame)");
  cmd->add_option("--pan", args->pan, "override the scene: camera pan (pixels per frame)");
  cmd->add_option("--drift", args->drift, "override the scene: lighting drift (gray levels per frame)");
  cmd->add_option("--cut-every", args->cut_every, "override the scene: a scene cut every N frames (0: none)");
  cmd->add_option("--recompute-radius", args->recompute_radius,
                  "also compute reused patches within this grid distance of a computed one (0: off)");
  cmd->add_option("--refresh-deviation", args->refresh_deviation,
                  "compute reused patches whose layer-1 KV moved by more than this (relative; default: $.frames)");
  cmd->add_option("--max-age", args->max_age, "reuse no block computed more than N frames ago (default: $.frames)");
  cmd->add_option("--motion-radius", args->motion_radius,
                  "also match blocks of patch positions within this grid distance (default: $.frames)")
      ->check(CLI::Range(0, 4));
  cmd->add_option("--spatial-radius", args->model.spatial_radius, "model: spatial attention reach (patches)");
  cmd->add_option("--pool", args->model.pool, "model: tokenizer pooling (pixels)");
  cmd->add_option("--patch", args->model.patch, "model: patch side (pixels; default 4)");
  cmd->add_flag("--input-kv,!--no-input-kv", args->model.input_kv,
                "model: K and V of every layer from the patch's embedding (default), or from each layer's input");
  cmd->add_option("--codes", args->model.codes, "model: VQ tokenizer codebook size (0: continuous pixel embedding)");
  cmd->add_option("--hysteresis", args->model.hysteresis,
                  "model: gray levels a new code must be nearer by to replace a patch's previous token");
  cmd->add_flag("!--no-context-gate", args->context_gate,
                "similar runs: the pixel gate alone (do not check the blocks' context fingerprints)");
  cmd->add_option("--hidden", args->model.hidden, "model width");
  cmd->add_option("--layers", args->model.layers, "model layers");
  cmd->add_option("--seed", args->model.seed, "model seed");
  cmd->add_flag("--json", args->json, "print JSON");
  cmd->add_flag("--per-frame", args->per_frame, "print (or put in the JSON) every frame");
  cmd->add_flag("--diagnose", args->diagnose, "break the similar run's error down by block age, distance and KV layer");
  cmd->add_flag("--sweep", args->sweep, "sweep tau x rho (reuse rate against error)");
  cmd->add_option("--sweep-tau", args->sweep_tau, "tau values of --sweep");
  cmd->add_option("--sweep-rho", args->sweep_rho, "rho values of --sweep");
  cmd->add_option("--plot", args->plot, "write PREFIX.png: reuse, latency and error over frames");
  cmd->add_flag("!--no-progress", args->progress, "no progress bar");
  cmd->callback([args, exit_code] { *exit_code = Run(*args); });
}

}  // namespace kvmesh::cli

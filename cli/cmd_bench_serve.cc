// kvmesh bench-serve — the latency-throughput curve of a serving system with
// and without kvmesh (cli/serve/bench_serve.h, docs/serving.md).
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include "cli/commands.h"
#include "cli/serve/bench_serve.h"
#include "cli/serve/engine_proc.h"
#include "cli/serve/reference.h"
#include "cli/serve/report.h"
#include "cli/serve/world_serve.h"
#include "kvmesh/size.h"

#include <nlohmann/json.hpp>

namespace kvmesh::cli {
namespace {

struct Args {
  serve::BenchServeOptions o;
  std::string rates = "2,4,8", configs = "recompute,local,kvmesh,kvmesh-blind", node_memory = "1GiB";
  std::string pressure_memory = "16MiB", ssd_memory = "4GiB";
  double slo_ttft_ms = 500, slo_tpot_ms = 50;
  bool json = false;
  std::string plot;
  std::string prefix_check;  // "1024,8192,32768": the hit-vs-recompute check instead of the sweep
  // --workload worldmodel: frame sessions (world_serve.h); --rates and
  // --configs keep the world model's defaults unless given.
  std::string workload = "sessions";
  serve::WorldServeOptions wm;
  std::string wm_scenes = "static,busy,static-b,drift,pan,cuts,noisy";
  double slo_frame_ms = 100;
  bool rates_given = false, configs_given = false;
};

template <typename T>
Result<std::vector<T>> SplitList(const std::string& s, const char* what) {
  std::vector<T> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if constexpr (std::is_same_v<T, std::string>) {
      out.push_back(item);
    } else {
      char* end = nullptr;
      const double v = std::strtod(item.c_str(), &end);
      if (item.empty() || *end != '\0' || !(v > 0)) return InvalidArgument(std::string(what) + ": '" + item + "' is not a positive number");
      out.push_back(v);
    }
  }
  if (out.empty()) return InvalidArgument(std::string(what) + ": empty list");
  return out;
}

std::string SelfPath() {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, size_t(n)) : "";
}

int PrefixCheck(const Args& a) {
  auto lengths = SplitList<double>(a.prefix_check, "--prefix-check");
  if (!lengths.ok()) {
    std::cerr << "kvmesh bench-serve: " << lengths.status().ToString() << "\n";
    return 1;
  }
  std::vector<uint32_t> prefixes;
  for (double l : *lengths) prefixes.push_back(static_cast<uint32_t>(l));
  auto r = serve::RunPrefixCheck(a.o, prefixes, 16, [](uint32_t tokens) {
    if (::isatty(2)) std::fprintf(stderr, "\r\033[K[bench-serve] prefix %u tokens stored, loading", tokens);
  });
  if (::isatty(2)) std::fprintf(stderr, "\r\033[K");
  if (!r.ok()) {
    std::cerr << "kvmesh bench-serve: " << r.status().ToString() << "\n";
    return 1;
  }
  if (a.json) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& x : *r)
      j.push_back({{"prefix_tokens", x.prefix_tokens}, {"suffix_tokens", x.suffix_tokens}, {"bytes", x.bytes},
                   {"recompute_ttft_s", x.recompute_ttft_s}, {"hit_ttft_s", x.hit_ttft_s}, {"load_s", x.load_s}, {"lookup_s", x.lookup_s},
                   {"load_min_s", x.load_min_s}, {"load_max_s", x.load_max_s}, {"blocks_got", x.blocks_got},
                   {"hit_over_recompute", x.hit_ttft_s / x.recompute_ttft_s},
                   {"decided_over_recompute", x.decided_ttft_s / x.recompute_ttft_s},
                   {"est_load_s", x.est_load_s}, {"est_recompute_s", x.est_recompute_s},
                   {"decided", x.decided_load ? "load" : "recompute"}, {"decided_ttft_s", x.decided_ttft_s},
                   {"pool_warm_s", x.pool_warm_s}, {"decided_loads", x.decided_loads},
                   {"first_load_s", x.first.load_s}, {"first_hit_ttft_s", x.first.hit_ttft_s},
                   {"first_hit_over_recompute", x.first.hit_ttft_s / x.recompute_ttft_s},
                   {"first_load_over_median", x.load_s > 0 ? x.first.load_s / x.load_s : 0.0},
                   {"first_blocks_got", x.first.got}, {"first_est_load_s", x.first.est_load_s},
                   {"first_decided", x.first.decided_load ? "load" : "recompute"},
                   {"first_decided_ttft_s", x.first.decided_ttft_s}});
    std::cout << nlohmann::json{{"engine_model", a.o.engine_model}, {"cluster", a.o.cluster},
                                {"transport", a.o.transport}, {"kv_scale", a.o.kv_scale},
                                {"reps", a.o.prefix_reps}, {"prefix_check", j}}
                     .dump(2)
              << "\n";
    return 0;
  }
  const uint32_t reps = std::max<uint32_t>(a.o.prefix_reps, 1);
  std::printf("kvmesh bench-serve --prefix-check: %s, %s kvmesh (%s), kv scale 1/%u; per prefix the first request "
              "after its store apart, then the median of %u more; TTFT in ms\n",
              a.o.engine_model.c_str(), a.o.cluster.c_str(), a.o.transport.c_str(), a.o.kv_scale, reps);
  std::printf("%8s %8s %10s %10s %9s %7s %10s %17s %7s %10s %10s %10s %11s %10s %9s | %10s %9s %10s %10s %9s\n",
              "prefix", "KV GB", "recompute", "hit", "hit/rec", "lookup", "load", "load min..max", "GB/s", "est load",
              "est recomp", "decision", "loaded", "decided", "dec/rec", "1st load", "1st/rec", "1st est", "1st dec",
              "1dec/rec");
  for (const auto& x : *r) {
    char loaded[32];
    std::snprintf(loaded, sizeof loaded, "%u/%u", x.decided_loads, x.reps);
    std::printf("%8u %8.3f %10.1f %10.1f %8.2fx %7.2f %10.1f %8.1f..%-8.1f %7.2f %10.1f %10.1f %10s %11s %10.1f %8.2fx "
                "| %10.1f %8.2fx %10.1f %10s %8.2fx\n",
                x.prefix_tokens, x.bytes / 1e9, x.recompute_ttft_s * 1e3, x.hit_ttft_s * 1e3,
                x.hit_ttft_s / x.recompute_ttft_s, x.lookup_s * 1e3, x.load_s * 1e3, x.load_min_s * 1e3,
                x.load_max_s * 1e3, x.load_s > 0 ? x.bytes / x.load_s / 1e9 : 0.0, x.est_load_s * 1e3,
                x.est_recompute_s * 1e3, x.decided_load ? "load" : "recompute", loaded, x.decided_ttft_s * 1e3,
                x.decided_ttft_s / x.recompute_ttft_s, x.first.load_s * 1e3, x.first.hit_ttft_s / x.recompute_ttft_s,
                x.first.est_load_s * 1e3, x.first.decided_load ? "load" : "recompute",
                x.first.decided_ttft_s / x.recompute_ttft_s);
  }
  std::printf("left of |: the %u requests after the first (medians; est load, decision and decided at each "
              "request: loaded = how many it loaded); right of |: the first request after the store, apart "
              "(its load, its hit TTFT / recompute, its estimate and decision)\n",
              reps);
  for (const auto& x : *r)
    if (x.blocks_got * a.o.block_tokens < x.prefix_tokens)
      std::printf("note: the %u-token prefix's median load found %zu of %u blocks (the rest was recomputed: "
                  "--node-memory too small?)\n",
                  x.prefix_tokens, x.blocks_got, x.prefix_tokens / a.o.block_tokens);
  if (!r->empty() && r->front().pool_warm_s > 0)
    std::printf("the nodes warmed their mappings of the registered destination in %.1f s before the first load "
                "(as at an engine's start)\n",
                r->front().pool_warm_s);
  std::printf("measured: the lookup and the load (every KV byte through kvmesh%s, into registered memory), x kv scale; "
              "modelled: the prefills (recompute, and the suffix after a hit) by the roofline of the named model "
              "and GPU\n",
              a.o.kv_scale == 1 ? " at its real size" : ", at 1/kv-scale of its size");
  return 0;
}

// A progress line on stderr when it is a terminal.
serve::ServeProgress ProgressLine() {
  const bool tty = ::isatty(2);
  return [tty](const std::string& label, uint64_t arrived, uint64_t finished, uint64_t total) {
    if (!tty) return;
    std::fprintf(stderr, "\r\033[K[bench-serve] %-28s arrived %4llu/%-4llu finished %4llu", label.c_str(),
                 (unsigned long long)arrived, (unsigned long long)total, (unsigned long long)finished);
    if (finished == total && arrived == total) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  };
}

int RunWorld(Args& a) {
  auto fail = [](const Status& s) {
    std::cerr << "kvmesh bench-serve: " << s.ToString() << "\n";
    return 1;
  };
  serve::WorldServeOptions& w = a.wm;
  if (a.rates_given) {
    auto rates = SplitList<double>(a.rates, "--rates");
    if (!rates.ok()) return fail(rates.status());
    w.rates = *rates;
  }
  if (a.configs_given) {
    auto configs = SplitList<std::string>(a.configs, "--configs");
    if (!configs.ok()) return fail(configs.status());
    w.configs = *configs;
  }
  auto scenes = SplitList<std::string>(a.wm_scenes, "--wm-scenes");
  if (!scenes.ok()) return fail(scenes.status());
  w.scenes = *scenes;
  w.duration_s = a.o.workload.duration_s;
  w.seed = a.o.workload.seed;
  w.slo_frame_s = a.slo_frame_ms / 1e3;
  auto results = serve::RunWorldServe(a.o, w, ProgressLine());
  if (!results.ok()) return fail(results.status());
  if (!a.plot.empty() && !serve::WriteWorldPlots(a.plot, w, *results))
    std::cerr << "kvmesh bench-serve: gnuplot failed; data in " << a.plot << ".dat\n";
  if (a.json) {
    std::cout << serve::WorldResultsJson(a.o, w, *results).dump(2) << "\n";
    return 0;
  }
  std::printf("kvmesh bench-serve --workload worldmodel: reference world model (%llu params, %ux%u frames of %u "
              "patches, %u codes, KV %s, computed on this CPU), %u engines, %s kvmesh (%s, %u nodes); gate tau %.2f "
              "rho %.2f window %u, %s\n",
              (unsigned long long)w.model.Params(), w.model.width, w.model.height, w.model.num_patches(),
              w.model.codes, w.model.input_kv ? "from the embedding" : "per layer", a.o.engines, a.o.cluster.c_str(),
              a.o.transport.c_str(), a.o.nodes, w.gate.ssim_threshold, w.gate.change_threshold, w.gate.window,
              w.context_gate ? "pixel gate and context fingerprint" : "pixel gate only");
  serve::PrintWorldTable(w, *results);
  if (!a.plot.empty())
    std::printf("plots: %s-frame-p99.png %s-goodput.png %s-kv.png\n", a.plot.c_str(), a.plot.c_str(), a.plot.c_str());
  return 0;
}

int Run(Args& a) {
  auto fail = [](const Status& s) {
    std::cerr << "kvmesh bench-serve: " << s.ToString() << "\n";
    return 1;
  };
  auto rates = SplitList<double>(a.rates, "--rates");
  if (!rates.ok()) return fail(rates.status());
  auto configs = SplitList<std::string>(a.configs, "--configs");
  if (!configs.ok()) return fail(configs.status());
  auto mem = ParseSize(a.node_memory);
  if (!mem.ok()) return fail(mem.status());
  a.o.rates = *rates;
  a.o.configs = *configs;
  a.o.node_memory = *mem;
  auto pmem = ParseSize(a.pressure_memory);
  if (!pmem.ok()) return fail(pmem.status());
  auto smem = ParseSize(a.ssd_memory);
  if (!smem.ok()) return fail(smem.status());
  a.o.pressure_memory = *pmem;
  a.o.ssd_memory = *smem;
  a.o.slo_ttft_s = a.slo_ttft_ms / 1e3;
  a.o.slo_tpot_s = a.slo_tpot_ms / 1e3;
  if (a.o.kvmesh_bin.empty()) a.o.kvmesh_bin = SelfPath();
  if (serve::IsReferenceModel(a.o.engine_model)) a.o.kv_scale = 1;  // its KV is small: real size
  if (a.workload == "worldmodel") return RunWorld(a);
  if (a.workload != "sessions") return fail(InvalidArgument("--workload must be sessions or worldmodel"));
  if (!a.prefix_check.empty()) return PrefixCheck(a);
  auto results = serve::RunBenchServe(a.o, ProgressLine());
  if (!results.ok()) return fail(results.status());
  if (!a.plot.empty() && !serve::WritePlots(a.plot, a.o, *results))
    std::cerr << "kvmesh bench-serve: gnuplot failed; data in " << a.plot << ".dat\n";
  if (a.json) {
    std::cout << serve::ResultsJson(a.o, *results).dump(2) << "\n";
  } else {
    if (serve::IsReferenceModel(a.o.engine_model))
      std::printf("kvmesh bench-serve: %s (computed on this CPU), %u engines, %s kvmesh (%s, %u nodes), kv scale 1/%u\n",
                  a.o.engine_model.c_str(), a.o.engines, a.o.cluster.c_str(), a.o.transport.c_str(), a.o.nodes,
                  a.o.kv_scale);
    else
      std::printf("kvmesh bench-serve: %s (MFU %.2f, HBM %.2f), %u engines, %s kvmesh (%s, %u nodes), kv scale 1/%u\n",
                  a.o.engine_model.c_str(), a.o.mfu, a.o.mbu, a.o.engines, a.o.cluster.c_str(),
                  a.o.transport.c_str(), a.o.nodes, a.o.kv_scale);
    serve::PrintTable(a.o, *results);
    serve::PrintRoutingComparison(*results);
    if (!a.plot.empty()) std::printf("plots: %s-ttft-p99.png %s-goodput.png\n", a.plot.c_str(), a.plot.c_str());
  }
  return 0;
}

}  // namespace

void AddServeEngineCommand(CLI::App& app, int* exit_code);

void AddBenchServeCommand(CLI::App& app, int* exit_code) {
  AddServeEngineCommand(app, exit_code);
  auto* cmd = app.add_subcommand(
      "bench-serve",
      "Open-loop serving benchmark: TTFT/TPOT/goodput vs offered load, recompute vs local cache vs kvmesh");
  auto a = std::make_shared<Args>();
  serve::BenchServeOptions& o = a->o;
  serve::WorkloadOptions& w = o.workload;
  cmd->add_option("--engine-model", o.engine_model, "roofline:<llama-3.1-8b|llama-3.1-70b|mixtral-8x7b>:<h100|h200>[:tpN], or reference[:LAYERSxHIDDEN] "
                  "(the CPU reference MoE model computing for real; see docs/serving.md for a workload it sustains)")
      ->capture_default_str();
  cmd->add_option("--mfu", o.mfu, "share of peak FLOP/s the engine model reaches")->capture_default_str();
  cmd->add_option("--mbu", o.mbu, "share of HBM bandwidth the engine model reaches")->capture_default_str();
  cmd->add_option("--rates", a->rates, "offered request rates, req/s (comma list)")->capture_default_str();
  cmd->add_option("--configs", a->configs, "configurations: recompute,local,kvmesh,kvmesh-blind,kvmesh-ssd,kvmesh-ssd-blind,kvmesh-int4,kvmesh-fp8 "
                  "(-ssd: against a second cluster of small device and host tiers over an SSD tier; -int4, -fp8: "
                  "against a cluster storing blocks with that codec; "
                  "a -kv suffix: KV-aware routing on the engines' KV events, -kv-approx: on routing history; "
                  "then a +procs suffix: that configuration's engines as child processes, as --engine-procs)")
      ->capture_default_str();
  cmd->add_option("--approx-ttl", o.approx_ttl_s, "-kv-approx: seconds a routed prompt counts as on its engine")
      ->capture_default_str();
  cmd->add_option("--engines", o.engines, "engine instances (threads, each its own kvmesh client)")->capture_default_str();
  cmd->add_flag("--engine-procs", o.engine_procs,
                "each engine a child process (kvmesh serve-engine) with its own kvmesh client, instead of a thread");
  cmd->add_option("--duration", w.duration_s, "seconds of session arrivals per run")->capture_default_str();
  cmd->add_option("--drain", o.drain_s, "seconds unfinished requests get after the last arrival")->capture_default_str();
  cmd->add_option("--turns", w.turns, "turns per session")->capture_default_str();
  cmd->add_option("--think", w.think_s, "mean seconds between a session's turns")->capture_default_str();
  cmd->add_option("--agent-share", w.agent_share, "share of sessions that are agent loops")->capture_default_str();
  cmd->add_option("--system-prompts", w.system_prompts, "distinct shared prefixes per kind")->capture_default_str();
  cmd->add_option("--system-tokens", w.system_tokens, "chat system prompt tokens")->capture_default_str();
  cmd->add_option("--preamble-tokens", w.agent_preamble_tokens, "agent preamble tokens")->capture_default_str();
  cmd->add_option("--user-tokens", w.user_tokens, "mean user message tokens")->capture_default_str();
  cmd->add_option("--tool-tokens", w.tool_tokens, "mean tool output tokens")->capture_default_str();
  cmd->add_option("--output-tokens", w.output_tokens, "mean output tokens")->capture_default_str();
  cmd->add_option("--seed", w.seed, "workload seed")->capture_default_str();
  cmd->add_option("--block-tokens", o.block_tokens, "tokens per KV block")->capture_default_str();
  cmd->add_option("--local-cache-blocks", o.local_cache_blocks, "each engine's device-tier prefix cache, blocks")
      ->capture_default_str();
  cmd->add_option("--max-batch", o.max_batch, "running requests per engine")->capture_default_str();
  cmd->add_option("--kv-scale", o.kv_scale, "blocks move at 1/N of their real bytes; load time is charged N times")
      ->capture_default_str();
  cmd->add_option("--cluster", o.cluster, "kvmesh tier: daemons (coordinator + node processes) | embedded")
      ->capture_default_str();
  cmd->add_option("--transport", o.transport, "daemons' data plane: tcp | ucx")->capture_default_str();
  cmd->add_option("--nodes", o.nodes, "kvmesh nodes")->capture_default_str();
  cmd->add_option("--node-memory", a->node_memory, "host memory per node (bytes moved, i.e. after --kv-scale)")
      ->capture_default_str();
  cmd->add_option("--pressure-memory", a->pressure_memory,
                  "kvmesh-ssd*: device and host tier per node, each (bytes moved)")
      ->capture_default_str();
  cmd->add_option("--ssd-memory", a->ssd_memory, "kvmesh-ssd*: SSD tier per node, in --work-dir (bytes moved)")
      ->capture_default_str();
  cmd->add_option("--probe-interval", o.probe_interval_s,
                  "the decision's shadow loads (measured while their run is recomputed): at most one per this many s")
      ->capture_default_str();
  cmd->add_option("--trace", o.trace_path,
                  "a Mooncake-format trace (JSONL: timestamp ms, input_length, output_length, hash_ids) as the "
                  "arrivals and prompts instead of the synthetic sessions; --rates is then ignored");
  cmd->add_option("--trace-start", o.trace.start_s, "--trace: first second of the trace replayed")
      ->capture_default_str();
  cmd->add_option("--trace-duration", o.trace.duration_s, "--trace: seconds of the trace replayed")
      ->capture_default_str();
  cmd->add_option("--trace-speed", o.trace.speed, "--trace: arrivals this many times faster than recorded")
      ->capture_default_str();
  cmd->add_option("--trace-max-output", o.trace.max_output, "--trace: output tokens per request at most")
      ->capture_default_str();
  cmd->add_option("--slo-ttft-ms", a->slo_ttft_ms, "goodput SLO: TTFT bound")->capture_default_str();
  cmd->add_option("--slo-tpot-ms", a->slo_tpot_ms, "goodput SLO: TPOT bound")->capture_default_str();
  cmd->add_option("--work-dir", o.work_dir, "daemons' config and logs (default /tmp/kvmesh-bench-serve-<pid>)");
  cmd->add_flag("--json", a->json, "print the results as JSON");
  cmd->add_option("--plot", a->plot, "write PREFIX-ttft-p99.png and PREFIX-goodput.png (gnuplot)");
  cmd->add_option("--prefix-check", a->prefix_check,
                  "instead of the sweep: TTFT of a hit vs recomputing, one request per prefix length (comma list)");
  cmd->add_option("--prefix-reps", o.prefix_reps,
                  "--prefix-check: loads of each prefix after the first (shown apart); their median is reported")
      ->capture_default_str();
  cmd->add_option("--workload", a->workload,
                  "sessions (chat and agent turns) | worldmodel (frame sessions of the reference world model; "
                  "--rates are frames/s, --configs wm-off,wm-exact,wm-kvmesh,wm-kvmesh-local)")
      ->capture_default_str();
  cmd->add_option("--wm-frames", a->wm.session_frames, "worldmodel: frames per session")->capture_default_str();
  cmd->add_option("--wm-fps", a->wm.fps, "worldmodel: a session's frames arrive this many a second")
      ->capture_default_str();
  cmd->add_option("--wm-scenes", a->wm_scenes, "worldmodel: scene presets, one per session in turn (comma list)")
      ->capture_default_str();
  cmd->add_option("--slo-frame-ms", a->slo_frame_ms, "worldmodel: goodput SLO, frame latency bound")
      ->capture_default_str();
  cmd->add_option("--wm-hidden", a->wm.model.hidden, "worldmodel: the model's hidden size")->capture_default_str();
  cmd->add_option("--wm-layers", a->wm.model.layers, "worldmodel: the model's layers")->capture_default_str();
  cmd->add_option("--wm-heads", a->wm.model.heads, "worldmodel: the model's attention heads")->capture_default_str();
  cmd->add_option("--wm-ffn", a->wm.model.ffn, "worldmodel: the model's FFN width")->capture_default_str();
  cmd->add_option("--wm-patch", a->wm.model.patch, "worldmodel: the model's patch side, pixels")->capture_default_str();
  cmd->add_option("--wm-codes", a->wm.model.codes, "worldmodel: VQ tokenizer codebook size (0: continuous pixel embedding)")
      ->capture_default_str();
  cmd->add_flag("--wm-input-kv,!--no-wm-input-kv", a->wm.model.input_kv,
                "worldmodel: K and V of every layer from the patch's embedding (default), or from each layer's input");
  cmd->add_flag("!--no-wm-context-gate", a->wm.context_gate,
                "worldmodel: wm-kvmesh reuses by the pixel gate alone, without checking each block's fingerprint");
  cmd->add_option("--tau", a->wm.gate.ssim_threshold, "worldmodel: wm-kvmesh's SSIM gate")->capture_default_str();
  cmd->add_option("--rho", a->wm.gate.change_threshold, "worldmodel: wm-kvmesh's changed-pixel gate")
      ->capture_default_str();
  cmd->callback([a, exit_code, cmd] {
    a->rates_given = cmd->count("--rates") > 0;
    a->configs_given = cmd->count("--configs") > 0;
    *exit_code = Run(*a);
  });
}

// `kvmesh serve-engine`: one engine of `bench-serve --engine-procs`, driven
// over stdin/stdout by the harness that spawns it (cli/serve/engine_proc.h).
void AddServeEngineCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand(
      "serve-engine",
      "One engine of `kvmesh bench-serve --engine-procs` (spawned by it): reads its JSON options and then request "
      "arrivals on stdin, writes one JSON line per request on stdout (protocol: cli/serve/engine_proc.h)");
  cmd->callback([exit_code] { *exit_code = serve::RunServeEngine(); });
}

}  // namespace kvmesh::cli

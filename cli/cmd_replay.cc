// kvmesh replay — trace replay of the eviction policies against Belady's
// optimum and the infinite cache: prefix hit rate, and the prefill FLOPs the
// cache saves (the model from --config) against a clairvoyant reference for
// FLOPs. See eviction/replay.h.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/default_config.h"
#include "cli/replay_cluster.h"
#include "common/progress.h"
#include "eviction/replay.h"
#include "kvmesh/config.h"

namespace kvmesh::cli {
namespace {

struct ReplayArgs {
  std::string trace;
  std::vector<size_t> capacity_blocks;
  std::string capacity_fractions;
  std::vector<std::string> policies;
  bool json = false;
  std::string plot;
  bool no_hints = false;
  bool session_closes = false;
  bool through_cluster = false;
  double aging_s = 60.0;
  size_t shadow_sample_floor = PolicyOptions{}.shadow_sample_floor;
  unsigned threads = 0;
  std::string config;          // the model for FLOPs; default: the built-in cluster_configs/local.json
  uint32_t block_tokens = 512;  // tokens per trace block (Mooncake: 512)
};

Result<std::vector<double>> ParseFractions(const std::string& s) {
  std::vector<double> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    double f = std::strtod(item.c_str(), &end);
    if (item.empty() || end != item.c_str() + item.size() || !(f > 0) || f > 1)
      return InvalidArgument("--capacity-fractions: '" + item + "' is not a number in (0, 1]");
    out.push_back(f);
  }
  return out;
}

std::vector<std::string> SplitPolicies(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  for (const std::string& a : args) {
    std::stringstream ss(a);
    std::string item;
    while (std::getline(ss, item, ','))
      if (!item.empty() && std::find(out.begin(), out.end(), item) == out.end()) out.push_back(item);
  }
  return out;
}

struct Column {
  size_t capacity = 0;
  double fraction = 0;  // 0 when given in blocks
  ReplayResult belady;
  ReplayResult belady_flops;
  std::vector<ReplayResult> policies;  // in --policy order
  // --session-closes: lru told nothing, the baseline of "gap closed" (the
  // hint is what is measured, so LRU without it stays the floor).
  ReplayResult lru_no_closes;
  // --through-cluster: the same policies on an embedded cluster's nodes, and
  // their own lru baseline.
  std::vector<ReplayResult> cluster;
  ReplayResult cluster_lru_no_closes;

  // The clairvoyant FLOPs reference: the better of Belady and belady-flops.
  double flops_reference() const {
    return std::max(belady.flops_saved_fraction(), belady_flops.flops_saved_fraction());
  }
};

double GapClosed(double policy, double lru, double belady) {
  return belady - lru > 1e-12 ? (policy - lru) / (belady - lru) : 0.0;
}

Status WritePlot(const std::string& png, const std::vector<Column>& cols, const std::vector<std::string>& names,
                 const ReplayResult& infinite, const std::string& title) {
  std::string dat = png + ".dat";
  {
    std::ofstream f(dat);
    if (!f) return IoError("cannot write " + dat);
    f << "# capacity_fraction, then prefix hit % and FLOPs saved % of:";
    for (const auto& n : names) f << " " << n;
    f << " belady infinite (and FLOPs: reference)\n";
    for (const Column& c : cols) {
      f << c.fraction;
      for (const ReplayResult& r : c.policies) f << " " << 100 * r.prefix_hit_rate();
      f << " " << 100 * c.belady.prefix_hit_rate() << " " << 100 * infinite.prefix_hit_rate();
      for (const ReplayResult& r : c.policies) f << " " << 100 * r.flops_saved_fraction();
      f << " " << 100 * c.flops_reference() << " " << 100 * infinite.flops_saved_fraction() << "\n";
    }
  }
  double lo = 1, hi = 0;
  for (const Column& c : cols) {
    lo = std::min(lo, c.fraction);
    hi = std::max(hi, c.fraction);
  }
  std::string gp = png + ".gp";
  {
    std::ofstream f(gp);
    if (!f) return IoError("cannot write " + gp);
    const size_t n = names.size();
    f << "set terminal pngcairo size 1200,520 font 'sans,10'\n"
      << "set output '" << png << "'\n"
      << "set termoption noenhanced\n"
      << "set multiplot layout 1,2 title '" << title << "'\n"
      << "set xlabel 'capacity (fraction of distinct blocks, log scale)'\n"
      << "set logscale x\nset grid\nset key bottom right\n"
      << "set xrange [" << lo / 1.3 << ":" << hi * 1.3 << "]\nset yrange [0:*]\n"
      << "set format x '%g'\n";
    for (int panel = 0; panel < 2; ++panel) {
      const size_t base = panel == 0 ? 2 : n + 4;  // first policy column
      f << "set title '" << (panel == 0 ? "prefix hit rate (%)" : "prefill FLOPs saved (%)") << "'\n"
        << "plot ";
      for (size_t i = 0; i < n; ++i)
        f << "'" << dat << "' using 1:" << base + i << " with linespoints"
          << (names[i] == std::string(kDefaultEvictionPolicy) ? " lw 3 lc rgb 'black'" : "") << " title '" << names[i]
          << (names[i] == std::string(kDefaultEvictionPolicy) ? " (default)" : "") << "', ";
      f << "'" << dat << "' using 1:" << base + n << " with linespoints lw 2 dt 2 title '"
        << (panel == 0 ? "belady" : "clairvoyant reference") << "', "
        << "'" << dat << "' using 1:" << base + n + 1 << " with lines lw 2 dt 3 title 'infinite'\n";
    }
    f << "unset multiplot\n";
  }
  std::string cmd = "gnuplot '" + gp + "' 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return IoError("cannot run gnuplot");
  std::string out;
  char buf[256];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  int rc = ::pclose(p);
  if (rc != 0) return IoError("gnuplot failed (is gnuplot installed?): " + out);
  std::remove(gp.c_str());
  std::remove(dat.c_str());
  return Status::Ok();
}

Result<ClusterConfig> ConfigFor(const ReplayArgs& a) {
  return a.config.empty() ? ParseConfig(kDefaultLocalConfig, "cluster_configs/local.json (built in)")
                          : LoadConfigFile(a.config);
}

Result<PrefillModel> ModelFor(const ReplayArgs& a, const ClusterConfig& cfg) {
  if (a.block_tokens == 0) return InvalidArgument("--block-tokens must be at least 1");
  PrefillModel m;
  m.layers = cfg.model.num_layers;
  m.heads = cfg.model.num_kv_heads;
  m.head_dim = cfg.model.head_dim;
  m.block_tokens = a.block_tokens;
  return m;
}

Status RunReplay(const ReplayArgs& a) {
  KVMESH_ASSIGN_OR_RETURN(Trace trace, LoadMooncakeTrace(a.trace));
  if (a.session_closes && trace.session.empty())
    return InvalidArgument("--session-closes: " + a.trace +
                           " has no \"session\" fields (write it with scripts/gen-trace.py --sessions)");
  if (trace.lookups() == 0) return InvalidArgument(a.trace + ": no requests");

  KVMESH_ASSIGN_OR_RETURN(const ClusterConfig cluster_config, ConfigFor(a));
  KVMESH_ASSIGN_OR_RETURN(const PrefillModel model, ModelFor(a, cluster_config));
  std::vector<std::string> names = SplitPolicies(a.policies);
  if (names.empty()) names = {"lru", "lru-priority", "arc", "s3-fifo", std::string(kDefaultEvictionPolicy)};
  if (std::find(names.begin(), names.end(), "lru") == names.end()) names.insert(names.begin(), "lru");
  if (std::find(names.begin(), names.end(), std::string(kDefaultEvictionPolicy)) == names.end())
    names.emplace_back(kDefaultEvictionPolicy);
  for (const std::string& n : names) KVMESH_RETURN_IF_ERROR(ParsePolicySpec(n).status());

  std::vector<Column> cols;
  for (size_t b : a.capacity_blocks) {
    if (b == 0) return InvalidArgument("--capacity-blocks must be at least 1");
    cols.push_back({b, static_cast<double>(b) / static_cast<double>(trace.distinct), {}, {}, {}});
  }
  if (!a.capacity_fractions.empty()) {
    KVMESH_ASSIGN_OR_RETURN(std::vector<double> fr, ParseFractions(a.capacity_fractions));
    for (double f : fr)
      cols.push_back({std::max<size_t>(1, static_cast<size_t>(f * static_cast<double>(trace.distinct))), f, {}, {}, {}});
  }
  if (cols.empty()) return InvalidArgument("give --capacity-blocks N or --capacity-fractions a,b,...");
  std::sort(cols.begin(), cols.end(), [](const Column& x, const Column& y) { return x.capacity < y.capacity; });
  for (Column& c : cols) {
    c.policies.resize(names.size());
    if (a.through_cluster) c.cluster.resize(names.size());
  }

  // One job per (capacity, policy) plus the two clairvoyant ones per capacity, on a small pool.
  struct Job {
    size_t col;
    int policy;  // -1: Belady, -2: belady-flops, -3: lru without session closes
    bool cluster = false;  // through the embedded cluster (--through-cluster)
  };
  std::vector<Job> jobs;
  for (size_t c = 0; c < cols.size(); ++c) {
    jobs.push_back({c, -1});
    jobs.push_back({c, -2});
    for (bool cl : {false, true}) {
      if (cl && !a.through_cluster) continue;
      if (a.session_closes) jobs.push_back({c, -3, cl});
      for (size_t p = 0; p < names.size(); ++p) jobs.push_back({c, static_cast<int>(p), cl});
    }
  }
  ReplayOptions ro;
  // The nodes get no derived hints, so neither does the policy object it is compared with.
  ro.derive_hints = !a.no_hints && !a.through_cluster;
  ro.session_closes = a.session_closes;
  ro.model = model;
  ro.hints.block_tokens = model.block_tokens;
  ro.aging_ns = static_cast<int64_t>(a.aging_s * 1e9);
  ro.shadow_sample_floor = a.shadow_sample_floor;
  std::atomic<uint64_t> done{0};
  ro.progress = &done;
  std::atomic<size_t> next_job{0};
  std::atomic<size_t> finished{0};
  std::vector<Status> errors(jobs.size());
  auto worker = [&] {
    for (size_t j; (j = next_job.fetch_add(1)) < jobs.size();) {
      Column& c = cols[jobs[j].col];
      if (jobs[j].cluster) {
        const bool plain_lru = jobs[j].policy == -3;
        ReplayOptions co = ro;
        if (plain_lru) co.session_closes = false;
        Result<ReplayResult> r = ReplayThroughCluster(trace, plain_lru ? "lru" : names[jobs[j].policy], c.capacity,
                                                      cluster_config, co);
        if (!r.ok()) errors[j] = r.status();
        else if (plain_lru) c.cluster_lru_no_closes = std::move(r).value();
        else c.cluster[jobs[j].policy] = std::move(r).value();
      } else if (jobs[j].policy == -1) {
        c.belady = ReplayBelady(trace, c.capacity, &done, model);
      } else if (jobs[j].policy == -2) {
        c.belady_flops = ReplayBeladyFlops(trace, c.capacity, model, &done);
      } else if (jobs[j].policy == -3) {
        ReplayOptions plain = ro;
        plain.session_closes = false;
        Result<ReplayResult> r = ReplayPolicy(trace, "lru", c.capacity, plain);
        if (r.ok()) c.lru_no_closes = std::move(r).value();
        else errors[j] = r.status();
      } else {
        Result<ReplayResult> r = ReplayPolicy(trace, names[jobs[j].policy], c.capacity, ro);
        if (r.ok()) c.policies[jobs[j].policy] = std::move(r).value();
        else errors[j] = r.status();
      }
      finished.fetch_add(1);
    }
  };
  const auto t0 = std::chrono::steady_clock::now();
  unsigned threads = a.threads ? a.threads : std::max(1u, std::thread::hardware_concurrency());
  threads = std::min<unsigned>(threads, static_cast<unsigned>(jobs.size()));
  {
    ProgressBar bar("replay", jobs.size() * trace.lookups());
    std::vector<std::thread> pool;
    for (unsigned i = 0; i < threads; ++i) pool.emplace_back(worker);
    while (finished.load() < jobs.size()) {
      bar.Update(done.load());
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    for (auto& t : pool) t.join();
    bar.Update(done.load());
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (const Status& s : errors) KVMESH_RETURN_IF_ERROR(s);

  const ReplayResult inf = ReplayInfinite(trace, model);
  const size_t lru_idx = std::find(names.begin(), names.end(), "lru") - names.begin();
  const std::string default_policy(kDefaultEvictionPolicy);

  if (a.json) {
    nlohmann::json j;
    j["trace"] = trace.source;
    j["requests"] = trace.requests();
    j["lookups"] = trace.lookups();
    j["distinct_blocks"] = trace.distinct;
    j["hints"] = (a.no_hints || a.through_cluster) ? "none" : "derived (docs/eviction.md)";
    if (a.through_cluster) j["cluster"] = {{"config", cluster_config.source}, {"nodes", cluster_config.nodes.size()},
                                           {"stripes", cluster_config.store.stripes}};
    j["session_closes"] = a.session_closes;
    j["default_policy"] = default_policy;
    j["model"] = {{"layers", model.layers},
                  {"heads", model.heads},
                  {"head_dim", model.head_dim},
                  {"block_tokens", model.block_tokens},
                  {"flops", "per block: layers x (24 D^2 t + 4 D (t p0 + t (t + 1) / 2)), D = heads x head_dim, "
                            "t tokens after p0 prefix tokens (eviction/replay.h)"}};
    j["infinite"] = {{"hit_rate", inf.hit_rate()},
                     {"prefix_hit_rate", inf.prefix_hit_rate()},
                     {"flops_saved_fraction", inf.flops_saved_fraction()}};
    j["seconds"] = seconds;
    j["threads"] = threads;
    for (const Column& c : cols) {
      nlohmann::json col;
      col["capacity_blocks"] = c.capacity;
      col["capacity_fraction"] = c.fraction;
      col["belady"] = {{"hit_rate", c.belady.hit_rate()},
                       {"prefix_hit_rate", c.belady.prefix_hit_rate()},
                       {"flops_saved_fraction", c.belady.flops_saved_fraction()},
                       {"declined", c.belady.declined}};
      col["belady_flops"] = {{"prefix_hit_rate", c.belady_flops.prefix_hit_rate()},
                             {"flops_saved_fraction", c.belady_flops.flops_saved_fraction()},
                             {"declined", c.belady_flops.declined}};
      col["flops_reference_fraction"] = c.flops_reference();
      const ReplayResult& lru = a.session_closes ? c.lru_no_closes : c.policies[lru_idx];
      if (a.session_closes)
        col["lru_without_session_closes"] = {{"prefix_hit_rate", lru.prefix_hit_rate()},
                                             {"flops_saved_fraction", lru.flops_saved_fraction()}};
      for (const ReplayResult& r : c.policies) {
        nlohmann::json row = {
            {"policy", r.policy},
            {"default", r.policy == default_policy},
            {"hit_rate", r.hit_rate()},
            {"prefix_hit_rate", r.prefix_hit_rate()},
            {"gap_closed", GapClosed(r.prefix_hit_rate(), lru.prefix_hit_rate(), c.belady.prefix_hit_rate())},
            {"flops_saved_fraction", r.flops_saved_fraction()},
            {"flops_gap_closed",
             GapClosed(r.flops_saved_fraction(), lru.flops_saved_fraction(), c.flops_reference())},
            {"declined", r.declined},
            {"evictions", r.evictions},
            {"seconds", r.seconds}};
        if (!r.leader.empty()) row["following"] = r.leader;
        if (a.session_closes) row["released"] = r.released;
        if (a.through_cluster) {
          const ReplayResult& x = c.cluster[&r - c.policies.data()];
          const ReplayResult& base = a.session_closes ? c.cluster_lru_no_closes : c.cluster[lru_idx];
          row["cluster"] = {
              {"prefix_hit_rate", x.prefix_hit_rate()},
              {"gap_closed", GapClosed(x.prefix_hit_rate(), base.prefix_hit_rate(), c.belady.prefix_hit_rate())},
              {"flops_saved_fraction", x.flops_saved_fraction()},
              {"evictions", x.evictions},
              {"released", x.released},
              {"seconds", x.seconds}};
          if (!x.leader.empty()) row["cluster"]["following"] = x.leader;
        }
        col["policies"].push_back(std::move(row));
      }
      j["results"].push_back(col);
    }
    std::cout << j.dump(2) << "\n";
  } else {
    std::printf("%s: %zu requests, %zu lookups, %zu distinct blocks; infinite cache: hit %.2f%%, prefix hit %.2f%%, "
                "FLOPs saved %.2f%%\n",
                trace.source.c_str(), trace.requests(), trace.lookups(), trace.distinct, 100 * inf.hit_rate(),
                100 * inf.prefix_hit_rate(), 100 * inf.flops_saved_fraction());
    if (a.session_closes) std::printf("session closes: a closed session's private blocks are released\n");
    if (a.through_cluster)
      std::printf("through the cluster of %s (%zu nodes, %u stripes each; no derived hints in either run)\n",
                  cluster_config.source.c_str(), cluster_config.nodes.size(), cluster_config.store.stripes);
    std::printf("model: %u layers x %u heads x %u head_dim, %u-token blocks; default policy: %s\n", model.layers,
                model.heads, model.head_dim, model.block_tokens, default_policy.c_str());
    std::printf("%-24s %9s %8s %9s %11s %9s %11s\n", "policy", "capacity", "hit %", "prefix %", "gap closed",
                "FLOPs %", "FLOPs gap");
    for (const Column& c : cols) {
      const ReplayResult& lru = a.session_closes ? c.lru_no_closes : c.policies[lru_idx];
      if (a.session_closes)
        std::printf("%-24s %9zu %8.2f %9.2f %11s %9.2f\n", "lru (no session closes)", c.capacity,
                    100 * lru.hit_rate(), 100 * lru.prefix_hit_rate(), "0.0%", 100 * lru.flops_saved_fraction());
      for (const ReplayResult& r : c.policies) {
        const std::string label = r.policy + (r.policy == default_policy ? " (default)" : "");
        std::printf("%-24s %9zu %8.2f %9.2f %10.1f%% %9.2f %10.1f%%\n", label.c_str(), c.capacity,
                    100 * r.hit_rate(), 100 * r.prefix_hit_rate(),
                    100 * GapClosed(r.prefix_hit_rate(), lru.prefix_hit_rate(), c.belady.prefix_hit_rate()),
                    100 * r.flops_saved_fraction(),
                    100 * GapClosed(r.flops_saved_fraction(), lru.flops_saved_fraction(), c.flops_reference()));
      }
      if (a.through_cluster) {
        const ReplayResult& base = a.session_closes ? c.cluster_lru_no_closes : c.cluster[lru_idx];
        if (a.session_closes)
          std::printf("%-24s %9zu %8s %9.2f %11s %9.2f\n", "lru [cluster, no closes]", c.capacity, "",
                      100 * base.prefix_hit_rate(), "0.0%", 100 * base.flops_saved_fraction());
        for (const ReplayResult& r : c.cluster) {
          const std::string label = r.policy + " [cluster]";
          std::printf("%-24s %9zu %8s %9.2f %10.1f%% %9.2f\n", label.c_str(), c.capacity, "",
                      100 * r.prefix_hit_rate(),
                      100 * GapClosed(r.prefix_hit_rate(), base.prefix_hit_rate(), c.belady.prefix_hit_rate()),
                      100 * r.flops_saved_fraction());
        }
      }
      std::printf("%-24s %9zu %8.2f %9.2f %11s %9.2f\n", "belady", c.capacity, 100 * c.belady.hit_rate(),
                  100 * c.belady.prefix_hit_rate(), "100.0%", 100 * c.belady.flops_saved_fraction());
      std::printf("%-24s %9zu %8.2f %9.2f %11s %9.2f\n", "belady-flops", c.capacity,
                  100 * c.belady_flops.hit_rate(), 100 * c.belady_flops.prefix_hit_rate(), "",
                  100 * c.belady_flops.flops_saved_fraction());
    }
    if (a.session_closes) std::printf("(with session closes, the LRU of both gaps is lru without them)\n");
    std::printf("(gap closed = share of the LRU-to-Belady prefix hit rate gap; FLOPs gap = share of the LRU-to-reference "
                "FLOPs gap, reference = the better of belady and belady-flops; %.1f s on %u threads)\n",
                seconds, threads);
  }
  if (!a.plot.empty()) {
    const std::string base = trace.source.substr(trace.source.find_last_of('/') + 1);
    KVMESH_RETURN_IF_ERROR(WritePlot(a.plot, cols, names, inf, base + ": prefix hits and prefill FLOPs saved vs capacity"));
    if (!a.json) std::printf("plot: %s\n", a.plot.c_str());
  }
  return Status::Ok();
}

}  // namespace

void AddReplayCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand(
      "replay", "Replay a Mooncake JSONL trace through eviction policies beside Belady's optimum");
  auto a = std::make_shared<ReplayArgs>();
  cmd->add_option("--trace", a->trace, "Mooncake-format JSONL trace")->required();
  cmd->add_option("--capacity-blocks", a->capacity_blocks, "cache capacity in blocks (repeatable)");
  cmd->add_option("--capacity-fractions", a->capacity_fractions,
                  "capacities as fractions of the distinct blocks, e.g. 0.01,0.05,0.1");
  cmd->add_option("--policy", a->policies,
                  "policies, comma-separated or repeated: a factory name, optionally @<aging seconds>[/<classes>] "
                  "(e.g. lru-priority@120/8); lru and the default policy are always included");
  cmd->add_flag("--json", a->json, "print JSON instead of a table");
  cmd->add_option("--plot", a->plot, "draw prefix hit rate and FLOPs saved vs capacity into this PNG (gnuplot)");
  cmd->add_flag("--no-hints", a->no_hints, "do not derive client priority hints (all accesses get defaults)");
  cmd->add_flag("--session-closes", a->session_closes,
                "honour the trace's \"session\"/\"closes\" fields (gen-trace.py --sessions): release a closed "
                "session's private blocks (docs/eviction.md)");
  cmd->add_flag("--through-cluster", a->through_cluster,
                "also replay each policy through an embedded cluster built from --config (its nodes, stripes and "
                "placement; tiny blocks; no derived hints in either run): what the nodes' stores get "
                "(docs/eviction.md)");
  cmd->add_option("--aging-s", a->aging_s,
                  "aging period in trace seconds for policies without @ (default 60, the config default; 0: off)");
  cmd->add_option("--shadow-sample-floor", a->shadow_sample_floor,
                  "adaptive: its experts simulate one key in R (R = 2^k <= 64) once capacity / R >= this "
                  "(default 2048; 0: every expert simulates every key, as before; docs/eviction.md)");
  cmd->add_option("--threads", a->threads, "worker threads (default: all cores)");
  cmd->add_option("--config", a->config,
                  "cluster config whose model (num_layers, num_kv_heads, head_dim) prices prefill FLOPs, and the "
                  "cluster of --through-cluster (default: the built-in cluster_configs/local.json)");
  cmd->add_option("--block-tokens", a->block_tokens,
                  "tokens per trace block, for FLOPs and the partial-last-block hint (default 512, Mooncake's)");
  cmd->callback([a, exit_code] {
    Status s = RunReplay(*a);
    if (!s.ok()) {
      std::cerr << "kvmesh replay: " << s.ToString() << "\n";
      *exit_code = 1;
    }
  });
}

}  // namespace kvmesh::cli

// kvmesh demo: the main job on the embedded cluster. Two parts: the prefill
// replay through the router (cli/demo.h), then a short model-parallel
// decode whose KV lives in kvmesh sequences, with and without prefix reuse
// (coordinator/decode/, the same code as `kvmesh decode`). With
// --compare-policy, the replay part runs again on a fresh cluster of the same
// config with that eviction policy, alternating with the config's own
// (--compare-rounds times each), and prints both with their ratio.
#include <algorithm>
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/default_config.h"
#include "cli/report.h"
#include "coordinator/decode/cluster.h"
#include "cli/demo.h"
#include "eviction/eviction_policy.h"
#include "kvmesh/embedded.h"
#include "kvmesh/size.h"
#include "shard_node/shard_node.h"

namespace kvmesh::cli {
namespace {

struct DemoArgs {
  std::string config;
  bool json = false;
  uint32_t threads = 1;
  uint64_t seed = 42;
  uint32_t conversations = 400;
  bool decode = true;
  int decode_ranks = 4;
  std::string compare_policy;  // empty: no comparison
  int compare_rounds = 3;
  bool worldmodel = true;
  uint32_t worldmodel_frames = 32;
};

double Us(uint64_t ns) { return static_cast<double>(ns) / 1e3; }

// The decode part: the reference MoE model on `ranks` thread ranks over a
// fresh embedded cluster of the same config, a small seeded chat + agent
// workload run with and without prefix reuse.
struct DemoDecode {
  int ranks = 0;
  double params_m = 0;
  decode::DecodeReport with, without;
  bool codec = false;  // the config's codec is in the KV path (tokens may differ with reuse)
  bool same_tokens() const { return with.token_digest == without.token_digest; }
};

Result<DemoDecode> RunDecodePart(const ClusterConfig& base, int ranks, uint64_t seed) {
  decode::ModelConfig mc;
  mc.block_tokens = base.model.block_tokens;
  KVMESH_ASSIGN_OR_RETURN(ClusterConfig cfg, decode::DecodeClusterConfig(base, mc, ranks));
  KVMESH_ASSIGN_OR_RETURN(std::shared_ptr<const decode::Weights> w, decode::Weights::Generate(mc));
  decode::DecodeWorkloadOptions wo;
  wo.seed = seed;
  wo.conversations = 6;
  wo.agents = 2;
  DemoDecode d;
  d.ranks = ranks;
  d.params_m = mc.Params() / 1e6;
  d.codec = cfg.codec.enabled();
  for (bool reuse : {true, false}) {
    decode::DecodeRunOptions o;
    o.prefix_reuse = reuse;
    o.label = reuse ? "reuse" : "no-reuse";
    decode::DecodeReport rep;
    KVMESH_RETURN_IF_ERROR(decode::RunOnThreads(
        cfg, w, ranks, [&](decode::RankEngine& e, const decode::PrefixLookup& lookup, ShardNode* node) -> Status {
          KVMESH_ASSIGN_OR_RETURN(decode::DecodeReport r, decode::RunDecodeWorkload(e, lookup, node, wo, o));
          if (e.comm().rank() == 0) rep = r;
          return Status::Ok();
        }));
    (reuse ? d.with : d.without) = rep;
  }
  return d;
}

nlohmann::json DecodeJson(const DemoDecode& d) {
  auto side = [](const decode::DecodeReport& r) {
    return nlohmann::json{{"requests", r.requests},
                          {"generated_tokens", r.generated_tokens},
                          {"prefix_hit_rate", r.prefix_hit_rate()},
                          {"computed_prompt_tokens", r.computed_prompt_tokens},
                          {"ttft_ms_p50", Ms(r.ttft.Percentile(0.5))},
                          {"tpot_ms_p50", Ms(r.tpot.Percentile(0.5))},
                          {"tokens_per_s", r.tokens_per_s()},
                          {"kv_bytes", r.kv_bytes_stored}};
  };
  return {{"ranks", d.ranks},
          {"params_m", d.params_m},
          {"with_reuse", side(d.with)},
          {"without_reuse", side(d.without)},
          {"ratio_with_over_without",
           {{"ttft_p50", Ratio(d.with.ttft.Percentile(0.5), d.without.ttft.Percentile(0.5))},
            {"tpot_p50", Ratio(d.with.tpot.Percentile(0.5), d.without.tpot.Percentile(0.5))},
            {"tokens_per_s", Ratio(d.with.tokens_per_s(), d.without.tokens_per_s())}}},
          {"same_tokens_with_and_without_reuse", d.same_tokens()}};
}

// One replay part on a fresh embedded cluster of `cfg`.
struct ReplayRun {
  DemoReport r;
  StoreStats total;
  std::string policy;
};

Result<ReplayRun> RunReplayPart(const ClusterConfig& cfg, const DemoOptions& o) {
  KVMESH_ASSIGN_OR_RETURN(std::unique_ptr<EmbeddedCluster> cluster, EmbeddedCluster::Start(cfg));
  ReplayRun run;
  KVMESH_ASSIGN_OR_RETURN(run.r, RunDemo(cluster->router(), o));
  for (size_t i = 0; i < cluster->num_nodes(); ++i) {
    run.total.Add(cluster->node(i).Stats().store);
    run.policy = cluster->node(i).store().policy_name();
  }
  return run;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// --compare-policy: the config's policy and `other` on the same workload,
// alternating, each on a fresh cluster; medians over the rounds.
int RunCompare(const DemoArgs& a, const ClusterConfig& cfg) {
  ClusterConfig other = cfg;
  other.eviction.policy = a.compare_policy;
  DemoOptions o;
  o.workload.seed = a.seed;
  o.workload.conversations = a.conversations;
  o.threads = a.threads;
  o.progress = false;
  struct Side {
    std::string policy;
    std::vector<double> match_p50, match_p99, get_p50, put_p50, wall;
    double hit_rate = 0;
    uint64_t evictions = 0;
    bool same_every_round = true;  // hit rate and evictions equal in every round
  } sides[2];
  for (int round = 0; round < a.compare_rounds; ++round) {
    for (int k = 0; k < 2; ++k) {
      if (!a.json) std::fprintf(stderr, "kvmesh demo: round %d/%d, %s...\n", round + 1, a.compare_rounds,
                                k == 0 ? cfg.eviction.policy.c_str() : a.compare_policy.c_str());
      Result<ReplayRun> run = RunReplayPart(k == 0 ? cfg : other, o);
      if (!run.ok()) {
        std::cerr << "kvmesh demo: " << run.status().ToString() << "\n";
        return 1;
      }
      if (run->r.mismatches != 0) {
        std::cerr << "kvmesh demo: " << run->r.mismatches << " byte mismatches with " << run->policy << "\n";
        return 2;
      }
      Side& s = sides[k];
      s.policy = run->policy;
      s.match_p50.push_back(Us(run->r.match.Percentile(0.5)));
      s.match_p99.push_back(Us(run->r.match.Percentile(0.99)));
      s.get_p50.push_back(Us(run->r.get.Percentile(0.5)));
      s.put_p50.push_back(Us(run->r.put.Percentile(0.5)));
      s.wall.push_back(run->r.wall_s);
      if (round > 0 && (s.hit_rate != run->r.prefix_hit_rate() || s.evictions != run->total.evictions))
        s.same_every_round = false;
      s.hit_rate = run->r.prefix_hit_rate();
      s.evictions = run->total.evictions;
    }
  }
  const Side& x = sides[0];
  const Side& y = sides[1];
  if (a.json) {
    auto side = [](const Side& s) {
      return nlohmann::json{{"policy", s.policy},
                            {"prefix_hit_rate", s.hit_rate},
                            {"evictions", s.evictions},
                            {"same_every_round", s.same_every_round},
                            {"match_prefix_p50_us", Median(s.match_p50)},
                            {"match_prefix_p99_us", Median(s.match_p99)},
                            {"get_p50_us", Median(s.get_p50)},
                            {"put_p50_us", Median(s.put_p50)},
                            {"wall_s", Median(s.wall)}};
    };
    nlohmann::json j = {{"cluster", cfg.name},
                        {"seed", a.seed},
                        {"threads", a.threads},
                        {"rounds", a.compare_rounds},
                        {"policy", side(x)},
                        {"compare", side(y)},
                        {"ratio",
                         {{"match_prefix_p50", Ratio(Median(x.match_p50), Median(y.match_p50))},
                          {"get_p50", Ratio(Median(x.get_p50), Median(y.get_p50))},
                          {"put_p50", Ratio(Median(x.put_p50), Median(y.put_p50))},
                          {"wall_s", Ratio(Median(x.wall), Median(y.wall))}}}};
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("kvmesh demo: embedded cluster \"%s\", seed %llu, %u client thread%s; %s against %s, %d rounds\n"
              "alternating, each on a fresh cluster (medians over the rounds)\n",
              cfg.name.c_str(), (unsigned long long)a.seed, a.threads, a.threads == 1 ? "" : "s", x.policy.c_str(),
              y.policy.c_str(), a.compare_rounds);
  std::printf("  %-24s %12s %12s %8s\n", "", x.policy.c_str(), y.policy.c_str(), "ratio");
  auto row = [](const char* name, double v, double w, const char* fmt) { PrintRatioRow(name, v, w, fmt, 24, 12); };
  row("prefix hit rate (%)", 100 * x.hit_rate, 100 * y.hit_rate, "%.2f");
  row("evictions", double(x.evictions), double(y.evictions), "%.0f");
  row("match_prefix p50 (us)", Median(x.match_p50), Median(y.match_p50), "%.1f");
  row("match_prefix p99 (us)", Median(x.match_p99), Median(y.match_p99), "%.1f");
  row("get (batch) p50 (us)", Median(x.get_p50), Median(y.get_p50), "%.1f");
  row("put (batch) p50 (us)", Median(x.put_p50), Median(y.put_p50), "%.1f");
  row("wall time (s)", Median(x.wall), Median(y.wall), "%.2f");
  if (!x.same_every_round || !y.same_every_round)
    std::printf("  (hit rate or evictions differed between rounds: %s)\n",
                a.threads > 1 ? "several client threads interleave differently" : "unexpected with one thread");
  std::printf("  match_prefix p50 per round (us): %s", x.policy.c_str());
  for (double v : x.match_p50) std::printf(" %.1f", v);
  std::printf(";  %s", y.policy.c_str());
  for (double v : y.match_p50) std::printf(" %.1f", v);
  std::printf("\n");
  return 0;
}

int Run(const DemoArgs& a) {
  Result<ClusterConfig> cfg = a.config.empty() ? ParseConfig(kDefaultLocalConfig, "cluster_configs/local.json (built in)")
                                               : LoadConfigFile(a.config);
  if (!cfg.ok()) {
    std::cerr << "kvmesh demo: " << cfg.status().ToString() << "\n";
    return 1;
  }
  if (!a.compare_policy.empty()) {
    if (auto p = MakeEvictionPolicy(a.compare_policy, PolicyOptions{}); !p.ok()) {  // before any round runs
      std::cerr << "kvmesh demo: --compare-policy: " << p.status().ToString() << "\n";
      return 1;
    }
    return RunCompare(a, *cfg);
  }
  auto cluster = EmbeddedCluster::Start(*cfg);
  if (!cluster.ok()) {
    std::cerr << "kvmesh demo: " << cluster.status().ToString() << "\n";
    return 1;
  }
  DemoOptions o;
  o.workload.seed = a.seed;
  o.workload.conversations = a.conversations;
  o.threads = a.threads;
  o.progress = !a.json;
  Result<DemoReport> rep = RunDemo((*cluster)->router(), o);
  if (!rep.ok()) {
    std::cerr << "kvmesh demo: " << rep.status().ToString() << "\n";
    return 1;
  }
  const DemoReport& r = *rep;
  StoreStats total;
  std::string policy;
  for (size_t i = 0; i < (*cluster)->num_nodes(); ++i) {
    ShardNode& n = (*cluster)->node(i);
    total.Add(n.Stats().store);
    policy = n.store().policy_name();
  }
  const uint32_t classes = cfg->eviction.priority_classes;
  // Part 2, decode: run after the replay's figures are printed (text mode).
  Result<DemoDecode> dec = DemoDecode{};
  auto run_decode = [&]() -> bool {
    if (!a.decode) return true;
    dec = RunDecodePart(*cfg, a.decode_ranks, a.seed);
    if (!dec.ok()) std::cerr << "kvmesh demo: decode: " << dec.status().ToString() << "\n";
    return dec.ok();
  };
  if (a.json) {
    if (!run_decode()) return 1;
    nlohmann::json by_class = nlohmann::json::object();
    for (uint32_t c = 0; c < classes; ++c) by_class[std::to_string(c)] = total.evictions_by_class[c];
    auto lat = [](const LatencyHistogram& h) {
      return nlohmann::json{{"count", h.count()}, {"p50", Us(h.Percentile(0.5))}, {"p99", Us(h.Percentile(0.99))},
                            {"mean", h.mean_ns() / 1e3}};
    };
    nlohmann::json j = {
        {"cluster", cfg->name},
        {"nodes", (*cluster)->num_nodes()},
        {"policy", policy},
        {"block_bytes", cfg->model.FullBlockBytes()},
        {"threads", a.threads},
        {"seed", a.seed},
        {"requests", r.requests},
        {"prompt_blocks", r.prompt_blocks},
        {"matched_blocks", r.matched_blocks},
        {"prefix_hit_rate", r.prefix_hit_rate()},
        {"infinite_cache_prefix_hit_rate", r.ideal_hit_rate()},
        {"blocks_stored", r.stored_blocks},
        {"put_errors", r.put_errors},
        {"blocks_read", r.read_blocks},
        {"read_misses", r.read_misses},
        {"mismatches", r.mismatches},
        {"evictions", {{"total", total.evictions}, {"by_class", by_class}}},
        {"blocks_resident", total.blocks},
        {"bytes_in_use", total.bytes_stored},
        {"capacity_bytes", total.capacity_bytes},
        {"latency_us", {{"match_prefix", lat(r.match)}, {"get", lat(r.get)}, {"put", lat(r.put)}}},
        {"wall_s", r.wall_s},
    };
    if (a.decode) j["decode"] = DecodeJson(*dec);
    if (a.worldmodel) {
      nlohmann::json wm;
      if (RunWorldModelDemoPart(a.config, a.worldmodel_frames, &wm) != 0) return 1;
      j["worldmodel"] = std::move(wm);
    }
    std::cout << j.dump(2) << "\n";
  } else {
    std::printf("kvmesh demo: embedded cluster \"%s\", %zu nodes, %s budget, %s blocks, policy %s\n",
                cfg->name.c_str(), (*cluster)->num_nodes(), FormatSize(total.capacity_bytes).c_str(),
                FormatSize(cfg->model.FullBlockBytes()).c_str(), policy.c_str());
    std::printf("  requests            %llu (seed %llu, %u client thread%s)\n", (unsigned long long)r.requests,
                (unsigned long long)a.seed, a.threads, a.threads == 1 ? "" : "s");
    std::printf("  prompt blocks       %llu\n", (unsigned long long)r.prompt_blocks);
    std::printf("  prefix hit rate     %.2f%%  (an infinite cache: %.2f%%)\n", 100 * r.prefix_hit_rate(),
                100 * r.ideal_hit_rate());
    std::printf("  blocks stored       %llu (put errors %llu)\n", (unsigned long long)r.stored_blocks,
                (unsigned long long)r.put_errors);
    std::printf("  blocks read back    %llu, %llu byte mismatches, %llu gone between match and read\n",
                (unsigned long long)r.read_blocks, (unsigned long long)r.mismatches, (unsigned long long)r.read_misses);
    std::printf("  evictions           %llu  by class:", (unsigned long long)total.evictions);
    for (uint32_t c = 0; c < classes; ++c)
      std::printf(" [%u] %llu", c, (unsigned long long)total.evictions_by_class[c]);
    std::printf("\n  bytes in use        %s of %s (%llu blocks)\n", FormatSize(total.bytes_stored).c_str(),
                FormatSize(total.capacity_bytes).c_str(), (unsigned long long)total.blocks);
    std::printf("  latency per call    %12s %10s %10s\n", "calls", "p50 us", "p99 us");
    auto row = [](const char* name, const LatencyHistogram& h) {
      std::printf("    %-16s %12llu %10.1f %10.1f\n", name, (unsigned long long)h.count(), Us(h.Percentile(0.5)),
                  Us(h.Percentile(0.99)));
    };
    row("match_prefix", r.match);
    row("get (batch)", r.get);
    row("put (batch)", r.put);
    std::printf("  wall time           %.2f s\n", r.wall_s);
    std::fflush(stdout);
    if (!run_decode()) return 1;
    if (a.decode) {
      const DemoDecode& d = *dec;
      std::printf("\nmodel-parallel decode over kvmesh sequences: %d ranks (threads), reference MoE model %.2fM params,\n"
                  "%llu requests (chat + agent loops); `kvmesh decode` for more\n",
                  d.ranks, d.params_m, (unsigned long long)d.with.requests);
      std::printf("  %-24s %12s %12s %8s\n", "", "with reuse", "without", "ratio");
      auto drow = [](const char* name, double x, double y, const char* fmt) { PrintRatioRow(name, x, y, fmt, 24, 12); };
      drow("TTFT p50 (ms)", Ms(d.with.ttft.Percentile(0.5)), Ms(d.without.ttft.Percentile(0.5)), "%.2f");
      drow("TPOT p50 (ms)", Ms(d.with.tpot.Percentile(0.5)), Ms(d.without.tpot.Percentile(0.5)), "%.2f");
      drow("throughput (tokens/s)", d.with.tokens_per_s(), d.without.tokens_per_s(), "%.0f");
      drow("prompt tokens computed", double(d.with.computed_prompt_tokens), double(d.without.computed_prompt_tokens),
           "%.0f");
      std::printf("  prefix hit rate %.1f%%; same tokens with and without reuse: %s\n", 100 * d.with.prefix_hit_rate(),
                  d.same_tokens() ? "yes" : d.codec ? "no (lossy KV codec)" : "NO");
    }
  }
  if (!a.json && a.worldmodel) {
    std::printf("\nworld-model frames with similarity-gated KV reuse; `kvmesh worldmodel` for more\n");
    std::fflush(stdout);
    if (RunWorldModelDemoPart(a.config, a.worldmodel_frames, nullptr) != 0) return 1;
  }
  // With raw KV, prefix reuse must not change a single generated token.
  const bool decode_ok = !a.decode || dec->codec || dec->same_tokens();
  if (!decode_ok) std::cerr << "kvmesh demo: prefix reuse changed the generated tokens\n";
  return r.mismatches == 0 && decode_ok ? 0 : 2;
}

}  // namespace

void AddDemoCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("demo", "Run the main job: a seeded conversation workload on the embedded cluster");
  auto a = std::make_shared<DemoArgs>();
  cmd->add_option("--config", a->config, "cluster config (default: the built-in cluster_configs/local.json)");
  cmd->add_flag("--json", a->json, "print one JSON object instead of text");
  cmd->add_option("--threads", a->threads, "client threads")->check(CLI::Range(1, 64));
  cmd->add_option("--seed", a->seed, "workload seed");
  cmd->add_option("--conversations", a->conversations, "conversations to run")->check(CLI::Range(1, 1000000));
  cmd->add_flag("!--no-decode", a->decode, "skip the model-parallel decode part");
  cmd->add_option("--decode-ranks", a->decode_ranks, "tensor/expert-parallel ranks of the decode part")
      ->check(CLI::Range(1, 4));
  cmd->add_option("--compare-policy", a->compare_policy,
                  "run only the replay part, alternating the config's eviction policy and this one on fresh "
                  "clusters, and print both with their ratio");
  cmd->add_option("--compare-rounds", a->compare_rounds, "rounds of --compare-policy (medians over them)")
      ->check(CLI::Range(1, 21));
  cmd->add_flag("!--no-worldmodel", a->worldmodel, "skip the world-model frames part");
  cmd->add_option("--worldmodel-frames", a->worldmodel_frames, "frames of the world-model part")
      ->check(CLI::Range(1, 100000));
  cmd->callback([a, exit_code] { *exit_code = Run(*a); });
}

}  // namespace kvmesh::cli

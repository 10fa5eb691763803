// kvmesh demo: the main job on the embedded cluster.
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/default_config.h"
#include "coordinator/demo.h"
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
};

double Us(uint64_t ns) { return static_cast<double>(ns) / 1e3; }

int Run(const DemoArgs& a) {
  Result<ClusterConfig> cfg = a.config.empty() ? ParseConfig(kDefaultLocalConfig, "cluster_configs/local.json (built in)")
                                               : LoadConfigFile(a.config);
  if (!cfg.ok()) {
    std::cerr << "kvmesh demo: " << cfg.status().ToString() << "\n";
    return 1;
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
  if (a.json) {
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
  }
  return r.mismatches == 0 ? 0 : 2;
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
  cmd->callback([a, exit_code] { *exit_code = Run(*a); });
}

}  // namespace kvmesh::cli

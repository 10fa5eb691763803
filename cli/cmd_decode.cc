// kvmesh decode: model-parallel decode over KV that lives in kvmesh (docs/decode.md).
//
//   kvmesh decode [--config F] [--json] [--ranks N]        threads, embedded cluster
//   mpirun -np 4 kvmesh decode --mpi [--config F] [--json]  one rank per process
//   kvmesh decode --tcp-rank R --tcp-world N --tcp-rendezvous HOST:PORT   one rank per process,
//       started once per rank without mpirun (scripts/decode-tcp.sh); steps over TCP
//
// Runs the seeded conversation + agent-loop workload twice on fresh shards,
// with and without prefix reuse, then (optionally) a batch-size sweep for the
// latency-throughput curve and the speculative-decoding demo. With a KV codec
// (--kv-codec, or the config's "codec" section) the ranks seal their KV
// blocks encoded, and one more run with raw KV gives the comparison.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/default_config.h"
#include "cli/report.h"
#include "coordinator/decode/cluster.h"
#include "coordinator/decode/comm_tcp.h"
#include "kvmesh/size.h"

namespace kvmesh::cli {
namespace {

using namespace kvmesh::decode;

struct DecodeArgs {
  std::string config;
  bool json = false;
  bool mpi = false;
  // TCP step transport: this process is rank tcp_rank of tcp_world (> 0).
  int tcp_rank = -1;
  int tcp_world = 0;
  std::string tcp_rendezvous;       // HOST:PORT (port 0 = rank 0 picks, published in the file)
  std::string tcp_rendezvous_file;  // rank 0 writes HOST:PORT here; the others poll it
  uint32_t tcp_timeout_ms = 30000;  // one collective
  uint32_t tcp_connect_timeout_ms = 30000;
  int ranks = 4;
  uint32_t batch = 8;
  std::string sweep = "1,2,4,8,16";
  std::string plot;        // PNG path for the latency-throughput curve
  std::string events;      // JSON-lines event log path
  bool spec = true;
  uint32_t repeat = 1;
  std::string draft = "int4";
  std::string kv_codec;  // overrides the config's codec section ("none": raw)
  ModelConfig model;
  DecodeWorkloadOptions workload;
  float temperature = 0.8f;
  SpecOptions spec_options;
};

struct Runner {
  const DecodeArgs& a;
  ClusterConfig cfg;
  std::shared_ptr<const Weights> w;
  StepComm* proc = nullptr;  // set when ranks are processes (MPI, TCP)
  int ranks = 1;
  bool is_driver = true;

  // Runs body on every rank (threads, or this process's rank).
  Status Run(const RankBody& body) {
    return proc ? RunOnComm(cfg, w, *proc, body) : RunOnThreads(cfg, w, ranks, body);
  }

  Result<DecodeReport> Workload(uint32_t batch, bool reuse, const std::string& label, std::ostream* events) {
    DecodeRunOptions o;
    o.batch = batch;
    o.prefix_reuse = reuse;
    o.temperature = a.temperature;
    o.label = label;
    std::mutex mu;
    if (events) o.events = [events](const std::string& line) { *events << line << '\n'; };
    DecodeReport rep;
    Status s = Run([&](RankEngine& e, const PrefixLookup& lookup, ShardNode* node) -> Status {
      KVMESH_ASSIGN_OR_RETURN(DecodeReport r, RunDecodeWorkload(e, lookup, node, a.workload, o));
      if (e.comm().rank() == 0) {
        std::lock_guard<std::mutex> lock(mu);
        rep = r;
      }
      return Status::Ok();
    });
    if (!s.ok()) return s;
    return rep;
  }

  Result<SpecReport> Spec() {
    SpecReport rep;
    Status s = Run([&](RankEngine& e, const PrefixLookup&, ShardNode*) -> Status {
      KVMESH_ASSIGN_OR_RETURN(SpecReport r, RunSpeculative(e, a.spec_options));
      if (e.comm().rank() == 0) rep = r;
      return Status::Ok();
    });
    if (!s.ok()) return s;
    return rep;
  }
};

nlohmann::json ReportJson(const DecodeReport& r) {
  return {{"requests", r.requests},
          {"generated_tokens", r.generated_tokens},
          {"prompt_tokens", r.prompt_tokens},
          {"computed_prompt_tokens", r.computed_prompt_tokens},
          {"prefix_hit_rate", r.prefix_hit_rate()},
          {"ttft_ms", {{"p50", Ms(r.ttft.Percentile(0.5))}, {"p99", Ms(r.ttft.Percentile(0.99))}}},
          {"tpot_ms", {{"p50", Ms(r.tpot.Percentile(0.5))}, {"p99", Ms(r.tpot.Percentile(0.99))}}},
          {"e2e_ms", {{"p50", Ms(r.e2e.Percentile(0.5))}, {"p99", Ms(r.e2e.Percentile(0.99))}}},
          {"tokens_per_s", r.tokens_per_s()},
          {"requests_per_s", r.requests_per_s()},
          {"steps", r.steps},
          {"kv_bytes", {{"device", r.kv_bytes_stored}, {"host", r.kv_bytes_host}, {"ssd", r.kv_bytes_ssd}}},
          {"kv_bytes_logical", r.kv_bytes_logical},
          {"kv_blocks", r.kv_blocks_stored},
          {"seals", r.kv_seals},
          {"seal_dedups", r.kv_seal_dedups},
          {"wall_s", r.wall_s},
          {"token_digest", r.token_digest}};
}

std::vector<uint32_t> ParseList(const std::string& s) {
  std::vector<uint32_t> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) v.push_back(static_cast<uint32_t>(std::stoul(item)));
  return v;
}

int Fail(const Status& s) {
  std::cerr << "kvmesh decode: " << s.ToString() << "\n";
  return 1;
}

// "HOST:PORT" with PORT in [0, 65535] (0: rank 0 picks a free port).
Status ParseRendezvous(const std::string& addr, std::string* host, uint16_t* port) {
  const size_t colon = addr.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == addr.size())
    return InvalidArgument("--tcp-rendezvous: expected HOST:PORT, got \"" + addr + "\"");
  const std::string p = addr.substr(colon + 1);
  if (p.size() > 5 || p.find_first_not_of("0123456789") != std::string::npos || std::stoul(p) > 65535)
    return InvalidArgument("--tcp-rendezvous: bad port in \"" + addr + "\"");
  *host = addr.substr(0, colon);
  *port = static_cast<uint16_t>(std::stoul(p));
  return Status::Ok();
}

Result<TcpCommOptions> TcpOptions(const DecodeArgs& a) {
  if (a.tcp_world <= 0) return InvalidArgument("the --tcp-* options need --tcp-world N");
  if (a.mpi) return InvalidArgument("--mpi and --tcp-world are exclusive");
  if (a.tcp_rank < 0 || a.tcp_rank >= a.tcp_world)
    return InvalidArgument("--tcp-rank must be given, in [0, --tcp-world)");
  if (a.tcp_rendezvous.empty() && a.tcp_rendezvous_file.empty())
    return InvalidArgument("--tcp-world needs --tcp-rendezvous HOST:PORT or --tcp-rendezvous-file PATH");
  TcpCommOptions o;
  o.rank = a.tcp_rank;
  o.size = a.tcp_world;
  o.rendezvous_file = a.tcp_rendezvous_file;
  if (!a.tcp_rendezvous.empty()) KVMESH_RETURN_IF_ERROR(ParseRendezvous(a.tcp_rendezvous, &o.host, &o.port));
  if (o.port == 0 && o.rendezvous_file.empty())
    return InvalidArgument("--tcp-rendezvous with port 0 needs --tcp-rendezvous-file (rank 0 publishes its port)");
  o.step_timeout = std::chrono::milliseconds(a.tcp_timeout_ms);
  o.connect_timeout = std::chrono::milliseconds(a.tcp_connect_timeout_ms);
  return o;
}

int Run(const DecodeArgs& a) {
  std::unique_ptr<MpiSession> session;
  std::unique_ptr<StepComm> proc;
  Runner run{a, {}, nullptr};
  if (a.mpi) {
    auto s = MpiSession::Init(nullptr, nullptr);
    if (!s.ok()) return Fail(s.status());
    session = std::move(s).value();
    auto c = MakeMpiComm();
    if (!c.ok()) return Fail(c.status());
    proc = std::move(c).value();
  } else if (a.tcp_world > 0 || a.tcp_rank >= 0 || !a.tcp_rendezvous.empty() || !a.tcp_rendezvous_file.empty()) {
    auto o = TcpOptions(a);
    if (!o.ok()) return Fail(o.status());
    auto c = MakeTcpComm(*o);
    if (!c.ok()) return Fail(c.status());
    proc = std::move(c).value();
  }
  if (proc) {
    run.proc = proc.get();
    run.ranks = proc->size();
    run.is_driver = proc->rank() == 0;
  } else {
    run.ranks = a.ranks;
  }
  Result<ClusterConfig> base = a.config.empty()
                                   ? ParseConfig(kDefaultLocalConfig, "cluster_configs/local.json (built in)")
                                   : LoadConfigFile(a.config);
  if (!base.ok()) return Fail(base.status());
  if (!a.kv_codec.empty()) {
    base->codec = CodecConfig{};
    base->codec.codec = a.kv_codec;
  }
  const bool kv_codec = base->codec.enabled();
  ModelConfig mc = a.model;
  mc.block_tokens = base->model.block_tokens;
  auto cfg = DecodeClusterConfig(*base, mc, run.ranks);
  if (!cfg.ok()) return Fail(cfg.status());
  run.cfg = *cfg;
  auto w = Weights::Generate(mc);
  if (!w.ok()) return Fail(w.status());
  run.w = *w;
  // The same cluster with raw KV, for the codec comparison.
  Runner raw_run = run;
  if (kv_codec) {
    ClusterConfig raw_base = *base;
    raw_base.codec = CodecConfig{};
    auto rc = DecodeClusterConfig(raw_base, mc, run.ranks);
    if (!rc.ok()) return Fail(rc.status());
    raw_run.cfg = *rc;
  }

  std::unique_ptr<std::ofstream> events;
  if (run.is_driver && !a.events.empty()) {
    events = std::make_unique<std::ofstream>(a.events);
    if (!*events) return Fail(IoError("cannot write " + a.events));
  }
  const bool say = run.is_driver && !a.json;
  if (say) {
    std::printf("kvmesh decode: %d rank%s (%s), model %u layers, %u q / %u kv heads x %u, hidden %u, %s, %.2fM params\n",
                run.ranks, run.ranks == 1 ? "" : "s",
                a.mpi ? "MPI collectives" : a.tcp_world > 0 ? "TCP collectives, one process per rank" : "threads",
                mc.layers, mc.q_heads,
                mc.kv_heads, mc.head_dim, mc.hidden,
                mc.experts ? ("MoE " + std::to_string(mc.experts) + " experts top-" + std::to_string(mc.top_k)).c_str()
                           : "dense FFN",
                mc.Params() / 1e6);
    std::printf("  cluster \"%s\", %zu nodes, block %u tokens, batch %u, %u conversations + %u agent loops, "
                "median of %u run%s\n",
                run.cfg.name.c_str(), run.cfg.nodes.size(), mc.block_tokens, a.batch, a.workload.conversations,
                a.workload.agents, a.repeat, a.repeat == 1 ? "" : "s");
    std::fflush(stdout);
  }

  // Each configuration runs `repeat` times (with and without reuse
  // interleaved, so background load hits both alike); a figure is taken from
  // the run of median wall time.
  auto median_run = [](std::vector<DecodeReport> v) {
    std::sort(v.begin(), v.end(), [](const DecodeReport& x, const DecodeReport& y) { return x.wall_s < y.wall_s; });
    return v[v.size() / 2];
  };
  std::vector<DecodeReport> withs, withouts;
  for (uint32_t i = 0; i < a.repeat; ++i) {
    auto with = run.Workload(a.batch, true, "reuse", i == 0 ? events.get() : nullptr);
    if (!with.ok()) return Fail(with.status());
    auto without = run.Workload(a.batch, false, "no-reuse", i == 0 ? events.get() : nullptr);
    if (!without.ok()) return Fail(without.status());
    withs.push_back(*with);
    withouts.push_back(*without);
  }
  const DecodeReport R = median_run(withs);
  const DecodeReport N = median_run(withouts);
  const bool same_tokens = R.token_digest == N.token_digest;
  DecodeReport raw;  // with reuse, raw KV (only with a KV codec)
  if (kv_codec) {
    std::vector<DecodeReport> raws;
    for (uint32_t i = 0; i < a.repeat; ++i) {
      auto r = raw_run.Workload(a.batch, true, "raw-kv", nullptr);
      if (!r.ok()) return Fail(r.status());
      raws.push_back(*r);
    }
    raw = median_run(raws);
  }

  // Latency-throughput sweep over batch sizes (with reuse).
  std::vector<std::pair<uint32_t, DecodeReport>> sweep;
  if (!a.sweep.empty()) {
    for (uint32_t b : ParseList(a.sweep)) {
      std::vector<DecodeReport> runs;
      for (uint32_t i = 0; i < a.repeat; ++i) {
        auto r = run.Workload(b, true, "sweep-b" + std::to_string(b), nullptr);
        if (!r.ok()) return Fail(r.status());
        runs.push_back(*r);
      }
      sweep.emplace_back(b, median_run(runs));
    }
  }
  Result<SpecReport> spec = SpecReport{};
  if (a.spec) {
    spec = run.Spec();
    if (!spec.ok()) return Fail(spec.status());
  }
  if (!run.is_driver) return 0;

  if (!a.plot.empty() && !sweep.empty()) {
    const std::string dat = a.plot + ".dat";
    {
      std::ofstream f(dat);
      f << "# batch tokens_per_s tpot_p50_ms ttft_p50_ms\n";
      for (const auto& [b, r] : sweep)
        f << b << ' ' << r.tokens_per_s() << ' ' << Ms(r.tpot.Percentile(0.5)) << ' ' << Ms(r.ttft.Percentile(0.5))
          << '\n';
    }
    const std::string gp = a.plot + ".gp";
    {
      std::ofstream f(gp);
      f << "set terminal pngcairo size 800,500\nset output '" << a.plot << "'\n"
        << "set title 'kvmesh decode: latency vs throughput over batch sizes (" << run.ranks << " ranks)'\n"
        << "set xlabel 'throughput (generated tokens/s)'\nset ylabel 'TPOT p50 (ms)'\nset grid\n"
        << "set key top right\n"
        << "plot '" << dat << "' using 2:3 with linespoints pt 7 title 'TPOT p50', '' using 2:3:(sprintf('b=%d',$1)) "
        << "with labels offset 0,1 notitle\n";
    }
    const std::string cmd = "gnuplot '" + gp + "'";
    if (std::system(cmd.c_str()) != 0) std::cerr << "kvmesh decode: gnuplot failed; data in " << dat << "\n";
  }

  if (a.json) {
    nlohmann::json j = {{"ranks", run.ranks},
                        {"transport", a.mpi ? "mpi" : a.tcp_world > 0 ? "tcp" : "threads"},
                        {"batch", a.batch},
                        {"repeat", a.repeat},
                        {"params", mc.Params()},
                        {"with_reuse", ReportJson(R)},
                        {"without_reuse", ReportJson(N)},
                        {"ratio_with_over_without",
                         {{"ttft_p50", Ratio(R.ttft.Percentile(0.5), N.ttft.Percentile(0.5))},
                          {"tpot_p50", Ratio(R.tpot.Percentile(0.5), N.tpot.Percentile(0.5))},
                          {"tokens_per_s", Ratio(R.tokens_per_s(), N.tokens_per_s())},
                          {"requests_per_s", Ratio(R.requests_per_s(), N.requests_per_s())},
                          {"computed_prompt_tokens", Ratio(R.computed_prompt_tokens, N.computed_prompt_tokens)}}},
                        {"same_tokens_with_and_without_reuse", same_tokens}};
    if (kv_codec) {
      j["kv_codec"] = {{"codec", run.cfg.codec.codec},
                       {"kv_bytes", R.kv_bytes_stored},
                       {"kv_bytes_raw_kv", raw.kv_bytes_stored},
                       {"kv_bytes_ratio", Ratio(R.kv_bytes_stored, raw.kv_bytes_stored)},
                       {"tokens_per_s", R.tokens_per_s()},
                       {"tokens_per_s_raw_kv", raw.tokens_per_s()},
                       {"tokens_per_s_ratio", Ratio(R.tokens_per_s(), raw.tokens_per_s())},
                       {"tpot_p50_ratio", Ratio(R.tpot.Percentile(0.5), raw.tpot.Percentile(0.5))},
                       {"same_tokens_as_raw_kv", R.token_digest == raw.token_digest}};
    }
    nlohmann::json sj = nlohmann::json::array();
    for (const auto& [b, r] : sweep)
      sj.push_back({{"batch", b}, {"tokens_per_s", r.tokens_per_s()}, {"tpot_p50_ms", Ms(r.tpot.Percentile(0.5))},
                    {"ttft_p50_ms", Ms(r.ttft.Percentile(0.5))}});
    j["sweep"] = sj;
    if (a.spec) {
      const SpecReport& s = *spec;
      j["speculative"] = {{"draft", a.spec_options.int4_draft ? "int4-kv" : "early-exit"},
                          {"draft_tokens", a.spec_options.draft_tokens},
                          {"draft_layers", a.spec_options.draft_layers},
                          {"acceptance_rate", s.acceptance()},
                          {"rolled_back_tokens", s.rolled_back},
                          {"tpot_p50_ms_plain", Ms(s.plain_tpot.Percentile(0.5))},
                          {"tpot_p50_ms_spec", Ms(s.spec_tpot.Percentile(0.5))},
                          {"tpot_ratio_spec_over_plain",
                           Ratio(s.spec_tpot.Percentile(0.5), s.plain_tpot.Percentile(0.5))},
                          {"same_tokens_as_plain", s.same_tokens}};
    }
    std::cout << j.dump(2) << "\n";
  } else {
    std::printf("\n  %-26s %14s %14s %10s\n", "", "with reuse", "without", "ratio");
    auto row = [](const char* name, double x, double y, const char* fmt) { PrintRatioRow(name, x, y, fmt, 26, 14); };
    row("TTFT p50 (ms)", Ms(R.ttft.Percentile(0.5)), Ms(N.ttft.Percentile(0.5)), "%.2f");
    row("TTFT p99 (ms)", Ms(R.ttft.Percentile(0.99)), Ms(N.ttft.Percentile(0.99)), "%.2f");
    row("TPOT p50 (ms)", Ms(R.tpot.Percentile(0.5)), Ms(N.tpot.Percentile(0.5)), "%.3f");
    row("throughput (tokens/s)", R.tokens_per_s(), N.tokens_per_s(), "%.1f");
    row("requests/s", R.requests_per_s(), N.requests_per_s(), "%.2f");
    row("prefix hit rate (%)", 100 * R.prefix_hit_rate(), 100 * N.prefix_hit_rate(), "%.1f");
    row("prompt tokens computed", double(R.computed_prompt_tokens), double(N.computed_prompt_tokens), "%.0f");
    row("KV bytes, device tier", double(R.kv_bytes_stored), double(N.kv_bytes_stored), "%.0f");
    if (R.kv_bytes_host + N.kv_bytes_host + R.kv_bytes_ssd + N.kv_bytes_ssd > 0) {
      row("KV bytes, host tier", double(R.kv_bytes_host), double(N.kv_bytes_host), "%.0f");
      row("KV bytes, SSD tier", double(R.kv_bytes_ssd), double(N.kv_bytes_ssd), "%.0f");
    }
    std::printf("  requests %llu, generated tokens %llu, prompt tokens %llu; same tokens with and without reuse: %s\n",
                (unsigned long long)R.requests, (unsigned long long)R.generated_tokens,
                (unsigned long long)R.prompt_tokens,
                same_tokens ? "yes"
                : kv_codec  ? "no (expected with a lossy KV codec: a computed prompt attends to its exact KV, a "
                              "reused one to decoded blocks)"
                            : "NO");
    if (kv_codec) {
      std::printf("\n  KV codec %-17s %14s %14s %10s\n", run.cfg.codec.codec.c_str(), "codec KV", "raw KV", "ratio");
      row("KV bytes, device tier", double(R.kv_bytes_stored), double(raw.kv_bytes_stored), "%.0f");
      row("KV bytes before encoding", double(R.kv_bytes_logical), double(raw.kv_bytes_logical), "%.0f");
      row("throughput (tokens/s)", R.tokens_per_s(), raw.tokens_per_s(), "%.1f");
      row("TPOT p50 (ms)", Ms(R.tpot.Percentile(0.5)), Ms(raw.tpot.Percentile(0.5)), "%.3f");
      std::printf("  same tokens as with raw KV: %s (the codec's logit tolerance: docs/decode.md)\n",
                  R.token_digest == raw.token_digest ? "yes" : "no");
    }
    if (!sweep.empty()) {
      std::printf("\n  batch sweep (with reuse)   %8s %14s %14s %14s\n", "batch", "tokens/s", "TPOT p50 ms", "TTFT p50 ms");
      for (const auto& [b, r] : sweep)
        std::printf("  %-26s %8u %14.1f %14.3f %14.2f\n", "", b, r.tokens_per_s(), Ms(r.tpot.Percentile(0.5)),
                    Ms(r.ttft.Percentile(0.5)));
      if (!a.plot.empty()) std::printf("  plot: %s\n", a.plot.c_str());
    }
    if (a.spec) {
      const SpecReport& s = *spec;
      if (a.spec_options.int4_draft) {
        std::printf("\n  speculative decoding (int4-KV self-draft: all %u layers over int4-rounded KV, k=%u, greedy, "
                    "%u prompts)\n", mc.layers, a.spec_options.draft_tokens, a.spec_options.prompts);
      } else {
        std::printf("\n  speculative decoding (early-exit self-draft: %u of %u layers, k=%u, greedy, %u prompts)\n",
                    std::clamp(a.spec_options.draft_layers, 1u, mc.layers), mc.layers, a.spec_options.draft_tokens,
                    a.spec_options.prompts);
      }
      std::printf("    acceptance rate %.1f%%, %llu rounds, %llu drafted tokens rolled back with truncate\n",
                  100 * s.acceptance(), (unsigned long long)s.rounds, (unsigned long long)s.rolled_back);
      std::printf("    TPOT p50 plain %.3f ms, speculative %.3f ms (%.2fx); same tokens as plain greedy: %s\n",
                  Ms(s.plain_tpot.Percentile(0.5)), Ms(s.spec_tpot.Percentile(0.5)),
                  Ratio(s.spec_tpot.Percentile(0.5), s.plain_tpot.Percentile(0.5)), s.same_tokens ? "yes" : "NO");
    }
  }
  return (a.spec && !spec->same_tokens) ? 2 : 0;
}

}  // namespace

void AddDecodeCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand(
      "decode", "Model-parallel decode of a seeded reference model whose KV lives in kvmesh (TTFT/TPOT, reuse)");
  auto a = std::make_shared<DecodeArgs>();
  cmd->add_option("--config", a->config, "cluster config (default: the built-in cluster_configs/local.json)");
  cmd->add_flag("--json", a->json, "print one JSON object instead of text");
  cmd->add_flag("--mpi", a->mpi, "one rank per MPI process (run under mpirun); steps use MPI collectives");
  cmd->add_option("--ranks", a->ranks, "tensor/expert-parallel ranks as threads (without --mpi)")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--tcp-rank", a->tcp_rank, "this process's rank, with --tcp-world (steps over TCP, no mpirun)")
      ->check(CLI::Range(0, 63));
  cmd->add_option("--tcp-world", a->tcp_world, "ranks in the TCP step group, one process each")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--tcp-rendezvous", a->tcp_rendezvous,
                  "HOST:PORT where rank 0 listens and the others connect (port 0: rank 0 picks one and "
                  "writes it to --tcp-rendezvous-file)");
  cmd->add_option("--tcp-rendezvous-file", a->tcp_rendezvous_file,
                  "rank 0 writes HOST:PORT here; the other ranks poll it (default host 127.0.0.1, port 0)");
  cmd->add_option("--tcp-timeout-ms", a->tcp_timeout_ms,
                  "longest wait for the slowest rank in one collective; then every rank fails")
      ->check(CLI::Range(1u, 3600000u));
  cmd->add_option("--tcp-connect-timeout-ms", a->tcp_connect_timeout_ms, "rendezvous timeout")
      ->check(CLI::Range(1u, 3600000u));
  cmd->add_option("--batch", a->batch, "requests decoded together")->check(CLI::Range(1, 1024));
  cmd->add_option("--sweep", a->sweep, "batch sizes for the latency-throughput curve ('' = none)");
  cmd->add_option("--repeat", a->repeat, "runs per configuration; figures come from the median-wall-time run")
      ->check(CLI::Range(1, 99));
  cmd->add_option("--plot", a->plot, "write the latency-throughput curve to this PNG (gnuplot)");
  cmd->add_option("--events", a->events, "write JSON-lines events (admit, first_token, token, finish) here");
  cmd->add_option("--temperature", a->temperature, "sampling temperature (0 = greedy)");
  cmd->add_option("--seed", a->workload.seed, "workload seed");
  cmd->add_option("--conversations", a->workload.conversations, "chat conversations");
  cmd->add_option("--agents", a->workload.agents, "agent loops");
  cmd->add_option("--reply-min", a->workload.reply_tokens_min, "shortest chat reply (tokens)");
  cmd->add_option("--reply-max", a->workload.reply_tokens_max, "longest chat reply (tokens)");
  cmd->add_option("--model-seed", a->model.seed, "weights seed");
  cmd->add_option("--layers", a->model.layers, "model layers")->check(CLI::Range(1, 256));
  cmd->add_option("--hidden", a->model.hidden, "hidden size")->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--q-heads", a->model.q_heads, "query heads")->check(CLI::Range(1, 1024));
  cmd->add_option("--kv-heads", a->model.kv_heads, "KV heads (GQA)")->check(CLI::Range(1, 1024));
  cmd->add_option("--head-dim", a->model.head_dim, "head dimension (even)")->check(CLI::Range(2, 1024));
  cmd->add_option("--ffn", a->model.ffn, "FFN inner size")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--experts", a->model.experts, "MoE experts (0 = dense)")->check(CLI::Range(0, 1024));
  cmd->add_option("--top-k", a->model.top_k, "experts per token")->check(CLI::Range(1, 1024));
  cmd->add_option("--vocab", a->model.vocab, "vocabulary size")->check(CLI::Range(2, 1 << 20));
  cmd->add_option("--kv-codec", a->kv_codec,
                  "codec of the sealed KV blocks (int8, int4, fp8-e4m3, fp16, ..., none); overrides the config's "
                  "codec section and adds a raw-KV run for comparison");
  cmd->add_flag("!--no-spec", a->spec, "skip the speculative-decoding demo");
  cmd->add_option("--draft-tokens", a->spec_options.draft_tokens, "speculative: drafted tokens per round")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--draft", a->draft,
                  "speculative draft: int4 (the whole model over int4-rounded KV, QuantSpec-style) or early-exit "
                  "(the first --draft-layers layers)")
      ->check(CLI::IsMember({"int4", "early-exit"}));
  cmd->add_option("--draft-layers", a->spec_options.draft_layers, "speculative: layers of the early-exit draft")
      ->check(CLI::Range(1, 256));
  cmd->callback([a, exit_code] {
    a->spec_options.int4_draft = a->draft == "int4";
    *exit_code = Run(*a);
  });
}

}  // namespace kvmesh::cli

// kvmesh_soak — starts a real cluster (a `kvmesh coordinator` and N `kvmesh
// node` daemons on 127.0.0.1), drives it with prefix-cache and live-sequence
// clients through NetworkClient while a chaos thread kills, restarts and
// stalls nodes, fills memory past capacity and sends malformed frames, and
// checks the invariants of docs/soak.md the whole time. A progress line on
// stderr every second, a JSON report on stdout; exit status 1 on any
// invariant violation, 2 when the cluster could not be started.
//
//   kvmesh_soak --seconds 300 --nodes 3            # scripts/soak.sh
//   kvmesh_soak --seconds 15 --nodes 3             # the CI variant (ctest label "chaos")
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include <CLI/CLI.hpp>

#include "kvmesh/network.h"
#include "soak.h"
#include "soak_cluster.h"
#include "soak_workload.h"

using namespace kvmesh;
using namespace kvmesh::soak;
using namespace std::chrono_literals;

namespace {

std::atomic<bool> g_interrupted{false};
void OnSignal(int) { g_interrupted.store(true); }

nlohmann::json Summary(std::vector<double> v) {
  if (v.empty()) return {{"n", 0}};
  std::sort(v.begin(), v.end());
  return {{"n", v.size()}, {"p50", v[v.size() / 2]}, {"max", v.back()}, {"min", v.front()}};
}

nlohmann::json OpJson(const OpStats& s) {
  nlohmann::json miss = nlohmann::json::object(), refused = nlohmann::json::object();
  for (int c = 0; c < 16; ++c) {
    const auto name = std::string(StatusCodeName(static_cast<StatusCode>(c)));
    if (s.miss[c]) miss[name] = s.miss[c].load();
    if (s.refused[c]) refused[name] = s.refused[c].load();
  }
  return {{"calls", s.calls.load()}, {"ok", s.ok.load()}, {"miss", miss}, {"refused", refused},
          {"max_ms", s.max_us.load() / 1000.0}, {"over_timeout", s.over_timeout.load()}};
}

uint64_t TotalCalls(const Stats& st, int from, int to) {
  uint64_t n = 0;
  for (int op = from; op < to; ++op) n += st.ops[op].calls.load();
  return n;
}

uint64_t Misses(const Stats& st, StatusCode code) {
  uint64_t n = 0;
  for (const OpStats& s : st.ops) n += s.miss[static_cast<int>(code)].load();
  return n;
}

uint64_t Refusals(const Stats& st) {
  uint64_t n = 0;
  for (const OpStats& s : st.ops)
    for (const auto& r : s.refused) n += r.load();
  return n;
}

std::unique_ptr<NetworkClient> Client(const Options& o, const std::string& coord, const std::string& salt) {
  NetworkClientOptions no;
  no.coordinator = coord;
  no.client_id = "kvmesh-soak-" + salt;
  no.tenant_salt = salt;
  no.timeout_ms = o.timeout_ms;
  no.connect_timeout_ms = std::min<int64_t>(500, o.timeout_ms);
  no.refresh_ms = 200;
  auto c = NetworkClient::Connect(no);
  if (!c.ok()) {
    std::fprintf(stderr, "kvmesh_soak: cannot connect a client: %s\n", c.status().ToString().c_str());
    return nullptr;
  }
  return std::move(*c);
}

// Once a second: ops/s, hit rate, misses by cause, chaos events.
class Progress {
 public:
  explicit Progress(Context& c) : c_(c) {}
  void Tick() {
    const Stats& st = c_.st;
    const uint64_t prefix = TotalCalls(st, kMatch, kSeqCreate), seq = TotalCalls(st, kSeqCreate, kFill);
    const uint64_t asked = st.prompt_blocks.load(), hit = st.matched_blocks.load();
    const double rate = asked > last_asked_ ? double(hit - last_hit_) / double(asked - last_asked_) : 0.0;
    c_.PushHitRate(rate);
    const double t = std::chrono::duration<double>(SteadyClock::now() - c_.start).count();
    std::fprintf(stderr,
                 "soak [%5.0fs] ops/s %5" PRIu64 " (prefix %5" PRIu64 " seq %4" PRIu64 ") | hit %5.1f%% | verified %7.1f MiB"
                 " | miss notfound %" PRIu64 " unavail %" PRIu64 " deadline %" PRIu64 " dataloss %" PRIu64
                 " | refused %" PRIu64 " | chaos kill %" PRIu64 " coord %" PRIu64 " stall %" PRIu64 " fill %" PRIu64 " garbage %" PRIu64
                 " | violations %zu\n",
                 t, (prefix - last_prefix_) + (seq - last_seq_), prefix - last_prefix_, seq - last_seq_, 100.0 * rate,
                 double(st.bytes_verified.load() + st.seq_bytes_verified.load()) / (1 << 20),
                 Misses(st, StatusCode::kNotFound), Misses(st, StatusCode::kUnavailable),
                 Misses(st, StatusCode::kDeadlineExceeded), Misses(st, StatusCode::kDataLoss), Refusals(st),
                 st.kills.load(), st.coordinator_kills.load(), st.stalls.load(), st.fills.load(), st.garbage_conns.load(), c_.inv.count());
    last_prefix_ = prefix;
    last_seq_ = seq;
    last_asked_ = asked;
    last_hit_ = hit;
  }

 private:
  Context& c_;
  uint64_t last_prefix_ = 0, last_seq_ = 0, last_asked_ = 0, last_hit_ = 0;
};

// Runs the progress line for `d` (or until interrupted).
void RunFor(Progress& p, std::chrono::milliseconds d, SteadyClock::time_point* next_tick) {
  const auto end = SteadyClock::now() + d;
  while (SteadyClock::now() < end && !g_interrupted.load()) {
    std::this_thread::sleep_until(std::min(end, *next_tick));
    if (SteadyClock::now() >= *next_tick) {
      p.Tick();
      *next_tick += 1s;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
#if defined(KVMESH_BIN)
  o.kvmesh_bin = KVMESH_BIN;
#endif
  CLI::App app{"kvmesh soak / chaos harness: a real cluster under load and faults, every byte checked"};
  app.add_option("--seconds", o.seconds, "duration of the load (after a 2 s warm-up)");
  app.add_option("--nodes", o.nodes, "kvmesh node daemons")->check(CLI::Range(1, 16));
  app.add_option("--prefix-threads", o.prefix_threads, "prefix-cache client threads");
  app.add_option("--seq-threads", o.seq_threads, "live-sequence client threads");
  app.add_option("--seed", o.seed, "workload and chaos seed");
  app.add_option("--timeout-ms", o.timeout_ms, "client call timeout");
  app.add_option("--timeout-margin-ms", o.timeout_margin_ms, "a call may last timeout + this");
  app.add_option("--recover-ms", o.recover_ms, "bound: a restarted or stalled node serving again");
  app.add_option("--hit-recover-ms", o.hit_recover_ms, "bound: hit rate back to half its pre-kill level");
  app.add_option("--chaos-gap-ms", o.chaos_gap_ms, "mean pause between chaos events");
  app.add_option("--node-memory", o.node_memory, "primary (device) budget per node");
  app.add_option("--node-host", o.node_host, "host tier budget per node (\"\": no tier)");
  app.add_option("--transport", o.transport, "data plane of the clients: tcp or ucx")
      ->check(CLI::IsMember({"tcp", "ucx"}));
  app.add_option("--replicas", o.replicas, "copies of each block ($.placement.replicas)")->check(CLI::Range(1, 4));
  app.add_option("--kvmesh", o.kvmesh_bin, "the kvmesh binary");
  app.add_option("--json-out", o.json_out, "also write the JSON report here");
  app.add_option("--work-dir", o.work_dir, "config and daemon logs (default /tmp/kvmesh-soak-PID)");
  app.add_flag("--keep-logs", o.keep_logs, "keep the work dir even when every invariant held");
  app.add_flag("!--no-chaos", o.chaos, "load only, no faults");
  CLI11_PARSE(app, argc, argv);
  if (o.kvmesh_bin.empty()) {
    std::fprintf(stderr, "kvmesh_soak: --kvmesh PATH is required\n");
    return 2;
  }
  std::string command;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);

  ::signal(SIGPIPE, SIG_IGN);
  ::signal(SIGINT, OnSignal);
  ::signal(SIGTERM, OnSignal);
  const auto t_start = SteadyClock::now();
  // Whatever hangs, the daemons die and the run ends.
  const auto bound = std::chrono::seconds(static_cast<int64_t>(o.seconds) + 120);
  std::thread([bound] {
    std::this_thread::sleep_for(bound);
    std::fprintf(stderr, "kvmesh_soak: past its %llds bound: daemons killed\n", static_cast<long long>(bound.count()));
    KillAllDaemons();
    std::_Exit(3);
  }).detach();

  Context c(o, t_start);
  const uint32_t fds_before_clients = CountFds(), threads_before_clients = CountThreads();
  auto cluster = std::make_unique<Cluster>(o, c.inv);
  c.cluster = cluster.get();
  if (Status s = cluster->Start(); !s.ok()) {
    std::fprintf(stderr, "kvmesh_soak: cannot start the cluster: %s\n", s.ToString().c_str());
    return 2;
  }
  std::fprintf(stderr, "soak: coordinator %s, %u nodes, work dir %s\n", cluster->coordinator().c_str(), o.nodes,
               cluster->work_dir().c_str());
  const uint32_t fds_cluster = CountFds(), threads_cluster = CountThreads();

  nlohmann::json resources;
  ChaosReport chaos;
  double load_seconds = 0;
  {
    auto kv = Client(o, cluster->coordinator(), "soak-kv");
    auto seq = Client(o, cluster->coordinator(), "soak-seq");
    auto ops = Client(o, cluster->coordinator(), "soak-kv");
    if (!kv || !seq || !ops) return 2;
    std::vector<std::thread> workers;
    for (uint32_t t = 0; t < o.prefix_threads; ++t)
      workers.emplace_back([&, t] { PrefixWorker(c, kv->router(), t); });
    for (uint32_t t = 0; t < o.seq_threads; ++t)
      workers.emplace_back([&, t] { SequenceWorker(c, seq->router(), t); });

    Progress progress(c);
    auto next_tick = SteadyClock::now() + 1s;
    const auto load_start = SteadyClock::now();
    RunFor(progress, 2s, &next_tick);  // warm-up: caches fill, connections open
    const uint32_t fds_start = CountFds(), threads_start = CountThreads();
    uint32_t fds_max = fds_start, threads_max = threads_start;
    std::thread chaos_thread;
    if (o.chaos) chaos_thread = std::thread([&] { ChaosLoop(c, *cluster, *ops, &chaos); });
    const auto load_end = load_start + std::chrono::milliseconds(static_cast<int64_t>(o.seconds * 1000));
    while (SteadyClock::now() < load_end && !g_interrupted.load()) {
      RunFor(progress, std::min<std::chrono::milliseconds>(
                           1s, std::chrono::duration_cast<std::chrono::milliseconds>(load_end - SteadyClock::now()) + 1ms),
             &next_tick);
      fds_max = std::max(fds_max, CountFds());
      threads_max = std::max(threads_max, CountThreads());
    }
    c.stop_chaos.store(true);
    if (chaos_thread.joinable()) chaos_thread.join();
    // Every node back and serving, then the same conditions as at the start.
    if (!cluster->WaitNodes(cluster->size(), 10s)) c.inv.Violation("recovery", "not every node listed at the end");
    RunFor(progress, 2s, &next_tick);
    const uint32_t fds_end = CountFds(), threads_end = CountThreads();
    if (fds_end > fds_start + o.fd_slack)
      c.inv.Violation("fd_leak", "client fds " + std::to_string(fds_start) + " -> " + std::to_string(fds_end));
    if (threads_end > threads_start + o.thread_slack)
      c.inv.Violation("thread_leak",
                      "client threads " + std::to_string(threads_start) + " -> " + std::to_string(threads_end));
    c.stop.store(true);
    for (auto& w : workers) w.join();
    load_seconds = std::chrono::duration<double>(SteadyClock::now() - load_start).count();
    resources = {{"fds_warm", fds_start}, {"fds_end", fds_end}, {"fds_max", fds_max},
                 {"threads_warm", threads_start}, {"threads_end", threads_end}, {"threads_max", threads_max},
                 {"fd_kinds_end", FdKinds()}};
  }
  // Clients gone: the process holds what it held with only the cluster up.
  const uint32_t fds_after = CountFds(), threads_after = CountThreads();
  resources["fds_cluster_only"] = fds_cluster;
  resources["fds_after_clients"] = fds_after;
  resources["threads_cluster_only"] = threads_cluster;
  resources["threads_after_clients"] = threads_after;
  resources["fds_before_cluster"] = fds_before_clients;
  resources["threads_before_cluster"] = threads_before_clients;
  if (fds_after > fds_cluster)
    c.inv.Violation("fd_leak", "after the clients closed: " + std::to_string(fds_after) + " fds, " +
                                   std::to_string(fds_cluster) + " before they opened");
  if (threads_after > threads_cluster)
    c.inv.Violation("thread_leak", "after the clients closed: " + std::to_string(threads_after) + " threads, " +
                                       std::to_string(threads_cluster) + " before they opened");
  cluster->CheckExits(c.st);
  cluster->StopAll();

  const Stats& st = c.st;
  nlohmann::json ops = nlohmann::json::object();
  for (int op = 0; op < kNumOps; ++op) ops[OpName(op)] = OpJson(st.ops[op]);
  const uint64_t total_ops = TotalCalls(st, 0, kNumOps);
  const uint64_t asked = st.prompt_blocks.load();
  nlohmann::json report = {
      {"command", command},
      {"seconds", load_seconds},
      {"nodes", o.nodes},
      {"transport", o.transport},
      {"replicas", o.replicas},
      {"threads", {{"prefix", o.prefix_threads}, {"sequence", o.seq_threads}}},
      {"seed", o.seed},
      {"timeout_ms", o.timeout_ms},
      {"node_memory", {{"device", o.node_memory}, {"host", o.node_host}}},
      {"totals",
       {{"ops", total_ops},
        {"ops_per_s", load_seconds > 0 ? double(total_ops) / load_seconds : 0.0},
        {"prompt_blocks", asked},
        {"matched_blocks", st.matched_blocks.load()},
        {"prefix_hit_rate", asked ? double(st.matched_blocks.load()) / double(asked) : 0.0},
        {"blocks_put", st.blocks_put.load()},
        {"blocks_verified", st.blocks_verified.load()},
        {"bytes_verified", st.bytes_verified.load()},
        {"read_gone_after_match", st.read_gone.load()},
        {"seq_tokens_verified", st.seq_tokens_verified.load()},
        {"seq_bytes_verified", st.seq_bytes_verified.load()},
        {"wrong_bytes", st.wrong_bytes.load()}}},
      {"sequences",
       {{"attached_prefix_tokens", st.seq_attached_tokens.load()},
        {"resyncs_after_failed_mutation", st.seq_resyncs.load()},
        {"killed_node_probes", st.seq_killed_probes.load()},
        {"killed_node_unavailable", st.seq_killed_unavailable.load()},
        {"killed_node_notfound", st.seq_killed_notfound.load()}}},
      {"chaos",
       {{"kills", st.kills.load()},
        {"restarts", st.restarts.load()},
        {"coordinator_kills", st.coordinator_kills.load()},
        {"probes_served_without_coordinator", st.served_without_coordinator.load()},
        {"replicated_blocks_checked_after_kill", st.replica_checked.load()},
        {"replicated_blocks_served_after_kill", st.replica_served.load()},
        {"stalls", st.stalls.load()},
        {"fills", st.fills.load()},
        {"fill_blocks", st.fill_blocks.load()},
        {"malformed_connections", st.garbage_conns.load()},
        {"malformed_closed_by_node", st.garbage_closed.load()},
        {"malformed_by_kind", chaos.garbage_by_kind},
        {"torn_put_payloads", st.corrupt_puts.load()},
        {"torn_put_payloads_refused_data_loss", st.corrupt_refused.load()},
        {"unexpected_daemon_exits", st.unexpected_exits.load()},
        {"serving_again_ms", Summary(chaos.recover_ms)},
        {"hit_rate_recovered_ms", Summary(chaos.hit_recover_ms)}}},
      {"ops", ops},
      {"resources", resources},
      {"invariants", c.inv.Json()},
      {"passed", c.inv.count() == 0},
  };
  const std::string text = report.dump(2);
  std::printf("%s\n", text.c_str());
  if (!o.json_out.empty()) std::ofstream(o.json_out) << text << "\n";
  const bool passed = c.inv.count() == 0;
  std::fprintf(stderr, "soak: %s — %" PRIu64 " ops, %.1f MiB verified, %zu violations%s\n",
               passed ? "PASSED" : "FAILED", total_ops,
               double(st.bytes_verified.load() + st.seq_bytes_verified.load()) / (1 << 20), c.inv.count(),
               passed && !o.keep_logs ? "" : (", logs in " + cluster->work_dir()).c_str());
  const std::string dir = cluster->work_dir();
  cluster.reset();
  if (passed && !o.keep_logs && o.work_dir.empty()) std::filesystem::remove_all(dir);
  return passed ? 0 : 1;
}

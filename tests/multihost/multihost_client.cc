// kvmesh_multihost_client — the client side of scripts/multihost.sh's test,
// run on one host (a network namespace) against a cluster on the others
// (docs/multihost.md):
//
//   kvmesh_multihost_client sink --listen HOST:PORT        raw TCP sink (the throughput baseline)
//   kvmesh_multihost_client bench --coordinator H:P ...    per-host throughput: kvmesh vs raw TCP
//   kvmesh_multihost_client load --coordinator H:P --nodes N [--proxy H:P] ...
//   kvmesh_multihost_client fresh --coordinator H:P[,H:P...] --salt S
//                                                          a new client: connect, put and read back 32 blocks
//
// Every --coordinator takes several addresses separated by commas (the
// etcd-backed control plane's coordinators); the first that answers serves.
// `load` drives the cluster through NetworkClient (the soak's prefix-cache
// and live-sequence workers, every byte read back compared) and, with
// --proxy, Redis clients through `kvmesh proxy` (every value compared),
// until told to stop. It reads commands on stdin, one per line, and answers
// each with one JSON line on stdout:
//   arm NAME      puts 32 canary blocks (priority 3)      -> {"event":"armed"}
//   fault NAME    the fault is in place: probe until end     -> {"event":"fault"}
//   end NAME      the fault is about to go: stop probing      -> {"event":"ended"}
//   restore NAME  the fault is gone: measure the recovery -> {"event":"recovered","recovery_ms",...}
//   hitset        puts 64 blocks (priority 3) kept for hitrate -> {"event":"hitset","blocks"}
//   hitrate NAME  reads the hit set back, every byte compared  -> {"event":"hitrate","hits","blocks","rate"}
//   stop | EOF    stop the load                            -> {"event":"report",...}; exit 1 on a violation
// Recovered = the coordinator lists all N nodes, this client's map has
// caught up with that epoch and holds N nodes, and 32 fresh blocks put and
// read back intact. While a fault lasts a probe (32 fresh blocks put, read
// back and erased, then the canary blocks read) runs every 100 ms, and the
// number of nodes in this client's map is sampled every 20 ms. The canary
// blocks' copies are counted on every node right after they are put, and
// again at `end` when a read missed some.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <thread>

#include <CLI/CLI.hpp>

#include "host_bench.h"
#include "kvmesh/network.h"
#include "raw_tcp.h"
#include "resp_check.h"
#include "router/map_fetch.h"
#include "router/map_json.h"
#include "soak.h"
#include "soak_cluster.h"
#include "soak_workload.h"
#include "transport/http_client.h"
#include "transport/socket_util.h"
#include "transport/tcp_channel.h"

using namespace kvmesh;
using namespace kvmesh::multihost;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop.store(true); }

void Say(const nlohmann::json& j) {
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

double MsSince(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

struct LoadArgs {
  soak::Options o;
  std::string coordinator, proxy;
  uint32_t nodes = 3, resp_threads = 1;
  int64_t recover_bound_ms = 30000;
};

// The map of the first coordinator of `coordinators` ("host:port", several
// separated by commas) that answers.
Result<PublishedMap> MapNow(const std::string& coordinators, int64_t timeout_ms) {
  KVMESH_ASSIGN_OR_RETURN(std::vector<CoordinatorAddress> list, ParseCoordinatorList(coordinators));
  size_t preferred = 0;
  return FetchPublishedMap(list, &preferred, timeout_ms, {});
}

// The coordinators' map now: {epoch, live nodes}, or an error.
Result<std::pair<uint64_t, size_t>> CoordinatorMap(const std::string& coordinator, int64_t timeout_ms) {
  KVMESH_ASSIGN_OR_RETURN(PublishedMap pm, MapNow(coordinator, timeout_ms));
  return std::pair{pm.epoch, pm.nodes.size()};
}

uint64_t OkCalls(const soak::Stats& st) {
  uint64_t n = 0;
  for (const auto& op : st.ops) n += op.ok.load();
  return n;
}
uint64_t AllCalls(const soak::Stats& st) {
  uint64_t n = 0;
  for (const auto& op : st.ops) n += op.calls.load();
  return n;
}

// Reads the canary blocks back, every byte compared (soak::ReadProbeBlocks);
// the items not served are tallied by status in *why.
size_t ReadCanary(soak::Context& c, Router& r, std::span<const BlockKey> keys, std::map<std::string, uint64_t>* why) {
  return soak::ReadProbeBlocks(c, r, keys, why, "canary");
}

// soak::Probe, then the probe's blocks are erased: probes every 100 ms at the
// canary blocks' priority would otherwise fill the nodes and evict the canary.
bool ProbeAndErase(soak::Context& c, Router& r, uint64_t salt) {
  const std::vector<BlockKey> keys = soak::PutProbeBlocks(c, r, salt);
  const bool ok = !keys.empty() && soak::ReadProbeBlocks(c, r, keys) == keys.size();
  if (!keys.empty()) (void)r.Erase(keys);  // best effort: a node away keeps its copies until evicted
  return ok;
}

// The nodes of the coordinator's map now, each with a TCP channel of its own
// (epoch 0: any node answers), for counting copies behind the router's back.
struct NodeProbe {
  std::vector<std::string> ids;
  std::vector<std::unique_ptr<TcpChannel>> chs;
};
Result<NodeProbe> NodesNow(const std::string& coordinator) {
  KVMESH_ASSIGN_OR_RETURN(PublishedMap pm, MapNow(coordinator, 1000));
  NodeProbe np;
  for (const ShardInfo& n : pm.nodes) {
    TcpChannelOptions t;
    t.host = n.host;
    t.port = n.ports.data;
    t.client_id = "kvmesh-multihost-audit";
    t.tenant = "multihost";
    t.connections = 1;
    t.timeout_ms = 300;
    t.connect_timeout_ms = 300;
    np.ids.push_back(n.id);
    np.chs.push_back(TcpChannel::Create(t));
  }
  return np;
}

// How many of `nodes` hold each key, asking every node for every key:
// {"copies": {"0": keys on no node, "1": ..., "2": ...}, "unreachable": [node ids]}.
nlohmann::json CountCopies(NodeProbe& nodes, std::span<const BlockKey> keys, size_t block_bytes) {
  std::map<std::string, uint64_t> copies;
  std::vector<std::byte> buf(keys.size() * block_bytes);
  std::vector<int> held(keys.size(), 0);
  nlohmann::json unreachable = nlohmann::json::array();
  for (size_t n = 0; n < nodes.chs.size(); ++n) {
    std::vector<GetItem> items;
    for (size_t i = 0; i < keys.size(); ++i)
      items.push_back(GetItem{keys[i], std::span(buf).subspan(i * block_bytes, block_bytes), 0, {}});
    if (!nodes.chs[n]->Get(items, RequestOptions{}).ok()) {
      unreachable.push_back(nodes.ids[n]);
      continue;
    }
    for (size_t i = 0; i < keys.size(); ++i) held[i] += items[i].status.ok();
  }
  for (int h : held) copies[std::to_string(h)]++;
  return {{"copies", copies}, {"unreachable", unreachable}};
}

// One fault as the client saw it.
struct FaultWatch {
  std::string name;
  std::vector<BlockKey> canary;
  std::optional<NodeProbe> nodes;  // the map's nodes when the canary blocks were put
  nlohmann::json canary_copies, canary_copies_end;  // right after they were put; at `end` when some missed
  Clock::time_point start;
  uint64_t salt = 0;      // the probes' keys
  bool ended = false;     // `end` came: the figures below are taken
  double fault_ms = -1;   // from `fault` to `end`
  uint64_t ok0 = 0, calls0 = 0, ok_during = 0, calls_during = 0;
  std::atomic<bool> done{false}, prober_exited{false};
  std::thread prober, sampler;
  // Written by the prober (the sampler: map_*), read after both joined. A
  // probe or read that finishes after `end` is not counted.
  uint64_t probes_ok = 0, probes_failed = 0, canary_reads = 0;
  size_t map_min = SIZE_MAX, map_max = 0;  // nodes in this client's map, every 20 ms
  size_t canary_min = SIZE_MAX, canary_last = 0;
  std::map<std::string, uint64_t> canary_missed;  // by status, over every read
  double first_fail_ms = -1, served_again_ms = -1;  // probe failed first / succeeded again after failing
};

int Load(const LoadArgs& a) {
  soak::Context c(a.o, Clock::now());
  // Sequence handles name nodes n0..n(N-1); no node of this cluster is
  // killed by this process, so the soak's cluster stays unstarted: its
  // generations stay 0 (a cut or partitioned node keeps its sequences).
  soak::Cluster ids(a.o, c.inv);
  c.cluster = &ids;
  NetworkClientOptions no;
  no.coordinator = a.coordinator;
  no.client_id = "kvmesh-multihost";
  no.tenant_salt = "multihost";
  no.timeout_ms = a.o.timeout_ms;
  no.connect_timeout_ms = std::min<int64_t>(500, a.o.timeout_ms);
  no.refresh_ms = 200;
  auto client = NetworkClient::Connect(no);
  if (!client.ok()) {
    std::fprintf(stderr, "multihost client: cannot connect: %s\n", client.status().ToString().c_str());
    return 2;
  }
  NetworkClient& nc = **client;
  Router& r = nc.router();
  std::string proxy_host;
  uint16_t proxy_port = 0;
  if (!a.proxy.empty()) {
    if (Status s = SplitHostPort(a.proxy, &proxy_host, &proxy_port); !s.ok()) {
      std::fprintf(stderr, "multihost client: --proxy: %s\n", s.ToString().c_str());
      return 2;
    }
  }
  RespCounters rc;
  std::vector<std::thread> workers;
  for (uint32_t t = 0; t < a.o.prefix_threads; ++t) workers.emplace_back([&, t] { soak::PrefixWorker(c, r, t); });
  for (uint32_t t = 0; t < a.o.seq_threads; ++t) workers.emplace_back([&, t] { soak::SequenceWorker(c, r, t); });
  if (proxy_port != 0)
    for (uint32_t t = 0; t < a.resp_threads; ++t)
      workers.emplace_back([&, t] { RespWorker(c, proxy_host, proxy_port, t, &rc); });
  std::thread progress([&] {
    uint64_t last = 0;
    while (!c.stop.load()) {
      std::this_thread::sleep_for(1s);
      const uint64_t calls = AllCalls(c.st) + rc.commands.load();
      std::fprintf(stderr,
                   "multihost client [%5.0fs] ops/s %6" PRIu64 " | map %zu nodes epoch %" PRIu64
                   " | verified %8.1f MiB | resp ok %" PRIu64 " nil %" PRIu64 " err %" PRIu64 " | violations %zu\n",
                   MsSince(c.start) / 1000, calls - last, nc.num_nodes(), nc.epoch(),
                   double(c.st.bytes_verified + c.st.seq_bytes_verified + rc.bytes_compared) / (1 << 20),
                   rc.values_ok.load(), rc.nils.load(), rc.errors.load(), c.inv.count());
      last = calls;
    }
  });

  nlohmann::json faults = nlohmann::json::array();
  std::unique_ptr<FaultWatch> w;
  std::vector<BlockKey> hitset;
  uint64_t salt = 1;
  auto end_fault = [&] {
    if (!w || w->ended || !w->prober.joinable()) return;
    w->done.store(true);
    w->ended = true;
    w->fault_ms = MsSince(w->start);
    w->ok_during = OkCalls(c.st) - w->ok0;
    w->calls_during = AllCalls(c.st) - w->calls0;
  };
  // A probe stuck in a call (UCX: until the link returns) is waited for here, not at `end`.
  auto stop_prober = [&] {
    end_fault();
    if (w && w->prober.joinable()) {
      w->prober.join();
      w->sampler.join();
    }
  };
  std::string line;
  while (!g_stop.load() && std::getline(std::cin, line)) {
    const size_t sp = line.find(' ');
    const std::string verb = line.substr(0, sp), name = sp == std::string::npos ? "" : line.substr(sp + 1);
    if (verb == "stop") break;
    if (verb == "hitset") {
      hitset.clear();
      for (uint64_t k = 0; k < 2; ++k) {
        const std::vector<BlockKey> keys = soak::PutProbeBlocks(c, r, 0x4175e7 + (salt++ << 8));
        hitset.insert(hitset.end(), keys.begin(), keys.end());
      }
      Say({{"event", "hitset"}, {"blocks", hitset.size()}});
      continue;
    }
    if (verb == "hitrate") {
      std::map<std::string, uint64_t> why;
      const size_t hits = hitset.empty() ? 0 : soak::ReadProbeBlocks(c, r, hitset, &why, "hitset");
      nlohmann::json j = {{"event", "hitrate"}, {"name", name}, {"hits", hits}, {"blocks", hitset.size()},
                          {"rate", hitset.empty() ? 0.0 : double(hits) / double(hitset.size())}, {"missed", why},
                          {"epoch", nc.epoch()}, {"map_nodes", nc.num_nodes()}};
      if (hits < hitset.size()) {  // where the blocks are: on no node, or on nodes the reads did not ask
        if (auto np = NodesNow(a.coordinator); np.ok())
          j["copies"] = CountCopies(*np, hitset, r.model().FullBlockBytes());
      }
      Say(j);
      continue;
    }
    if (verb == "arm") {
      stop_prober();
      w = std::make_unique<FaultWatch>();
      w->name = name;
      w->canary = soak::PutProbeBlocks(c, r, 0xca9a + salt++);
      if (auto np = NodesNow(a.coordinator); np.ok()) {
        w->nodes = std::move(*np);
        w->canary_copies = CountCopies(*w->nodes, w->canary, r.model().FullBlockBytes());
      } else {
        w->canary_copies = {{"error", np.status().ToString()}};
      }
      Say({{"event", "armed"}, {"fault", name}, {"canary_blocks", w->canary.size()}, {"canary_copies", w->canary_copies}});
    } else if (verb == "fault" && w) {
      w->start = Clock::now();
      w->ok0 = OkCalls(c.st);
      w->calls0 = AllCalls(c.st);
      FaultWatch* fw = w.get();
      fw->sampler = std::thread([&nc, fw] {
        while (!fw->done.load()) {
          const size_t m = nc.num_nodes();
          fw->map_min = std::min(fw->map_min, m);
          fw->map_max = std::max(fw->map_max, m);
          std::this_thread::sleep_for(20ms);
        }
      });
      fw->salt = 0x9e00000 + (salt++ << 16);
      fw->prober = std::thread([&c, &r, fw] {
        for (uint64_t i = 0; !fw->done.load(); ++i) {
          const auto t0 = Clock::now();
          const bool ok = ProbeAndErase(c, r, fw->salt + i);
          if (fw->done.load()) break;
          if (ok) {
            fw->probes_ok++;
            if (fw->first_fail_ms >= 0 && fw->served_again_ms < 0) fw->served_again_ms = MsSince(fw->start);
          } else {
            fw->probes_failed++;
            if (fw->first_fail_ms < 0) fw->first_fail_ms = MsSince(fw->start);
          }
          if (!fw->canary.empty()) {
            std::map<std::string, uint64_t> why;
            const size_t served = ReadCanary(c, r, fw->canary, &why);
            if (fw->done.load()) break;
            fw->canary_reads++;
            fw->canary_last = served;
            fw->canary_min = std::min(fw->canary_min, served);
            for (const auto& [k, n] : why) fw->canary_missed[k] += n;
          }
          std::this_thread::sleep_until(t0 + 100ms);
        }
        fw->prober_exited.store(true);
      });
      Say({{"event", "fault"}, {"fault", name}});
    } else if (verb == "end" && w) {
      end_fault();
      Say({{"event", "ended"}, {"fault", name}});
      // While the fault is still in place: where are the canary blocks a read
      // missed? Only when the prober is done within 2 s (over UCX a call to a
      // silent host holds it until the link returns).
      for (int i = 0; i < 200 && !w->prober_exited.load(); ++i) std::this_thread::sleep_for(10ms);
      if (w->prober_exited.load()) {
        w->prober.join();
        w->sampler.join();
        if (w->nodes && w->canary_reads && w->canary_last < w->canary.size())
          w->canary_copies_end = CountCopies(*w->nodes, w->canary, r.model().FullBlockBytes());
      }
    } else if (verb == "restore" && w) {
      const auto t_restore = Clock::now();
      stop_prober();
      double recovery = -1;
      while (!g_stop.load() && MsSince(t_restore) < double(a.recover_bound_ms)) {
        const auto t0 = Clock::now();
        auto cm = CoordinatorMap(a.coordinator, 500);
        if (cm.ok() && cm->second == a.nodes && nc.epoch() >= cm->first && nc.num_nodes() == a.nodes &&
            ProbeAndErase(c, r, 0x7ec + salt++)) {
          recovery = MsSince(t_restore);
          break;
        }
        std::this_thread::sleep_until(t0 + 20ms);
      }
      if (recovery < 0)
        c.inv.Violation("recovery", name + ": not serving on all " + std::to_string(a.nodes) + " nodes " +
                                        std::to_string(a.recover_bound_ms) + " ms after the fault ended");
      nlohmann::json j = {
          {"event", "recovered"},
          {"fault", name},
          {"recovered", recovery >= 0},
          {"recovery_ms", recovery},
          {"fault_ms", w->fault_ms},
          {"during",
           {{"calls", w->calls_during},
            {"ok_calls", w->ok_during},
            {"probes_ok", w->probes_ok},
            {"probes_failed", w->probes_failed},
            {"first_probe_failed_ms", w->first_fail_ms},
            {"probes_served_again_ms", w->served_again_ms},
            {"map_nodes_min", w->map_min == SIZE_MAX ? 0 : w->map_min},
            {"map_nodes_max", w->map_max},
            {"canary_blocks", w->canary.size()},
            {"canary_reads", w->canary_reads},
            {"canary_copies_when_put", w->canary_copies},
            {"canary_copies_at_end", w->canary_copies_end},
            {"canary_served_min", w->canary_min == SIZE_MAX ? 0 : w->canary_min},
            {"canary_served_last", w->canary_last},
            {"canary_missed", w->canary_missed}}}};
      faults.push_back(j);
      Say(j);
      w.reset();
    } else {
      Say({{"event", "error"}, {"what", "unknown or out-of-order command: " + line}});
    }
  }
  stop_prober();
  c.stop.store(true);
  for (auto& t : workers) t.join();
  progress.join();
  const soak::Stats& st = c.st;
  const uint64_t calls = AllCalls(st) + rc.commands.load();
  const uint64_t compared = st.bytes_verified + st.seq_bytes_verified + rc.bytes_compared;
  const uint64_t wrong = st.wrong_bytes + rc.wrong_bytes;
  nlohmann::json ops = nlohmann::json::object();
  uint64_t max_us = rc.max_us.load();
  for (int op = 0; op < soak::kNumOps; ++op) {
    if (!st.ops[op].calls) continue;
    ops[soak::OpName(op)] = {{"calls", st.ops[op].calls.load()}, {"ok", st.ops[op].ok.load()},
                             {"max_ms", st.ops[op].max_us.load() / 1000.0}};
    max_us = std::max(max_us, st.ops[op].max_us.load());
  }
  Say({{"event", "report"},
       {"seconds", MsSince(c.start) / 1000},
       {"calls", calls},
       {"bytes_compared", compared},
       {"wrong_bytes", wrong},
       {"blocks_verified", st.blocks_verified.load()},
       {"seq_tokens_verified", st.seq_tokens_verified.load()},
       {"max_call_ms", max_us / 1000.0},
       {"timeout_ms", a.o.timeout_ms},
       {"stale_epoch_refusals", st.stale_epoch.load()},
       {"prefix_hit_rate", st.prompt_blocks ? double(st.matched_blocks) / double(st.prompt_blocks) : 0.0},
       {"resp", {{"commands", rc.commands.load()}, {"values_ok", rc.values_ok.load()}, {"nils", rc.nils.load()},
                 {"errors", rc.errors.load()}, {"reconnects", rc.reconnects.load()},
                 {"bytes_compared", rc.bytes_compared.load()}, {"max_ms", rc.max_us.load() / 1000.0}}},
       {"ops", ops},
       {"faults", faults},
       {"invariants", c.inv.Json()},
       {"passed", c.inv.count() == 0}});
  return c.inv.count() == 0 ? 0 : 1;
}

// A client started now: connects through `coordinators` (each in turn),
// puts 32 fresh blocks and reads them back, every byte compared. One JSON
// line; exit 0 when every block came back intact.
int Fresh(const std::string& coordinators, uint64_t salt, int64_t timeout_ms) {
  soak::Options so;
  so.timeout_ms = timeout_ms;
  soak::Context c(so, Clock::now());
  const auto t0 = Clock::now();
  NetworkClientOptions no;
  no.coordinator = coordinators;
  no.client_id = "kvmesh-multihost-fresh";
  no.tenant_salt = "multihost";
  no.timeout_ms = timeout_ms;
  no.connect_timeout_ms = std::min<int64_t>(500, timeout_ms);
  auto client = NetworkClient::Connect(no);
  const double connect_ms = MsSince(t0);
  nlohmann::json j = {{"event", "fresh_client"}, {"salt", salt}, {"connect_ms", connect_ms}};
  if (!client.ok()) {
    j["ok"] = false;
    j["error"] = client.status().ToString();
    Say(j);
    return 1;
  }
  Router& r = (*client)->router();
  const std::vector<BlockKey> keys = soak::PutProbeBlocks(c, r, 0xf7e500000 + (salt << 8));
  const size_t back = keys.empty() ? 0 : soak::ReadProbeBlocks(c, r, keys, nullptr, "fresh");
  const bool ok = !keys.empty() && back == keys.size() && c.st.wrong_bytes == 0 && c.inv.count() == 0;
  j["ok"] = ok;
  j["ms"] = MsSince(t0);
  j["epoch"] = (*client)->epoch();
  j["blocks"] = keys.size();
  j["read_back"] = back;
  j["wrong_bytes"] = c.st.wrong_bytes.load();
  j["bytes_compared"] = c.st.bytes_verified.load();
  if (!ok) j["invariants"] = c.inv.Json();
  Say(j);
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kvmesh multi-host test client (scripts/multihost.sh)"};
  app.require_subcommand(1);
  ::signal(SIGPIPE, SIG_IGN);
  ::signal(SIGTERM, OnSignal);
  ::signal(SIGINT, OnSignal);
  int rc = 0;

  auto* sink = app.add_subcommand("sink", "raw TCP sink: the baseline's far end");
  std::string listen;
  sink->add_option("--listen", listen, "HOST:PORT")->required();
  sink->callback([&] {
    std::string host;
    uint16_t port = 0;
    Status s = SplitHostPort(listen, &host, &port);
    if (s.ok()) s = RunSink(host, port, &g_stop);
    if (!s.ok()) {
      std::fprintf(stderr, "sink: %s\n", s.ToString().c_str());
      rc = 1;
    }
  });

  auto* bench = app.add_subcommand("bench", "throughput to each node host: kvmesh PUT/GET vs raw TCP");
  HostBenchOptions bo;
  bench->add_option("--coordinator", bo.coordinator, "HOST:PORT")->required();
  bench->add_option("--sink-port", bo.sink_port, "the raw sink's port on every node host");
  bench->add_option("--node", bo.only_node, "only this node");
  bench->add_option("--seconds", bo.seconds, "per cell");
  bench->add_option("--reps", bo.reps, "rounds; a cell's figure is the median");
  bench->add_option("--threads", bo.threads, "channels / connections per host");
  bench->add_option("--block", bo.block, "block bytes");
  bench->add_option("--token", bo.token, "shared secret");
  bench->callback([&] {
    BenchCounters k;
    auto j = RunHostBench(bo, &k);
    if (!j.ok()) {
      std::fprintf(stderr, "bench: %s\n", j.status().ToString().c_str());
      rc = 1;
      return;
    }
    (*j)["event"] = "bench";
    (*j)["calls"] = k.calls.load();
    (*j)["bytes_compared"] = k.bytes_compared.load();
    (*j)["wrong_bytes"] = k.wrong_bytes.load();
    (*j)["errors"] = k.errors.load();
    Say(*j);
    rc = k.wrong_bytes ? 1 : 0;
  });

  auto* load = app.add_subcommand("load", "verified load through NetworkClient and the RESP proxy; commands on stdin");
  LoadArgs la;
  la.o.prefix_threads = 2;
  la.o.seq_threads = 1;
  la.o.timeout_ms = 1000;
  load->add_option("--coordinator", la.coordinator, "HOST:PORT")->required();
  load->add_option("--nodes", la.nodes, "nodes the healed cluster has")->required();
  load->add_option("--proxy", la.proxy, "HOST:PORT of a kvmesh proxy (RESP)");
  load->add_option("--prefix-threads", la.o.prefix_threads, "prefix-cache client threads");
  load->add_option("--seq-threads", la.o.seq_threads, "live-sequence client threads");
  load->add_option("--resp-threads", la.resp_threads, "RESP client threads (with --proxy)");
  load->add_option("--seed", la.o.seed, "workload seed");
  load->add_option("--timeout-ms", la.o.timeout_ms, "client call timeout");
  load->add_option("--timeout-margin-ms", la.o.timeout_margin_ms, "a call may last timeout + this");
  load->add_option("--recover-bound-ms", la.recover_bound_ms, "bound: serving on every node after a fault");
  load->add_flag("--stale-epoch-refusal", la.o.stale_epoch_refusal,
                 "a StaleEpoch answer after the router's one refresh failed is a counted refusal, not a violation");
  load->add_option("--work-dir", la.o.work_dir, "scratch directory")->required();
  load->callback([&] {
    la.o.nodes = la.nodes;
    rc = Load(la);
  });

  auto* fresh = app.add_subcommand("fresh", "a new client: connect, put and read back 32 blocks (one JSON line)");
  std::string fresh_coordinators;
  uint64_t fresh_salt = 1;
  int64_t fresh_timeout_ms = 1000;
  fresh->add_option("--coordinator", fresh_coordinators, "HOST:PORT[,HOST:PORT...]")->required();
  fresh->add_option("--salt", fresh_salt, "the blocks' keys");
  fresh->add_option("--timeout-ms", fresh_timeout_ms, "client call timeout");
  fresh->callback([&] { rc = Fresh(fresh_coordinators, fresh_salt, fresh_timeout_ms); });

  CLI11_PARSE(app, argc, argv);
  return rc;
}

// Four real processes from cluster_configs/daemons-local.json (a coordinator
// and three `kvmesh node`s on 127.0.0.1, ports chosen at run time): put, get
// and prefix match through the network router, a node killed with SIGKILL
// under load and rejoining, garbage on a data port, and clean SIGTERM exits.
#include <catch2/catch.hpp>

#include <fstream>
#include <numeric>
#include <random>
#include <thread>

#include "cluster_process.h"
#include "cluster_workload.h"
#include "test_time.h"
#include "kvmesh/build_config.h"
#include "kvmesh/config.h"
#include "kvmesh/network.h"
#include "transport/http_client.h"
#include "transport/socket_util.h"
#if defined(KVMESH_HAVE_UCX)
#include "transport/ucx_channel.h"
#endif

using namespace kvmesh;
using kvmesh::testing::Process;
using namespace kvmesh::testing;  // the workload (cluster_workload.h)
using kvmesh::testing::TimeBound;
using SteadyClock = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {

const std::string kBin = KVMESH_BIN;
const std::string kConfig = std::string(KVMESH_SOURCE_DIR) + "/cluster_configs/daemons-local.json";
// Bound on one HTTP request to a daemon.
const int64_t kHttpMs = TimeBound(1000ms).count();

struct Cluster {
  std::string config = kConfig;
  Process coord;
  std::map<std::string, std::unique_ptr<Process>> nodes;
  uint16_t coord_port = 0;
  std::map<std::string, nlohmann::json> listening;

  std::string addr() const { return "127.0.0.1:" + std::to_string(coord_port); }

  void StartCoordinator() {
    REQUIRE(coord.Start({kBin, "coordinator", "--config", config, "--port", "0"}));
    auto j = coord.WaitEvent("listening", TimeBound(10s));
    REQUIRE(j);
    coord_port = (*j)["ports"]["http"].get<uint16_t>();
  }
  void StartNode(const std::string& id) {
    auto p = std::make_unique<Process>();
    REQUIRE(p->Start({kBin, "node", "--config", config, "--id", id, "--coordinator", addr()}));
    auto j = p->WaitEvent("listening", TimeBound(10s));
    REQUIRE(j);
    CHECK((*j)["role"] == "node");
    CHECK((*j)["node_id"] == id);
    CHECK((*j)["ports"]["data"].get<int>() > 0);
    listening[id] = *j;
    nodes[id] = std::move(p);
  }
  // Waits until the coordinator lists exactly n nodes (timeout: before the
  // build's scaling, test_time.h); returns its epoch.
  uint64_t WaitNodes(size_t n, std::chrono::milliseconds timeout = 10s) {
    const auto end = SteadyClock::now() + TimeBound(timeout);
    while (SteadyClock::now() < end) {
      auto r = HttpRequest("127.0.0.1", coord_port, "GET", "/nodes", "", kHttpMs);
      if (r.ok() && r->status == 200) {
        auto j = nlohmann::json::parse(r->body);
        if (j["nodes"].size() == n) return j["epoch"].get<uint64_t>();
      }
      std::this_thread::sleep_for(50ms);
    }
    FAIL("coordinator did not reach " << n << " nodes");
    return 0;
  }
};

// A client whose calls time out after timeout_ms (before the build's scaling).
std::unique_ptr<NetworkClient> Client(const Cluster& c, int64_t timeout_ms = 1000) {
  NetworkClientOptions o;
  o.coordinator = c.addr();
  o.timeout_ms = TimeBound(std::chrono::milliseconds(timeout_ms)).count();
  o.refresh_ms = 200;
  auto r = NetworkClient::Connect(o);
  REQUIRE(r.ok());
  return std::move(*r);
}

// Number of blocks read back byte-for-byte.
size_t CountHits(Router& r, const Workload& w) {
  size_t hits = 0;
  for (size_t s = 0; s < w.seqs.size(); ++s) {
    auto keys = r.Keys(w.seqs[s]);
    for (size_t i = 0; i < keys.size(); ++i) {
      auto got = r.Get(keys[i]);
      if (got.ok() && *got == w.blocks[s][i]) ++hits;
    }
  }
  return hits;
}

}  // namespace

TEST_CASE("Process: a child a test started dies with the test process, even one killed by SIGKILL", "[cluster][daemons]") {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t test = ::fork();
  REQUIRE(test >= 0);
  if (test == 0) {  // a test binary that ctest's timeout kills: no destructor runs
    ::close(fds[0]);
    Process p;
    const pid_t child = p.Start({"/bin/sleep", "30"}) ? p.pid() : -1;
    if (::write(fds[1], &child, sizeof child) != sizeof child) ::_exit(1);
    ::raise(SIGKILL);
  }
  ::close(fds[1]);
  pid_t child = -1;
  const bool got = ::read(fds[0], &child, sizeof child) == sizeof child;
  ::close(fds[0]);
  int st = 0;
  REQUIRE(::waitpid(test, &st, 0) == test);
  REQUIRE(got);
  REQUIRE(child > 0);
  // Gone, or a zombie that nobody reaps (a container's pid 1 may not).
  auto gone = [&] {
    std::ifstream f("/proc/" + std::to_string(child) + "/stat");
    std::string stat;
    std::getline(f, stat);
    const size_t close = stat.rfind(')');
    return stat.empty() || (close != std::string::npos && close + 2 < stat.size() && stat[close + 2] == 'Z');
  };
  const auto end = SteadyClock::now() + TimeBound(5s);
  while (!gone() && SteadyClock::now() < end) std::this_thread::sleep_for(10ms);
  CHECK(gone());
  ::kill(child, SIGKILL);  // never left behind, whatever the check said
}

TEST_CASE("Daemons: coordinator + 3 nodes serve put/get/match through the network router", "[cluster][daemons]") {
  Cluster c;
  c.StartCoordinator();
  for (const char* id : {"n0", "n1", "n2"}) c.StartNode(id);
  c.WaitNodes(3);
  auto client = Client(c);
  REQUIRE(client->num_nodes() == 3);
  Router& r = client->router();
  const size_t block_bytes = r.model().FullBlockBytes();
  Workload w = MakeWorkload(6, 8, r.block_tokens(), block_bytes, 1);
  REQUIRE(PutAll(r, w).ok());
  CHECK(CountHits(r, w) == 48);
  for (auto& s : w.seqs) {
    auto m = r.MatchPrefix(s);
    REQUIRE(m.ok());
    CHECK(*m == 8);
  }
  // A sequence that diverges after 5 blocks matches 5.
  std::vector<TokenId> div = w.seqs[0];
  div[5 * r.block_tokens() + 3] += 1;
  CHECK(r.MatchPrefix(div).value() == 5);
  // Blocks spread over the nodes (rendezvous placement across three processes).
  // The next heartbeat of each node carries its stats.
  nlohmann::json sj;
  int nonempty = 0;
  for (const auto end = SteadyClock::now() + TimeBound(5s); SteadyClock::now() < end;
       std::this_thread::sleep_for(50ms)) {
    auto stats = HttpRequest("127.0.0.1", c.coord_port, "GET", "/stats", "", kHttpMs);
    REQUIRE(stats.ok());
    sj = nlohmann::json::parse(stats->body);
    nonempty = 0;
    for (auto& [id, st] : sj["nodes"].items()) nonempty += st.value("blocks", 0) > 0;
    // Totals hold only what heartbeats reported so far: none before the first.
    if (sj["totals"].value("blocks", uint64_t{0}) == 48 && nonempty == 3) break;
  }
  CHECK(sj["totals"].value("blocks", uint64_t{0}) == 48);
  CHECK(nonempty == 3);
  // /metrics and /healthz on a node.
  uint16_t http = c.listening["n0"]["ports"]["http"].get<uint16_t>();
  auto health = HttpRequest("127.0.0.1", http, "GET", "/healthz", "", kHttpMs);
  REQUIRE(health.ok());
  CHECK(health->status == 200);
  auto metrics = HttpRequest("127.0.0.1", http, "GET", "/metrics", "", kHttpMs);
  REQUIRE(metrics.ok());
  CHECK_THAT(metrics->body, Catch::Contains("kvmesh_requests_total{op=\"PUT\"}"));
  CHECK_THAT(metrics->body, Catch::Contains("kvmesh_store_blocks"));
  // The eviction policy is switched at run time over HTTP; a bad name changes nothing.
  auto sw = HttpRequest("127.0.0.1", http, "POST", "/policy", R"({"policy": "arc"})", kHttpMs);
  REQUIRE(sw.ok());
  CHECK(sw->status == 200);
  CHECK_THAT(sw->body, Catch::Contains("\"arc\""));
  auto bad = HttpRequest("127.0.0.1", http, "POST", "/policy", R"({"policy": "fifo-ish"})", kHttpMs);
  REQUIRE(bad.ok());
  CHECK(bad->status == 400);
  auto now = HttpRequest("127.0.0.1", http, "GET", "/policy", "", kHttpMs);
  REQUIRE(now.ok());
  CHECK_THAT(now->body, Catch::Contains("\"arc\""));

  // The C ABI example program, against the same cluster.
  {
    Process ex;
    REQUIRE(ex.Start({KVMESH_C_EXAMPLE, c.addr()}));
    auto ok = ex.WaitEvent("c_client_ok", TimeBound(20s));
    REQUIRE(ok);
    CHECK((*ok)["matched"] == 4);
    CHECK((*ok)["seq_prefix_tokens"] == 2 * r.block_tokens());  // the C sequence calls, second client reuse
    CHECK((*ok)["frames_reused"] == 4);  // the C frame-stream calls: a repeated frame reuses its four blocks
    // Context tags: a frame re-tagged on two of its four patches reuses the other two (and every
    // check of tagged_frames in examples/c_client.c passed: untagged = pixel gate, wrong sizes refused).
    CHECK((*ok)["frames_tagged_reused"] == 2);
    auto st = ex.Wait(TimeBound(5s));
    REQUIRE(st);
    CHECK(WEXITSTATUS(*st) == 0);
  }

  // Garbage on a data port closes that connection only.
  uint16_t data = c.listening["n1"]["ports"]["data"].get<uint16_t>();
  for (int i = 0; i < 5; ++i) {
    auto fd = ConnectTcp("127.0.0.1", data, SteadyClock::now() + 1s);
    REQUIRE(fd.ok());
    std::string junk(1000 + i * 37, static_cast<char>(0xA5 + i));
    (void)WriteAll(fd->get(), junk.data(), junk.size(), SteadyClock::now() + 1s);
  }
  CHECK(CountHits(r, w) == 48);

  // SIGTERM: every daemon stops cleanly and says so.
  for (auto& [id, p] : c.nodes) p->Kill(SIGTERM);
  for (auto& [id, p] : c.nodes) {
    CHECK(p->WaitEvent("stopped", TimeBound(5s)));
    auto st = p->Wait(TimeBound(5s));
    REQUIRE(st);
    CHECK(WIFEXITED(*st));
    CHECK(WEXITSTATUS(*st) == 0);
  }
  c.coord.Kill(SIGTERM);
  auto st = c.coord.Wait(TimeBound(5s));
  REQUIRE(st);
  CHECK(WEXITSTATUS(*st) == 0);
}

TEST_CASE("Daemons: a node killed under load, then rejoining", "[cluster][daemons][faults]") {
  Cluster c;
  c.StartCoordinator();
  for (const char* id : {"n0", "n1", "n2"}) c.StartNode(id);
  const uint64_t epoch3 = c.WaitNodes(3);
  auto client = Client(c, 800);
  Router& r = client->router();
  const size_t block_bytes = r.model().FullBlockBytes();
  Workload w = MakeWorkload(12, 4, r.block_tokens(), block_bytes, 2);
  REQUIRE(PutAll(r, w).ok());
  REQUIRE(CountHits(r, w) == 48);

  // Readers hammer the cluster while n1 is SIGKILLed.
  std::atomic<bool> stop{false};
  std::atomic<int> calls{0}, slow{0}, wrong{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 3; ++t) {
    readers.emplace_back([&, t] {
      size_t i = t;
      while (!stop) {
        const size_t s = i++ % w.seqs.size();
        auto keys = r.Keys(w.seqs[s]);
        auto t0 = SteadyClock::now();
        for (size_t b = 0; b < keys.size(); ++b) {
          auto got = r.Get(keys[b]);
          if (got.ok() && *got != w.blocks[s][b]) ++wrong;  // a hit is always the right bytes
        }
        if (SteadyClock::now() - t0 > TimeBound(3s)) ++slow;  // never a hang
        ++calls;
      }
    });
  }
  std::this_thread::sleep_for(300ms);
  c.nodes["n1"]->Kill(SIGKILL);
  REQUIRE(c.nodes["n1"]->Wait(TimeBound(5s)));
  // The coordinator notices the missed heartbeats and advances the epoch.
  const uint64_t epoch2 = c.WaitNodes(2, 10s);
  CHECK(epoch2 > epoch3);
  // The client's background refresh.
  for (const auto end = SteadyClock::now() + TimeBound(5s); client->num_nodes() != 2 && SteadyClock::now() < end;)
    std::this_thread::sleep_for(50ms);
  stop = true;
  for (auto& t : readers) t.join();
  CHECK(calls > 0);
  CHECK(slow == 0);
  CHECK(wrong == 0);
  CHECK(client->num_nodes() == 2);
  CHECK(client->epoch() >= epoch2);
  // Survivors still serve their blocks; re-putting lands every block on a live node.
  const size_t survivors = CountHits(r, w);
  CHECK(survivors > 0);
  CHECK(survivors < 48);
  REQUIRE(PutAll(r, w).ok());
  CHECK(CountHits(r, w) == 48);

  // n1 rejoins (a fresh process, new ports): the epoch advances again, the
  // client routes to it, and only the keys n1 now owns move (they miss once).
  c.StartNode("n1");
  const uint64_t epoch_back = c.WaitNodes(3, 10s);
  CHECK(epoch_back > epoch2);
  const auto end = SteadyClock::now() + TimeBound(5s);
  while (client->num_nodes() != 3 && SteadyClock::now() < end) std::this_thread::sleep_for(50ms);
  REQUIRE(client->num_nodes() == 3);
  const size_t after_rejoin = CountHits(r, w);
  CHECK(after_rejoin >= 16);  // about 2/3 stay where they are
  CHECK(after_rejoin < 48);   // the rest moved to the empty n1
  REQUIRE(PutAll(r, w).ok());
  CHECK(CountHits(r, w) == 48);
}

TEST_CASE("Daemons: a cluster with a token refuses clients without it", "[cluster][daemons][auth]") {
  Cluster c;
  c.StartCoordinator();
  auto p = std::make_unique<Process>();
  REQUIRE(p->Start({kBin, "node", "--config", kConfig, "--id", "n0", "--coordinator", c.addr(), "--token", "s3cret"}));
  REQUIRE(p->WaitEvent("listening", TimeBound(10s)));
  c.nodes["n0"] = std::move(p);
  c.WaitNodes(1);
  NetworkClientOptions o;
  o.coordinator = c.addr();
  o.timeout_ms = kHttpMs;
  auto bad = NetworkClient::Connect(o);
  REQUIRE(bad.ok());
  Router& r = (*bad)->router();
  auto blocks = Blocks(1, r.model().FullBlockBytes(), 5);
  std::vector<std::span<const std::byte>> spans(blocks.begin(), blocks.end());
  auto seq = Tokens(r.block_tokens(), 1);
  CHECK(r.Put(seq, spans).code() == StatusCode::kPermissionDenied);
  o.token = "s3cret";
  auto good = NetworkClient::Connect(o);
  REQUIRE(good.ok());
  REQUIRE((*good)->router().Put(seq, spans).ok());
  CHECK((*good)->router().MatchPrefix(seq).value() == 1);
}

TEST_CASE("Daemons: a router with an old map is refused (stale epoch), refreshes and retries", "[cluster][daemons]") {
  Cluster c;
  c.StartCoordinator();
  for (const char* id : {"n0", "n1"}) c.StartNode(id);
  c.WaitNodes(2);
  NetworkClientOptions o;
  o.coordinator = c.addr();
  o.timeout_ms = TimeBound(2000ms).count();
  o.refresh_ms = 0;  // no background refresh: only a stale-epoch answer can update the map
  auto client = NetworkClient::Connect(o);
  REQUIRE(client.ok());
  const uint64_t before = (*client)->epoch();
  REQUIRE((*client)->num_nodes() == 2);
  // n2 joins: the epoch advances and the nodes learn it from their next heartbeat.
  c.StartNode("n2");
  const uint64_t after = c.WaitNodes(3);
  REQUIRE(after > before);
  std::this_thread::sleep_for(TimeBound(600ms));  // > 2 heartbeats
  Router& r = (*client)->router();
  Workload w = MakeWorkload(3, 4, r.block_tokens(), r.model().FullBlockBytes(), 4);
  REQUIRE(PutAll(r, w).ok());  // first attempt answered StaleEpoch, refreshed, retried
  CHECK((*client)->epoch() == after);
  CHECK((*client)->num_nodes() == 3);
  CHECK(CountHits(r, w) == 12);
  CHECK(r.Stats().node_errors >= 1);  // the stale answers
  // The nodes counted the refusals.
  uint64_t stale = 0;
  for (const char* id : {"n0", "n1"}) {
    auto m = HttpRequest("127.0.0.1", c.listening[id]["ports"]["http"].get<uint16_t>(), "GET", "/metrics", "", kHttpMs);
    REQUIRE(m.ok());
    auto pos = m->body.find("reason=\"stale_epoch\"} ");
    REQUIRE(pos != std::string::npos);
    stale += std::stoull(m->body.substr(pos + 22));
  }
  CHECK(stale >= 1);
}

TEST_CASE("Daemons: a restarted coordinator gets the nodes back and routers keep going", "[cluster][daemons][faults]") {
  Cluster c;
  c.StartCoordinator();
  for (const char* id : {"n0", "n1", "n2"}) c.StartNode(id);
  const uint64_t first = c.WaitNodes(3);
  auto client = Client(c);
  Router& r = client->router();
  Workload w = MakeWorkload(3, 4, r.block_tokens(), r.model().FullBlockBytes(), 5);
  REQUIRE(PutAll(r, w).ok());
  // The coordinator dies; the data plane does not need it.
  c.coord.Kill(SIGKILL);
  REQUIRE(c.coord.Wait(TimeBound(5s)));
  CHECK(CountHits(r, w) == 12);
  // A new coordinator on the same port: the nodes' heartbeats get 404 and they
  // register again; its epochs start above the old ones, so routers take its map.
  Process again;
  REQUIRE(again.Start({kBin, "coordinator", "--config", c.config, "--port", std::to_string(c.coord_port)}));
  REQUIRE(again.WaitEvent("listening", TimeBound(10s)));
  const uint64_t second = c.WaitNodes(3);
  CHECK(second > first);
  const auto end = SteadyClock::now() + TimeBound(5s);
  while (client->epoch() < second && SteadyClock::now() < end) std::this_thread::sleep_for(50ms);
  CHECK(client->epoch() >= second);
  CHECK(CountHits(r, w) == 12);  // same nodes, same placement: every block still there
  again.Kill(SIGTERM);
  CHECK(again.Wait(TimeBound(5s)));
}

TEST_CASE("Daemons: a bad registration is refused naming the JSON path and changes nothing", "[cluster][daemons]") {
  Cluster c;
  c.StartCoordinator();
  c.StartNode("n0");
  const uint64_t epoch = c.WaitNodes(1);
  const std::pair<const char*, const char*> bad[] = {
      {R"({"id": "x", "ports": {"data": 70000}})", "$.ports.data: too large"},  // once stored as port 4464
      {R"({"id": "x", "ports": {"data": "7000"}})", "$.ports.data: expected an integer"},
      {R"({"id": "x", "ports": {"data": 0}})", "$.ports.data: must be a port"},
      {R"({"id": "x", "ports": 9})", "$.ports: expected an object"},
      {R"({"id": "x"})", "$.ports"},
      {R"({"id": "x", "ports": {"data": 9}, "weight": 0})", "$.weight: must be > 0"},
      {R"({"id": "x", "ports": {"data": 9}, "colour": "red"})", "$.colour: unknown key"},
      {R"({"id": "x", "ports": {"data": 9, "rdma": 1}})", "$.ports.rdma: unknown key"},
      {R"({"id": 5, "ports": {"data": 9}})", "a non-empty string"},
      {R"([1, 2])", "JSON object"},
  };
  for (const auto& [body, want] : bad) {
    auto r = HttpRequest("127.0.0.1", c.coord_port, "POST", "/register", body, kHttpMs);
    REQUIRE(r.ok());
    INFO(body << " -> " << r->body);
    CHECK(r->status == 400);
    CHECK(r->body.find(want) != std::string::npos);
  }
  auto nodes = HttpRequest("127.0.0.1", c.coord_port, "GET", "/nodes", "", kHttpMs);
  REQUIRE(nodes.ok());
  auto j = nlohmann::json::parse(nodes->body);
  CHECK(j["nodes"].size() == 1);
  CHECK(j["epoch"].get<uint64_t>() == epoch);
}

TEST_CASE("Daemons: the nodes' eviction groups add each other's scores through the coordinator's heartbeats",
          "[cluster][daemons]") {
  // Two nodes run the default `adaptive`; each of its groups' scores reaches
  // the other node as that group's peers (docs/eviction.md "Through the
  // nodes"), so both decide on the cluster's sum. A node that dies leaves no
  // peers behind; a heartbeat with bad scores is refused naming the path.
  Cluster c;
  c.StartCoordinator();
  for (const char* id : {"n0", "n1"}) c.StartNode(id);
  const uint64_t epoch = c.WaitNodes(2);
  auto client = Client(c);
  Router& r = client->router();
  // 300 blocks, matched 8 times: every stripe of both nodes publishes (a
  // member publishes every 64 of its accesses).
  Workload w = MakeWorkload(30, 10, r.block_tokens(), r.model().FullBlockBytes(), 3);
  REQUIRE(PutAll(r, w).ok());
  for (int round = 0; round < 8; ++round)
    for (const auto& s : w.seqs) REQUIRE(r.MatchPrefix(s).value() == 10);
  auto groups = [&](const std::string& id) {
    const uint16_t http = c.listening[id]["ports"]["http"].get<uint16_t>();
    auto st = HttpRequest("127.0.0.1", http, "GET", "/stats", "", kHttpMs);
    REQUIRE(st.ok());
    REQUIRE(st->status == 200);
    return nlohmann::json::parse(st->body)["eviction_groups"];
  };
  // With the traffic over, each node's peers become the other's scores.
  nlohmann::json g0, g1;
  std::string key;
  for (const auto end = SteadyClock::now() + TimeBound(10s); SteadyClock::now() < end && key.empty();
       std::this_thread::sleep_for(100ms)) {
    g0 = groups("n0");
    g1 = groups("n1");
    for (auto& [k, v] : g0.items()) {
      if (!g1.contains(k) || v["scores"].empty()) continue;
      if (v["peer_scores"] == g1[k]["scores"] && g1[k]["peer_scores"] == v["scores"]) key = k;
    }
  }
  INFO("n0: " << g0.dump() << "\nn1: " << g1.dump());
  REQUIRE_FALSE(key.empty());
  CHECK(key.rfind("primary/adaptive/", 0) == 0);
  CHECK(g0[key]["scores"].size() == g1[key]["scores"].size());
  CHECK(g0[key]["following"].get<std::string>().size() > 0);
  double total = 0;
  for (const auto& x : g1[key]["scores"]) total += x.get<double>();
  CHECK(total > 0);

  // A heartbeat with bad scores is refused whole, naming the path.
  auto bad = HttpRequest("127.0.0.1", c.coord_port, "POST", "/heartbeat",
                         R"({"id": "n0", "eviction": {"primary/adaptive/65536": [1, -3]}})", kHttpMs);
  REQUIRE(bad.ok());
  CHECK(bad->status == 400);
  CHECK_THAT(bad->body, Catch::Contains("$.eviction.primary/adaptive/65536: scores must be finite numbers >= 0"));

  // n1 dies: once the coordinator drops it, n0 has no peers left.
  c.nodes["n1"]->Kill(SIGKILL);
  bool alone = false;
  for (const auto end = SteadyClock::now() + TimeBound(10s); SteadyClock::now() < end && !alone;
       std::this_thread::sleep_for(100ms)) {
    g0 = groups("n0");
    alone = g0.contains(key) && g0[key]["peer_scores"].empty();
  }
  INFO("n0: " << g0.dump());
  CHECK(alone);
  CHECK(c.WaitNodes(1) > epoch);
}

#if defined(KVMESH_HAVE_UCX)
TEST_CASE("Daemons: with $.transport.backend = ucx the router's data goes over UCX", "[cluster][daemons][ucx]") {
  // daemons-local.json with the UCX backend, in a temporary file.
  auto j = nlohmann::json::parse(std::ifstream(kConfig));
  j["transport"]["backend"] = "ucx";
  const std::string path = "/tmp/kvmesh-ucx-test-" + std::to_string(::getpid()) + ".json";
  std::ofstream(path) << j.dump();
  Cluster c;
  c.config = path;
  c.StartCoordinator();
  for (const char* id : {"n0", "n1", "n2"}) c.StartNode(id);
  ::unlink(path.c_str());
  for (auto& [id, l] : c.listening) CHECK(l.value("ucx_address", "").size() > 16);
  c.WaitNodes(3);
  auto client = Client(c, 3000);
  Router& r = client->router();
  Workload w = MakeWorkload(4, 6, r.block_tokens(), r.model().FullBlockBytes(), 3);
  REQUIRE(PutAll(r, w).ok());
  CHECK(CountHits(r, w) == 24);
  CHECK(r.MatchPrefix(w.seqs[0]).value() == 6);
  // The GETs are local reads (the nodes are on this host): no request, but
  // each reaches its node as a hit once the node drains the reads.
  auto metric = [&](const nlohmann::json& l, const std::string& name) {
    auto m = HttpRequest("127.0.0.1", l["ports"]["http"].get<uint16_t>(), "GET", "/metrics", "", kHttpMs);
    REQUIRE(m.ok());
    auto pos = m->body.find("\n" + name + " ");  // the sample line, not the # TYPE line
    REQUIRE(pos != std::string::npos);
    CHECK_THAT(m->body, Catch::Contains("kvmesh_requests_total{op=\"PUT\"} 0"));  // nothing over TCP
    return std::stoull(m->body.substr(pos + name.size() + 2));
  };
  uint64_t ucx_requests = 0, hits = 0;
  const auto until = std::chrono::steady_clock::now() + TimeBound(5s);
  do {
    ucx_requests = hits = 0;
    for (auto& [id, l] : c.listening) {
      ucx_requests += metric(l, "kvmesh_ucx_requests_total");
      hits += metric(l, "kvmesh_store_hits_total");
    }
  } while (hits < 24 && std::chrono::steady_clock::now() < until &&
           (std::this_thread::sleep_for(20ms), true));
  CHECK(ucx_requests >= 3 + 3 + 4);  // HELLOs, LOCAL_MAPs, puts
  CHECK(hits >= 24);                 // the GETs
}

TEST_CASE("Daemons: a UCX channel whose node died or stopped with sends in flight fails the calls and closes at once",
          "[cluster][daemons][ucx]") {
  // A standalone node with the UCX backend and a fresh channel to it: PUTs of
  // rendezvous-sized blocks are posted, and the node is killed (SIGKILL) at
  // once, or was stopped (SIGSTOP) before: the calls fail (Unavailable from
  // the watch endpoint, or DeadlineExceeded), and the channel is destroyed
  // with sends never completed. Closing must not wait for the node, and the
  // sends' bytes go with the channel: UCX drops the sends of a data endpoint
  // whose node died before its connection was up without calling back
  // (LeakSanitizer, in the asan preset, reports their bytes at exit if the
  // channel does not free them).
  auto j = nlohmann::json::parse(std::ifstream(kConfig));
  j["transport"]["backend"] = "ucx";
  j["coordinator"]["port"] = 0;  // standalone
  const std::string path = "/tmp/kvmesh-ucx-death-test-" + std::to_string(::getpid()) + ".json";
  std::ofstream(path) << j.dump();
  const char* old_tls = std::getenv("UCX_TLS");
  const std::string saved_tls = old_tls ? old_tls : "";
  auto blocks = Blocks(4, 1 << 20, 11);
  constexpr size_t kCalls = 8;
  for (const char* tls : {"", "tcp"}) {
    for (int sig : {SIGKILL, SIGSTOP}) {
      INFO("UCX_TLS=" << (*tls ? tls : "(default)") << (sig == SIGKILL ? ", node killed" : ", node stopped"));
      if (*tls) ::setenv("UCX_TLS", tls, 1);  // the node (a child) and the channel's own context
      Process node;
      REQUIRE(node.Start({kBin, "node", "--config", path, "--id", "n0"}));
      auto l = node.WaitEvent("listening", TimeBound(10s));
      REQUIRE(l);
      auto address = HexDecode(l->value("ucx_address", ""));
      REQUIRE(address.ok());
      UcxChannelOptions o;
      o.node_address = *address;
      o.timeout_ms = 3000;
      o.limits.max_body_bytes = 64 << 20;
      auto ch = UcxChannel::Connect(o);
      if (old_tls) ::setenv("UCX_TLS", saved_tls.c_str(), 1);
      else ::unsetenv("UCX_TLS");
      INFO(ch.status().ToString());
      REQUIRE(ch.ok());
      if (sig == SIGSTOP) node.Kill(SIGSTOP);  // the node takes nothing from here on
      std::vector<std::vector<PutItem>> puts(kCalls);
      std::vector<ChannelCall> calls(kCalls);
      auto t0 = SteadyClock::now();
      for (uint64_t c = 0; c < kCalls; ++c) {
        for (uint64_t i = 0; i < blocks.size(); ++i) puts[c].push_back(PutItem{BlockKey{c, i}, blocks[i], {}});
        (*ch)->StartPut(puts[c], {}, &calls[c]);
      }
      if (sig == SIGKILL) node.Kill(SIGKILL);
      std::vector<StatusCode> got;
      for (ChannelCall& c : calls) got.push_back(c.Wait().code());
      CHECK(SteadyClock::now() - t0 < 3000ms + TimeBound(5s));
      const StatusCode want = sig == SIGKILL ? StatusCode::kUnavailable : StatusCode::kDeadlineExceeded;
      CHECK(std::count(got.begin(), got.end(), want) >= 1);
      CHECK(std::count(got.begin(), got.end(), want) + std::count(got.begin(), got.end(), StatusCode::kOk) == kCalls);
      t0 = SteadyClock::now();
      ch->reset();
      CHECK(SteadyClock::now() - t0 < 5s);
      node.Kill(SIGCONT);
    }
  }
  ::unlink(path.c_str());
}
#endif

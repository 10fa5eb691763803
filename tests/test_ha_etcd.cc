// The control plane on etcd ($.coordinator.etcd; coordinator/etcd_control.h),
// against a real etcd (/usr/bin/etcd, Debian's etcd-server, started here on
// ports chosen at run time and removed afterwards; the tests say they are
// skipped when it is missing):
//  - two `kvmesh coordinator`s and three nodes under client load: the leader
//    killed with SIGKILL; every block still reads back byte for byte, a client
//    started during the outage connects, and the other coordinator leads and
//    publishes the next map when a node joins;
//  - a leader cut off between planning a map and publishing it (two
//    EtcdControls in this process, interleaved at that moment) never
//    publishes once the new leader has: no epoch number is used twice;
//  - the same with processes: the leader stopped (SIGSTOP) past its lease and
//    resumed.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <numeric>
#include <random>
#include <set>
#include <thread>

#include "cluster_process.h"
#include "cluster_workload.h"
#include "common/credentials.h"
#include "coordinator/etcd_client.h"
#include "coordinator/etcd_control.h"
#include "coordinator/membership.h"
#include "kvmesh/config.h"
#include "kvmesh/network.h"
#include "test_pki.h"
#include "test_time.h"
#include "transport/http_client.h"

using namespace kvmesh;
using kvmesh::testing::Process;
using namespace kvmesh::testing;  // the workload (cluster_workload.h)
using kvmesh::testing::Certs;
using kvmesh::testing::TimeBound;
using nlohmann::json;
using SteadyClock = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {

const std::string kBin = KVMESH_BIN;
const std::string kEtcd = "/usr/bin/etcd";
const std::string kConfig = std::string(KVMESH_SOURCE_DIR) + "/cluster_configs/daemons-local.json";
const int64_t kHttpMs = TimeBound(1000ms).count();

bool HaveEtcd() {
  if (::access(kEtcd.c_str(), X_OK) == 0) return true;
  WARN("skipped: " << kEtcd << " is missing (Debian: apt-get install etcd-server; scripts/install-deps.sh)");
  return false;
}

uint16_t FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  uint16_t port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

// $.tls of a coordinator showing `name`.pem of the test PKI (tests/test_pki.h)
// as its client certificate ("": none), trusting the cluster CA.
TlsConfig ClientTls(const std::string& name) {
  TlsConfig t;
  t.ca = Certs()("ca.pem");
  if (!name.empty()) {
    t.cert = Certs()(name + ".pem");
    t.key = Certs()(name + ".key");
  }
  return t;
}

// One etcd member on 127.0.0.1, its data and log in a temporary directory.
// With `tls`: HTTPS with the PKI's node certificate, and only clients that
// show a certificate of the cluster CA get in (--client-cert-auth; flags from
// https://etcd.io/docs/v3.4/op-guide/security/).
struct Etcd {
  Process p;
  std::string dir;
  uint16_t port = 0;
  bool tls = false;

  explicit Etcd(bool with_tls = false) : tls(with_tls) {
    char tmpl[] = "/tmp/kvmesh-etcd-XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    dir = tmpl;
    port = FreePort();
    const std::string client = std::string(tls ? "https" : "http") + "://127.0.0.1:" + std::to_string(port);
    const std::string peer = "http://127.0.0.1:" + std::to_string(FreePort());
    const std::string tls_flags = tls ? " --cert-file " + Certs()("node.pem") + " --key-file " + Certs()("node.key") +
                                            " --trusted-ca-file " + Certs()("ca.pem") + ""
                                      : "";
    REQUIRE(p.Start({"/bin/sh", "-c",
                     "exec " + kEtcd + " --name t --data-dir '" + dir + "/data' --listen-client-urls " + client +
                         " --advertise-client-urls " + client + " --listen-peer-urls " + peer +
                         " --initial-advertise-peer-urls " + peer + " --initial-cluster t=" + peer + tls_flags +
                         " >'" + dir + "/log' 2>&1"}));
    EtcdConfig e;
    e.endpoints = {endpoint()};
    e.tls = tls;
    e.request_timeout_ms = kHttpMs;
    auto probe = EtcdClient::Create(e, tls ? ClientTls("client") : TlsConfig{});
    REQUIRE(probe.ok());
    const auto end = SteadyClock::now() + TimeBound(10s);
    for (;;) {
      if ((*probe)->Call("kv/range", {{"key", "AA=="}}).ok()) break;
      REQUIRE(SteadyClock::now() < end);
      std::this_thread::sleep_for(50ms);
    }
  }
  ~Etcd() {
    p.Kill(SIGKILL);
    p.Wait(5s);
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port); }

  // The config of daemons-local.json with a fourth node and the control plane in this etcd.
  std::string WriteConfig() const {
    std::ifstream in(kConfig);
    json c = json::parse(in);
    json n3 = c["nodes"][2];
    n3["id"] = "n3";
    c["nodes"].push_back(n3);
    c["coordinator"]["etcd"] = {{"endpoints", {endpoint()}}, {"lease_ms", 2000}, {"request_timeout_ms", 500}};
    const std::string path = dir + "/config.json";
    std::ofstream(path) << c.dump(2);
    return path;
  }
};

size_t Total(const Workload& w) {
  size_t n = 0;
  for (const auto& b : w.blocks) n += b.size();
  return n;
}
struct Reads {
  size_t hits = 0, misses = 0, wrong = 0;
};
Reads ReadAll(Router& r, const Workload& w) {
  Reads out;
  for (size_t s = 0; s < w.seqs.size(); ++s) {
    auto keys = r.Keys(w.seqs[s]);
    for (size_t i = 0; i < keys.size(); ++i) {
      auto got = r.Get(keys[i]);
      if (!got.ok()) ++out.misses;
      else if (*got == w.blocks[s][i]) ++out.hits;
      else ++out.wrong;
    }
  }
  return out;
}

std::unique_ptr<NetworkClient> Client(const std::string& coordinators) {
  NetworkClientOptions o;
  o.coordinator = coordinators;
  o.timeout_ms = TimeBound(1000ms).count();
  o.refresh_ms = 200;
  auto r = NetworkClient::Connect(o);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  return std::move(*r);
}

json GetJson(uint16_t port, const std::string& path) {
  auto r = HttpRequest("127.0.0.1", port, "GET", path, "", kHttpMs);
  if (!r.ok() || r->status != 200) return json();
  return json::parse(r->body, nullptr, false);
}

struct Coordinators {
  std::string config;
  Process p[2];
  uint16_t port[2] = {0, 0};

  void Start(bool merge_stderr = false) {
    for (int i = 0; i < 2; ++i) {
      REQUIRE(p[i].Start({kBin, "coordinator", "--config", config, "--port", "0"}, merge_stderr));
      auto j = p[i].WaitEvent("listening", TimeBound(10s));
      REQUIRE(j);
      port[i] = (*j)["ports"]["http"].get<uint16_t>();
    }
  }
  // Which coordinator leads (its /stats "etcd"), waiting up to `timeout`.
  int WaitLeader(std::chrono::milliseconds timeout, int except = -1) {
    const auto end = SteadyClock::now() + TimeBound(timeout);
    while (SteadyClock::now() < end) {
      for (int i = 0; i < 2; ++i) {
        if (i == except) continue;
        json s = GetJson(port[i], "/stats");
        if (s.is_object() && s.contains("etcd") && s["etcd"].value("leader", false)) return i;
      }
      std::this_thread::sleep_for(50ms);
    }
    FAIL("no coordinator leads");
    return -1;
  }
  // Coordinator i's map once it has n nodes: its epoch.
  uint64_t WaitMap(int i, size_t n, std::chrono::milliseconds timeout) {
    const auto end = SteadyClock::now() + TimeBound(timeout);
    while (SteadyClock::now() < end) {
      json m = GetJson(port[i], "/map");
      if (m.is_object() && m["nodes"].size() == n) return m["epoch"].get<uint64_t>();
      std::this_thread::sleep_for(20ms);
    }
    FAIL("coordinator " << i << " did not publish a map of " << n << " nodes");
    return 0;
  }
  std::string List(int first) const {
    return "127.0.0.1:" + std::to_string(port[first]) + ",127.0.0.1:" + std::to_string(port[1 - first]);
  }
};

std::unique_ptr<Process> StartNode(const std::string& config, const std::string& id, const std::string& coordinators) {
  auto p = std::make_unique<Process>();
  REQUIRE(p->Start({kBin, "node", "--config", config, "--id", id, "--coordinator", coordinators}));
  REQUIRE(p->WaitEvent("listening", TimeBound(10s)));
  return p;
}

}  // namespace

TEST_CASE("etcd: the leader coordinator killed under client load; the other leads, clients and nodes fail over",
          "[cluster][etcd]") {
  if (!HaveEtcd()) return;
  Etcd etcd;
  Coordinators c;
  c.config = etcd.WriteConfig();
  c.Start();
  const int leader = c.WaitLeader(10s);
  const int follower = 1 - leader;
  const std::string list = c.List(leader);  // the leader first: every client and node starts there
  std::map<std::string, std::unique_ptr<Process>> nodes;
  for (const char* id : {"n0", "n1", "n2"}) nodes[id] = StartNode(c.config, id, list);
  const uint64_t e1 = c.WaitMap(follower, 3, 10s);  // a follower answers GET /map from etcd

  auto cfg = LoadConfigFile(c.config);
  REQUIRE(cfg.ok());
  const Workload w = MakeWorkload(16, 4, cfg->model.block_tokens, cfg->model.FullBlockBytes(), 1);
  auto client = Client(list);
  REQUIRE(PutAll(client->router(), w).ok());
  REQUIRE(ReadAll(client->router(), w).hits == Total(w));

  // Client load through the failover: every read must hit, byte for byte.
  std::atomic<bool> stop{false};
  std::atomic<size_t> hits{0}, misses{0}, wrong{0};
  std::thread load([&] {
    while (!stop.load()) {
      Reads r = ReadAll(client->router(), w);
      hits += r.hits, misses += r.misses, wrong += r.wrong;
    }
  });
  struct StopLoad {  // a failed REQUIRE below still stops and joins the load thread
    std::atomic<bool>& stop;
    std::thread& t;
    ~StopLoad() {
      stop = true;
      if (t.joinable()) t.join();
    }
  } stop_load{stop, load};
  std::this_thread::sleep_for(300ms);
  c.p[leader].Kill(SIGKILL);
  const auto killed = SteadyClock::now();
  // During the outage (the dead leader's lease has not run out yet): a new
  // client connects through the list, whose first coordinator is dead.
  bool during_outage = false;
  {
    auto late = Client(list);
    json s = GetJson(c.port[follower], "/stats");  // not leading yet: the client came in during the outage
    during_outage = s.is_object() && s.contains("etcd") && !s["etcd"].value("leader", true);
    CHECK(ReadAll(late->router(), w).hits == Total(w));
  }
  CHECK(c.WaitLeader(8s, leader) == follower);
  const size_t misses_before_join = misses.load();
  // Map updates continue: a node joins through the new leader.
  nodes["n3"] = StartNode(c.config, "n3", list);
  const uint64_t e2 = c.WaitMap(follower, 4, 8s);
  const auto failover_ms = std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - killed).count();
  stop = true;
  load.join();
  CHECK(e2 > e1);
  CHECK(wrong.load() == 0);
  CHECK(misses_before_join == 0);  // the leader's death cost no read
  CHECK(hits.load() > 0);
  // The first client's map followed (from the follower), and new blocks land and read back.
  const Workload w2 = MakeWorkload(8, 4, cfg->model.block_tokens, cfg->model.FullBlockBytes(), 2);
  REQUIRE(PutAll(client->router(), w2).ok());
  const Reads r2 = ReadAll(client->router(), w2);
  CHECK(r2.hits == Total(w2));
  CHECK(r2.wrong == 0);
  json s = GetJson(c.port[follower], "/stats");
  CHECK(s["etcd"]["leader"] == true);
  CHECK(s["etcd"]["leader_changes"].get<uint64_t>() >= 1);
  WARN("failover: leader killed to the next map " << failover_ms << " ms; epochs " << e1 << " -> " << e2
                                                    << "; a client started " << (during_outage ? "during" : "after")
                                                    << " the outage");
}

TEST_CASE("etcd: a leader cut off between planning and publishing a map never publishes after the new leader",
          "[cluster][etcd]") {
  if (!HaveEtcd()) return;
  Etcd etcd;
  auto cfg = LoadConfigFile(etcd.WriteConfig());
  REQUIRE(cfg.ok());
  std::mutex mu;
  std::vector<json> published;  // every map_published event, from either coordinator
  auto sink = [&](const std::string& line) {
    json j = json::parse(line, nullptr, false);
    std::lock_guard<std::mutex> lock(mu);
    if (j.is_object() && j.value("event", "") == "map_published") published.push_back(j);
  };
  Membership ma(*cfg, sink), mb(*cfg, sink);
  auto a = EtcdControl::Create(*cfg, &ma, "A");  // its events go out through ma's sink
  auto b = EtcdControl::Create(*cfg, &mb, "B");
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  auto Register = [](Membership& m, const std::string& id, int port) {
    HttpServerRequest r{"POST", "/register", json{{"id", id}, {"ports", {{"data", port}}}}.dump(), "", "test"};
    REQUIRE(m.Handle(r).status == 200);
  };
  Register(ma, "n0", 9000);
  (*a)->Tick();
  REQUIRE((*a)->leader());
  (*b)->Tick();
  REQUIRE(!(*b)->leader());
  const uint64_t e0 = mb.epoch();  // the follower serves the leader's map
  REQUIRE(e0 == ma.epoch());
  REQUIRE(e0 > 0);

  // A plans the next map (n1 joined) and is cut off before publishing it.
  Register(ma, "n1", 9001);
  REQUIRE((*a)->SyncNodes().ok());
  REQUIRE((*a)->Lead().ok());
  auto plan = (*a)->PlanMap();
  REQUIRE(plan.ok());
  REQUIRE(plan->has_value());
  CHECK((*plan)->epoch == e0 + 1);

  // B leads once A's lease has run out, and publishes with a node of its own.
  Register(mb, "n2", 9002);
  const auto end = SteadyClock::now() + TimeBound(8s);
  while (!((*b)->leader() && mb.epoch() > e0)) {
    REQUIRE(SteadyClock::now() < end);
    Register(mb, "n2", 9002);  // its heartbeat
    (*b)->Tick();
    std::this_thread::sleep_for(100ms);
  }
  const uint64_t eb = mb.epoch();
  CHECK(eb == e0 + 1);  // the very number A planned

  // A resumes and tries to publish what it planned: refused.
  auto committed = (*a)->CommitMap(**plan);
  REQUIRE(committed.ok());
  CHECK(!*committed);
  CHECK(!(*a)->leader());
  for (int i = 0; i < 3; ++i) {
    (*a)->Tick();
    (*b)->Tick();
  }
  auto etcd_client = EtcdClient::Create(cfg->coordinator.etcd, cfg->tls);
  REQUIRE(etcd_client.ok());
  auto epoch_kv = (*etcd_client)->Get(cfg->coordinator.etcd.prefix + "epoch");
  REQUIRE(epoch_kv.ok());
  REQUIRE(epoch_kv->has_value());
  // B may have published again since (A's nodes' leases ran out too): etcd holds B's latest, which A serves.
  CHECK((*epoch_kv)->value == std::to_string(mb.epoch()));
  CHECK(mb.epoch() >= eb);
  CHECK(ma.epoch() == mb.epoch());
  std::lock_guard<std::mutex> lock(mu);
  std::set<uint64_t> epochs;
  for (const json& e : published) CHECK(epochs.insert(e["epoch"].get<uint64_t>()).second);  // no number twice
  REQUIRE(published.size() >= 2);
  CHECK(published[0]["self"] == "A");
  for (size_t i = 1; i < published.size(); ++i) CHECK(published[i]["self"] == "B");
}

TEST_CASE("etcd: a leader stopped past its lease (SIGSTOP) and resumed publishes nothing", "[cluster][etcd]") {
  if (!HaveEtcd()) return;
  Etcd etcd;
  Coordinators c;
  c.config = etcd.WriteConfig();
  c.Start(/*merge_stderr=*/true);  // their events on the pipe: map_published, leader_lost
  const int leader = c.WaitLeader(10s);
  const int follower = 1 - leader;
  const std::string list = c.List(leader);
  std::map<std::string, std::unique_ptr<Process>> nodes;
  for (const char* id : {"n0", "n1"}) nodes[id] = StartNode(c.config, id, list);
  const uint64_t e1 = c.WaitMap(follower, 2, 10s);
  c.p[leader].Signal(SIGSTOP);
  CHECK(c.WaitLeader(8s, leader) == follower);
  nodes["n2"] = StartNode(c.config, "n2", list);  // registers with the follower: the new leader publishes
  const uint64_t e2 = c.WaitMap(follower, 3, 8s);
  CHECK(e2 > e1);
  while (c.p[leader].ReadLine(50ms)) {  // what it printed before it was stopped
  }
  c.p[leader].Signal(SIGCONT);
  // Its nodes have moved on; it finds its lease gone and publishes nothing.
  const auto end = SteadyClock::now() + TimeBound(1500ms);
  bool lost = false;
  std::vector<uint64_t> resumed_publishes;
  while (SteadyClock::now() < end) {
    auto line = c.p[leader].ReadLine(100ms);
    if (!line) continue;
    json j = json::parse(*line, nullptr, false);
    if (!j.is_object()) continue;
    if (j.value("event", "") == "leader_lost") lost = true;
    if (j.value("event", "") == "map_published") resumed_publishes.push_back(j["epoch"].get<uint64_t>());
    UNSCOPED_INFO("resumed leader: " << *line);
  }
  CHECK(lost);
  CHECK(resumed_publishes.empty());
  // Both answer the new leader's map.
  CHECK(GetJson(c.port[leader], "/map")["epoch"].get<uint64_t>() == GetJson(c.port[follower], "/map")["epoch"]);
  CHECK(c.WaitMap(follower, 3, 1s) >= e2);
}

TEST_CASE("etcd over TLS with client certificates: the cluster CA's certificate gets in, no other", "[cluster][etcd]") {
  if (!HaveEtcd()) return;
  Etcd etcd(/*with_tls=*/true);
  EtcdConfig e;
  e.endpoints = {etcd.endpoint()};
  e.tls = true;
  e.request_timeout_ms = kHttpMs;
  const std::string key = "/kvmesh/tls-test/k";
  {
    auto c = EtcdClient::Create(e, ClientTls("client"));
    REQUIRE(c.ok());
    auto put = (*c)->Call("kv/put", EtcdClient::PutOp(key, "v").at("request_put"));
    INFO(put.status().ToString());
    REQUIRE(put.ok());
    auto got = (*c)->Get(key);
    REQUIRE(got.ok());
    REQUIRE(got->has_value());
    CHECK((*got)->value == "v");
  }
  // A certificate of another CA, no certificate, and plain HTTP: refused, nothing read.
  for (const char* who : {"rogue", ""}) {
    INFO("client certificate: " << (*who ? who : "none"));
    auto c = EtcdClient::Create(e, ClientTls(who));
    REQUIRE(c.ok());
    auto got = (*c)->Get(key);
    CHECK(!got.ok());
  }
  {
    EtcdConfig plain = e;
    plain.tls = false;
    auto c = EtcdClient::Create(plain, TlsConfig{});
    REQUIRE(c.ok());
    CHECK(!(*c)->Get(key).ok());
  }

  // A coordinator's control plane over it: $.coordinator.etcd.tls with $.tls's
  // client certificate leads; with the other CA's certificate it cannot.
  auto cfg = LoadConfigFile(kConfig);
  REQUIRE(cfg.ok());
  cfg->coordinator.etcd = e;
  cfg->coordinator.etcd.prefix = "/kvmesh/tls-test/";
  cfg->tls = ClientTls("client");
  Membership m(*cfg, [](const std::string&) {});
  auto ok = EtcdControl::Create(*cfg, &m, "with-cert");
  REQUIRE(ok.ok());
  ClusterConfig rogue_cfg = *cfg;
  rogue_cfg.tls = ClientTls("rogue");
  Membership rm(rogue_cfg, [](const std::string&) {});
  auto rogue = EtcdControl::Create(rogue_cfg, &rm, "rogue");
  REQUIRE(rogue.ok());
  (*rogue)->Tick();
  CHECK(!(*rogue)->leader());
  (*ok)->Tick();
  CHECK((*ok)->leader());
  (*rogue)->Tick();
  CHECK(!(*rogue)->leader());
  auto c = EtcdClient::Create(e, ClientTls("client"));
  REQUIRE(c.ok());
  auto leader = (*c)->Get("/kvmesh/tls-test/leader");
  REQUIRE(leader.ok());
  REQUIRE(leader->has_value());
  CHECK((*leader)->value == "with-cert");
  (*ok)->Stop();
}

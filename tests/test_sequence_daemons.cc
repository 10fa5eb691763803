// Live sequences end to end over real daemons: a `kvmesh coordinator` and two
// `kvmesh node`s as child processes on 127.0.0.1 (run-time ports), a
// NetworkClient per client. Create / append / fork / truncate / read /
// release give back the bytes appended; a second client's CreateSequence of
// the same prompt lands on the same node and attaches the blocks the first
// sealed; $.sequences reaches the daemons; a node killed with SIGKILL leaves
// its handles answering Unavailable while the other node's keep working.
// Over TCP, and over UCX when it is built. A watchdog bounds each run to 20 s
// and kills the daemons whatever happens.
#include <catch2/catch.hpp>

#include <signal.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <numeric>
#include <thread>

#include "cluster_process.h"
#include "kvmesh/build_config.h"
#include "kvmesh/network.h"
#include "transport/http_client.h"

using namespace kvmesh;
using kvmesh::testing::Process;
using SteadyClock = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {

const std::string kBin = KVMESH_BIN;
constexpr uint32_t kLayers = 2, kHeads = 2, kDim = 8, kBt = 4;
constexpr uint32_t kMaxSequences = 6;

// Two nodes, a small fp32 model, a fast heartbeat, and $.sequences.
nlohmann::json ConfigJson() {
  return nlohmann::json::parse(R"({
    "name": "seq-daemons",
    "model": {"model_id": "seqd", "num_layers": 2, "num_kv_heads": 2, "head_dim": 8, "dtype": "fp32",
              "block_tokens": 4},
    "nodes": [
      {"id": "n0", "host": "127.0.0.1", "ports": {"data": 0, "http": 0, "resp": 0}, "memory": {"host": "4MiB"}},
      {"id": "n1", "host": "127.0.0.1", "ports": {"data": 0, "http": 0, "resp": 0}, "memory": {"host": "4MiB"}}
    ],
    "store": {"stripes": 2},
    "transport": {"io_threads": 1, "timeout_ms": 1000},
    "coordinator": {"host": "127.0.0.1", "port": 0, "heartbeat_ms": 100, "dead_after_ms": 600},
    "sequences": {"idle_timeout_ms": 60000, "max_sequences": 6}
  })");
}

// Kills the daemons' process groups and ends the test process if the test
// runs past its bound (a hang anywhere still cleans up); removes the config.
class Watchdog {
 public:
  Watchdog(std::chrono::seconds bound, std::string config_path)
      : config_(std::move(config_path)), thread_([this, bound] { Run(bound); }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
    ::unlink(config_.c_str());
  }
  void Track(pid_t pgid) {
    std::lock_guard<std::mutex> lock(mu_);
    groups_.push_back(pgid);
  }

 private:
  void Run(std::chrono::seconds bound) {
    std::unique_lock<std::mutex> lock(mu_);
    if (cv_.wait_for(lock, bound, [this] { return done_; })) return;
    for (pid_t g : groups_) ::kill(-g, SIGKILL);
    ::unlink(config_.c_str());
    std::fprintf(stderr, "test_sequence_daemons: past its %llds bound, daemons killed\n",
                 static_cast<long long>(bound.count()));
    std::_Exit(1);
  }
  const std::string config_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;              // guarded by mu_
  std::vector<pid_t> groups_;      // guarded by mu_
  std::thread thread_;             // last: starts after the members it reads
};

struct Daemons {
  explicit Daemons(Watchdog& w, std::string config_path) : dog(w), config(std::move(config_path)) {}
  Watchdog& dog;
  std::string config;
  Process coord;
  std::map<std::string, std::unique_ptr<Process>> nodes;
  uint16_t coord_port = 0;

  std::string addr() const { return "127.0.0.1:" + std::to_string(coord_port); }
  void StartCoordinator() {
    REQUIRE(coord.Start({kBin, "coordinator", "--config", config, "--port", "0"}));
    dog.Track(coord.pid());
    auto j = coord.WaitEvent("listening", 5s);
    REQUIRE(j);
    coord_port = (*j)["ports"]["http"].get<uint16_t>();
  }
  void StartNode(const std::string& id) {
    auto p = std::make_unique<Process>();
    REQUIRE(p->Start({kBin, "node", "--config", config, "--id", id, "--coordinator", addr()}));
    dog.Track(p->pid());
    REQUIRE(p->WaitEvent("listening", 5s));
    nodes[id] = std::move(p);
  }
  void WaitNodes(size_t n) {
    const auto end = SteadyClock::now() + 5s;
    while (SteadyClock::now() < end) {
      auto r = HttpRequest("127.0.0.1", coord_port, "GET", "/nodes", "", 500);
      if (r.ok() && r->status == 200 && nlohmann::json::parse(r->body)["nodes"].size() == n) return;
      std::this_thread::sleep_for(20ms);
    }
    FAIL("coordinator did not reach " << n << " nodes");
  }
};

std::unique_ptr<NetworkClient> Client(const Daemons& d) {
  NetworkClientOptions o;
  o.coordinator = d.addr();
  o.timeout_ms = 1000;
  o.connect_timeout_ms = 500;
  o.refresh_ms = 100;
  auto c = NetworkClient::Connect(o);
  REQUIRE(c.ok());
  return std::move(*c);
}

std::vector<TokenId> Toks(size_t n, TokenId base) {
  std::vector<TokenId> t(n);
  std::iota(t.begin(), t.end(), base);
  return t;
}

// K or V of token `tok` at `pos`, element (layer, head, d): recomputable.
float Val(int kv, uint32_t layer, uint32_t pos, uint32_t head, uint32_t d, TokenId tok) {
  return static_cast<float>(tok) * 4096.0f + static_cast<float>(pos) * 16.0f + layer * 8.0f + head * 2.0f + kv +
         d * 0.03125f;
}
// [layer][n][heads][dim] over the full slice for tokens at positions pos0...
void MakeKv(std::span<const TokenId> toks, uint32_t pos0, std::vector<float>* k, std::vector<float>* v) {
  const size_t n = toks.size();
  k->assign(size_t{kLayers} * n * kHeads * kDim, 0.0f);
  v->assign(k->size(), 0.0f);
  for (uint32_t l = 0; l < kLayers; ++l)
    for (size_t i = 0; i < n; ++i)
      for (uint32_t h = 0; h < kHeads; ++h)
        for (uint32_t d = 0; d < kDim; ++d) {
          const size_t at = ((l * n + i) * kHeads + h) * kDim + d;
          const uint32_t pos = pos0 + static_cast<uint32_t>(i);
          (*k)[at] = Val(0, l, pos, h, d, toks[i]);
          (*v)[at] = Val(1, l, pos, h, d, toks[i]);
        }
}
Result<uint32_t> Append(Router& r, const SequenceHandle& s, std::span<const TokenId> toks, uint32_t pos0) {
  std::vector<float> k, v;
  MakeKv(toks, pos0, &k, &v);
  return r.AppendSequence(s, toks, std::as_bytes(std::span(k)), std::as_bytes(std::span(v)));
}
// The whole sequence read back equals the values of its tokens.
void CheckContent(Router& r, const SequenceHandle& s, const std::vector<TokenId>& expect) {
  SequenceState st = r.SequenceInfo(s).value();
  REQUIRE(st.tokens == expect);
  std::vector<std::byte> k, v;
  REQUIRE(r.ReadSequence(s, 0, st.length, &k, &v).ok());
  std::vector<float> ek, ev;
  MakeKv(expect, 0, &ek, &ev);
  REQUIRE(k.size() == ek.size() * sizeof(float));
  CHECK(std::memcmp(k.data(), ek.data(), k.size()) == 0);
  CHECK(std::memcmp(v.data(), ev.data(), v.size()) == 0);
}

// The whole scenario with $.transport.backend = `backend` (the routers' data plane).
void Scenario(const std::string& backend) {
  const auto t0 = SteadyClock::now();
  const std::string path = "/tmp/kvmesh-seqd-" + backend + "-" + std::to_string(::getpid()) + ".json";
  nlohmann::json cfg = ConfigJson();
  cfg["transport"]["backend"] = backend;
  std::ofstream(path) << cfg.dump();
  Watchdog dog(20s, path);
  Daemons d(dog, path);
  d.StartCoordinator();
  d.StartNode("n0");
  d.StartNode("n1");
  d.WaitNodes(2);
  auto a = Client(d);
  Router& r = a->router();
  REQUIRE(a->num_nodes() == 2);

  // One sequence on each node: prefix affinity places a prompt by its first block.
  std::map<std::string, SequenceHandle> on;
  std::map<std::string, std::vector<TokenId>> prompt;
  for (TokenId base = 100; on.size() < 2 && base < 100 + 64 * 100; base += 100) {
    std::vector<TokenId> p = Toks(10, base);  // two full blocks and two tokens
    SequenceHandle h = r.CreateSequence(p).value();
    CHECK(h.prefix_tokens == 0);
    if (on.count(h.node_id)) {
      REQUIRE(r.ReleaseSequence(h).ok());
      continue;
    }
    on[h.node_id] = h;
    prompt[h.node_id] = p;
  }
  REQUIRE(on.size() == 2);

  // Append, fork, truncate and read on each node.
  std::map<std::string, std::vector<TokenId>> content;
  for (auto& [node, h] : on) {
    const std::vector<TokenId>& p = prompt[node];
    REQUIRE(Append(r, h, std::span(p).first(7), 0).value() == 0);
    REQUIRE(Append(r, h, std::span(p).subspan(7), 7).value() == 7);
    SequenceState st = r.SequenceInfo(h).value();
    CHECK(st.length == 10);
    CHECK(st.sealed_blocks == 2);
    CheckContent(r, h, p);
    SequenceHandle f = r.ForkSequence(h).value();
    CHECK(f.node_id == node);
    std::vector<TokenId> fork_toks = p;
    const std::vector<TokenId> tail = Toks(3, 90000);
    REQUIRE(Append(r, f, tail, 10).value() == 10);
    fork_toks.insert(fork_toks.end(), tail.begin(), tail.end());
    REQUIRE(r.TruncateSequence(h, 3).ok());  // 10 -> 7: the fork keeps its tokens
    std::vector<TokenId> cut(p.begin(), p.begin() + 7);
    CheckContent(r, h, cut);
    CheckContent(r, f, fork_toks);
    std::vector<std::byte> k, v;
    CHECK(r.ReadSequence(h, 5, 5, &k, &v).code() == StatusCode::kInvalidArgument);  // past the end
    REQUIRE(r.ReleaseSequence(f).ok());
    CHECK(r.SequenceInfo(f).status().code() == StatusCode::kNotFound);
    content[node] = cut;
  }

  // A second client: the same prompt goes to the same node and attaches the
  // two blocks the first client sealed there.
  auto b = Client(d);
  for (auto& [node, h] : on) {
    const std::vector<TokenId>& p = prompt[node];
    SequenceHandle g = b->router().CreateSequence(p).value();
    CHECK(g.node_id == node);
    CHECK(g.prefix_tokens == 2 * kBt);
    REQUIRE(Append(b->router(), g, std::span(p).subspan(8), 8).value() == 8);
    CheckContent(b->router(), g, p);
    REQUIRE(b->router().ReleaseSequence(g).ok());
  }

  // $.sequences.max_sequences reached the daemons: one node holds at most 6.
  {
    const std::string node = on.begin()->first;
    std::vector<SequenceHandle> extra;
    Status refused = Status::Ok();
    for (uint32_t i = 0; i < kMaxSequences + 1 && refused.ok(); ++i) {
      auto h = r.CreateSequence(prompt[node]);
      if (h.ok()) extra.push_back(*h);
      else refused = h.status();
    }
    CHECK(refused.code() == StatusCode::kResourceExhausted);
    CHECK(extra.size() == kMaxSequences - 1);  // `on` holds one there
    for (auto& h : extra) REQUIRE(r.ReleaseSequence(h).ok());
  }

  // SIGKILL the node of one sequence: its handles answer Unavailable (the
  // connection dies, then the node leaves the map), never hang; the other
  // node's sequence keeps working.
  const std::string dead = on.begin()->first, alive = std::next(on.begin())->first;
  d.nodes[dead]->Kill(SIGKILL);
  REQUIRE(d.nodes[dead]->Wait(5s));
  const auto t_kill = SteadyClock::now();
  CHECK(r.SequenceInfo(on[dead]).status().code() == StatusCode::kUnavailable);
  CHECK(Append(r, on[dead], Toks(1, 1), 7).status().code() == StatusCode::kUnavailable);
  d.WaitNodes(1);
  const auto end = SteadyClock::now() + 3s;
  while (a->num_nodes() != 1 && SteadyClock::now() < end) std::this_thread::sleep_for(20ms);
  CHECK(a->num_nodes() == 1);
  CHECK(r.SequenceInfo(on[dead]).status().code() == StatusCode::kUnavailable);  // its node left the map
  std::vector<std::byte> k, v;
  CHECK(r.ReadSequence(on[dead], 0, 1, &k, &v).code() == StatusCode::kUnavailable);
  CHECK(r.ReleaseSequence(on[dead]).code() == StatusCode::kUnavailable);
  CHECK(SteadyClock::now() - t_kill < 8s);

  const SequenceHandle& live = on[alive];
  std::vector<TokenId> more = Toks(5, 70000);
  REQUIRE(Append(r, live, more, 7).value() == 7);
  content[alive].insert(content[alive].end(), more.begin(), more.end());
  CheckContent(r, live, content[alive]);
  SequenceHandle f = r.ForkSequence(live).value();
  CheckContent(b->router(), f, content[alive]);  // any client reaches it by its handle
  REQUIRE(r.ReleaseSequence(f).ok());
  REQUIRE(r.ReleaseSequence(live).ok());
  CHECK(r.SequenceInfo(live).status().code() == StatusCode::kNotFound);

  // The survivors stop cleanly.
  d.nodes[alive]->Kill(SIGTERM);
  CHECK(d.nodes[alive]->Wait(5s));
  d.coord.Kill(SIGTERM);
  CHECK(d.coord.Wait(5s));
  CHECK(SteadyClock::now() - t0 < 20s);
}

}  // namespace

TEST_CASE("Sequence daemons over TCP: create/append/fork/truncate/read/release, prefix reuse, a killed node",
          "[cluster][daemons][sequence]") {
  Scenario("tcp");
}

#if defined(KVMESH_HAVE_UCX)
TEST_CASE("Sequence daemons over UCX: the same scenario with $.transport.backend = ucx",
          "[cluster][daemons][sequence][ucx]") {
  Scenario("ucx");
}
#endif

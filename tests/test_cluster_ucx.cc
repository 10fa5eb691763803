// The UCX backend in one process: a ShardNode served by UcxServer (worker fd
// on an Asio loop) and a UcxChannel (own worker and progress thread), over
// UCX's default transports and over UCX_TLS=tcp: eager and rendezvous sizes
// byte-for-byte, token refusal, stale epochs.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "kvmesh/config.h"
#include "kvmesh/router.h"
#include "router/shard_map.h"
#include "shard_node/server/node_daemon.h"
#include "shard_node/server/ucx_server.h"
#include "shard_node/shard_node.h"
#include "transport/ucx_channel.h"
#include "tests/test_time.h"

using namespace kvmesh;

namespace {

// A node of `host` memory served over UCX with `so`, starting at `epoch0`.
struct Served {
  Served(const std::string& host, const UcxServerOptions& so, uint64_t epoch0 = 0) : epoch(epoch0) {
    auto c = ParseConfig(R"({
      "model": {"model_id": "m", "num_layers": 2, "num_kv_heads": 2, "head_dim": 64, "block_tokens": 16},
      "nodes": [{"id": "u0", "memory": {"host": ")" + host + R"("}}],
      "transport": {"backend": "ucx"},
      "store": {"slot_bytes": "2MiB", "stripes": 2}})");
    REQUIRE(c.ok());
    auto n = ShardNode::Create(*c, "u0");
    REQUIRE(n.ok());
    node = std::move(*n);
    auto s = UcxServer::Start(node.get(), so, &epoch);
    REQUIRE(s.ok());
    server = std::move(*s);
  }
  // A channel to it with the default client options and `timeout` (scaled).
  Result<std::unique_ptr<UcxChannel>> Connect(std::chrono::milliseconds timeout) const {
    UcxChannelOptions co;
    co.node_address = server->address();
    co.timeout_ms = kvmesh::testing::TimeBound(timeout).count();
    co.local_reads = false;  // these tests are about the messages (local reads: their own test)
    return UcxChannel::Connect(co);
  }
  std::atomic<uint64_t> epoch;
  std::unique_ptr<ShardNode> node;
  std::unique_ptr<UcxServer> server;
};

struct Fixture : Served {
  explicit Fixture(std::string token = "", uint64_t epoch = 0, UcxProgress progress = UcxProgress::kHybrid,
                   int workers = 1)
      : Served("64MiB", Options(std::move(token), progress, workers), epoch), progress_(progress) {}
  static UcxServerOptions Options(std::string token, UcxProgress progress, int workers) {
    UcxServerOptions o;
    o.token = std::move(token);
    o.limits.max_block_bytes = 2 << 20;
    o.limits.max_body_bytes = 16 << 20;
    o.progress = progress;
    o.workers = workers;
    return o;
  }
  Result<std::unique_ptr<UcxChannel>> Channel(std::string token = "", bool local_reads = false) {
    UcxChannelOptions o;
    o.local_reads = local_reads;  // the messages are under test, unless asked
    o.node_address = server->address();
    o.token = std::move(token);
    o.timeout_ms = kvmesh::testing::TimeBound(std::chrono::milliseconds(5000)).count();  // grows under sanitizers
    o.limits.max_body_bytes = 16 << 20;
    o.limits.max_block_bytes = 2 << 20;
    o.progress = progress_;
    return UcxChannel::Connect(o);
  }
  // A channel with local reads, which the node granted.
  Result<std::unique_ptr<UcxChannel>> LocalReadsChannel() {
    auto ch = Channel("", /*local_reads=*/true);
    REQUIRE(ch.ok());
    REQUIRE((*ch)->local_reads_status().ok());
    return ch;
  }
  UcxProgress progress_;
};

BlockKey Key(uint64_t i) { return BlockKey{i * 0x9E3779B97F4A7C15ull, i}; }

// Random blocks of these sizes (seeded), and their puts under Key(0), Key(1), ...
std::vector<std::vector<std::byte>> RandomBlocks(uint64_t seed, std::initializer_list<size_t> sizes) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<std::byte>> data;
  for (size_t size : sizes) {
    data.emplace_back(size);
    for (auto& b : data.back()) b = static_cast<std::byte>(rng());
  }
  return data;
}
// GETs Key(0..n) and Key(n), which was never put, in one batch: every block
// byte-for-byte, the last NotFound.
void GetEveryBlock(ShardChannel& ch, const std::vector<std::vector<std::byte>>& data) {
  std::vector<std::vector<std::byte>> dst(data.size() + 1, std::vector<std::byte>(2 << 20));
  std::vector<GetItem> gets;
  for (size_t i = 0; i <= data.size(); ++i) gets.push_back(GetItem{Key(i), dst[i], 0, {}});
  REQUIRE(ch.Get(gets, {}).ok());
  for (size_t i = 0; i < data.size(); ++i) {
    REQUIRE(gets[i].status.ok());
    REQUIRE(gets[i].size == data[i].size());
    CHECK(std::equal(data[i].begin(), data[i].end(), dst[i].begin()));
  }
  CHECK(gets.back().status.code() == StatusCode::kNotFound);
}
std::vector<PutItem> PutsOf(const std::vector<std::vector<std::byte>>& data) {
  std::vector<PutItem> puts;
  for (size_t i = 0; i < data.size(); ++i) puts.push_back(PutItem{Key(i), data[i], {}});
  return puts;
}

void RoundTrip(UcxProgress progress = UcxProgress::kHybrid) {
  Fixture f("", 0, progress);
  auto ch = f.Channel();
  REQUIRE(ch.ok());
  const auto data = RandomBlocks(9, {100, 4096, 65536, 300000, 1 << 20, 2 << 20});  // eager and rendezvous
  std::vector<PutItem> puts = PutsOf(data);
  REQUIRE((*ch)->Put(puts, {}).ok());
  for (auto& p : puts) CHECK(p.status.ok());
  GetEveryBlock(**ch, data);
  std::vector<BlockKey> keys = {Key(0), Key(99)};
  std::vector<uint8_t> found(2);
  REQUIRE((*ch)->Exists(keys, found, false, {}).ok());
  CHECK(found == std::vector<uint8_t>{1, 0});
  CHECK(f.server->requests() >= 4);
}

}  // namespace

TEST_CASE("UCX: put/get eager and rendezvous blocks byte-for-byte (default UCX_TLS)", "[cluster][ucx]") {
  RoundTrip();
}

TEST_CASE("UCX: every progress mode moves blocks byte-for-byte, one caller and several", "[cluster][ucx]") {
  for (const char* name : {"poll", "event", "hybrid", "adaptive"}) {
    INFO("progress " << name);
    auto mode = ParseUcxProgress(name);
    REQUIRE(mode.ok());
    RoundTrip(*mode);
    // Several threads on one channel: one progresses the worker, the others
    // wait their turn.
    Fixture f("", 0, *mode);
    auto ch = f.Channel();
    REQUIRE(ch.ok());
    std::atomic<int> wrong{0}, failed{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&, t] {
        std::vector<std::byte> v(256 << 10), got(256 << 10);
        for (int i = 0; i < 40; ++i) {
          for (size_t j = 0; j < v.size(); j += 4096) v[j] = static_cast<std::byte>(t * 41 + i + j / 4096);
          std::vector<PutItem> p = {PutItem{Key(1000 + t * 100 + i), v, {}}};
          std::vector<GetItem> g = {GetItem{Key(1000 + t * 100 + i), got, 0, {}}};
          if (!(*ch)->Put(p, {}).ok() || !p[0].status.ok() || !(*ch)->Get(g, {}).ok() || !g[0].status.ok()) {
            ++failed;
            continue;
          }
          if (g[0].size != v.size() || !std::equal(v.begin(), v.end(), got.begin())) ++wrong;
        }
      });
    for (auto& th : threads) th.join();
    CHECK(failed == 0);
    CHECK(wrong == 0);
  }
  CHECK(!ParseUcxProgress("spin").ok());
}

TEST_CASE("UCX adaptive progress: the spin budget follows the waits", "[ucx]") {
  using std::chrono::microseconds;
  using std::chrono::nanoseconds;
  SpinBudget b(100);
  CHECK(b.budget() == microseconds(100));  // starts as hybrid
  for (int i = 0; i < 12; ++i) b.Waited(microseconds(400), true);  // answers queue: longer than a spin
  CHECK(b.budget().count() == 0);                                   // sleeps at once, as event
  b.Waited(microseconds(0), false);  // there at once: says nothing about spinning
  CHECK(b.budget().count() == 0);
  b.Waited(microseconds(20), true);  // slept, yet a spin of 20 us might have caught it: probe
  CHECK(b.budget() == microseconds(40));
  b.Waited(microseconds(15), false);  // the probe caught it: spinning pays
  CHECK(b.budget() == microseconds(80));
  b.Waited(microseconds(15), false);
  CHECK(b.budget() == microseconds(100));  // never above spin_us
  b.Waited(microseconds(101), true);
  CHECK(b.budget() == microseconds(50));
  SpinBudget never(0);
  never.Waited(microseconds(0), true);
  CHECK(never.budget().count() == 0);
}

namespace {

// A waiter and the thread that answers it, as the budget sees them: on two
// cores the answer comes `answer` after the wait starts whatever the waiter
// does (a sleeping waiter wakes `wake` later); on one shared core the
// answerer runs only once the waiter sleeps, so the answer comes `answer`
// after the spin ends. Returns the mean spin the waiter burns per wait and
// the share of waits it slept in, over `waits` waits.
struct SpinOutcome {
  double spin_us = 0;
  double slept = 0;
};
SpinOutcome Simulate(SpinBudget& b, bool shared_core, int waits, int64_t answer_us = 15, int64_t wake_us = 30) {
  using std::chrono::microseconds;
  double spun = 0, slept = 0;
  for (int i = 0; i < waits; ++i) {
    const int64_t budget = std::chrono::duration_cast<microseconds>(b.budget()).count();
    if (!shared_core && budget >= answer_us) {
      spun += double(answer_us);
      b.Waited(microseconds(answer_us), false);
      continue;
    }
    spun += double(budget);
    slept += 1;
    b.Waited(microseconds(shared_core ? budget + answer_us : answer_us + wake_us), true);
  }
  return {spun / waits, slept / waits};
}

}  // namespace

TEST_CASE("UCX adaptive progress: spins on two cores, hands over at once on a shared one", "[ucx]") {
  SpinBudget b(100);
  SpinOutcome two = Simulate(b, false, 1000);
  CHECK(two.slept < 0.01);  // the answer is caught while spinning: no wake-ups
  // Both threads on one core (a busy neighbour, taskset): spinning only
  // delays the answer, so the waiter learns to sleep at once. A fixed
  // 100 us spin would burn 100 us per wait here.
  SpinOutcome shared = Simulate(b, true, 4000);
  CHECK(shared.spin_us < 3.0);
  SpinOutcome settled = Simulate(b, true, 4000);
  CHECK(settled.spin_us < 1.0);
  // Back on two cores: the next probe catches an answer and spinning resumes.
  Simulate(b, false, 1100);
  SpinOutcome again = Simulate(b, false, 1000);
  CHECK(again.slept < 0.01);
  CHECK(again.spin_us == Approx(15.0).margin(0.5));
}

TEST_CASE("UCX worker addresses: several packed into one, one left plain, a malformed pack read as plain", "[ucx]") {
  const std::string a(300, 'a'), b(41, 'b');
  CHECK(PackWorkerAddresses({a}) == a);
  const std::string packed = PackWorkerAddresses({a, b});
  CHECK(UnpackWorkerAddresses(packed) == std::vector<std::string>{a, b});
  CHECK(UnpackWorkerAddresses(a) == std::vector<std::string>{a});
  CHECK(UnpackWorkerAddresses(packed.substr(0, packed.size() - 1)) == std::vector<std::string>{packed.substr(0, packed.size() - 1)});
  CHECK(UnpackWorkerAddresses(packed + "x") == std::vector<std::string>{packed + "x"});
  CHECK(UnpackWorkerAddresses("KVMW") == std::vector<std::string>{"KVMW"});
}

TEST_CASE("UCX endpoint pairs: a worker's data and watch addresses packed, a plain address both", "[cluster][ucx]") {
  const std::string a(300, 'a'), b(41, 'b');
  CHECK(UnpackEndpointPair(PackEndpointPair(a, b)) == std::pair{a, b});
  CHECK(UnpackEndpointPair(a) == std::pair{a, a});
  const std::string pair = PackEndpointPair(a, b);
  CHECK(UnpackEndpointPair(pair.substr(0, pair.size() - 1)).first == pair.substr(0, pair.size() - 1));
  CHECK(UnpackWorkerAddresses(pair) == std::vector<std::string>{pair});  // one worker, not two
  // A node's worker keeps its sessions' watch endpoints on a worker of its
  // own (the data worker then polls no TCP socket): it publishes two
  // different addresses, per worker of the node.
  for (int workers : {1, 2}) {
    Fixture f("", 0, UcxProgress::kAdaptive, workers);
    const std::vector<std::string> each = UnpackWorkerAddresses(f.server->address());
    REQUIRE(each.size() == size_t(workers));
    for (const std::string& w : each) {
      const auto [data, watch] = UnpackEndpointPair(w);
      CHECK(data != watch);
    }
    CHECK(f.Channel().ok());  // its HELLO, over the pair, answered
  }
}

TEST_CASE("UCX: a node with two workers serves channels on both, byte-for-byte", "[cluster][ucx]") {
  Fixture f("", 0, UcxProgress::kAdaptive, /*workers=*/2);
  CHECK(UnpackWorkerAddresses(f.server->address()).size() == 2);
  std::vector<std::unique_ptr<UcxChannel>> chs;
  for (int c = 0; c < 4; ++c) {
    auto ch = f.Channel();
    REQUIRE(ch.ok());
    chs.push_back(std::move(*ch));
  }
  std::atomic<int> wrong{0}, failed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      std::vector<std::byte> v(300000), got(300000);  // rendezvous-sized
      for (int i = 0; i < 30; ++i) {
        for (size_t j = 0; j < v.size(); j += 4096) v[j] = static_cast<std::byte>(t * 37 + i + j / 4096);
        // Each block is put through one worker and read through the other.
        std::vector<PutItem> p = {PutItem{Key(5000 + t * 100 + i), v, {}}};
        std::vector<GetItem> g = {GetItem{Key(5000 + t * 100 + i), got, 0, {}}};
        if (!chs[t]->Put(p, {}).ok() || !p[0].status.ok() || !chs[(t + 1) % 4]->Get(g, {}).ok() || !g[0].status.ok()) {
          ++failed;
          continue;
        }
        if (g[0].size != v.size() || !std::equal(v.begin(), v.end(), got.begin())) ++wrong;
      }
    });
  for (auto& th : threads) th.join();
  CHECK(failed == 0);
  CHECK(wrong == 0);
  const std::vector<uint64_t> per_worker = f.server->worker_requests();
  REQUIRE(per_worker.size() == 2);
  CHECK(per_worker[0] >= 2 * 30);  // each worker served two channels' HELLOs, puts and gets
  CHECK(per_worker[1] >= 2 * 30);
  CHECK(per_worker[0] + per_worker[1] == f.server->requests());
}

TEST_CASE("UCX: the same over UCX_TLS=tcp", "[cluster][ucx]") {
  const char* old = std::getenv("UCX_TLS");
  std::string saved = old ? old : "";
  ::setenv("UCX_TLS", "tcp", 1);
  RoundTrip();
  if (old) ::setenv("UCX_TLS", saved.c_str(), 1);
  else ::unsetenv("UCX_TLS");
}

TEST_CASE("UCX: by default a node runs one worker per core (up to 4)", "[cluster][ucx]") {
  // $.transport.ucx.workers left out (0): the node decides from the cores.
  auto cfg = ParseConfig(R"({"model": {"model_id": "w", "num_layers": 2, "num_kv_heads": 2, "head_dim": 64,
                                       "block_tokens": 16},
                             "nodes": [{"id": "n0", "memory": {"host": "64MiB"}}],
                             "transport": {"backend": "ucx", "io_threads": 1}})");
  REQUIRE(cfg.ok());
  CHECK(cfg->transport.ucx_workers == 0);
  NodeDaemonOptions o;
  o.node_id = "n0";
  o.resp = false;
  auto d = NodeDaemon::Start(*cfg, o);
  REQUIRE(d.ok());
  auto address = HexDecode((*d)->ucx_address());
  REQUIRE(address.ok());
  const size_t want = std::clamp<unsigned>(std::thread::hardware_concurrency(), 1, 4);
  CHECK(UnpackWorkerAddresses(*address).size() == want);
  (*d)->Stop();
}

TEST_CASE("UCX channel: batches over the node's limits are split into several frames", "[cluster][ucx]") {
  // The frame plan (transport/frame_plan.h) splits by the limits the node
  // announced: 16 MiB of body, 4096 items.
  Fixture f;
  auto ch = f.Channel();
  REQUIRE(ch.ok());
  std::mt19937_64 rng(11);
  std::vector<std::vector<std::byte>> data(10, std::vector<std::byte>(2 << 20));  // 20 MiB: two frames each way
  for (auto& d : data)
    for (auto& b : d) b = static_cast<std::byte>(rng());
  std::vector<PutItem> puts;
  for (size_t i = 0; i < data.size(); ++i) puts.push_back(PutItem{Key(600 + i), data[i], {}});
  REQUIRE((*ch)->Put(puts, {}).ok());
  for (auto& p : puts) CHECK(p.status.ok());
  std::vector<std::vector<std::byte>> dst(data.size(), std::vector<std::byte>(2 << 20));
  std::vector<GetItem> gets;
  for (size_t i = 0; i < data.size(); ++i) gets.push_back(GetItem{Key(600 + i), dst[i], 0, {}});
  REQUIRE((*ch)->Get(gets, {}).ok());
  for (size_t i = 0; i < data.size(); ++i) {
    INFO(i << " " << gets[i].status.ToString());
    REQUIRE(gets[i].status.ok());
    CHECK(dst[i] == data[i]);
  }
  // 5000 keys: over the 4096 items of one frame.
  std::vector<BlockKey> keys;
  for (size_t i = 0; i < 5000; ++i) keys.push_back(Key(i < data.size() ? 600 + i : 10000 + i));
  std::vector<uint8_t> found(keys.size());
  REQUIRE((*ch)->Exists(keys, found, false, {}).ok());
  CHECK(std::accumulate(found.begin(), found.end(), 0) == static_cast<int>(data.size()));
  // An empty block and one over the node's block limit fail alone; the others are stored.
  std::vector<std::byte> big((2 << 20) + 1), small(100);
  std::vector<PutItem> mixed = {{Key(700), {}, {}}, {Key(701), small, {}}, {Key(702), big, {}}, {Key(703), small, {}}};
  REQUIRE((*ch)->Put(mixed, {}).ok());  // the call went; its items say which blocks were stored
  CHECK(mixed[0].status.code() == StatusCode::kResourceExhausted);
  CHECK(mixed[1].status.ok());
  CHECK(mixed[2].status.code() == StatusCode::kResourceExhausted);
  CHECK(mixed[3].status.ok());
}

TEST_CASE("UCX: wrong token refused, stale epoch answered", "[cluster][ucx]") {
  Fixture f("s3cret", 4);
  auto bad = f.Channel("nope");
  REQUIRE(!bad.ok());
  CHECK(bad.status().code() == StatusCode::kPermissionDenied);
  auto good = f.Channel("s3cret");
  INFO(good.status().ToString());
  REQUIRE(good.ok());
  std::vector<BlockKey> k = {Key(1)};
  std::vector<uint8_t> found(1);
  (*good)->set_epoch(2);
  CHECK((*good)->Exists(k, found, false, {}).code() == StatusCode::kStaleEpoch);
  (*good)->set_epoch(4);
  CHECK((*good)->Exists(k, found, false, {}).ok());
}

TEST_CASE("UCX: router fan-out over three UCX nodes answers exactly like the serial router", "[cluster][ucx][fanout]") {
  // The UCX channel's Start* calls post every node's request before any
  // answer is awaited; results (hits, bytes, per-item statuses, prefix
  // lengths) must equal the serial path over the same channels.
  auto cfg = ParseConfig(R"({
    "model": {"model_id": "m", "num_layers": 2, "num_kv_heads": 2, "head_dim": 64, "block_tokens": 16},
    "nodes": [{"id": "u0", "memory": {"host": "16MiB"}}, {"id": "u1", "memory": {"host": "16MiB"}},
              {"id": "u2", "memory": {"host": "16MiB"}}]})");
  REQUIRE(cfg.ok());
  std::atomic<uint64_t> epoch{0};
  std::vector<std::unique_ptr<ShardNode>> nodes;
  std::vector<std::unique_ptr<UcxServer>> servers;
  std::vector<std::shared_ptr<ShardChannel>> channels;
  for (const NodeConfig& nc : cfg->nodes) {
    nodes.push_back(ShardNode::Create(*cfg, nc.id).value());
    servers.push_back(UcxServer::Start(nodes.back().get(), {}, &epoch).value());
    UcxChannelOptions o;
    o.node_address = servers.back()->address();
    o.timeout_ms = 5000;
    auto ch = UcxChannel::Connect(o);
    REQUIRE(ch.ok());
    REQUIRE((*ch)->async_calls());
    channels.push_back(std::shared_ptr<ShardChannel>(std::move(*ch)));
  }
  auto make = [&](bool fanout) {
    RouterOptions ro;
    ro.parallel_fanout = fanout;
    return Router::Create(cfg->model, ShardMap::FromConfig(*cfg).value(), channels, ro).value();
  };
  auto fan = make(true), serial = make(false);
  const size_t bytes = cfg->model.FullBlockBytes();  // 16 KiB: UCX eager or rendezvous by its thresholds
  std::vector<TokenId> prompt(16 * 24);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<TokenId>(i * 7 + 1);
  std::mt19937_64 rng(5);
  std::vector<std::vector<std::byte>> data(20, std::vector<std::byte>(bytes));
  for (auto& d : data)
    for (auto& b : d) b = static_cast<std::byte>(rng());
  std::vector<std::span<const std::byte>> spans(data.begin(), data.end());
  REQUIRE(fan->Put(prompt, spans).ok());  // blocks 0..19 of 24
  CHECK(fan->MatchPrefix(prompt).value() == 20);
  CHECK(serial->MatchPrefix(prompt).value() == 20);
  for (size_t n = 0; n < nodes.size(); ++n) CHECK(nodes[n]->store().Stats().blocks > 0);  // spread over all three

  auto keys = fan->Keys(prompt);
  auto read = [&](Router& r) {
    std::vector<std::vector<std::byte>> dst(keys.size(), std::vector<std::byte>(bytes));
    std::vector<GetItem> items;
    for (size_t i = 0; i < keys.size(); ++i) items.push_back(GetItem{keys[i], dst[i], 0, {}});
    REQUIRE(r.GetBatch(items).ok());
    std::vector<std::pair<StatusCode, std::vector<std::byte>>> out;
    for (size_t i = 0; i < keys.size(); ++i)
      out.emplace_back(items[i].status.code(), items[i].status.ok() ? dst[i] : std::vector<std::byte>{});
    return out;
  };
  auto a = read(*fan), b = read(*serial);
  CHECK(a == b);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i < 20) {
      REQUIRE(a[i].first == StatusCode::kOk);
      CHECK(a[i].second == data[i]);
    } else {
      CHECK(a[i].first == StatusCode::kNotFound);
    }
  }
  std::vector<uint8_t> fa(keys.size()), fb(keys.size());
  REQUIRE(fan->ExistsBatch(keys, fa).ok());
  REQUIRE(serial->ExistsBatch(keys, fb).ok());
  CHECK(fa == fb);
  REQUIRE(fan->Release(std::span<const BlockKey>(&keys[0], 5)).ok());  // a hint: nothing leaves
  REQUIRE(serial->Release(std::span<const BlockKey>(&keys[5], 5)).ok());
  CHECK(fan->MatchPrefix(prompt).value() == 20);
  REQUIRE(fan->Erase(std::span<const BlockKey>(&keys[10], 3)).ok());
  CHECK(serial->MatchPrefix(prompt).value() == 10);
  CHECK(fan->MatchPrefix(prompt).value() == 10);
  channels.clear();
  fan.reset();
  serial.reset();
}

TEST_CASE("UCX: clients that vanish with requests in flight never take the node down", "[cluster][ucx]") {
  // Each client posts many GETs of large blocks, gives up on them at once
  // (1 ms timeout) and is destroyed while the node still has them queued.
  // The node must stay up and serve the next client; before server-owned
  // endpoints it replied on the vanished client's reply endpoint (freed by
  // UCX once the peer was gone) and crashed.
  Fixture f;
  {
    auto ch = f.Channel();
    REQUIRE(ch.ok());
    std::vector<std::byte> big(1 << 20, std::byte{7});
    std::vector<PutItem> puts;
    for (uint64_t i = 0; i < 8; ++i) puts.push_back(PutItem{Key(100 + i), big, {}});
    REQUIRE((*ch)->Put(puts, {}).ok());
  }
  std::vector<std::vector<std::byte>> dst(8, std::vector<std::byte>(1 << 20));
  for (int round = 0; round < 20; ++round) {
    auto ch = f.Channel();
    INFO("round " << round << ": " << ch.status().ToString());
    REQUIRE(ch.ok());
    std::vector<std::vector<GetItem>> items(16);
    std::vector<ChannelCall> calls(16);
    RequestOptions ro;
    ro.timeout_ms = 1;
    for (size_t c = 0; c < calls.size(); ++c) {
      for (uint64_t i = 0; i < 8; ++i) items[c].push_back(GetItem{Key(100 + i), dst[i], 0, {}});
      (*ch)->StartGet(items[c], ro, &calls[c]);
    }
    for (auto& c : calls) (void)c.Wait();
  }  // the channel goes: endpoint force-closed, worker destroyed
  auto ch = f.Channel();
  INFO(ch.status().ToString());
  REQUIRE(ch.ok());
  std::vector<GetItem> g = {GetItem{Key(100), dst[0], 0, {}}};
  REQUIRE((*ch)->Get(g, {}).ok());
  CHECK(g[0].status.ok());
  CHECK(g[0].size == size_t{1} << 20);
}

TEST_CASE("UCX: large GET batches (16 MiB, 128 MiB of 256 KiB blocks) come back within the timeout",
          "[cluster][ucx][big]") {
  // What `kvmesh bench-serve --transport ucx --prefix-check 1024,8192` loads:
  // 64 and 512 blocks of 256 KiB in one GetBatch, from a node that accepts
  // frames of 512 MiB (bench-serve's transport.max_frame_bytes) by a client
  // that accepts answers of 64 MiB (the default limits): the batch must be
  // split by the smaller, or the node's 128 MiB answer is one the client drops.
  UcxServerOptions so;
  so.limits.max_body_bytes = 512u << 20;  // node_daemon: transport.max_frame_bytes
  Served sv("384MiB", so);
  auto ch = sv.Connect(std::chrono::milliseconds(20000));
  REQUIRE(ch.ok());
  constexpr size_t kBlock = 256 << 10, kBlocks = 512;
  std::vector<std::byte> data(kBlock * kBlocks);
  std::mt19937_64 rng(21);
  for (size_t i = 0; i < data.size(); i += 8) {
    const uint64_t v = rng();
    std::memcpy(data.data() + i, &v, 8);
  }
  std::vector<PutItem> puts;
  for (size_t i = 0; i < kBlocks; ++i)
    puts.push_back(PutItem{Key(20000 + i), std::span<const std::byte>(data.data() + i * kBlock, kBlock), {}});
  for (size_t at = 0; at < kBlocks; at += 64) {
    REQUIRE((*ch)->Put(std::span(puts).subspan(at, 64), {}).ok());
  }
  for (auto& p : puts) REQUIRE(p.status.ok());
  for (size_t count : {size_t{64}, kBlocks}) {
    INFO(count << " blocks of 256 KiB in one GET");
    std::vector<std::byte> dst(kBlock * count, std::byte{0});
    std::vector<GetItem> gets;
    for (size_t i = 0; i < count; ++i)
      gets.push_back(GetItem{Key(20000 + i), std::span<std::byte>(dst.data() + i * kBlock, kBlock), 0, {}});
    const auto t0 = std::chrono::steady_clock::now();
    const Status st = (*ch)->Get(gets, {});
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    WARN(count << " blocks: " << secs << " s, " << double(count * kBlock) / secs / 1e9 << " GB/s");
    REQUIRE(st.ok());
    size_t bad = 0;
    for (auto& g : gets) bad += !g.status.ok();
    INFO("first item: " << gets[0].status.ToString() << ", last: " << gets.back().status.ToString());
    REQUIRE(bad == 0);
    CHECK(std::memcmp(dst.data(), data.data(), dst.size()) == 0);
  }
}

TEST_CASE("UCX two-sided GET: answers land in the callers' buffers or in reused pooled buffers, byte-for-byte",
          "[cluster][ucx]") {
  // docs/protocol.md "UCX": a GET answer's item table rides in the AM
  // header, so the client knows every hit's size before it accepts the
  // payloads: hits that fit their dsts and lie end to end there are received
  // in place (direct); others land in a pooled buffer and are copied out.
  Fixture f;
  auto ch = f.Channel();
  REQUIRE(ch.ok());
  UcxChannel& c = **ch;
  std::mt19937_64 rng(31);
  constexpr size_t kBig = 300000, kSmall = 1000;  // rendezvous and eager answers
  std::vector<std::vector<std::byte>> data;
  for (size_t i = 0; i < 8; ++i) data.emplace_back(i < 6 ? kBig : kSmall);
  for (auto& d : data)
    for (auto& b : d) b = static_cast<std::byte>(rng());
  std::vector<PutItem> puts;
  for (size_t i = 0; i < data.size(); ++i) puts.push_back(PutItem{Key(40000 + i), data[i], {}});
  REQUIRE(c.Put(puts, {}).ok());
  const std::byte kFill{0xAB};
  auto untouched = [&](std::span<const std::byte> s) {
    return std::all_of(s.begin(), s.end(), [&](std::byte b) { return b == kFill; });
  };

  SECTION("single blocks and adjacent batches land directly") {
    const auto before = c.answer_counts();
    std::vector<std::byte> one(kBig, kFill);
    for (int r = 0; r < 20; ++r) {
      std::vector<GetItem> g = {GetItem{Key(40000 + r % 6), one, 0, {}}};
      REQUIRE(c.Get(g, {}).ok());
      REQUIRE(g[0].status.ok());
      REQUIRE(g[0].size == kBig);
      CHECK(std::equal(one.begin(), one.end(), data[r % 6].begin()));
    }
    // Four blocks into four adjacent slices of one buffer (a KV pool's layout).
    std::vector<std::byte> run(4 * kBig, kFill);
    std::vector<GetItem> g;
    for (size_t i = 0; i < 4; ++i) g.push_back(GetItem{Key(40000 + i), std::span(run).subspan(i * kBig, kBig), 0, {}});
    REQUIRE(c.Get(g, {}).ok());
    for (size_t i = 0; i < 4; ++i) {
      REQUIRE(g[i].status.ok());
      CHECK(std::equal(data[i].begin(), data[i].end(), run.begin() + i * kBig));
    }
    // Eager answers: copied from UCX's buffer straight into separate dsts.
    std::vector<std::byte> s0(kSmall, kFill), s1(kSmall, kFill);
    std::vector<GetItem> gs = {GetItem{Key(40006), s0, 0, {}}, GetItem{Key(40007), s1, 0, {}}};
    REQUIRE(c.Get(gs, {}).ok());
    REQUIRE(gs[0].status.ok());
    REQUIRE(gs[1].status.ok());
    CHECK(s0 == data[6]);
    CHECK(s1 == data[7]);
    const auto after = c.answer_counts();
    CHECK(after.direct - before.direct == 22);
    CHECK(after.pooled == before.pooled);
  }

  SECTION("a miss between hits, a dst larger than its block, a dst too small: pooled, nothing written off the hits") {
    const auto before = c.answer_counts();
    for (int r = 0; r < 30; ++r) {
      // Slices of kBig + 100 bytes: the hits do not lie end to end.
      constexpr size_t kSlot = kBig + 100;
      std::vector<std::byte> run(4 * kSlot, kFill), tiny(10, kFill);
      std::vector<GetItem> g = {GetItem{Key(40000), std::span(run).subspan(0, kSlot), 0, {}},
                                GetItem{Key(49999), std::span(run).subspan(kSlot, kSlot), 0, {}},  // a miss
                                GetItem{Key(40002), std::span(run).subspan(2 * kSlot, kSlot), 0, {}},
                                GetItem{Key(40003), tiny, 0, {}},  // smaller than its block
                                GetItem{Key(40004), std::span(run).subspan(3 * kSlot, kSlot), 0, {}}};
      REQUIRE(c.Get(g, {}).ok());
      REQUIRE(g[0].status.ok());
      CHECK(g[1].status.code() == StatusCode::kNotFound);
      REQUIRE(g[2].status.ok());
      CHECK(g[3].status.code() == StatusCode::kResourceExhausted);
      CHECK(g[3].size == kBig);
      REQUIRE(g[4].status.ok());
      CHECK(std::equal(data[0].begin(), data[0].end(), run.begin()));
      CHECK(std::equal(data[2].begin(), data[2].end(), run.begin() + 2 * kSlot));
      CHECK(std::equal(data[4].begin(), data[4].end(), run.begin() + 3 * kSlot));
      CHECK(untouched(std::span(run).subspan(kBig, kSlot - kBig + kSlot)));  // the tail of slice 0 and the miss's
      CHECK(untouched(std::span(run).subspan(3 * kSlot + kBig, kSlot - kBig)));
      CHECK(untouched(tiny));
    }
    const auto after = c.answer_counts();
    CHECK(after.pooled - before.pooled == 30);
    CHECK(after.direct == before.direct);
    CHECK(after.pool_allocations - before.pool_allocations <= 4);  // reused, not one per answer
  }

  SECTION("a table too long for the AM header: the answer lands pooled, byte-for-byte") {
    // 300 items (4800 table bytes): over the 256 items that ride in the header.
    std::vector<std::byte> run(6 * kBig, kFill);
    std::vector<std::byte> scratch(294 * 16, kFill);
    std::vector<GetItem> g;
    for (size_t i = 0; i < 300; ++i) {
      if (i < 6) g.push_back(GetItem{Key(40000 + i), std::span(run).subspan(i * kBig, kBig), 0, {}});
      else g.push_back(GetItem{Key(60000 + i), std::span(scratch).subspan((i - 6) * 16, 16), 0, {}});  // misses
    }
    const auto before = c.answer_counts();
    REQUIRE(c.Get(g, {}).ok());
    for (size_t i = 0; i < 6; ++i) {
      REQUIRE(g[i].status.ok());
      CHECK(std::equal(data[i].begin(), data[i].end(), run.begin() + i * kBig));
    }
    for (size_t i = 6; i < 300; ++i) CHECK(g[i].status.code() == StatusCode::kNotFound);
    CHECK(untouched(scratch));
    CHECK(c.answer_counts().pooled - before.pooled == 1);
  }
}

TEST_CASE("UCX: a GET answer is sent from its pinned slot; a client that stops reading loses its session",
          "[cluster][ucx]") {
  // The node sends a GET's payload straight from the pool (no copy), pinned
  // while the send is in flight; a client that never progresses its worker
  // would hold that pin forever, so the node closes its session after
  // max_pinned_send_ms, which ends the send and drops the pin.
  UcxServerOptions so;
  so.max_pinned_send_ms = 400;
  Served sv("64MiB", so);
  auto ch = sv.Connect(std::chrono::milliseconds(5000));
  REQUIRE(ch.ok());
  std::vector<std::byte> v(1 << 20, std::byte{7}), got(1 << 20);
  std::vector<PutItem> p = {PutItem{Key(1), v, {}}};
  REQUIRE((*ch)->Put(p, {}).ok());
  REQUIRE(p[0].status.ok());
  auto pinned = [&] { return sv.node->store().Stats().pinned_blocks; };
  REQUIRE(pinned() == 0);
  {
    // The GET is posted and nobody progresses the client's worker: the
    // answer's rendezvous cannot finish.
    std::vector<GetItem> g = {GetItem{Key(1), got, 0, {}}};
    ChannelCall call;
    (*ch)->StartGet(g, {}, &call);
    const auto t0 = std::chrono::steady_clock::now();
    while (pinned() == 0 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2))
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    CHECK(pinned() == 1);  // sent from the slot, which stays pinned while the send is in flight
    while (pinned() != 0 && std::chrono::steady_clock::now() - t0 < kvmesh::testing::TimeBound(std::chrono::seconds(5)))
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK(pinned() == 0);  // the session was closed: the send ended, the pin went
    CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(400));
    (void)call.Wait();  // the closed session fails the call (or times it out); either way it ends
  }
  // A new channel is served as before.
  auto again = sv.Connect(std::chrono::milliseconds(5000));
  REQUIRE(again.ok());
  std::vector<GetItem> g = {GetItem{Key(1), got, 0, {}}};
  REQUIRE((*again)->Get(g, {}).ok());
  REQUIRE(g[0].status.ok());
  CHECK(got == v);
}

TEST_CASE("UCX local reads: a client on the node's host reads its blocks from the pool, the rest from the node",
          "[cluster][ucx][local_reads]") {
  Fixture f;
  auto ch = f.LocalReadsChannel();
  const auto data = RandomBlocks(5, {100, 65536, 300000, 2 << 20});
  std::vector<PutItem> puts = PutsOf(data);
  REQUIRE((*ch)->Put(puts, {}).ok());
  const uint64_t node_hits0 = f.node->Stats().store.hits;
  // Every block, and one never stored (asked of the node: NotFound).
  const auto before = (*ch)->answer_counts();
  GetEveryBlock(**ch, data);
  const auto after = (*ch)->answer_counts();
  CHECK(after.local_hits - before.local_hits == data.size());
  CHECK(after.local_misses - before.local_misses == 1);
  // The node counts the local reads as hits once its drain thread has them.
  const auto until = std::chrono::steady_clock::now() + kvmesh::testing::TimeBound(std::chrono::seconds(5));
  while (f.node->Stats().store.hits < node_hits0 + data.size() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  CHECK(f.node->Stats().store.hits >= node_hits0 + data.size());
  std::vector<std::vector<std::byte>> dst(data.size(), std::vector<std::byte>(2 << 20));
  // Erased through the channel: a local miss, then the node's NotFound.
  std::vector<BlockKey> erase = {Key(1)};
  std::vector<Status> st(1);
  REQUIRE((*ch)->Erase(erase, st).ok());
  std::vector<GetItem> again = {GetItem{Key(1), dst[1], 0, {}}, GetItem{Key(2), dst[2], 0, {}}};
  REQUIRE((*ch)->Get(again, {}).ok());
  CHECK(again[0].status.code() == StatusCode::kNotFound);
  REQUIRE(again[1].status.ok());
  CHECK(std::equal(data[2].begin(), data[2].end(), dst[2].begin()));
  // A client that asks for none gets the messages, and the same bytes.
  auto plain = f.Channel("", /*local_reads=*/false);
  REQUIRE(plain.ok());
  CHECK((*plain)->local_reads_status().code() == StatusCode::kFailedPrecondition);
  std::vector<GetItem> one = {GetItem{Key(3), dst[3], 0, {}}};
  REQUIRE((*plain)->Get(one, {}).ok());
  REQUIRE(one[0].status.ok());
  CHECK(std::equal(data[3].begin(), data[3].end(), dst[3].begin()));
  CHECK((*plain)->answer_counts().local_hits == 0);
}

TEST_CASE("UCX local reads: a batch of 4 MiB or more into registered memory goes as GET_INTO, a smaller one is read locally",
          "[cluster][ucx][local_reads]") {
  Fixture f;
  auto ch = f.LocalReadsChannel();
  const auto data = RandomBlocks(7, {2 << 20, 2 << 20, 1 << 20});
  std::vector<PutItem> puts = PutsOf(data);
  REQUIRE((*ch)->Put(puts, {}).ok());
  std::vector<std::byte> region(8 << 20);
  REQUIRE((*ch)->RegisterMemory(MemoryRegion{1, region.data(), region.size(), MemoryKind::kHost}).ok());
  auto get = [&](size_t n) {
    std::vector<GetItem> gets;
    for (size_t i = 0; i < n; ++i)
      gets.push_back(GetItem{Key(i), std::span<std::byte>(region.data() + i * (2 << 20), data[i].size()), 0, {}});
    std::fill(region.begin(), region.end(), std::byte{0});
    REQUIRE((*ch)->Get(gets, {}).ok());
    for (size_t i = 0; i < n; ++i) {
      REQUIRE(gets[i].status.ok());
      CHECK(std::equal(data[i].begin(), data[i].end(), region.begin() + i * (2 << 20)));
    }
  };
  const uint64_t moved0 = f.server->one_sided_bytes();
  const auto c0 = (*ch)->answer_counts();
  get(3);  // 5 MiB: the node writes them (GET_INTO)
  const auto c1 = (*ch)->answer_counts();
  CHECK(c1.local_hits == c0.local_hits);
  CHECK(f.server->one_sided_bytes() - moved0 == 5u << 20);
  get(1);  // 2 MiB: read locally
  CHECK((*ch)->answer_counts().local_hits == c1.local_hits + 1);
  CHECK(f.server->one_sided_bytes() - moved0 == 5u << 20);
}

TEST_CASE("UCX local reads: a node configured without them refuses LOCAL_MAP and serves GETs as before",
          "[cluster][ucx][local_reads]") {
  {
    // A TCP cluster's node keeps a private pool (no local reads) whatever $.transport.ucx says.
    auto tcp = ParseConfig(R"({
      "model": {"model_id": "m", "num_layers": 2, "num_kv_heads": 2, "head_dim": 64, "block_tokens": 16},
      "nodes": [{"id": "u0", "memory": {"host": "16MiB"}}]})");
    REQUIRE(tcp.ok());
    auto n = ShardNode::Create(*tcp, "u0");
    REQUIRE(n.ok());
    CHECK((*n)->local_index() == nullptr);
    CHECK((*n)->local_pool_fd() == -1);
  }
  auto c = ParseConfig(R"({
    "model": {"model_id": "m", "num_layers": 2, "num_kv_heads": 2, "head_dim": 64, "block_tokens": 16},
    "nodes": [{"id": "u0", "memory": {"host": "16MiB"}}],
    "transport": {"backend": "ucx", "ucx": {"local_reads": false}},
    "store": {"slot_bytes": "2MiB", "stripes": 2}})");
  REQUIRE(c.ok());
  auto node = ShardNode::Create(*c, "u0");
  REQUIRE(node.ok());
  CHECK((*node)->local_index() == nullptr);
  std::atomic<uint64_t> epoch{0};
  auto server = UcxServer::Start(node->get(), {}, &epoch);
  REQUIRE(server.ok());
  UcxChannelOptions o;
  o.node_address = (*server)->address();
  o.timeout_ms = kvmesh::testing::TimeBound(std::chrono::milliseconds(5000)).count();
  auto ch = UcxChannel::Connect(o);
  REQUIRE(ch.ok());
  CHECK((*ch)->local_reads_status().code() == StatusCode::kFailedPrecondition);
  std::vector<std::byte> b(5000, std::byte{7}), d(5000);
  std::vector<PutItem> p = {PutItem{Key(1), b, {}}};
  REQUIRE((*ch)->Put(p, {}).ok());
  std::vector<GetItem> g = {GetItem{Key(1), d, 0, {}}};
  REQUIRE((*ch)->Get(g, {}).ok());
  REQUIRE(g[0].status.ok());
  CHECK(d == b);
  CHECK((*ch)->answer_counts().local_hits == 0);
}

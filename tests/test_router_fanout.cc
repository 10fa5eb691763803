// Router fan-out (RouterOptions::parallel_fanout) over TCP data servers on
// loopback: the same hits, bytes and per-item statuses as the serial path;
// dead and stalled nodes cost one timeout for the whole operation, their
// items missing and the other nodes' served; StaleEpoch refresh-and-retry;
// replicas; many threads sharing one router (TSan).
#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>

#include "coordinator/embedded/inproc_channel.h"
#include "kvmesh/router.h"
#include "router/shard_map.h"
#include "shard_node/server/data_server.h"
#include "shard_node/shard_node.h"
#include "tests/test_data.h"
#include "transport/protocol.h"
#include "transport/socket_util.h"
#include "transport/tcp_channel.h"
#include "tests/stalled_node.h"

using namespace kvmesh;
using SteadyClock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

ClusterConfig Config(int nodes, uint32_t replicas = 1) {
  return testing::NodesConfig(R"("model": {"model_id": "fan", "num_layers": 2, "num_kv_heads": 2, "head_dim": 16,
                                          "block_tokens": 4},
                               "placement": {"replicas": )" + std::to_string(replicas) + "}",
                              nodes, "4MiB");
}

std::vector<TokenId> Tokens(size_t n, TokenId base) {
  std::vector<TokenId> t(n);
  std::iota(t.begin(), t.end(), base);
  return t;
}

// Block contents recomputable from a seed.
std::vector<std::byte> Block(uint64_t seed, size_t n) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> v(n);
  for (auto& b : v) b = static_cast<std::byte>(rng());
  return v;
}

// N shard nodes, each behind a TCP data server on 127.0.0.1, and TCP channels
// to them shared by routers that differ only in their options.
struct TcpCluster {
  explicit TcpCluster(int n, uint32_t replicas = 1, int64_t timeout_ms = 2000) : timeout_ms(timeout_ms) {
    cfg = Config(n, replicas);
    for (const NodeConfig& nc : cfg.nodes) {
      auto node = ShardNode::Create(cfg, nc.id);
      REQUIRE(node.ok());
      auto s = DataServer::Start(node->get(), {}, &epoch);
      REQUIRE(s.ok());
      nodes.push_back(std::move(*node));
      servers.push_back(std::move(*s));
      TcpChannelOptions o;
      o.port = servers.back()->port();
      o.timeout_ms = timeout_ms;
      o.connect_timeout_ms = timeout_ms;
      auto ch = TcpChannel::Create(o);
      tcp.push_back(ch.get());
      channels.push_back(std::move(ch));
    }
  }
  // A router over the shared channels; fanout picks RouterOptions::parallel_fanout.
  std::unique_ptr<Router> MakeRouter(bool fanout, RouterOptions ro = {}) {
    ro.parallel_fanout = fanout;
    ro.timeout_ms = timeout_ms;
    return Router::Create(cfg.model, ShardMap::FromConfig(cfg).value(), channels, std::move(ro)).value();
  }
  size_t BlockBytes() const { return cfg.model.FullBlockBytes(); }

  int64_t timeout_ms;
  ClusterConfig cfg;
  std::atomic<uint64_t> epoch{0};
  std::vector<std::unique_ptr<ShardNode>> nodes;
  std::vector<std::unique_ptr<DataServer>> servers;
  std::vector<TcpChannel*> tcp;
  std::vector<std::shared_ptr<ShardChannel>> channels;
};

// Puts blocks [0, n) of `prompt` with contents Block(seed + i).
void PutPrompt(Router& r, std::span<const TokenId> prompt, size_t n, uint64_t seed, size_t bytes) {
  std::vector<std::vector<std::byte>> data;
  std::vector<std::span<const std::byte>> spans;
  for (size_t i = 0; i < n; ++i) data.push_back(Block(seed + i, bytes));
  for (auto& d : data) spans.emplace_back(d);
  REQUIRE(r.Put(prompt, spans).ok());
}

// What a GetBatch answered, comparable across routers.
struct Read {
  std::vector<StatusCode> codes;
  std::vector<size_t> sizes;
  std::vector<std::vector<std::byte>> bytes;
  bool operator==(const Read&) const = default;
};
Read GetAll(Router& r, std::span<const BlockKey> keys, size_t dst_bytes, size_t small_at = SIZE_MAX) {
  Read out;
  std::vector<std::vector<std::byte>> dst(keys.size());
  std::vector<GetItem> items;
  for (size_t i = 0; i < keys.size(); ++i) {
    dst[i].assign(i == small_at ? 16 : dst_bytes, std::byte{0});
    items.push_back(GetItem{keys[i], dst[i], 0, {}});
  }
  REQUIRE(r.GetBatch(items).ok());
  for (size_t i = 0; i < keys.size(); ++i) {
    out.codes.push_back(items[i].status.code());
    out.sizes.push_back(items[i].size);
    if (items[i].status.ok()) dst[i].resize(items[i].size);
    out.bytes.push_back(items[i].status.ok() ? dst[i] : std::vector<std::byte>{});
  }
  return out;
}

// The index of the first key of `keys` whose primary is node `node`.
size_t FirstOn(const ClusterConfig& cfg, std::span<const BlockKey> keys, int node) {
  auto map = ShardMap::FromConfig(cfg).value();
  size_t i = 0;
  while (i < keys.size() && map->Primary(keys[i], {}) != node) ++i;
  return i;
}

using testing::StalledNode;

double Ms(SteadyClock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

}  // namespace

TEST_CASE("Router fan-out over TCP: hits, bytes and per-item statuses equal the serial path",
          "[router][fanout][cluster]") {
  TcpCluster c(4);
  auto fan = c.MakeRouter(true);
  auto serial = c.MakeRouter(false);
  const size_t bytes = c.BlockBytes();
  auto prompt = Tokens(4 * 48, 11);
  auto keys = fan->Keys(prompt);
  REQUIRE(keys.size() == 48);
  PutPrompt(*fan, prompt, 40, 1000, bytes);  // blocks 40..47 never stored

  CHECK(*fan->MatchPrefix(prompt) == 40);
  CHECK(*serial->MatchPrefix(prompt) == 40);

  std::vector<BlockKey> ask(keys.begin(), keys.end());
  ask.push_back(BlockKey{0xdead, 0xbeef});  // never stored anywhere
  Read a = GetAll(*fan, ask, bytes, /*small_at=*/7);
  Read b = GetAll(*serial, ask, bytes, /*small_at=*/7);
  CHECK(a == b);
  for (size_t i = 0; i < ask.size(); ++i) {
    if (i == 7) {
      CHECK(a.codes[i] == StatusCode::kResourceExhausted);
      CHECK(a.sizes[i] == bytes);
    } else if (i < 40) {
      REQUIRE(a.codes[i] == StatusCode::kOk);
      CHECK(a.bytes[i] == Block(1000 + i, bytes));
    } else {
      CHECK(a.codes[i] == StatusCode::kNotFound);
    }
  }

  std::vector<uint8_t> fa(ask.size()), fb(ask.size());
  REQUIRE(fan->ExistsBatch(ask, fa).ok());
  REQUIRE(serial->ExistsBatch(ask, fb).ok());
  CHECK(fa == fb);
  CHECK(std::accumulate(fa.begin(), fa.end(), 0) == 40);

  // PutBatch per-item statuses: one block too large for the nodes' slots.
  std::vector<std::vector<std::byte>> data;
  for (size_t i = 0; i < 8; ++i) data.push_back(Block(2000 + i, i == 3 ? 2 * bytes : bytes));  // 3: larger than a slot
  auto put_items = [&](uint64_t salt) {
    std::vector<PutItem> items;
    for (size_t i = 0; i < data.size(); ++i) items.push_back(PutItem{BlockKey{salt, i + 1}, data[i], {}});
    return items;
  };
  auto pf = put_items(77), ps = put_items(78);
  Status sf = fan->PutBatch(pf), ss = serial->PutBatch(ps);
  CHECK(sf.code() == ss.code());
  for (size_t i = 0; i < data.size(); ++i) {
    CHECK(pf[i].status.code() == ps[i].status.code());
    CHECK(pf[i].status.ok() == (i != 3));
  }

  // Erase through one router, seen by the other; the prefix now stops at block 20.
  REQUIRE(fan->Erase(std::span<const BlockKey>(&keys[20], 5)).ok());
  CHECK(*serial->MatchPrefix(prompt) == 20);
  CHECK(*fan->MatchPrefix(prompt) == 20);
  REQUIRE(serial->Erase(std::span<const BlockKey>(&keys[0], 1)).ok());
  CHECK(*fan->MatchPrefix(prompt) == 0);
  CHECK(fan->Stats().node_errors == 0);
}

TEST_CASE("Router fan-out: a dead node ends the call within the timeout, its items miss, the others are served",
          "[router][fanout][cluster][faults]") {
  TcpCluster c(4, 1, /*timeout_ms=*/500);
  auto fan = c.MakeRouter(true);
  const size_t bytes = c.BlockBytes();
  auto prompt = Tokens(4 * 64, 5);
  auto keys = fan->Keys(prompt);
  PutPrompt(*fan, prompt, keys.size(), 300, bytes);
  REQUIRE(*fan->MatchPrefix(prompt) == keys.size());

  c.servers[2].reset();  // the process died: its connections close, new ones are refused
  const size_t first_dead = FirstOn(c.cfg, keys, 2);
  auto map = ShardMap::FromConfig(c.cfg).value();
  auto t0 = SteadyClock::now();
  CHECK(*fan->MatchPrefix(prompt) == first_dead);
  Read got = GetAll(*fan, keys, bytes);
  CHECK(Ms(SteadyClock::now() - t0) < c.timeout_ms);  // a refused node fails fast
  for (size_t i = 0; i < keys.size(); ++i) {
    if (map->Primary(keys[i], {}) == 2) {
      CHECK(IsMiss(Status(got.codes[i], "")));
    } else {
      REQUIRE(got.codes[i] == StatusCode::kOk);
      CHECK(got.bytes[i] == Block(300 + i, bytes));
    }
  }
  CHECK(fan->Stats().node_errors >= 2);
}

TEST_CASE("Router fan-out: two stalled nodes cost one timeout for the whole operation, not one each",
          "[router][fanout][cluster][faults]") {
  constexpr int64_t kTimeout = 400;
  TcpCluster c(4, 1, kTimeout);
  StalledNode s1, s3;
  // Nodes 1 and 3 answer HELLO and then stall.
  for (int i : {1, 3}) {
    TcpChannelOptions o;
    o.port = i == 1 ? s1.port() : s3.port();
    o.timeout_ms = kTimeout;
    o.connect_timeout_ms = kTimeout;
    c.channels[i] = TcpChannel::Create(o);
  }
  auto fan = c.MakeRouter(true);
  auto serial = c.MakeRouter(false);
  const size_t bytes = c.BlockBytes();
  auto prompt = Tokens(4 * 32, 9);
  auto keys = fan->Keys(prompt);
  auto map = ShardMap::FromConfig(c.cfg).value();
  std::vector<PutItem> live;  // the blocks of the live nodes, put directly
  std::vector<std::vector<std::byte>> data;
  for (size_t i = 0; i < keys.size(); ++i) data.push_back(Block(500 + i, bytes));
  for (size_t i = 0; i < keys.size(); ++i) {
    int p = map->Primary(keys[i], {});
    if (p == 0 || p == 2) live.push_back(PutItem{keys[i], data[i], {}});
  }
  for (int n : {0, 2}) {
    std::vector<PutItem> mine;
    for (const PutItem& it : live)
      if (map->Primary(it.key, {}) == n) mine.push_back(it);
    REQUIRE(c.channels[n]->Put(mine, {}).ok());
  }

  auto t0 = SteadyClock::now();
  Read got = GetAll(*fan, keys, bytes);
  const double fan_ms = Ms(SteadyClock::now() - t0);
  t0 = SteadyClock::now();
  Read base = GetAll(*serial, keys, bytes);
  const double serial_ms = Ms(SteadyClock::now() - t0);
  CHECK(got == base);
  for (size_t i = 0; i < keys.size(); ++i) {
    int p = map->Primary(keys[i], {});
    if (p == 1 || p == 3) {
      CHECK(got.codes[i] == StatusCode::kDeadlineExceeded);
    } else {
      REQUIRE(got.codes[i] == StatusCode::kOk);
      CHECK(got.bytes[i] == data[i]);
    }
  }
  INFO("fan-out " << fan_ms << " ms, serial " << serial_ms << " ms");
  CHECK(fan_ms >= kTimeout * 0.9);
  CHECK(fan_ms < kTimeout * 1.75);
  CHECK(serial_ms >= 2 * kTimeout * 0.9);  // the baseline waits for each stalled node in turn

  // A per-request timeout bounds the whole fanned-out operation too.
  RequestOptions ro;
  ro.timeout_ms = 150;
  std::vector<uint8_t> found(keys.size());
  t0 = SteadyClock::now();
  REQUIRE(fan->ExistsBatch(keys, found, ro).ok());
  CHECK(Ms(SteadyClock::now() - t0) < 150 * 1.75 + 100);
}

TEST_CASE("Router fan-out: StaleEpoch from every node refreshes once and retries", "[router][fanout][cluster][faults]") {
  TcpCluster c(4);
  for (TcpChannel* t : c.tcp) t->set_epoch(1);
  int refreshes = 0;
  RouterOptions ro;
  ro.refresh = [&](Router&) {
    ++refreshes;
    for (TcpChannel* t : c.tcp) t->set_epoch(c.epoch.load());
    return Status::Ok();
  };
  auto fan = c.MakeRouter(true, ro);
  const size_t bytes = c.BlockBytes();
  auto prompt = Tokens(4 * 24, 3);
  PutPrompt(*fan, prompt, 24, 40, bytes);
  CHECK(refreshes == 0);

  c.epoch = 2;  // the coordinator moved on: every node refuses epoch 1
  CHECK(*fan->MatchPrefix(prompt) == 24);
  CHECK(refreshes == 1);
  CHECK(c.tcp[0]->last_node_epoch() == 2);

  c.epoch = 3;
  auto keys = fan->Keys(prompt);
  Read got = GetAll(*fan, keys, bytes);
  CHECK(refreshes == 2);
  for (size_t i = 0; i < keys.size(); ++i) CHECK(got.bytes[i] == Block(40 + i, bytes));

  // Without a refresh hook StaleEpoch is a miss.
  auto bare = c.MakeRouter(true);
  c.epoch = 4;
  CHECK(*bare->MatchPrefix(prompt) == 0);
}

TEST_CASE("Router fan-out: with replicas a dead primary is read from the next replica",
          "[router][fanout][cluster][faults]") {
  TcpCluster c(4, /*replicas=*/2, /*timeout_ms=*/500);
  auto fan = c.MakeRouter(true);
  const size_t bytes = c.BlockBytes();
  auto prompt = Tokens(4 * 32, 21);
  auto keys = fan->Keys(prompt);
  PutPrompt(*fan, prompt, keys.size(), 900, bytes);
  uint64_t stored = 0;
  for (auto& n : c.nodes) stored += n->Stats().store.blocks;
  CHECK(stored == 2 * keys.size());
  c.servers[0].reset();  // dead (a stalled primary would use the whole timeout: misses, see docs/router.md)
  CHECK(*fan->MatchPrefix(prompt) == keys.size());
  Read got = GetAll(*fan, keys, bytes);
  for (size_t i = 0; i < keys.size(); ++i) {
    REQUIRE(got.codes[i] == StatusCode::kOk);
    CHECK(got.bytes[i] == Block(900 + i, bytes));
  }
}

TEST_CASE("Router fan-out: threads sharing one router and its channels get their own blocks back",
          "[router][fanout][cluster][threads]") {
  TcpCluster c(4);
  auto fan = c.MakeRouter(true);
  auto serial = c.MakeRouter(false);  // the same channels, serially, at the same time
  const size_t bytes = c.BlockBytes();
  constexpr int kThreads = 6, kRounds = 20;
  std::atomic<int> failures{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      Router& r = t % 3 == 2 ? *serial : *fan;
      for (int round = 0; round < kRounds; ++round) {
        const uint64_t seed = (uint64_t(t) << 32) | uint64_t(round) << 8;
        auto prompt = Tokens(4 * 16, TokenId(100000 * t + 1000 * round));
        std::vector<std::vector<std::byte>> data;
        std::vector<std::span<const std::byte>> spans;
        for (size_t i = 0; i < 16; ++i) data.push_back(Block(seed + i, bytes));
        for (auto& d : data) spans.emplace_back(d);
        if (!r.Put(prompt, spans).ok()) ++failures;
        auto m = r.MatchPrefix(prompt);
        if (!m.ok() || *m != 16) ++failures;
        auto keys = r.Keys(prompt);
        std::vector<std::vector<std::byte>> dst(keys.size(), std::vector<std::byte>(bytes));
        std::vector<GetItem> items;
        for (size_t i = 0; i < keys.size(); ++i) items.push_back(GetItem{keys[i], dst[i], 0, {}});
        if (!r.GetBatch(items).ok()) ++failures;
        for (size_t i = 0; i < keys.size(); ++i)
          if (!items[i].status.ok() || dst[i] != data[i]) ++failures;
        if (round % 2 == 0) {
          if (!r.Erase(keys).ok()) ++failures;
          auto gone = r.MatchPrefix(prompt);
          if (!gone.ok() || *gone != 0) ++failures;
        }
      }
    });
  }
  for (auto& th : ts) th.join();
  CHECK(failures == 0);
  CHECK(fan->Stats().node_errors == 0);
}

TEST_CASE("Router PutBatch with RequestOptions::replace overwrites over TCP and in-process; without it the first stays",
          "[router][cluster]") {
  TcpCluster c(3);
  auto r = c.MakeRouter(true);
  const size_t bytes = c.BlockBytes();
  std::vector<std::byte> v1 = Block(1, bytes), v2 = Block(2, bytes), v3 = Block(3, bytes);
  std::vector<PutItem> items;
  for (uint64_t i = 0; i < 6; ++i) items.push_back(PutItem{BlockKey{99, i}, v1, {}});
  REQUIRE(r->PutBatch(items).ok());
  auto read_all = [&](Router& router) {
    std::vector<BlockKey> keys;
    for (const PutItem& it : items) keys.push_back(it.key);
    return GetAll(router, keys, bytes);
  };
  for (PutItem& it : items) it.data = v2;
  REQUIRE(r->PutBatch(items).ok());  // keys name their content: the first block stays
  for (const auto& b : read_all(*r).bytes) CHECK(b == v1);
  RequestOptions replace;
  replace.replace = true;
  REQUIRE(r->PutBatch(items, replace).ok());
  for (const PutItem& it : items) CHECK(it.status.ok());
  for (const auto& b : read_all(*r).bytes) CHECK(b == v2);

  // The in-process channel honours it too.
  auto node = ShardNode::Create(c.cfg, "n0").value();
  std::vector<std::shared_ptr<ShardChannel>> local{std::shared_ptr<ShardChannel>(MakeInProcessChannel(node.get()))};
  ClusterConfig one = Config(1);
  auto lr = Router::Create(one.model, ShardMap::FromConfig(one).value(), local).value();
  PutItem it{BlockKey{7, 7}, v1, {}};
  REQUIRE(lr->PutBatch(std::span(&it, 1)).ok());
  it.data = v3;
  REQUIRE(lr->PutBatch(std::span(&it, 1), replace).ok());
  std::vector<std::byte> got(bytes);
  GetItem g{BlockKey{7, 7}, got, 0, {}};
  REQUIRE(lr->GetBatch(std::span(&g, 1)).ok());
  REQUIRE(g.status.ok());
  CHECK(got == v3);
}

TEST_CASE("TCP channel: a lone caller keeps to one connection, concurrent callers spread over the pool",
          "[router][fanout][cluster]") {
  // A stalled node shows which connections the requests went on. (Two
  // round-robin steps per call, one to learn the node's limits and one to
  // send, would put every request on the same one of two connections whatever
  // the concurrency; alternating connections would slow a lone caller down.)
  StalledNode s;
  TcpChannelOptions o;
  o.port = s.port();
  o.connections = 2;
  auto ch = TcpChannel::Create(o);
  std::vector<std::byte> dst(64), dst2(64);
  RequestOptions quick;
  quick.timeout_ms = 30;
  for (uint64_t i = 0; i < 4; ++i) {  // one after another: always the same connection
    GetItem it{BlockKey{7, i + 1}, dst, 0, {}};
    CHECK(ch->Get(std::span<GetItem>(&it, 1), quick).code() == StatusCode::kDeadlineExceeded);
    PutItem p{BlockKey{8, i + 1}, dst, {}};
    CHECK(ch->Put(std::span<PutItem>(&p, 1), quick).code() == StatusCode::kDeadlineExceeded);
  }
  auto wait_for = [&](size_t n) {
    const auto end = SteadyClock::now() + std::chrono::seconds(2);
    while (s.ConnectionsWithRequests() < n && SteadyClock::now() < end) std::this_thread::sleep_for(milliseconds(5));
    return s.ConnectionsWithRequests();
  };
  CHECK(wait_for(1) == 1);
  std::this_thread::sleep_for(milliseconds(50));
  CHECK(s.ConnectionsWithRequests() == 1);

  // While one call is in flight, the next takes the other connection.
  RequestOptions slow;
  slow.timeout_ms = 600;
  Status first;
  std::thread t([&] {
    GetItem it{BlockKey{9, 1}, dst2, 0, {}};
    first = ch->Get(std::span<GetItem>(&it, 1), slow);
  });
  std::this_thread::sleep_for(milliseconds(100));
  GetItem it{BlockKey{9, 2}, dst, 0, {}};
  CHECK(ch->Get(std::span<GetItem>(&it, 1), quick).code() == StatusCode::kDeadlineExceeded);
  t.join();
  CHECK(first.code() == StatusCode::kDeadlineExceeded);
  CHECK(wait_for(2) == 2);
}

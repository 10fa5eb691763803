// The UCX backend in one process: a ShardNode served by UcxServer (worker fd
// on an Asio loop) and a UcxChannel (own worker and progress thread), over
// UCX's default transports and over UCX_TLS=tcp: eager and rendezvous sizes
// byte-for-byte, token refusal, stale epochs.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <random>

#include "kvmesh/config.h"
#include "shard_node/server/ucx_server.h"
#include "shard_node/shard_node.h"
#include "transport/ucx_channel.h"

using namespace kvmesh;

namespace {

struct Fixture {
  explicit Fixture(std::string token = "", uint64_t epoch = 0) : epoch_(epoch) {
    auto c = ParseConfig(R"({
      "model": {"model_id": "m", "num_layers": 2, "num_kv_heads": 2, "head_dim": 64, "block_tokens": 16},
      "nodes": [{"id": "u0", "memory": {"host": "64MiB"}}],
      "store": {"slot_bytes": "2MiB", "stripes": 2}})");
    REQUIRE(c.ok());
    auto n = ShardNode::Create(*c, "u0");
    REQUIRE(n.ok());
    node = std::move(*n);
    UcxServerOptions o;
    o.token = std::move(token);
    o.limits.max_block_bytes = 2 << 20;
    o.limits.max_body_bytes = 16 << 20;
    auto s = UcxServer::Start(node.get(), o, &epoch_);
    REQUIRE(s.ok());
    server = std::move(*s);
  }
  Result<std::unique_ptr<UcxChannel>> Channel(std::string token = "") {
    UcxChannelOptions o;
    o.node_address = server->address();
    o.token = std::move(token);
    o.timeout_ms = 5000;
    o.limits.max_body_bytes = 16 << 20;
    o.limits.max_block_bytes = 2 << 20;
    return UcxChannel::Connect(o);
  }
  std::atomic<uint64_t> epoch_;
  std::unique_ptr<ShardNode> node;
  std::unique_ptr<UcxServer> server;
};

BlockKey Key(uint64_t i) { return BlockKey{i * 0x9E3779B97F4A7C15ull, i}; }

void RoundTrip() {
  Fixture f;
  auto ch = f.Channel();
  REQUIRE(ch.ok());
  std::mt19937_64 rng(9);
  const size_t sizes[] = {100, 4096, 65536, 300000, 1 << 20, 2 << 20};  // eager and rendezvous
  std::vector<std::vector<std::byte>> data;
  std::vector<PutItem> puts;
  for (size_t i = 0; i < std::size(sizes); ++i) {
    data.emplace_back(sizes[i]);
    for (auto& b : data.back()) b = static_cast<std::byte>(rng());
  }
  for (size_t i = 0; i < data.size(); ++i) puts.push_back(PutItem{Key(i), data[i], {}});
  REQUIRE((*ch)->Put(puts, {}).ok());
  for (auto& p : puts) CHECK(p.status.ok());
  std::vector<std::vector<std::byte>> dst(data.size() + 1, std::vector<std::byte>(2 << 20));
  std::vector<GetItem> gets;
  for (size_t i = 0; i <= data.size(); ++i) gets.push_back(GetItem{Key(i), dst[i], 0, {}});
  REQUIRE((*ch)->Get(gets, {}).ok());
  for (size_t i = 0; i < data.size(); ++i) {
    REQUIRE(gets[i].status.ok());
    REQUIRE(gets[i].size == data[i].size());
    CHECK(std::equal(data[i].begin(), data[i].end(), dst[i].begin()));
  }
  CHECK(gets.back().status.code() == StatusCode::kNotFound);
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

TEST_CASE("UCX: the same over UCX_TLS=tcp", "[cluster][ucx]") {
  const char* old = std::getenv("UCX_TLS");
  std::string saved = old ? old : "";
  ::setenv("UCX_TLS", "tcp", 1);
  RoundTrip();
  if (old) ::setenv("UCX_TLS", saved.c_str(), 1);
  else ::unsetenv("UCX_TLS");
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

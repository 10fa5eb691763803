// A sequence handle made before its node was killed never reaches a sequence
// of the restarted node: found by kvmesh_soak (docs/soak.md). A `kvmesh
// coordinator` and one `kvmesh node` as child processes; client A holds a
// sequence, the node is SIGKILLed and started again (same id, new ports),
// client B creates a sequence there; A's old handle must miss (NotFound /
// Unavailable), not read, truncate or release B's sequence.
#include <catch2/catch.hpp>

#include <signal.h>
#include <unistd.h>

#include <fstream>
#include <numeric>
#include <thread>

#include "kvmesh/network.h"
#include "tests/cluster_process.h"
#include "transport/http_client.h"

using namespace kvmesh;
using kvmesh::testing::Process;
using namespace std::chrono_literals;

namespace {

const std::string kBin = KVMESH_BIN;

std::string WriteConfig() {
  const std::string path = "/tmp/kvmesh-seq-restart-" + std::to_string(::getpid()) + ".json";
  std::ofstream(path) << R"({
    "name": "seq-restart",
    "model": {"model_id": "seqr", "num_layers": 1, "num_kv_heads": 1, "head_dim": 4, "dtype": "fp32",
              "block_tokens": 4},
    "nodes": [{"id": "n0", "host": "127.0.0.1", "ports": {"data": 0, "http": 0, "resp": 0}, "memory": {"host": "1MiB"}}],
    "transport": {"io_threads": 1, "timeout_ms": 1000},
    "coordinator": {"host": "127.0.0.1", "port": 0, "heartbeat_ms": 100, "dead_after_ms": 500}
  })";
  return path;
}

std::unique_ptr<NetworkClient> Client(uint16_t coord) {
  NetworkClientOptions o;
  o.coordinator = "127.0.0.1:" + std::to_string(coord);
  o.timeout_ms = 1000;
  o.refresh_ms = 100;
  auto c = NetworkClient::Connect(o);
  REQUIRE(c.ok());
  return std::move(*c);
}

// Appends tokens with K = V = the token value (fp32, one layer, one head of 4).
void Append(Router& r, const SequenceHandle& h, std::vector<TokenId> toks) {
  std::vector<float> kv;
  for (TokenId t : toks) kv.insert(kv.end(), 4, static_cast<float>(t));
  auto b = std::as_bytes(std::span(kv));
  REQUIRE(r.AppendSequence(h, toks, b, b).ok());
}

}  // namespace

TEST_CASE("A sequence handle from before its node restarted never reaches the new node's sequences",
          "[cluster][sequence][faults]") {
  const std::string config = WriteConfig();
  Process coord, node;
  REQUIRE(coord.Start({kBin, "coordinator", "--config", config, "--port", "0"}));
  auto cj = coord.WaitEvent("listening", 10s);
  REQUIRE(cj);
  const uint16_t port = (*cj)["ports"]["http"].get<uint16_t>();
  const std::string addr = "127.0.0.1:" + std::to_string(port);
  auto start_node = [&](Process& p) {
    REQUIRE(p.Start({kBin, "node", "--config", config, "--id", "n0", "--coordinator", addr, "--no-resp"}));
    REQUIRE(p.WaitEvent("listening", 10s));
  };
  start_node(node);
  auto a = Client(port);
  // The node prints "listening" before the coordinator has it in the map.
  for (auto until = std::chrono::steady_clock::now() + 10s;
       a->num_nodes() != 1 && std::chrono::steady_clock::now() < until;)
    std::this_thread::sleep_for(20ms);
  REQUIRE(a->num_nodes() == 1);
  Result<SequenceHandle> created = a->router().CreateSequence({});
  REQUIRE(created.ok());
  SequenceHandle old = *created;
  Append(a->router(), old, {1, 2, 3});
  const uint64_t epoch_before = a->epoch();

  node.Kill(SIGKILL);
  REQUIRE(node.Wait(5s));
  Process again;
  start_node(again);
  const auto end = std::chrono::steady_clock::now() + 10s;
  while ((a->epoch() == epoch_before || a->num_nodes() != 1) && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(20ms);
  REQUIRE(a->num_nodes() == 1);
  REQUIRE(a->epoch() > epoch_before);

  // Client B's first sequence on the restarted node.
  auto b = Client(port);
  Result<SequenceHandle> made = b->router().CreateSequence({});
  REQUIRE(made.ok());
  SequenceHandle fresh = *made;
  Append(b->router(), fresh, {70, 71, 72, 73, 74});

  Result<SequenceState> info = a->router().SequenceInfo(old);
  CHECK_FALSE(info.ok());
  if (info.ok()) {
    CHECK(info->tokens == std::vector<TokenId>{1, 2, 3});  // what A appended, if it were still there
  } else {
    CHECK(IsMiss(info.status()));
  }
  CHECK_FALSE(a->router().TruncateSequence(old, 2).ok());
  CHECK_FALSE(a->router().ReleaseSequence(old).ok());
  // B's sequence is untouched.
  Result<SequenceState> mine = b->router().SequenceInfo(fresh);
  REQUIRE(mine.ok());
  CHECK(mine->tokens == std::vector<TokenId>{70, 71, 72, 73, 74});
  ::unlink(config.c_str());
}

// `mpirun --allow-run-as-root --oversubscribe -np 4 kvmesh serve --config
// cluster_configs/mpi-local.json`: rank 0 coordinator, ranks 1-3 nodes,
// bootstrapped over MPI; a network router stores and reads back blocks
// byte-for-byte; SIGTERM to mpirun stops every rank cleanly.
#include <catch2/catch.hpp>

#include <fstream>
#include <numeric>
#include <random>
#include <thread>

#include "cluster_process.h"
#include "kvmesh/build_config.h"
#include "kvmesh/network.h"
#include "transport/http_client.h"

using namespace kvmesh;
using kvmesh::testing::Process;
using namespace std::chrono_literals;

TEST_CASE("mpirun -np 4 kvmesh serve brings up a cluster a router can use", "[cluster][mpi]") {
  std::string config = std::string(KVMESH_SOURCE_DIR) + "/cluster_configs/mpi-local.json";
  std::string backend = "tcp";
#if defined(KVMESH_HAVE_UCX)
  backend = GENERATE(as<std::string>{}, "tcp", "ucx");
  if (backend == "ucx") {  // the same config with the UCX data plane (worker addresses exchanged over MPI)
    auto j = nlohmann::json::parse(std::ifstream(config));
    j["transport"]["backend"] = "ucx";
    config = "/tmp/kvmesh-mpi-ucx-" + std::to_string(::getpid()) + ".json";
    std::ofstream(config) << j.dump();
  }
#endif
  INFO("backend " << backend);
  Process mpi;
  REQUIRE(mpi.Start({KVMESH_MPIEXEC, "--allow-run-as-root", "--oversubscribe", "-np", "4", KVMESH_BIN, "serve",
                     "--config", config}));
  auto boot = mpi.WaitEvent("bootstrap", 30s);
  if (backend == "ucx") ::unlink(config.c_str());
  REQUIRE(boot);
  CHECK((*boot)["ranks"] == 4);
  CHECK((*boot)["ucx_addresses"] == (backend == "ucx" ? 3 : 0));
  REQUIRE((*boot)["endpoints"].size() == 4);
  CHECK_THAT((*boot)["endpoints"][1].get<std::string>(), Catch::StartsWith("node n0 tcp://127.0.0.1:"));
  const std::string coord = (*boot)["coordinator"].get<std::string>();
  const uint16_t port = static_cast<uint16_t>(std::stoi(coord.substr(coord.rfind(':') + 1)));

  // All three node ranks register.
  const auto end = std::chrono::steady_clock::now() + 15s;
  size_t n = 0;
  while (n != 3 && std::chrono::steady_clock::now() < end) {
    auto r = HttpRequest("127.0.0.1", port, "GET", "/nodes", "", 1000);
    if (r.ok() && r->status == 200) n = nlohmann::json::parse(r->body)["nodes"].size();
    if (n != 3) std::this_thread::sleep_for(50ms);
  }
  REQUIRE(n == 3);

  NetworkClientOptions o;
  o.coordinator = coord;
  o.timeout_ms = 2000;
  auto client = NetworkClient::Connect(o);
  REQUIRE(client.ok());
  Router& r = (*client)->router();
  REQUIRE((*client)->num_nodes() == 3);
  std::vector<TokenId> tokens(r.block_tokens() * 10);
  std::iota(tokens.begin(), tokens.end(), 42);
  std::mt19937_64 rng(7);
  std::vector<std::vector<std::byte>> blocks(10, std::vector<std::byte>(r.model().FullBlockBytes()));
  for (auto& b : blocks)
    for (auto& x : b) x = static_cast<std::byte>(rng());
  std::vector<std::span<const std::byte>> spans(blocks.begin(), blocks.end());
  REQUIRE(r.Put(tokens, spans).ok());
  CHECK(r.MatchPrefix(tokens).value() == 10);
  auto keys = r.Keys(tokens);
  for (size_t i = 0; i < keys.size(); ++i) {
    auto got = r.Get(keys[i]);
    REQUIRE(got.ok());
    CHECK(*got == blocks[i]);
  }

  // SIGTERM to mpirun is forwarded to every rank; each stops cleanly and says
  // so (mpirun itself reports 1 after forwarding a signal, so its own status
  // is not the measure).
  mpi.Signal(SIGTERM);
  int stopped = 0;
  while (stopped < 4) {
    auto ev = mpi.WaitEvent("stopped", 20s);
    if (!ev) break;
    CHECK((*ev)["signal"] == SIGTERM);
    ++stopped;
  }
  CHECK(stopped == 4);
  CHECK(mpi.Wait(20s));
}

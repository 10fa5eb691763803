// kvmesh serve --config F — the mpirun launch mode (docs/launch.md):
//   mpirun -np N kvmesh serve --config cluster_configs/mpi-local.json
// Rank 0 runs the coordinator, rank r >= 1 runs node config.nodes[r-1].
// MPI only bootstraps: rank 0 broadcasts the coordinator's address, every
// rank's data endpoint is all-gathered (and, with NCCL, rank 0 broadcasts the
// NCCL unique id). The data plane stays on TCP/UCX; MPI is idle afterwards.
//
//   mpirun -np N kvmesh serve --config F --decode [DECODE OPTIONS]
// is `kvmesh decode --mpi --config F [DECODE OPTIONS]` (cli/cmd_decode.cc):
// one decode rank per MPI process instead of the daemons.
#include <algorithm>
#include <cstring>
#include <iostream>
#include <vector>

#include "cli/commands.h"
#include "cli/daemon_signals.h"
#include "coordinator/coordinator_server.h"
#include "kvmesh/build_config.h"
#include "kvmesh/config.h"
#include "shard_node/server/node_daemon.h"

#if defined(KVMESH_HAVE_MPI)
#include <mpi.h>
#endif
#if defined(KVMESH_HAVE_NCCL)
#include <nccl.h>
#endif

namespace kvmesh::cli {

#if defined(KVMESH_HAVE_MPI)
namespace {

constexpr int kEndpointBytes = 512;

int Fail(const std::string& why) {
  std::cerr << "kvmesh serve: " << why << "\n";
  return 1;
}

int Serve(const std::string& config_path) {
  BlockStopSignals();  // before MPI starts its threads
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  auto finish = [](int code) {
    if (code != 0) MPI_Abort(MPI_COMM_WORLD, code);
    MPI_Finalize();
    return code;
  };
  Result<ClusterConfig> c = LoadConfigFile(config_path);
  if (!c.ok()) return finish(Fail(c.status().ToString()));
  if (size < 2) return finish(Fail("needs at least 2 ranks (rank 0 coordinator, ranks 1.. nodes)"));
  if (static_cast<size_t>(size - 1) > c->nodes.size())
    return finish(Fail(std::to_string(size - 1) + " node ranks but the config lists only " +
                       std::to_string(c->nodes.size()) + " nodes"));

  // 1. Rank 0 starts the coordinator and broadcasts its address.
  std::unique_ptr<CoordinatorServer> coord;
  char coord_addr[kEndpointBytes] = {0};
  if (rank == 0) {
    auto s = CoordinatorServer::Start(*c);
    if (!s.ok()) return finish(Fail(s.status().ToString()));
    coord = std::move(*s);
    std::snprintf(coord_addr, sizeof(coord_addr), "%s:%u", c->coordinator.host.c_str(), coord->port());
    PrintLine(coord->ListeningJson());
  }
  MPI_Bcast(coord_addr, kEndpointBytes, MPI_CHAR, 0, MPI_COMM_WORLD);

  // 2. Node ranks start their daemons against it.
  std::unique_ptr<NodeDaemon> node;
  std::string endpoint;
  if (rank > 0) {
    NodeDaemonOptions o;
    o.node_id = c->nodes[rank - 1].id;
    o.coordinator = coord_addr;
    auto d = NodeDaemon::Start(*c, o);
    if (!d.ok()) return finish(Fail("rank " + std::to_string(rank) + ": " + d.status().ToString()));
    node = std::move(*d);
    PrintLine(node->ListeningJson());
    endpoint = "node " + o.node_id + " tcp://" + c->nodes[rank - 1].host + ":" + std::to_string(node->data_port());
    if (!node->ucx_address().empty()) endpoint += " ucx:" + node->ucx_address();
  } else {
    endpoint = std::string("coordinator http://") + coord_addr;
  }

  // 3. Exchange every rank's endpoint, UCX worker address included (variable length).
  int len = static_cast<int>(endpoint.size());
  std::vector<int> lens(size), displs(size);
  MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, MPI_COMM_WORLD);
  int total = 0;
  for (int r = 0; r < size; ++r) {
    displs[r] = total;
    total += lens[r];
  }
  std::vector<char> all(static_cast<size_t>(total));
  MPI_Allgatherv(endpoint.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, MPI_COMM_WORLD);

  // 4. The NCCL unique id, for the block mover's communicator.
  std::string nccl = "absent";
#if defined(KVMESH_HAVE_NCCL)
  ncclUniqueId id{};
  if (rank == 0 && ncclGetUniqueId(&id) != ncclSuccess) std::memset(&id, 0, sizeof(id));
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  nccl = "broadcast";
#endif
  if (rank == 0) {
    std::string ranks;
    int ucx = 0;
    for (int r = 0; r < size; ++r) {
      std::string e(all.data() + displs[r], static_cast<size_t>(lens[r]));
      if (size_t u = e.find(" ucx:"); u != std::string::npos) {
        ++ucx;
        e.resize(u);  // the address itself is long; the count is what the log needs
      }
      ranks += (r ? "," : "") + std::string("\"") + e + "\"";
    }
    PrintLine("{\"event\":\"bootstrap\",\"role\":\"coordinator\",\"ranks\":" + std::to_string(size) +
              ",\"coordinator\":\"" + coord_addr + "\",\"nccl_unique_id\":\"" + nccl +
              "\",\"ucx_addresses\":" + std::to_string(ucx) + ",\"endpoints\":[" + ranks + "]}");
  }

  int sig = WaitForStopSignal();
  if (node) node->Stop();
  if (coord) coord->Stop();
  PrintLine("{\"event\":\"stopped\",\"role\":\"" + std::string(rank == 0 ? "coordinator" : "node") +
            "\",\"rank\":" + std::to_string(rank) + ",\"signal\":" + std::to_string(sig) + "}");
  MPI_Finalize();
  return 0;
}

}  // namespace
#endif

namespace {

// `kvmesh decode --mpi --config F EXTRA...`, parsed and run like the decode command.
int ServeDecode(const std::string& config, std::vector<std::string> extra) {
  CLI::App app{"kvmesh serve --decode: kvmesh decode --mpi"};
  app.require_subcommand(1);
  int exit_code = 0;
  AddDecodeCommand(app, &exit_code);
  extra.erase(std::remove(extra.begin(), extra.end(), "--mpi"), extra.end());
  std::vector<std::string> args = {"decode", "--mpi", "--config", config};
  args.insert(args.end(), extra.begin(), extra.end());
  std::reverse(args.begin(), args.end());  // CLI::App::parse takes a vector last argument first
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return exit_code;
}

}  // namespace

void AddServeCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("serve", "Run under mpirun: rank 0 coordinator, ranks 1.. shard nodes");
  auto config = std::make_shared<std::string>();
  auto decode = std::make_shared<bool>(false);
  cmd->add_option("--config", *config, "cluster config JSON")->required();
  cmd->add_flag("--decode", *decode,
                "run the model-parallel decode instead of the daemons: `kvmesh decode --mpi --config F`; "
                "the other options are decode's");
  cmd->allow_extras();
  cmd->callback([cmd, config, decode, exit_code] {
    std::vector<std::string> extra = cmd->remaining();
    if (*decode) {
      *exit_code = ServeDecode(*config, std::move(extra));
      return;
    }
    if (!extra.empty()) throw CLI::ExtrasError(cmd->get_name(), extra);
#if defined(KVMESH_HAVE_MPI)
    *exit_code = Serve(*config);
#else
    std::cerr << "kvmesh serve: this build has no MPI (KVMESH_WITH_MPI); use `kvmesh coordinator` and `kvmesh node`\n";
    *exit_code = 1;
#endif
  });
}

}  // namespace kvmesh::cli

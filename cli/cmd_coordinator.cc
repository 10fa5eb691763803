// kvmesh coordinator --config F [--host H] [--port P]
#include <iostream>

#include "cli/commands.h"
#include "cli/daemon_signals.h"
#include "coordinator/coordinator_server.h"
#include "kvmesh/config.h"

namespace kvmesh::cli {

void AddCoordinatorCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("coordinator", "Run the coordinator (membership, heartbeats, shard-map epochs)");
  auto config = std::make_shared<std::string>();
  auto port = std::make_shared<int>(-1);
  auto host = std::make_shared<std::string>();
  cmd->add_option("--config", *config, "cluster config JSON")->required();
  cmd->add_option("--host", *host,
                  "address to listen on and to advertise to the other coordinators (default $.coordinator.host): "
                  "coordinators on several machines share one config file");
  cmd->add_option("--port", *port, "HTTP port (default $.coordinator.port; 0 = a free port)")->check(CLI::Range(-1, 65535));
  cmd->callback([config, host, port, exit_code] {
    BlockStopSignals();
    Result<ClusterConfig> c = LoadConfigFile(*config);
    if (!c.ok()) {
      std::cerr << "kvmesh coordinator: " << c.status().ToString() << "\n";
      *exit_code = 1;
      return;
    }
    if (!host->empty()) c->coordinator.host = *host;
    if (*port >= 0) c->coordinator.port = static_cast<uint16_t>(*port);
    auto s = CoordinatorServer::Start(*c);
    if (!s.ok()) {
      std::cerr << "kvmesh coordinator: " << s.status().ToString() << "\n";
      *exit_code = 1;
      return;
    }
    PrintLine((*s)->ListeningJson());
    int sig = WaitForStopSignal();
    (*s)->Stop();
    PrintLine("{\"event\":\"stopped\",\"role\":\"coordinator\",\"signal\":" + std::to_string(sig) + "}");
  });
}

}  // namespace kvmesh::cli

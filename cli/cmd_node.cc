// kvmesh node --config F --id N [--coordinator host:port]
#include <iostream>

#include "cli/commands.h"
#include "cli/daemon_signals.h"
#include "kvmesh/config.h"
#include "router/map_fetch.h"
#include "shard_node/server/node_daemon.h"

namespace kvmesh::cli {

void AddNodeCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("node", "Run one shard node daemon (binary protocol, RESP, /metrics)");
  struct Args {
    std::string config, id, coordinator, token;
    bool no_resp = false;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--config", a->config, "cluster config JSON")->required();
  cmd->add_option("--id", a->id, "this node's id in the config")->required();
  cmd->add_option("--coordinator", a->coordinator,
                  "coordinator host:port, or several separated by commas "
                  "(default: $.coordinator.addresses, or host:port when its port is set; none = standalone)");
  cmd->add_option("--token", a->token, "shared secret (overrides $.auth.token)");
  cmd->add_flag("--no-resp", a->no_resp, "do not serve the Redis protocol");
  cmd->callback([a, exit_code] {
    BlockStopSignals();
    Result<ClusterConfig> c = LoadConfigFile(a->config);
    if (!c.ok()) {
      std::cerr << "kvmesh node: " << c.status().ToString() << "\n";
      *exit_code = 1;
      return;
    }
    if (!a->token.empty()) c->auth.token = a->token;
    NodeDaemonOptions o;
    o.node_id = a->id;
    o.coordinator = a->coordinator;
    if (o.coordinator.empty()) o.coordinator = ConfigCoordinators(c->coordinator);
    o.resp = !a->no_resp;
    auto d = NodeDaemon::Start(*c, o);
    if (!d.ok()) {
      std::cerr << "kvmesh node: " << d.status().ToString() << "\n";
      *exit_code = 1;
      return;
    }
    PrintLine((*d)->ListeningJson());
    int sig = WaitForStopSignal();
    (*d)->Stop();
    PrintLine("{\"event\":\"stopped\",\"role\":\"node\",\"node_id\":\"" + a->id + "\",\"signal\":" +
              std::to_string(sig) + "}");
  });
}

}  // namespace kvmesh::cli

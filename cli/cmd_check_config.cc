#include <iostream>

#include "cli/commands.h"
#include "kvmesh/config.h"
#include "kvmesh/size.h"

namespace kvmesh::cli {

void AddCheckConfigCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("check-config", "Validate a cluster config; exit 1 naming the bad field");
  auto path = std::make_shared<std::string>();
  cmd->add_option("config", *path, "cluster config JSON file")->required();
  cmd->callback([path, exit_code] {
    Result<ClusterConfig> c = LoadConfigFile(*path);
    if (!c.ok()) {
      std::cerr << "kvmesh check-config: " << c.status().ToString() << "\n";
      *exit_code = 1;
      return;
    }
    uint64_t total = 0;
    for (const auto& n : c->nodes) total += n.primary_budget();
    std::cout << *path << ": OK (" << c->nodes.size() << " nodes, "
              << FormatSize(total) << " primary budget, model " << c->model.model_id << ", block "
              << FormatSize(c->model.FullBlockBytes()) << ")\n";
  });
}

}  // namespace kvmesh::cli

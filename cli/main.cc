// kvmesh — one binary for every role: demo, check-config, and (as they land)
// node, coordinator, serve (mpirun), replay, codec, bench, decode.
#include <cstdio>

#include "cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"kvmesh: a distributed, sharded KV-cache service for LLM inference"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "kvmesh 0.1.0");
  int exit_code = 0;
  kvmesh::cli::AddDemoCommand(app, &exit_code);
  kvmesh::cli::AddCheckConfigCommand(app, &exit_code);
  kvmesh::cli::AddReplayCommand(app, &exit_code);
  kvmesh::cli::AddCodecCommand(app, &exit_code);
  kvmesh::cli::AddBenchCodecsCommand(app, &exit_code);
  kvmesh::cli::AddNodeCommand(app, &exit_code);
  kvmesh::cli::AddCoordinatorCommand(app, &exit_code);
  kvmesh::cli::AddServeCommand(app, &exit_code);
  kvmesh::cli::AddProxyCommand(app, &exit_code);
  kvmesh::cli::AddRouteCommand(app, &exit_code);
  kvmesh::cli::AddDecodeCommand(app, &exit_code);
  kvmesh::cli::AddBenchServeCommand(app, &exit_code);
  kvmesh::cli::AddWorldModelCommand(app, &exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return exit_code;
}

// cli/commands.h — the kvmesh subcommands. Each lives in its own cmd_*.cc and
// registers itself on the app; main.cc calls every Add*Command below.
// A command's callback sets *exit_code (0 = success).
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

namespace kvmesh::cli {

void AddDemoCommand(CLI::App& app, int* exit_code);
void AddCheckConfigCommand(CLI::App& app, int* exit_code);
void AddReplayCommand(CLI::App& app, int* exit_code);
// kvmesh codec encode|decode|info|fit-basis (cli/cmd_codec.cc).
void AddCodecCommand(CLI::App& app, int* exit_code);
// kvmesh bench codecs; creates the `bench` group if no other command has.
void AddBenchCodecsCommand(CLI::App& app, int* exit_code);
// The codec benchmark's options and callback on any app (bench/bench_codecs).
void ConfigureCodecBench(CLI::App* cmd, int* exit_code);

// The daemons: kvmesh node / coordinator / serve (mpirun) (cli/cmd_node.cc, cmd_coordinator.cc, cmd_serve.cc).
void AddNodeCommand(CLI::App& app, int* exit_code);
void AddCoordinatorCommand(CLI::App& app, int* exit_code);
void AddServeCommand(CLI::App& app, int* exit_code);

// kvmesh proxy: the cluster-wide RESP front (cli/cmd_proxy.cc).
void AddProxyCommand(CLI::App& app, int* exit_code);

// kvmesh decode (cli/cmd_decode.cc).
void AddDecodeCommand(CLI::App& app, int* exit_code);

// kvmesh bench-serve: the serving benchmark (cli/cmd_bench_serve.cc, cli/serve/).
void AddBenchServeCommand(CLI::App& app, int* exit_code);

// kvmesh route: KV-aware routing over HTTP, fed by KV events (cli/cmd_route.cc).
void AddRouteCommand(CLI::App& app, int* exit_code);
// kvmesh worldmodel: world-model frames with similarity-gated KV reuse (cli/cmd_worldmodel.cc).
void AddWorldModelCommand(CLI::App& app, int* exit_code);
// The world-model part of `kvmesh demo`: `kvmesh worldmodel --frames N` on the
// demo's config; text on stdout, or (json_out set) the command's JSON there.
int RunWorldModelDemoPart(const std::string& config, uint32_t frames, nlohmann::json* json_out);

}  // namespace kvmesh::cli

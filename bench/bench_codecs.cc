// bench_codecs: the codec benchmark as a standalone binary (same options and
// output as `kvmesh bench codecs`), buildable without the rest of the CLI.
#include "cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"kvmesh codec benchmark: ratio, cache and attention error, encode/decode GB/s vs memcpy"};
  int exit_code = 0;
  kvmesh::cli::ConfigureCodecBench(&app, &exit_code);
  CLI11_PARSE(app, argc, argv);
  return exit_code;
}

// libFuzzer target for the cluster config loader (common/config.cc,
// common/config_auth.cc, common/json_reader.cc): every `kvmesh` daemon and
// tool reads a config file an operator (or a script) wrote. Any input is
// either a config or an error naming a JSON path; nothing else may happen.
// Build and run (clang only): fuzz/build.sh && build-fuzz/bin/fuzz_config -max_total_time=60
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "kvmesh/config.h"
#include "kvmesh/size.h"

using namespace kvmesh;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  Result<ClusterConfig> c = ParseConfig(in, "fuzz");
  if (c.ok()) {
    // A config that loads keeps the loader's promises.
    if (c->nodes.empty() || c->model.block_tokens == 0) __builtin_trap();
    for (const NodeConfig& n : c->nodes)
      if (c->FindNode(n.id) == nullptr || n.primary_budget() == 0) __builtin_trap();
    if (!c->auth.tenants.empty() && c->auth.token.empty()) __builtin_trap();
    for (const TenantConfig& t : c->auth.tenants)
      if (t.token.empty() || t.token == c->auth.token || c->auth.FindTenant(t.name) == nullptr) __builtin_trap();
  } else if (c.status().message().empty() || c.status().message()[0] != '$') {
    __builtin_trap();  // every refusal names its JSON path
  }
  if (size < 64) (void)ParseSize(in);
  return 0;
}

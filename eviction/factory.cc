#include <functional>

#include "eviction/eviction_policy.h"
#include "eviction/policies.h"

namespace kvmesh {
namespace {

struct Entry {
  const char* name;
  std::unique_ptr<EvictionPolicy> (*make)(const PolicyOptions&);
};

// The registry: one row per policy.
constexpr Entry kPolicies[] = {
    {"lru-priority", &eviction_internal::MakeLruPriority},
    {"lru", &eviction_internal::MakeLru},
};

}  // namespace

Result<std::unique_ptr<EvictionPolicy>> MakeEvictionPolicy(std::string_view name,
                                                           const PolicyOptions& options) {
  for (const Entry& e : kPolicies)
    if (name == e.name) return e.make(options);
  std::string known;
  for (const Entry& e : kPolicies) known += (known.empty() ? "" : ", ") + std::string(e.name);
  return InvalidArgument("unknown eviction policy '" + std::string(name) + "' (known: " + known + ")");
}

std::vector<std::string> EvictionPolicyNames() {
  std::vector<std::string> out;
  for (const Entry& e : kPolicies) out.emplace_back(e.name);
  return out;
}

}  // namespace kvmesh

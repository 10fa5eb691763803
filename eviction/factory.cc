#include <functional>

#include "eviction/eviction_policy.h"
#include "eviction/policies.h"

namespace kvmesh {
namespace {

struct Entry {
  const char* name;
  std::unique_ptr<EvictionPolicy> (*make)(const PolicyOptions&);
};

// The registry: one row per policy. Any of them can also be named with the
// "tinylfu-" prefix to put a TinyLFU admission filter in front of it.
constexpr Entry kPolicies[] = {
    {"lru-priority", &eviction_internal::MakeLruPriority},
    {"lru", &eviction_internal::MakeLru},
    {"lfu", &eviction_internal::MakeLfu},
    {"arc", &eviction_internal::MakeArc},
    {"s3-fifo", &eviction_internal::MakeS3Fifo},
    {"score", &eviction_internal::MakeScore},
    {"turnover-priority", &eviction_internal::MakeTurnoverPriority},
    {"freq-class", &eviction_internal::MakeFreqClass},
    {"freq-class-turnover", &eviction_internal::MakeFreqClassTurnover},
    {"adaptive", &eviction_internal::MakeAdaptive},
    {"adaptive-cost", &eviction_internal::MakeAdaptiveCost},
};
constexpr std::string_view kTinyLfuPrefix = "tinylfu-";

}  // namespace

Result<std::unique_ptr<EvictionPolicy>> MakeEvictionPolicy(std::string_view name,
                                                           const PolicyOptions& options) {
  if (name.starts_with(kTinyLfuPrefix)) {
    std::string_view inner = name.substr(kTinyLfuPrefix.size());
    if (inner.starts_with(kTinyLfuPrefix))
      return InvalidArgument("eviction policy '" + std::string(name) + "': tinylfu- may appear once");
    KVMESH_ASSIGN_OR_RETURN(auto p, MakeEvictionPolicy(inner, options));
    return eviction_internal::MakeTinyLfu(std::move(p), options);
  }
  for (const Entry& e : kPolicies)
    if (name == e.name) return e.make(options);
  std::string known;
  for (const Entry& e : kPolicies) known += (known.empty() ? "" : ", ") + std::string(e.name);
  return InvalidArgument("unknown eviction policy '" + std::string(name) + "' (known: " + known +
                         ", and tinylfu-<any of them>)");
}

std::vector<std::string> EvictionPolicyNames() {
  std::vector<std::string> out;
  for (const Entry& e : kPolicies) out.emplace_back(e.name);
  for (const Entry& e : kPolicies) out.push_back(std::string(kTinyLfuPrefix) + e.name);
  return out;
}

}  // namespace kvmesh

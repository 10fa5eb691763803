// eviction/policies.h — internal: constructors of the policies behind the factory.
// Each policy lives in its own file in an anonymous namespace; add a line here
// and a row in factory.cc for a new one.
#pragma once

#include <memory>

#include "eviction/eviction_policy.h"

namespace kvmesh::eviction_internal {

std::unique_ptr<EvictionPolicy> MakeLru(const PolicyOptions& o);
std::unique_ptr<EvictionPolicy> MakeLruPriority(const PolicyOptions& o);
std::unique_ptr<EvictionPolicy> MakeLfu(const PolicyOptions& o);
std::unique_ptr<EvictionPolicy> MakeArc(const PolicyOptions& o);
std::unique_ptr<EvictionPolicy> MakeS3Fifo(const PolicyOptions& o);
std::unique_ptr<EvictionPolicy> MakeScore(const PolicyOptions& o);
std::unique_ptr<EvictionPolicy> MakeTurnoverPriority(const PolicyOptions& o);
std::unique_ptr<EvictionPolicy> MakeFreqClass(const PolicyOptions& o);
std::unique_ptr<EvictionPolicy> MakeFreqClassTurnover(const PolicyOptions& o);
// turnover-priority whose effective class also rises by two per doubling of
// the block's access count (an expert of "adaptive" only, not in the factory).
std::unique_ptr<EvictionPolicy> MakeTurnoverFreq(const PolicyOptions& o);
// Follows the best of the experts above on shadow caches (adaptive.cc); the
// -cost variant ranks them by prefill FLOPs saved instead of prefix hits.
std::unique_ptr<EvictionPolicy> MakeAdaptive(const PolicyOptions& o);
std::unique_ptr<EvictionPolicy> MakeAdaptiveCost(const PolicyOptions& o);
// Wraps `inner` in a TinyLFU admission filter.
std::unique_ptr<EvictionPolicy> MakeTinyLfu(std::unique_ptr<EvictionPolicy> inner, const PolicyOptions& o);

}  // namespace kvmesh::eviction_internal

// tests/eviction_contract.h — the owner's contract of an EvictionPolicy under
// random operations, checked against a reference set of the tracked ids: an
// access hits exactly when the id is tracked, Remove (erase or pin) forgets,
// Release only reorders, Victim names a tracked id, and the size never
// exceeds the owner's capacity. Used by test_eviction_policies.cc (every
// factory policy) and test_eviction_adaptive.cc (sampled shadows), with the
// owner's side the eviction tests share: making a policy, the owner's
// protocol for one access, and draining a policy in eviction order.
#pragma once

#include <catch2/catch.hpp>

#include <functional>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "eviction/eviction_policy.h"
#include "kvmesh/clock.h"

namespace kvmesh::testing {

// The factory's policy `name` with options `o`; REQUIREs a known name.
inline std::unique_ptr<EvictionPolicy> MakePolicy(const std::string& name, const PolicyOptions& o) {
  auto r = MakeEvictionPolicy(name, o);
  REQUIRE(r.ok());
  return std::move(r).value();
}

// The same with a capacity hint, a clock (nullptr: the system's) and aging_ns.
inline std::unique_ptr<EvictionPolicy> MakePolicy(const std::string& name, size_t capacity, Clock* clock = nullptr,
                                                  int64_t aging_ns = 0) {
  return MakePolicy(name, {.aging_ns = aging_ns, .capacity_hint = capacity, .clock = clock});
}

// Evicts everything; returns the order.
inline std::vector<EntryId> Drain(EvictionPolicy& p) {
  std::vector<EntryId> out;
  while (auto v = p.Victim()) {
    out.push_back(*v);
    p.Remove(*v, RemoveReason::kEvicted);
  }
  return out;
}

// The owner's protocol (as in the replay and the block store): a hit Touches;
// a miss asks Admit, evicts Victims until there is room, then Inserts.
// Returns true on a hit; appends evicted ids to *evicted (may be null).
inline bool OwnerAccess(EvictionPolicy& p, EntryId id, size_t capacity, const AccessInfo& info,
                        std::vector<EntryId>* evicted) {
  if (p.Contains(id)) {
    p.Touch(id, info);
    return true;
  }
  if (!p.Admit(id, info)) return false;
  while (p.size() >= capacity) {
    auto v = p.Victim();
    REQUIRE(v.has_value());
    if (evicted) evicted->push_back(*v);
    p.Remove(*v, RemoveReason::kEvicted);
  }
  p.Insert(id, info);
  return false;
}

struct ContractRun {
  size_t capacity = 64;     // the owner's: access evicts down to it
  uint64_t keys = 200;      // ids drawn from 0..keys-1
  int steps = 20000;
  uint64_t seed = 7;
  int access_weight = 7;    // an access in access_weight of (access_weight + 3) steps; the
                            // other three: Remove, Release, evict the Victim
  ManualClock* clock = nullptr;  // advanced by tick_ns per step when set
  int64_t tick_ns = 0;
};

// `access(id, info)` runs the owner's protocol (Touch on a hit; else Admit,
// evict to capacity, Insert) and returns whether it hit. Returns the hits.
inline uint64_t CheckContract(EvictionPolicy& p, const ContractRun& r,
                              const std::function<bool(EntryId, const AccessInfo&)>& access) {
  std::set<EntryId> ref;
  std::mt19937_64 rng(r.seed);
  uint64_t hits = 0;
  for (int step = 0; step < r.steps; ++step) {
    if (r.clock) r.clock->Advance(r.tick_ns);
    const EntryId id = rng() % r.keys;
    AccessInfo info;
    info.priority = static_cast<Priority>(rng() % 4);
    info.score = static_cast<float>(rng() % 10);
    info.key_hash = id * 2654435761u + 1;
    const int op = static_cast<int>(rng() % static_cast<uint64_t>(r.access_weight + 3));
    if (op < r.access_weight) {
      const bool hit = access(id, info);
      hits += hit;
      REQUIRE(hit == (ref.count(id) == 1));
      // Access may evict: resync the reference from Contains of the tracked ids.
      for (auto it = ref.begin(); it != ref.end();) it = p.Contains(*it) ? std::next(it) : ref.erase(it);
      if (p.Contains(id)) ref.insert(id);
    } else if (op == r.access_weight) {
      p.Remove(id, rng() % 2 ? RemoveReason::kErased : RemoveReason::kPinned);
      ref.erase(id);
    } else if (op == r.access_weight + 1) {
      p.Release(id);  // changes the order only
      REQUIRE(p.Contains(id) == (ref.count(id) == 1));
    } else if (auto v = p.Victim()) {
      REQUIRE(ref.count(*v) == 1);
      p.Remove(*v, RemoveReason::kEvicted);
      ref.erase(*v);
    }
    REQUIRE(p.size() == ref.size());
    REQUIRE(p.size() <= r.capacity);
  }
  return hits;
}

}  // namespace kvmesh::testing

// eviction/eviction_policy.h — the one interface every eviction policy implements.
//
// A policy orders the evictable entries of one cache (a store stripe, a tier,
// or a trace replay) and names the next victim. It holds ids only, never
// payloads. The owner calls Insert when an entry becomes evictable, Touch on
// every hit, Remove when it leaves (erase, eviction, or pin), and Victim when
// it needs room; then it removes the victim itself:
//
//   auto p = MakeEvictionPolicy("lru-priority", opts).value();
//   p->Insert(id, {.priority = 2});
//   if (auto v = p->Victim()) { free(*v); p->Remove(*v, RemoveReason::kEvicted); }
//
// Pinned entries are not in the policy (the owner Removes them with kPinned and
// re-Inserts them on the last unpin), so Victim never names a pinned entry.
// Every operation is O(1) (amortised) unless the policy's doc says otherwise.
// Thread-safety: none; the owner serialises calls (one policy per stripe).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvmesh/clock.h"
#include "kvmesh/status.h"
#include "kvmesh/types.h"

namespace kvmesh {
namespace eviction_internal {
class SharedIndex;
}

using EntryId = uint64_t;

// What the owner knows about an access. Policies that ignore a field are free to.
struct AccessInfo {
  Priority priority = kDefaultPriority;  // client's class; higher survives longer
  uint32_t bytes = 0;                    // payload bytes (for size-aware policies)
  float score = 0.0f;                    // client importance hint (score-based policies)
  uint64_t key_hash = 0;                 // stable hash of the block's key (the EntryId may be
                                         // a slot number); frequency sketches count this
  uint32_t depth = 0;                    // the block's position in its request's prefix chain
                                         // when the owner accesses a request's blocks in order
                                         // (0: the chain's first block, or unknown)
  float cost = 0.0f;                     // relative cost of recomputing the block (prefill
                                         // FLOPs; cost-aware policies); 0: unknown, counts as 1
  bool refresh = false;                  // Touch only: the owner was handed the block again (a
                                         // duplicate put of a block the client recomputed):
                                         // recency, but no work saved ("adaptive" does not score it)
};

enum class RemoveReason : uint8_t {
  kErased = 0,   // the client deleted it
  kEvicted = 1,  // the owner evicted the victim; policies with ghost lists remember it
  kPinned = 2,   // temporarily unevictable; it comes back with Insert on unpin
};

// Policies that split one cache between them and should evict alike: a
// block store runs one policy per stripe (and size class), each over a share
// of the keys, while a request's chain of blocks spreads over the stripes, so
// a chain is only worth keeping if every stripe keeps its part. "adaptive"
// members of a group follow one expert, chosen on their summed scores (alone,
// stripes chose different experts at different times and broke each other's
// chains: docs/eviction.md "Through the nodes"); other policies ignore it.
// Thread-safe: its members run under different locks.
class PolicyGroup {
 public:
  static constexpr size_t kMaxMembers = 256;  // a member beyond these decides alone
  static constexpr size_t kMaxScores = 8;

  PolicyGroup();
  ~PolicyGroup();
  PolicyGroup(const PolicyGroup&) = delete;
  PolicyGroup& operator=(const PolicyGroup&) = delete;

  // A slot for a new member, or -1 when the group is full. `names` names the
  // members' scores (adaptive: its experts); the first member's are kept.
  int Join(const std::vector<std::string_view>& names = {});
  // The member in `slot` is gone: its scores no longer count.
  void Leave(int slot);
  // The member in `slot` publishes its current scores (n <= kMaxScores).
  void Publish(int slot, const double* scores, size_t n);
  // out[i] = the sum over members of score i, plus the peers' (n <= kMaxScores).
  void Sum(double* out, size_t n) const;
  // The members' sum alone, without the peers'. Returns how many scores the
  // members publish (0: none has published yet, or every member has left).
  size_t Own(double* out, size_t n) const;
  // Scores of the same group elsewhere (the other nodes of a cluster, as the
  // coordinator sums them: docs/eviction.md "Through the nodes"), added to
  // every Sum until replaced; n == 0 clears them.
  void SetPeers(const double* scores, size_t n);
  // The peers' scores as last set; returns how many were set (0: none).
  size_t Peers(double* out, size_t n) const;
  // The choice the members follow (an index into their scores).
  uint32_t leader() const;
  void set_leader(uint32_t i);
  // The name of score i as the first member gave it ("" when unnamed).
  std::string name(uint32_t i) const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// Scores by group key, as a node's groups report them and as the
// coordinator sums the other nodes' (eviction/score_exchange.h).
using PeerScores = std::vector<std::pair<std::string, std::vector<double>>>;

// Policy groups by name: what the block stores of one node share, or of
// every node of one process (an embedded cluster), so that all the stripes of
// a size class follow one expert wherever they are. A node daemon sends its
// groups' own sums with each heartbeat and installs the other nodes' sums the
// coordinator answers with as each group's peers. A key names the tier, the
// policy and the class: "primary/adaptive/262144". Thread-safe.
class PolicyGroups {
 public:
  // The group `key`, made on first use.
  std::shared_ptr<PolicyGroup> Get(const std::string& key);

  struct Entry {
    std::string key;
    std::vector<double> own;    // the members' summed scores (empty: none published yet)
    std::vector<double> peers;  // as last installed (empty: none)
    std::string following;      // the name of the leader's score
  };
  // Every group whose members have published scores, by key.
  std::vector<Entry> Snapshot() const;
  // Installs the peers' scores of the groups named; every other group's are cleared.
  void SetPeers(const PeerScores& peers);

 private:
  mutable std::mutex mu_;
  std::vector<std::pair<std::string, std::shared_ptr<PolicyGroup>>> groups_;  // few: a tier x class x policy
};

struct PolicyOptions {
  uint32_t priority_classes = 4;      // lru-priority: number of classes (1..kMaxPriorityClasses)
  int64_t aging_ns = 60'000'000'000;  // lru-priority: idle time after which a block drops a class;
                                      // score: half-life of importance; 0 = off
  size_t capacity_hint = 0;           // the cache's capacity in entries (reserves memory; arc,
                                      // s3-fifo and tinylfu size their lists/sketch by it; 0 = learn)
  Clock* clock = nullptr;             // nullptr: SystemClock()
  bool leaf_first = false;            // lru, lru-priority, turnover-priority, freq-class*: a block
                                      // accessed after its parent in the same request (depth > 0)
                                      // goes right behind it in recency, so chains are evicted
                                      // deepest block first ("adaptive" sets it for its experts)
  std::shared_ptr<PolicyGroup> group;  // adaptive: decide with the other policies of this group
  size_t shadow_sample_floor = 2048;   // adaptive: once capacity_hint / R >= this for some R = 2^k
                                       // (<= 64), its experts simulate the keys of one hash bucket in
                                       // R at capacity c / R, beside one full copy of the leader; 0:
                                       // every expert simulates every key (docs/eviction.md)
  eviction_internal::SharedIndex* shared_index = nullptr;  // the list policies (lru, lru-priority,
                                       // s3-fifo, turnover-*, freq-class*) index their entries in it
                                       // instead of a map of their own: "adaptive" gives its experts
                                       // one (eviction/list_pool.h); it must outlive the policy
};

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;

  virtual std::string_view name() const = 0;

  // Admission filter: false means "do not cache this new entry" (TinyLFU-style
  // policies). The owner calls it on every miss it would cache, before it
  // evicts anything for the entry, then (when true) evicts and Inserts. ARC
  // also learns from it which ghost list the missed entry is on. The owner may
  // not have chosen the entry's id yet, so a block store passes info.key_hash
  // as `id`; policies that need an identity stable across evictions (ghosts,
  // frequency sketches) key on AccessInfo::key_hash, because owners may reuse
  // ids (a block store's id is its slot number). Default: admit all.
  virtual bool Admit(EntryId /*id*/, const AccessInfo& /*info*/) { return true; }

  // Starts tracking `id` as most recently used. REQUIRES: !Contains(id).
  virtual void Insert(EntryId id, const AccessInfo& info) = 0;
  // Records a hit on `id` (refreshes recency; info.priority replaces the stored
  // class). REQUIRES: Contains(id).
  virtual void Touch(EntryId id, const AccessInfo& info) = 0;
  // Touch if `id` is tracked: true; false, changing nothing, if it is not.
  // The list policies do it in one lookup ("adaptive" asks it of every
  // expert on every access).
  virtual bool TouchIfPresent(EntryId id, const AccessInfo& info) {
    if (!Contains(id)) return false;
    Touch(id, info);
    return true;
  }
  // Stops tracking `id`. No-op when it is not tracked.
  virtual void Remove(EntryId id, RemoveReason reason) = 0;

  // The entry to evict next, or nullopt when nothing is tracked. Does not remove it.
  virtual std::optional<EntryId> Victim() = 0;

  // The class `id` would be counted under if evicted now (after aging);
  // 0 for policies without classes. REQUIRES: Contains(id).
  virtual Priority EffectiveClass(EntryId /*id*/) const { return 0; }

  // Policies that follow other policies ("adaptive"): the name of the one
  // followed now; empty for the others. For reports.
  virtual std::string_view following() const { return {}; }

  // The owner's readers are done with `id` (a closed session's private
  // block, docs/eviction.md): it becomes the next victim, before every entry
  // not released (the latest released first), until a Touch makes it an
  // ordinary entry again. No-op when `id` is not tracked. The list policies
  // (lru, lru-priority, turnover-*, freq-class*, s3-fifo) and adaptive
  // implement it; lfu, arc and score ignore it (the default), tinylfu-* pass
  // it to their inner policy.
  virtual void Release(EntryId /*id*/) {}

  virtual bool Contains(EntryId id) const = 0;
  virtual size_t size() const = 0;
};

// Names (docs/eviction.md says when to use which):
//   "adaptive" (default)      follows the best of the experts below on shadow caches
//   "adaptive-cost"           the same, ranking experts by prefill FLOPs saved
//   "lru-priority"            LRU inside priority classes, with aging
//   "lru"                     plain LRU
//   "lfu"                     LFU with dynamic aging (LFU-DA)
//   "arc"                     Adaptive Replacement Cache (uses capacity_hint)
//   "s3-fifo"                 S3-FIFO (uses capacity_hint)
//   "score"                   client hints: class, then H2O-style importance
//   "turnover-priority"       lru-priority aged by the cache's own turnover time
//   "freq-class"              class, then log2 accumulated score hints (O(1) "score")
//   "freq-class-turnover"     the same, importance halved per 3 turnover times
//   "tinylfu-<name>"          TinyLFU admission filter in front of <name>
// Unknown names -> InvalidArgument listing the known ones.
// The policy a store uses when its config names none (config.h's
// EvictionConfig::policy and StoreOptions::policy carry the same name).
inline constexpr std::string_view kDefaultEvictionPolicy = "adaptive";

Result<std::unique_ptr<EvictionPolicy>> MakeEvictionPolicy(std::string_view name,
                                                           const PolicyOptions& options);
std::vector<std::string> EvictionPolicyNames();

}  // namespace kvmesh

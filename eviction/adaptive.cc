// "adaptive" (the default): follows the best of several expert policies,
// each simulated on the same accesses (shadow caches of identities only).
// Why: no fixed policy wins on every workload; ARC and S3-FIFO adapt one knob
// between recency and frequency with ghost lists, this generalises the ghost
// list to whole policies and adapts the choice of policy. docs/eviction.md
// ("The adaptive default", "Measured figures behind adaptive") has the
// measurements behind each choice below.
//
// Shadows. E expert policies (the factory's code, built with
// PolicyOptions::leaf_first so an expert evicts a chain's deepest block
// before its parent) each see every access the owner reports (Touch on a hit,
// Admit on a miss, an Insert that no Admit announced, such as a block store's
// re-insert after the last unpin) as if each alone managed a cache of c
// entries: a hit is Touched, a miss evicts the expert's own victims until
// there is room and is Inserted. Experts key entries by GhostId, so they
// remember blocks the real cache no longer holds. Each expert scores the hits
// it would have had, decayed by 1 - 1/W per access (W = max(4096, 4c)). Only
// prefix hits count: AccessInfo::depth == 0 starts a request's chain and a
// miss breaks the rest of it (an owner that passes no depth gets block hits; a
// Touch marked AccessInfo::refresh, a duplicate put, is no hit).
// "adaptive-cost" weights each hit by AccessInfo::cost (prefill FLOPs).
//
// Following. The expert with the best score leads once it beats the leader by
// a margin (kChainMargin, kBlockMargin), so the lead does not flap. For every
// tracked simulation the policy keeps the list of resident entries that
// simulation does not hold (diff_, updated in O(1) whenever it evicts or
// admits a resident key), and Victim() is the oldest entry of the leader's
// list: the real cache converges to the leader's contents and, seeing the
// same accesses, then evicts exactly what the leader evicts. Admit always
// admits. With the leader holding every resident entry, Victim() is the
// leader's own victim when resident, else the least recently used entry;
// evicting an entry the leader keeps shows that the owner's real capacity is
// below c (a store class whose pages went to other classes, pinned entries,
// pressure), so the experts shrink to the count it held, their own victims
// first; c grows again with the resident count. Victim() changes nothing but
// the experts' internal order.
//
// Groups. An owner that splits its cache (a block store: one policy per stripe
// and size class) passes one PolicyGroup to the parts: every kPublishEvery
// accesses a member publishes its scores and the group's leader is chosen on
// their sum with the same margins, so a chain spread over the parts is evicted
// by one rule.
//
// Sampled shadows. Full simulations of a large cache cost most of an access
// (their working sets leave the CPU caches), and scores only rank the experts:
// so, as SHARDS-style miniature simulations do, each expert simulates the keys
// of one hash bucket in R at capacity c / R, a sampled hit counting R; R is the
// largest power of two (<= kMaxRate) that leaves c / R >=
// PolicyOptions::shadow_sample_floor (0 turns it off). The real cache then
// tracks one full simulation, of the leader (in place of the E lists), which
// starts over from the resident entries, oldest first, when the leader
// changes. An owner whose real capacity falls far below the hint lowers R
// (the experts start over from the resident entries). With R = 1 none of this
// happens.
//
// Deferred hits. A hit (Touch) is the lookup path of the owner (a node's
// match_prefix touches every block of a request), so Touch only queues the
// access with the time it happened (at most kMaxPending); every other
// operation first replays the queue in order, as Touch did before, and the
// experts read the time of the access they replay (their clock is a
// ManualClock the policy sets). The experts, scores, leader and victims are
// then exactly what they were with immediate replay; the work moves to the
// owner's next miss, insert, removal or victim choice (or to the Touch that
// finds the queue full). In a group, a queued publishing access (every
// kPublishEvery-th) publishes when it replays, not at its Touch: the scores
// are those it had, but the group's leader may move a few of the owners'
// calls later than with immediate replay (the one thing queueing changes; a
// queued access replays with the group's leader as it was when it happened,
// and decides against the leader as it is then).
//
// c is PolicyOptions::capacity_hint, or the largest resident count seen.
// Cost: O(1) per Touch; O(E) per access replayed, each expert O(1); memory: E + 1 entry pools of c
// entries (with R > 1: E pools of c / R and 2 of c) and the queue of kMaxPending accesses
// (reserved once). The experts index their entries in one SharedIndex (eviction/list_pool.h),
// one probe per access for all of them instead of one map each. EffectiveClass is the
// leader's for entries it holds, the latest AccessInfo::priority for the
// others. Thread-safety: none (the owner's lock).
#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <vector>

#include <absl/container/flat_hash_map.h>

#include "eviction/eviction_policy.h"
#include "eviction/list_pool.h"
#include "eviction/policies.h"
#include "kvmesh/clock.h"

namespace kvmesh::eviction_internal {
namespace {

constexpr size_t kMaxExperts = 8;
using ExpertMaker = std::unique_ptr<EvictionPolicy> (*)(const PolicyOptions&);

class AdaptivePolicy final : public EvictionPolicy {
 public:
  AdaptivePolicy(const PolicyOptions& o, const std::vector<ExpertMaker>& experts, bool cost_aware)
      : c_(o.capacity_hint), cost_aware_(cost_aware), clock_(o.clock ? o.clock : SystemClock()) {
    xo_ = o;
    xo_.leaf_first = true;  // chains leave deepest block first in every list-based expert
    xo_.group.reset();
    xo_.clock = &replay_clock_;  // the time of the access being replayed
    shared_.NewSlot();            // kResidentSlot: the resident entries by GhostId
    xo_.shared_index = &shared_;  // one index for every expert's entries
    pending_.reserve(kMaxPending);
    // Sampled shadows: the experts see one key in rate_ (a hash bucket) at c / rate_; the full
    // copy of the leader takes the slot after the experts'.
    if (experts.size() < kMaxExperts) floor_ = o.shadow_sample_floor;
    rate_ = RateFor(o.capacity_hint);
    PolicyOptions xo = xo_;
    xo.capacity_hint = o.capacity_hint / rate_;
    for (const ExpertMaker make : experts) {
      experts_.push_back(Expert{make(xo)});
      makers_.push_back(make);
      if (experts_.size() == kMaxExperts) break;
    }
    if (o.group && experts_.size() <= PolicyGroup::kMaxScores) {
      std::vector<std::string_view> names;
      for (const Expert& x : experts_) names.push_back(x.policy->name());
      slot_ = o.group->Join(names);
      if (slot_ >= 0) group_ = o.group;
    }
    nodes_.Reserve(o.capacity_hint);
    shared_.Reserve(o.capacity_hint);
    window_ = std::max<double>(4096.0, 4.0 * static_cast<double>(c_));
  }
  std::string_view name() const override { return cost_aware_ ? "adaptive-cost" : "adaptive"; }

  ~AdaptivePolicy() override {
    if (group_) group_->Leave(slot_);
  }

  bool Admit(EntryId id, const AccessInfo& info) override {
    Sync();
    const uint64_t gid = GhostId(id, info);
    Access(gid, info);
    announced_ = true;
    announced_gid_ = gid;
    return true;
  }
  void Insert(EntryId id, const AccessInfo& info) override {
    Sync();
    const uint64_t gid = GhostId(id, info);
    if (!(announced_ && announced_gid_ == gid)) Access(gid, info);
    announced_ = false;
    const uint32_t i = Alloc(id, gid);
    nodes_[i].cls = info.priority;
    lru_.PushFront(Links(kLru), i);
    for (size_t s = FirstTracked(); s < EndTracked(); ++s) {
      if (Sim(s).Contains(gid)) nodes_[i].in |= Bit(s);
      else diff_[s].PushFront(Links(s), i);
    }
    c_ = std::max(c_, nodes_.size());
  }
  // Queued (Deferred hits, above); an id not tracked when the queue is
  // replayed is skipped, as Touch skipped it. Nothing else happens here, not
  // even a group member's publication (it waits for the replay).
  void Touch(EntryId id, const AccessInfo& info) override {
    if (pending_.size() == kMaxPending) Flush();
    pending_.push_back(Pending{id, clock_->NowNanos(), group_ ? group_->leader() : 0, info});
    // A queued publication waits for the replay, but not for ever: a stripe
    // that only hits (no miss, pin or insert replays its queue) replays once
    // its queue holds a publishing access kPublishEvery accesses old, so its
    // scores still reach the group and, through the heartbeats, the cluster.
    if (group_ && since_publish_ + pending_.size() >= 2 * kPublishEvery) Flush();
  }
  void Remove(EntryId id, RemoveReason reason) override {
    Sync();
    const uint32_t i = nodes_.Take(id);
    if (i == kNil) return;
    const uint64_t gid = nodes_[i].gid;
    const size_t resident = nodes_.size() + 1;  // counting this entry
    const bool leader_keeps = !experts_.empty() && (nodes_[i].in & Bit(LeadSlot()));
    if (reason == RemoveReason::kErased) {  // gone for every expert too
      for (Expert& x : experts_) x.policy->Remove(gid, RemoveReason::kErased);
      if (full_) full_->Remove(gid, RemoveReason::kErased);
    }
    Free(i);
    if (reason == RemoveReason::kEvicted && leader_keeps) {
      // The owner evicted an entry the leader keeps: it holds fewer than c_
      // (a store class whose pages went to other classes, pinned entries, or
      // pressure). The experts shrink to what it held, their own victims first.
      c_ = std::max<size_t>(resident, 1);
      if (rate_ > 1 && c_ < size_t{rate_} * floor_ / 2) {
        // Too few sampled keys left for the experts to score well. Only below
        // half the floor: an owner a few entries short of its hint (pinned
        // entries) keeps its rate.
        SetRate(RateFor(c_));
      } else {
        for (size_t e = 0; e < experts_.size(); ++e) Trim(e, SampledCap());
        if (full_) Trim(experts_.size(), c_);
      }
    }
  }
  std::optional<EntryId> Victim() override {
    Sync();
    if (nodes_.size() == 0) return std::nullopt;
    if (experts_.empty()) return nodes_[lru_.tail].id;
    const size_t leader = LeadSlot();
    if (!diff_[leader].empty()) return nodes_[diff_[leader].tail].id;
    // The leader keeps every resident entry: its own victim, if resident.
    if (const std::optional<EntryId> v = Sim(leader).Victim()) {
      if (const uint32_t r = Resident(*v); r != kNil) return nodes_[r].id;
    }
    return nodes_[lru_.tail].id;
  }
  Priority EffectiveClass(EntryId id) const override {
    SyncConst();
    const uint32_t i = nodes_.Find(id);
    if (i == kNil) return 0;
    const Node& n = nodes_[i];
    if (experts_.empty()) return n.cls;
    size_t leader = Leader();
    if (rate_ > 1) {  // the full copy, when it copies the leader now
      if (!full_ || full_for_ != leader) return n.cls;
      leader = experts_.size();
    }
    if (!(n.in & Bit(leader))) return n.cls;  // the leader dropped it: its class as last given
    return Sim(leader).EffectiveClass(n.gid);
  }
  // Released in every expert that holds it (each makes it its next victim)
  // and in the cache's own LRU order; the leader's victim is then this entry
  // unless the leader has dropped resident entries that go first anyway.
  void Release(EntryId id) override {
    Sync();
    const uint32_t i = nodes_.Find(id);
    if (i == kNil) return;
    for (Expert& x : experts_) x.policy->Release(nodes_[i].gid);
    if (full_) full_->Release(nodes_[i].gid);
    lru_.Unlink(Links(kLru), i);
    lru_.PushBack(Links(kLru), i);
  }
  bool Contains(EntryId id) const override { return nodes_.Find(id) != kNil; }
  size_t size() const override { return nodes_.size(); }

  std::string_view following() const override {
    SyncConst();
    return experts_.empty() ? std::string_view("lru") : experts_[Leader()].policy->name();
  }

 private:
  static constexpr size_t kLru = kMaxExperts;  // link slot of the LRU list
  static constexpr size_t kResidentSlot = 0;    // shared_'s slot of the resident entries (by GhostId)
  static constexpr uint32_t kMaxRate = 64;     // sampled shadows: at most one key in 64
  static constexpr uint32_t kPublishEvery = 64;  // accesses between a group member's decisions
  static constexpr size_t kMaxPending = 256;      // queued hits; bounds the work one call replays
  static uint16_t Bit(size_t e) { return static_cast<uint16_t>(1u << e); }

  // A queued Touch: the access and the owner's clock when it happened.
  struct Pending {
    EntryId id;
    int64_t now_ns;
    uint32_t leader;  // the group's leader then (with a group)
    AccessInfo info;
  };
  // Replays the queued hits in order, each as Touch did before queueing:
  // into the experts at its own time, then the entry's class and recency.
  void Flush() {
    for (const Pending& p : pending_) {
      const uint32_t i = nodes_.Find(p.id);
      if (i == kNil) continue;
      replay_clock_.Set(p.now_ns);
      replay_leader_ = p.leader;
      Access(nodes_[i].gid, p.info);
      nodes_[i].cls = p.info.priority;
      lru_.Unlink(Links(kLru), i);
      lru_.PushFront(Links(kLru), i);
    }
    pending_.clear();
    replay_leader_ = kNoLeader;
  }
  // A group member publishes its scores `mine` and moves the group's leader
  // from `lead` to the best sum when it wins by the margin.
  void Decide(const double* mine, bool chain_seen, size_t lead) {
    const double margin = chain_seen ? kChainMargin : kBlockMargin;
    std::array<double, kMaxExperts> sum{};
    group_->Publish(slot_, mine, experts_.size());
    group_->Sum(sum.data(), experts_.size());
    size_t best = lead;
    for (size_t e = 0; e < experts_.size(); ++e)
      if (sum[e] > sum[best]) best = e;
    if (best != lead && sum[best] > sum[lead] * (1.0 + margin) + 1.0) group_->set_leader(static_cast<uint32_t>(best));
  }
  // Before any operation but Touch: the queue replayed, and the experts' clock at now.
  void Sync() {
    if (!pending_.empty()) Flush();
    replay_clock_.Set(clock_->NowNanos());
  }
  // The const queries answer for the replayed state too. The queue is part of
  // the policy's state, not of what it answers, and the owner never holds a
  // const policy object (it makes them), so this cast writes no const object.
  void SyncConst() const { const_cast<AdaptivePolicy*>(this)->Sync(); }

  // The expert followed: the group's choice when in a group (while a queued
  // access replays, the choice when it happened).
  size_t Leader() const {
    if (!group_) return leader_;
    const uint32_t l = replay_leader_ != kNoLeader ? replay_leader_ : group_->leader();
    return l < experts_.size() ? l : 0;
  }

  // A resident entry, on the LRU list and on the list of every tracked
  // simulation that does not hold it: one link pair per list (slot s).
  struct Node {
    EntryId id = 0;
    uint64_t gid = 0;
    uint16_t in = 0;  // bit e: expert e holds gid
    Priority cls = 0;  // AccessInfo::priority of the latest access
    std::array<uint32_t, kMaxExperts + 1> prev{}, next{};
  };
  using Pool = BasicNodePool<Node>;
  struct SlotLinks {
    Pool& pool;
    size_t s;
    uint32_t& prev(uint32_t i) const { return pool[i].prev[s]; }
    uint32_t& next(uint32_t i) const { return pool[i].next[s]; }
  };
  using List = BasicDList<SlotLinks>;
  SlotLinks Links(size_t s) { return {nodes_, s}; }
  struct Expert {
    std::unique_ptr<EvictionPolicy> policy;
    double score = 0;    // decayed prefix hits (or cost saved)
    bool prefix = true;  // the current request's chain has only hit so far
  };

  uint32_t Alloc(EntryId id, uint64_t gid) {
    const uint32_t i = nodes_.Alloc(id);
    nodes_[i].gid = gid;
    shared_.Assign(gid, kResidentSlot, i);
    return i;
  }
  // The simulations: 0..E-1 the experts, E (rate_ > 1) the full copy of the leader.
  EvictionPolicy& Sim(size_t s) { return s < experts_.size() ? *experts_[s].policy : *full_; }
  const EvictionPolicy& Sim(size_t s) const { return s < experts_.size() ? *experts_[s].policy : *full_; }
  // The simulations whose contents the real cache tracks (Node::in, diff_):
  // every expert when they see every key, else the full copy alone.
  size_t FirstTracked() const { return rate_ == 1 ? 0 : experts_.size(); }
  size_t EndTracked() const { return rate_ == 1 ? experts_.size() : experts_.size() + 1; }
  bool Tracked(size_t s) const { return s >= FirstTracked() && s < EndTracked(); }
  size_t SampledCap() const { return std::max<size_t>(c_ / rate_, 1); }
  // Whether the experts see this key (a fixed hash bucket of one in rate_).
  bool Sampled(uint64_t gid) const {
    uint64_t z = gid + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return ((z ^ (z >> 31)) & (rate_ - 1)) == 0;
  }
  // The tracked simulation the real cache follows; with sampled experts, the
  // full copy, rebuilt first if the leader changed.
  size_t LeadSlot() {
    if (rate_ == 1) return Leader();
    EnsureFull();
    return experts_.size();
  }
  // The sampling rate for capacity c: the largest power of two (<= kMaxRate)
  // that leaves the experts at least floor_ entries; 1 when floor_ is 0.
  uint32_t RateFor(size_t c) const {
    uint32_t r = 1;
    if (floor_ == 0) return r;
    while (r < kMaxRate && c / (2 * size_t{r}) >= floor_) r *= 2;
    return r;
  }
  // Changes the sampling rate (an owner whose real capacity turned out far
  // below the hint: a store class whose pages went to other classes). The
  // experts start over holding the resident entries they sample, oldest
  // first; their scores are kept. O(resident x experts), at most log2(kMaxRate)
  // times in a policy's life, since the rate only falls.
  void SetRate(uint32_t r) {
    rate_ = r;
    PolicyOptions xo = xo_;
    xo.capacity_hint = SampledCap();
    for (Expert& x : experts_) x.policy.reset();
    shared_.KeepOnly(kResidentSlot);  // the new experts take the same slots
    for (size_t e = 0; e < experts_.size(); ++e) experts_[e].policy = makers_[e](xo);
    full_.reset();
    for (List& l : diff_) l = List{};
    uint16_t all = 0;
    for (size_t e = 0; e < experts_.size(); ++e) all |= Bit(e);
    for (uint32_t i = lru_.tail; i != kNil; i = nodes_[i].prev[kLru]) {
      AccessInfo a;
      a.priority = nodes_[i].cls;
      if (rate_ == 1 || Sampled(nodes_[i].gid))
        for (Expert& x : experts_) x.policy->Insert(nodes_[i].gid, a);
      nodes_[i].in = rate_ == 1 ? all : 0;
    }
    if (rate_ > 1) EnsureFull();
  }

  // With sampled experts: a full simulation of the leader at capacity c. When
  // the leader changes it starts over from the resident entries, oldest
  // first, so it holds exactly what the real cache holds (its own history of
  // the entries that left, ghosts and counts, is lost). O(resident) per change
  // of leader, O(1) otherwise.
  void EnsureFull() {
    const size_t l = Leader();
    if (full_ && full_for_ == l) return;
    PolicyOptions fo = xo_;
    fo.capacity_hint = c_;
    fo.shared_index = nullptr;  // remade on every change of leader: a map of its own
    full_ = makers_[l](fo);
    full_for_ = l;
    const size_t s = experts_.size();
    diff_[s] = List{};
    for (uint32_t i = lru_.tail; i != kNil; i = nodes_[i].prev[kLru]) {
      AccessInfo a;
      a.priority = nodes_[i].cls;
      full_->Insert(nodes_[i].gid, a);
      nodes_[i].in |= Bit(s);
    }
  }

  // Unlinks node i and recycles it; the caller has taken it from nodes_ (Pool::Take).
  void Free(uint32_t i) {
    Node& n = nodes_[i];
    lru_.Unlink(Links(kLru), i);
    for (size_t s = FirstTracked(); s < EndTracked(); ++s)
      if (!(n.in & Bit(s))) diff_[s].Unlink(Links(s), i);
    if (shared_.Get(n.gid, kResidentSlot) == i) shared_.Clear(n.gid, kResidentSlot);
    nodes_.Recycle(i);
  }
  uint32_t Resident(uint64_t gid) const {
    return shared_.Get(gid, kResidentSlot);
  }

  // Evicts simulation s's victims until it holds at most `n` entries.
  void Trim(size_t s, size_t n) {
    EvictionPolicy& p = Sim(s);
    const bool tracked = Tracked(s);
    while (p.size() > n) {
      const std::optional<EntryId> v = p.Victim();
      if (!v) break;
      p.Remove(*v, RemoveReason::kEvicted);
      if (!tracked) continue;
      if (const uint32_t r = Resident(*v); r != kNil && (nodes_[r].in & Bit(s))) {
        nodes_[r].in &= static_cast<uint16_t>(~Bit(s));
        diff_[s].PushFront(Links(s), r);
      }
    }
  }

  // Replays one access into every expert, scores them, and picks the leader.
  void Access(uint64_t gid, const AccessInfo& info) {
    const double w = cost_aware_ && info.cost > 0 ? info.cost : 1.0;
    chain_seen_ = chain_seen_ || info.depth > 0;
    const uint32_t resident = Resident(gid);
    if (rate_ == 1 || Sampled(gid)) {
      // A sampled hit stands for rate_ hits, so scores keep the scale (and
      // the margins their meaning) whatever the rate.
      const double decay = 1.0 - static_cast<double>(rate_) / window_;
      const double gain = w * static_cast<double>(rate_);
      const size_t cap = SampledCap();
      for (size_t e = 0; e < experts_.size(); ++e) {
        Expert& x = experts_[e];
        EvictionPolicy& p = *x.policy;
        if (info.depth == 0) x.prefix = true;
        x.score *= decay;
        if (p.TouchIfPresent(gid, info)) {
          if (x.prefix && !info.refresh) x.score += gain;
          continue;
        }
        x.prefix = false;
        if (!p.Admit(gid, info)) continue;
        Trim(e, cap - 1);
        p.Insert(gid, info);
        if (rate_ == 1) Track(e, resident);
      }
    } else if (info.depth == 0) {
      for (Expert& x : experts_) x.prefix = true;
    }
    if (rate_ > 1) {  // the full copy of the leader sees every key
      const size_t s = LeadSlot();
      EvictionPolicy& p = *full_;
      if (!p.TouchIfPresent(gid, info) && p.Admit(gid, info)) {
        Trim(s, std::max<size_t>(c_, 1) - 1);
        p.Insert(gid, info);
        Track(s, resident);
      }
    }
    if (group_) {  // publish, and decide on the group's sums
      if (++since_publish_ < kPublishEvery) return;
      since_publish_ = 0;
      std::array<double, kMaxExperts> mine{};
      for (size_t e = 0; e < experts_.size(); ++e) mine[e] = experts_[e].score;
      const uint32_t now_leading = group_->leader();  // as it is now, also in a replay
      Decide(mine.data(), chain_seen_, now_leading < experts_.size() ? now_leading : 0);
      return;
    }
    const double margin = chain_seen_ ? kChainMargin : kBlockMargin;
    size_t best = leader_;
    for (size_t e = 0; e < experts_.size(); ++e)
      if (experts_[e].score > experts_[best].score) best = e;
    if (best != leader_ && experts_[best].score > experts_[leader_].score * (1.0 + margin) + 1.0) leader_ = best;
  }

  // Simulation s now holds the entry in node `resident` (kNil: none).
  void Track(size_t s, uint32_t resident) {
    if (resident != kNil && !(nodes_[resident].in & Bit(s))) {
      nodes_[resident].in |= Bit(s);
      diff_[s].Unlink(Links(s), resident);
    }
  }

  // How much a challenger must beat the leader by: 2% when the owner gives
  // chain positions (scores are prefix hits), 10% when it does not (scores
  // are block hits, a noisy proxy: a chain broken in another stripe or node
  // voids a hit counted here, and every switch costs misses while the cache
  // converges to the new leader).
  static constexpr double kChainMargin = 0.02;
  static constexpr double kBlockMargin = 0.10;

  size_t c_;
  bool cost_aware_;
  Clock* clock_;                       // the owner's
  ManualClock replay_clock_{0};        // the experts': the time of the access replayed
  std::vector<Pending> pending_;       // queued Touches, oldest first
  static constexpr uint32_t kNoLeader = UINT32_MAX;
  uint32_t replay_leader_ = kNoLeader;  // Pending::leader of the access replaying now
  double window_;
  SharedIndex shared_;                 // the resident entries by GhostId, and the experts' entries
                                       // (before experts_: it outlives them)
  PolicyOptions xo_;                   // how the experts are made (leaf_first, no group, shared_)
  size_t floor_ = 0;                   // PolicyOptions::shadow_sample_floor (0: never sample)
  uint32_t rate_ = 1;                  // the experts see one key in rate_
  std::vector<Expert> experts_;
  std::vector<ExpertMaker> makers_;    // experts_[i] was made by makers_[i]
  std::unique_ptr<EvictionPolicy> full_;  // rate_ > 1: the leader at full capacity
  size_t full_for_ = 0;                // ... made by makers_[full_for_]
  size_t leader_ = 0;                    // without a group
  std::shared_ptr<PolicyGroup> group_;   // with one: Leader() is its choice
  int slot_ = -1;
  uint32_t since_publish_ = 0;
  bool chain_seen_ = false;  // the owner passes AccessInfo::depth: scores are prefix hits
  bool announced_ = false;   // Admit already replayed the access of announced_gid_
  uint64_t announced_gid_ = 0;
  Pool nodes_;  // resident entries by EntryId
  List lru_;
  std::array<List, kMaxExperts> diff_;
};

}  // namespace

// The experts, in order of preference on ties (the first leads at start).
// Each earns its place on some workload (docs/eviction.md, "The adaptive
// default"): lru-priority is the configured class policy, s3-fifo adapts
// recency and frequency with a ghost list, turnover-priority ages classes by
// the cache's own turnover, freq-class and freq-class-turnover rank by class,
// then by accumulated request sharing, lru keeps the cache near LRU where every
// class rule loses, and turnover-freq (turnover-priority plus two classes per
// doubling of a block's accesses; not a factory policy) keeps re-read blocks
// of mixed traffic. Each expert costs every access, so one that adds no hits
// over these (ARC) is left out.
const std::vector<ExpertMaker>& Experts() {
  static const std::vector<ExpertMaker> kExperts{&MakeLruPriority, &MakeS3Fifo,            &MakeTurnoverPriority,
                                                 &MakeFreqClass,   &MakeFreqClassTurnover, &MakeLru,
                                                 &MakeTurnoverFreq};
  return kExperts;
}

std::unique_ptr<EvictionPolicy> MakeAdaptive(const PolicyOptions& o) {
  return std::make_unique<AdaptivePolicy>(o, Experts(), /*cost_aware=*/false);
}
std::unique_ptr<EvictionPolicy> MakeAdaptiveCost(const PolicyOptions& o) {
  return std::make_unique<AdaptivePolicy>(o, Experts(), /*cost_aware=*/true);
}

}  // namespace kvmesh::eviction_internal

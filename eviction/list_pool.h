// eviction/list_pool.h — index-linked doubly linked lists over a node pool,
// the building block of the list-based policies (LRU, LRU-priority, ...) and
// of adaptive's resident-entry lists. Nodes live in one vector and are
// recycled through a free list; an open addressing map finds a node by id. No
// allocation per operation once the pool and map have grown to the
// working-set size (reserve with capacity_hint).
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <utility>
#include <vector>

#include <absl/container/flat_hash_map.h>

#include "eviction/eviction_policy.h"

namespace kvmesh::eviction_internal {

inline constexpr uint32_t kNil = UINT32_MAX;

// The identity a policy remembers an entry by after it has left (ghost lists,
// frequency sketches): the key hash when the owner gives one (a block store's
// EntryIds are slot numbers, reused by other keys), else the id itself.
inline uint64_t GhostId(EntryId id, const AccessInfo& info) { return info.key_hash ? info.key_hash : id; }

// PolicyOptions::priority_classes clamped to 1..kMaxPriorityClasses.
inline uint8_t ClassCount(const PolicyOptions& o) {
  return static_cast<uint8_t>(std::clamp<uint32_t>(o.priority_classes, 1, kMaxPriorityClasses));
}

struct Node {
  EntryId id = 0;
  uint32_t prev = kNil;
  uint32_t next = kNil;
  int64_t last_ns = 0;  // last access time
  uint32_t freq = 0;    // access count
  uint64_t key = 0;     // policy-defined ordering key (LFU-DA priority, score sequence)
  float score = 0.0f;   // accumulated importance (score-based policies)
  uint8_t list = 0;     // which list the node is on (policy-defined)
  uint8_t cls = 0;      // priority class
  bool released = false;  // on the policy's list of released entries (EvictionPolicy::Release)
};

// One index for several node pools that key the same ids: the experts of
// "adaptive" (eviction/adaptive.cc) each simulate a cache of the same keys,
// and with a map apiece an access probed seven maps, whose memory together
// pushed the owner's own index out of the CPU caches. Here an id maps to one
// record holding each pool's node (a slot per pool, kNil where that pool does
// not hold the id), and the last two ids looked up are remembered, so the
// experts' calls for one access (a hit in each, or an eviction and an insert)
// cost one probe of the map instead of one per expert. adaptive keeps its
// own resident entries by GhostId in a slot too (Assign, KeepOnly). It only answers where
// each pool's node is: what a pool holds, and so what any policy decides, is
// the same as with a map per pool. Thread-safety: none (the pools' owner's).
class SharedIndex {
 public:
  static constexpr size_t kSlots = 9;  // adaptive's resident entries, seven experts and s3-fifo's ghosts

  // A slot for one more pool, or -1 when every slot is taken.
  int NewSlot() { return slots_ < kSlots ? static_cast<int>(slots_++) : -1; }
  void Reserve(size_t n) {
    if (n <= reserved_) return;
    reserved_ = n;
    map_.reserve(n);
    recs_.reserve(n);
  }
  // The node of `slot` for `id`; kNil when that pool does not hold it.
  uint32_t Get(EntryId id, size_t slot) const {
    const uint32_t r = Find(id);
    return r == kNil ? kNil : recs_[r].node[slot];
  }
  // REQUIRES: slot holds no node for id.
  void Set(EntryId id, size_t slot, uint32_t node) {
    uint32_t r = Find(id);
    if (r == kNil) r = Add(id);
    recs_[r].node[slot] = node;
  }
  // Sets the slot's node for id, replacing the one it held.
  void Assign(EntryId id, size_t slot, uint32_t node) {
    uint32_t r = Find(id);
    if (r == kNil) r = Add(id);
    recs_[r].node[slot] = node;
  }
  // Every slot but `keep` emptied (records left empty go) and the slots after
  // it free again, for pools made anew.
  void KeepOnly(size_t keep) {
    for (auto it = map_.begin(); it != map_.end();) {
      Record& rec = recs_[it->second];
      for (size_t k = 0; k < kSlots; ++k)
        if (k != keep) rec.node[k] = kNil;
      if (rec.node[keep] == kNil) {
        free_.push_back(it->second);
        map_.erase(it++);
      } else {
        ++it;
      }
    }
    recent_[0] = recent_[1] = Cached{};
    slots_ = keep + 1;
  }
  // Clears the slot's node for id and returns it (kNil: there was none). The
  // record goes once no slot holds a node.
  uint32_t Clear(EntryId id, size_t slot) {
    const uint32_t r = Find(id);
    if (r == kNil) return kNil;
    const uint32_t node = recs_[r].node[slot];
    if (node == kNil) return kNil;
    recs_[r].node[slot] = kNil;
    if (std::all_of(std::begin(recs_[r].node), std::end(recs_[r].node), [](uint32_t n) { return n == kNil; }))
      Drop(id, r);
    return node;
  }

 private:
  struct Record {
    uint32_t node[kSlots];
  };
  struct Cached {
    EntryId id = 0;
    uint32_t rec = kNil;
  };
  uint32_t Find(EntryId id) const {
    if (recent_[0].rec != kNil && recent_[0].id == id) return recent_[0].rec;
    if (recent_[1].rec != kNil && recent_[1].id == id) {
      std::swap(recent_[0], recent_[1]);
      return recent_[0].rec;
    }
    auto it = map_.find(id);
    if (it == map_.end()) return kNil;
    Remember(id, it->second);
    return it->second;
  }
  void Remember(EntryId id, uint32_t r) const {
    recent_[1] = recent_[0];
    recent_[0] = Cached{id, r};
  }
  uint32_t Add(EntryId id) {
    uint32_t r;
    if (!free_.empty()) {
      r = free_.back();
      free_.pop_back();
    } else {
      r = static_cast<uint32_t>(recs_.size());
      recs_.emplace_back();
    }
    std::fill(std::begin(recs_[r].node), std::end(recs_[r].node), kNil);
    map_.emplace(id, r);
    Remember(id, r);
    return r;
  }
  void Drop(EntryId id, uint32_t r) {
    map_.erase(id);
    free_.push_back(r);
    for (Cached& c : recent_)
      if (c.rec == r) c = Cached{};
  }

  size_t slots_ = 0;
  size_t reserved_ = 0;
  std::vector<Record> recs_;
  std::vector<uint32_t> free_;
  absl::flat_hash_map<EntryId, uint32_t> map_;
  mutable Cached recent_[2];  // the ids looked up last, the latest first
};

// A pool of nodes of type N, which has an `EntryId id` field; NodePool (of
// Node) serves the list-based policies, adaptive.cc keeps its own node type.
// Its index is a map of its own, or a slot of a SharedIndex (Share).
template <class N>
class BasicNodePool {
 public:
  // Index the pool's ids in a slot of `index` (nullptr, or no slot left: its
  // own map). Call before anything is allocated.
  void Share(SharedIndex* index) {
    if (index == nullptr) return;
    if (const int s = index->NewSlot(); s >= 0) {
      shared_ = index;
      slot_ = static_cast<size_t>(s);
    }
  }
  void Reserve(size_t n) {
    nodes_.reserve(n);
    if (shared_) shared_->Reserve(n);
    else index_.reserve(n);
  }
  // REQUIRES: id is not present.
  uint32_t Alloc(EntryId id) {
    uint32_t i;
    if (!free_.empty()) {
      i = free_.back();
      free_.pop_back();
      nodes_[i] = N{};
    } else {
      i = static_cast<uint32_t>(nodes_.size());
      nodes_.emplace_back();
    }
    nodes_[i].id = id;
    if (shared_) shared_->Set(id, slot_, i);
    else index_.emplace(id, i);
    ++size_;
    return i;
  }
  void Free(uint32_t i) {
    if (shared_) shared_->Clear(nodes_[i].id, slot_);
    else index_.erase(nodes_[i].id);
    --size_;
    free_.push_back(i);
  }
  // Find and Free in one probe of the map, for a policy's Remove: `id` is
  // forgotten at once, its node stays readable (fields and links, to unlink
  // it) until Recycle(i). kNil when `id` is not present.
  uint32_t Take(EntryId id) {
    uint32_t i;
    if (shared_) {
      i = shared_->Clear(id, slot_);
      if (i == kNil) return kNil;
    } else {
      auto it = index_.find(id);
      if (it == index_.end()) return kNil;
      i = it->second;
      index_.erase(it);
    }
    --size_;
    return i;
  }
  void Recycle(uint32_t i) { free_.push_back(i); }
  uint32_t Find(EntryId id) const {
    if (shared_) return shared_->Get(id, slot_);
    auto it = index_.find(id);
    return it == index_.end() ? kNil : it->second;
  }
  N& operator[](uint32_t i) { return nodes_[i]; }
  const N& operator[](uint32_t i) const { return nodes_[i]; }
  size_t size() const { return size_; }

 private:
  std::vector<N> nodes_;
  std::vector<uint32_t> free_;
  absl::flat_hash_map<EntryId, uint32_t> index_;  // unless shared_
  SharedIndex* shared_ = nullptr;
  size_t slot_ = 0;
  size_t size_ = 0;  // ids indexed
};
using NodePool = BasicNodePool<Node>;

// The links a list threads through: Node::prev/next of a NodePool's nodes.
// Implicit from the pool, so a policy passes its pool to the list calls.
struct NodeLinks {
  NodePool& pool;
  NodeLinks(NodePool& p) : pool(p) {}  // NOLINT(google-explicit-constructor)
  uint32_t& prev(uint32_t i) const { return pool[i].prev; }
  uint32_t& next(uint32_t i) const { return pool[i].next; }
};

// A doubly linked list of pool nodes by index: head = most recently used,
// tail = least recently used. `Links` gives a node's prev and next on this
// list (a node on several lists at once keeps a pair per list; adaptive.cc).
template <class Links>
struct BasicDList {
  uint32_t head = kNil;
  uint32_t tail = kNil;
  size_t size = 0;

  bool empty() const { return size == 0; }
  void PushFront(Links l, uint32_t i) {
    l.prev(i) = kNil;
    l.next(i) = head;
    if (head != kNil) l.prev(head) = i;
    head = i;
    if (tail == kNil) tail = i;
    ++size;
  }
  void PushBack(Links l, uint32_t i) {
    l.next(i) = kNil;
    l.prev(i) = tail;
    if (tail != kNil) l.next(tail) = i;
    tail = i;
    if (head == kNil) head = i;
    ++size;
  }
  // Links `i` right behind `after` (one step older). REQUIRES: after is on this list.
  void InsertAfter(Links l, uint32_t after, uint32_t i) {
    const uint32_t next = l.next(after);
    l.prev(i) = after;
    l.next(i) = next;
    if (next != kNil) l.prev(next) = i; else tail = i;
    l.next(after) = i;
    ++size;
  }
  void Unlink(Links l, uint32_t i) {
    const uint32_t prev = l.prev(i), next = l.next(i);
    if (prev != kNil) l.next(prev) = next; else head = next;
    if (next != kNil) l.prev(next) = prev; else tail = prev;
    l.prev(i) = l.next(i) = kNil;
    --size;
  }
};
using DList = BasicDList<NodeLinks>;

// Leaf-first placement of a request's chain (PolicyOptions::leaf_first). A
// policy that places every accessed entry at the front of a recency list
// calls Place instead of DList::PushFront. An access with AccessInfo::depth > 0
// that lands on the same list as the previous access of its request is linked
// right behind it, so a request's blocks end up ordered parent before child
// from the front: the list evicts a chain's deepest block first, never a
// parent whose cached children its eviction would make unreachable by prefix.
// Off (or depth 0, as from a block store): plain PushFront. O(1).
struct ChainPlacer {
  bool enabled = false;
  uint32_t last = kNil;        // the node placed by the previous access
  const DList* list = nullptr;  // ... and its list

  void Place(DList& l, NodePool& p, uint32_t i, const AccessInfo& info) {
    if (enabled && info.depth > 0 && last != kNil && last != i && list == &l) l.InsertAfter(p, last, i);
    else l.PushFront(p, i);
    last = i;
    list = &l;
  }
  // Call when node `i` leaves its list for good (Remove, before NodePool::Free).
  void Forget(uint32_t i) {
    if (last == i) last = kNil;
  }
};

// The victim search of a policy that compares the tails of its lists: keeps
// the tail offered with the lowest value, a tie going to the older entry.
struct LowestTail {
  uint32_t best = kNil;
  double value = 0;

  void Offer(const NodePool& p, uint32_t t, double v) {
    if (best == kNil || v < value || (v == value && p[t].last_ns < p[best].last_ns)) {
      best = t;
      value = v;
    }
  }
};

// EvictionPolicy::Release for a policy that keeps its released entries on a
// list of their own (Node::released set; the policy's Victim takes that
// list's tail first): moves node `i` from `from` to the tail of `released`.
inline void MoveToReleased(NodePool& p, uint32_t i, DList& from, DList& released, ChainPlacer& chain) {
  from.Unlink(p, i);
  p[i].released = true;
  released.PushBack(p, i);
  chain.Forget(i);
}

}  // namespace kvmesh::eviction_internal

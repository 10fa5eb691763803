// eviction/list_pool.h — index-linked doubly linked lists over a node pool,
// the building block of the list-based policies (LRU, LRU-priority, ...).
// Nodes live in one vector and are recycled through a free list; an open
// addressing map finds a node by id. No allocation per operation once the
// pool and map have grown to the working-set size (reserve with capacity_hint).
#pragma once

#include <cstdint>
#include <vector>

#include <absl/container/flat_hash_map.h>

#include "eviction/eviction_policy.h"

namespace kvmesh::eviction_internal {

inline constexpr uint32_t kNil = UINT32_MAX;

// The identity a policy remembers an entry by after it has left (ghost lists,
// frequency sketches): the key hash when the owner gives one (a block store's
// EntryIds are slot numbers, reused by other keys), else the id itself.
inline uint64_t GhostId(EntryId id, const AccessInfo& info) { return info.key_hash ? info.key_hash : id; }

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

class NodePool {
 public:
  void Reserve(size_t n) {
    nodes_.reserve(n);
    index_.reserve(n);
  }
  // REQUIRES: id is not present.
  uint32_t Alloc(EntryId id) {
    uint32_t i;
    if (!free_.empty()) {
      i = free_.back();
      free_.pop_back();
      nodes_[i] = Node{};
    } else {
      i = static_cast<uint32_t>(nodes_.size());
      nodes_.emplace_back();
    }
    nodes_[i].id = id;
    index_.emplace(id, i);
    return i;
  }
  void Free(uint32_t i) {
    index_.erase(nodes_[i].id);
    free_.push_back(i);
  }
  // Find and Free in one probe of the map, for a policy's Remove: `id` is
  // forgotten at once, its node stays readable (fields and links, to unlink
  // it) until Recycle(i). kNil when `id` is not present.
  uint32_t Take(EntryId id) {
    auto it = index_.find(id);
    if (it == index_.end()) return kNil;
    const uint32_t i = it->second;
    index_.erase(it);
    return i;
  }
  void Recycle(uint32_t i) { free_.push_back(i); }
  uint32_t Find(EntryId id) const {
    auto it = index_.find(id);
    return it == index_.end() ? kNil : it->second;
  }
  Node& operator[](uint32_t i) { return nodes_[i]; }
  const Node& operator[](uint32_t i) const { return nodes_[i]; }
  size_t size() const { return index_.size(); }

 private:
  std::vector<Node> nodes_;
  std::vector<uint32_t> free_;
  absl::flat_hash_map<EntryId, uint32_t> index_;
};

// head = most recently used, tail = least recently used.
struct DList {
  uint32_t head = kNil;
  uint32_t tail = kNil;
  size_t size = 0;

  bool empty() const { return size == 0; }
  void PushFront(NodePool& p, uint32_t i) {
    p[i].prev = kNil;
    p[i].next = head;
    if (head != kNil) p[head].prev = i;
    head = i;
    if (tail == kNil) tail = i;
    ++size;
  }
  void PushBack(NodePool& p, uint32_t i) {
    p[i].next = kNil;
    p[i].prev = tail;
    if (tail != kNil) p[tail].next = i;
    tail = i;
    if (head == kNil) head = i;
    ++size;
  }
  // Links `i` right behind `after` (one step older). REQUIRES: after is on this list.
  void InsertAfter(NodePool& p, uint32_t after, uint32_t i) {
    Node& a = p[after];
    p[i].prev = after;
    p[i].next = a.next;
    if (a.next != kNil) p[a.next].prev = i; else tail = i;
    a.next = i;
    ++size;
  }
  void Unlink(NodePool& p, uint32_t i) {
    Node& n = p[i];
    if (n.prev != kNil) p[n.prev].next = n.next; else head = n.next;
    if (n.next != kNil) p[n.next].prev = n.prev; else tail = n.prev;
    n.prev = n.next = kNil;
    --size;
  }
};

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

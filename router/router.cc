#include "kvmesh/router.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <shared_mutex>

#include "router/device_copy.h"
#include "router/replica_plan.h"
#include "router/shard_map.h"
#include "transport/shard_channel.h"

namespace kvmesh {

namespace {
// A consistent (map, channels) pair; replaced whole on UpdateMap.
struct View {
  std::shared_ptr<const ShardMap> map;
  std::vector<std::shared_ptr<ShardChannel>> channels;
};

struct Counters {
  std::atomic<uint64_t> puts{0}, put_blocks{0}, gets{0}, get_blocks{0}, get_hits{0};
  std::atomic<uint64_t> match_calls{0}, match_blocks_asked{0}, match_blocks_hit{0}, node_errors{0};
};

using SteadyClock = std::chrono::steady_clock;

// One node's share of a batch in one round: the indices of its items in the
// caller's batch, the sub-batch sent to it, and the call while in flight.
struct NodeBatch {
  std::vector<size_t> idx;
  std::vector<PutItem> put;
  std::vector<GetItem> get;
  std::vector<BlockKey> keys;
  std::vector<uint8_t> found;
  std::vector<Status> statuses;
  ChannelCall call;
};

// Per-thread scratch for grouping a batch by node: no allocation per call
// once warm (the channels' ChannelCall states included).
struct Scratch {
  std::vector<NodeBatch> nodes;  // by node index
  std::vector<uint32_t> active;  // nodes with items this round, ascending
  std::vector<uint8_t> pending;  // per item of the caller's batch: asked at the next rank
  std::vector<WriteMerge> merged;  // per item of the caller's batch: its replicas' PUT answers
  void Reset(size_t n) {
    if (nodes.size() < n) nodes.resize(n);
    for (NodeBatch& b : nodes) b.idx.clear();
    active.clear();
  }
};
thread_local Scratch t_scratch;
}  // namespace

struct Router::Impl {
  ModelSpec model;
  RouterOptions options;
  KeyDeriver deriver;
  mutable std::mutex mu;
  std::shared_ptr<const View> view;  // guarded by mu
  Counters counters;

  Impl(const ModelSpec& m, RouterOptions o)
      : model(m), options(std::move(o)), deriver(m.model_id, options.tenant_salt, m.block_tokens) {}

  std::shared_ptr<const View> Snapshot() const {
    std::lock_guard<std::mutex> lock(mu);
    return view;
  }
  // The replica plan's stale-epoch rule (router/replica_plan.h): after a
  // pass that saw StaleEpoch (stale), true when the map was refreshed (once
  // per operation, with the refresh hook) and the operation is to run again.
  bool Refreshed(Router& self, EpochRetry& retry, bool stale) {
    return retry.WantsRefresh(stale) && options.refresh && retry.Refreshed(options.refresh(self));
  }
  // Runs pass(view, &stale) on the current view, and once more on the
  // refreshed view when a node answered StaleEpoch (Refreshed).
  template <typename Pass>
  void WithRefresh(Router& self, Pass pass) {
    EpochRetry retry;
    for (;;) {
      bool stale = false;
      pass(*Snapshot(), &stale);
      if (!Refreshed(self, retry, stale)) return;
    }
  }
  // Bookkeeping shared by every node call: a StaleEpoch answer asks for a
  // refresh; any call-level failure counts as a node error (its items miss).
  void NoteCall(const Status& s, bool* stale) {
    if (EpochRetry::IsStale(s)) *stale = true;
    if (!s.ok()) counters.node_errors.fetch_add(1, std::memory_order_relaxed);
  }

  // One round of per-node calls, to the nodes in sc.active.
  // call(channel, batch, options, ChannelCall* c) fills the node's sub-batch
  // and calls it: synchronously when c is null (returning the call's Status),
  // else started on c (returning OK). merge(batch, status) folds the node's
  // answer into the caller's items, in node order either way, so fan-out and
  // serial give the same results.
  //
  // Fan-out needs two or more nodes and at least one asynchronous channel;
  // otherwise (one node, in-process channels) the calls run directly as they
  // always did. When fanning out, every call of the operation shares one
  // deadline, set by the first round that fans out (*deadline, zero until then).
  template <typename Call, typename Merge>
  void FanOut(const View& view, Scratch& sc, const RequestOptions& o, SteadyClock::time_point* deadline, bool* stale,
              Call call, Merge merge) {
    bool fan = false;
    if (options.parallel_fanout && sc.active.size() > 1)
      for (uint32_t n : sc.active) fan = fan || view.channels[n]->async_calls();
    if (!fan) {
      for (uint32_t n : sc.active) {
        Status s = call(*view.channels[n], sc.nodes[n], o, nullptr);
        NoteCall(s, stale);
        merge(sc.nodes[n], s);
      }
      return;
    }
    if (*deadline == SteadyClock::time_point{})
      *deadline = SteadyClock::now() + std::chrono::milliseconds(o.timeout_ms > 0 ? o.timeout_ms : options.timeout_ms);
    const int64_t left =
        std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - SteadyClock::now()).count();
    if (left <= 0) {  // an earlier round (or pass) used the whole timeout
      for (uint32_t n : sc.active) {
        Status s = DeadlineExceeded("router operation ran out of time");
        NoteCall(s, stale);
        merge(sc.nodes[n], s);
      }
      return;
    }
    RequestOptions ro = o;
    ro.timeout_ms = left;
    for (uint32_t n : sc.active) (void)call(*view.channels[n], sc.nodes[n], ro, &sc.nodes[n].call);
    for (uint32_t n : sc.active) {
      Status s = sc.nodes[n].call.Wait();
      NoteCall(s, stale);
      merge(sc.nodes[n], s);
    }
  }
  // Sends `keys` to every replica of each: per replica rank, one batch per
  // node, whose keys and statuses are filled before send(channel, batch,
  // options, ChannelCall* c) calls the node (as FanOut's call does). Returns
  // the first call-level failure (per-key answers such as NotFound are fine).
  template <typename Send>
  Status ToEveryReplica(Router& self, std::span<const BlockKey> keys, const RequestOptions& o, Send send);
  // The node of handle h in `view`: by index when the map is the one the
  // handle was made under, else by node id.
  Result<size_t> Resolve(const View& view, const SequenceHandle& h) const {
    const auto& nodes = view.map->nodes();
    if (h.node < nodes.size() && nodes[h.node].id == h.node_id) return size_t{h.node};
    const int i = view.map->IndexOf(h.node_id);
    if (i < 0)
      return Unavailable("node \"" + h.node_id + "\" holding sequence " + std::to_string(h.id) +
                         " is no longer in the shard map");
    return static_cast<size_t>(i);
  }
  // Runs call(channel) on the node of h; a StaleEpoch answer refreshes the map
  // (when a hook is set) and retries once.
  template <typename T, typename Call>
  Result<T> OnSequenceNode(Router& self, const SequenceHandle& h, Call call) {
    EpochRetry retry;
    for (;;) {
      std::shared_ptr<const View> v = Snapshot();
      KVMESH_ASSIGN_OR_RETURN(size_t node, Resolve(*v, h));
      Result<T> r = call(*v->channels[node]);
      bool stale = false;
      if (!r.ok()) NoteCall(r.status(), &stale);
      if (!Refreshed(self, retry, stale)) return r;
    }
  }
  std::atomic<uint64_t> spread{0};  // places sequences without a full prefix block

  // Registered memory (RegisterMemory), sorted by base. Lock order: mu, then regions_mu.
  mutable std::shared_mutex regions_mu;
  std::vector<MemoryRegion> regions;  // guarded by regions_mu
  uint64_t next_region = 1;           // guarded by regions_mu
  std::map<uint64_t, std::shared_ptr<std::byte>> allocated;  // AllocateMemory's, by region; guarded by mu
  std::atomic<bool> any_device{false};

  // The device region holding [p, p + n), if any.
  const MemoryRegion* DeviceRegionOf(const void* p, size_t n) const {
    for (const MemoryRegion& r : regions)
      if (r.kind == MemoryKind::kDevice && r.Contains(p, n)) return &r;
    return nullptr;
  }
  void RegisterAll(const std::vector<std::shared_ptr<ShardChannel>>& channels) {
    std::shared_lock<std::shared_mutex> lock(regions_mu);
    for (const MemoryRegion& r : regions)
      if (r.kind == MemoryKind::kHost)
        for (const auto& ch : channels) (void)ch->RegisterMemory(r);  // a failure: bounce path
  }

  Range Layers(const RequestOptions& o) const { return o.layers.empty() ? Range{0, model.num_layers} : o.layers; }
  Range Heads(const RequestOptions& o) const { return o.heads.empty() ? Range{0, model.num_kv_heads} : o.heads; }
};

Router::Router(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Router::~Router() = default;

Result<std::unique_ptr<Router>> Router::Create(const ModelSpec& model, std::shared_ptr<const ShardMap> map,
                                               std::vector<std::shared_ptr<ShardChannel>> channels,
                                               RouterOptions options) {
  KVMESH_RETURN_IF_ERROR(model.Validate());
  if (!map) return InvalidArgument("router needs a shard map");
  if (channels.size() != map->nodes().size())
    return InvalidArgument("router needs one channel per node of the shard map");
  auto impl = std::make_unique<Impl>(model, std::move(options));
  impl->view = std::make_shared<View>(View{std::move(map), std::move(channels)});
  return std::unique_ptr<Router>(new Router(std::move(impl)));
}

const ModelSpec& Router::model() const { return impl_->model; }
uint32_t Router::block_tokens() const { return impl_->model.block_tokens; }
uint64_t Router::epoch() const { return impl_->Snapshot()->map->epoch(); }
std::shared_ptr<const ShardMap> Router::map() const { return impl_->Snapshot()->map; }

Status Router::UpdateMap(std::shared_ptr<const ShardMap> map, std::vector<std::shared_ptr<ShardChannel>> channels) {
  if (!map || channels.size() != map->nodes().size())
    return InvalidArgument("UpdateMap needs a map and one channel per node");
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (map->epoch() <= impl_->view->map->epoch())
    return FailedPrecondition("shard map epoch " + std::to_string(map->epoch()) + " is not newer than " +
                              std::to_string(impl_->view->map->epoch()));
  impl_->RegisterAll(channels);
  impl_->view = std::make_shared<View>(View{std::move(map), std::move(channels)});
  return Status::Ok();
}

Result<MemoryRegion> Router::RegisterMemory(void* base, size_t bytes, MemoryKind kind) {
  Impl& im = *impl_;
  if (base == nullptr || bytes == 0) return InvalidArgument("RegisterMemory needs a non-empty range");
  if (kind == MemoryKind::kDevice && !DeviceCopyAvailable())
    return Unimplemented("device memory needs a kvmesh built with CUDA");
  std::lock_guard<std::mutex> lock(im.mu);  // against UpdateMap: every channel of every view sees it
  MemoryRegion r;
  {
    std::unique_lock<std::shared_mutex> rl(im.regions_mu);
    const auto b = reinterpret_cast<uintptr_t>(base);
    for (const MemoryRegion& o : im.regions) {
      const auto ob = reinterpret_cast<uintptr_t>(o.base);
      if (b < ob + o.bytes && ob < b + bytes)
        return InvalidArgument("memory overlaps registered region " + std::to_string(o.id));
    }
    r = MemoryRegion{im.next_region++, static_cast<std::byte*>(base), bytes, kind};
    im.regions.push_back(r);
    std::sort(im.regions.begin(), im.regions.end(),
              [](const MemoryRegion& x, const MemoryRegion& y) { return x.base < y.base; });
    if (kind == MemoryKind::kDevice) im.any_device.store(true);
  }
  if (kind == MemoryKind::kHost)
    for (const auto& ch : im.view->channels) (void)ch->RegisterMemory(r);  // a failure: bounce path
  return r;
}

Result<MemoryRegion> Router::AllocateMemory(size_t bytes, std::shared_ptr<std::byte>* owner) {
  Impl& im = *impl_;
  if (bytes == 0) return InvalidArgument("AllocateMemory needs a size");
  std::shared_ptr<std::byte> mem;
  if (im.options.allocate_memory) {
    KVMESH_ASSIGN_OR_RETURN(mem, im.options.allocate_memory(bytes));
  }
  if (!mem) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return ResourceExhausted("mmap of " + std::to_string(bytes) + " bytes failed");
    mem = std::shared_ptr<std::byte>(static_cast<std::byte*>(p), [bytes](std::byte* q) { ::munmap(q, bytes); });
  }
  KVMESH_ASSIGN_OR_RETURN(MemoryRegion r, RegisterMemory(mem.get(), bytes, MemoryKind::kHost));
  if (owner != nullptr) *owner = mem;
  std::lock_guard<std::mutex> lock(im.mu);
  im.allocated.emplace(r.id, std::move(mem));
  return r;
}

Status Router::UnregisterMemory(uint64_t id) {
  Impl& im = *impl_;
  std::shared_ptr<std::byte> owned;  // freed last, once every channel forgot the region
  std::lock_guard<std::mutex> lock(im.mu);
  {
    std::unique_lock<std::shared_mutex> rl(im.regions_mu);
    auto it = std::find_if(im.regions.begin(), im.regions.end(), [&](const MemoryRegion& r) { return r.id == id; });
    if (it == im.regions.end()) return NotFound("no registered memory region " + std::to_string(id));
    im.regions.erase(it);
    bool dev = false;
    for (const MemoryRegion& r : im.regions) dev = dev || r.kind == MemoryKind::kDevice;
    im.any_device.store(dev);
  }
  for (const auto& ch : im.view->channels) ch->UnregisterMemory(id);
  if (auto it = im.allocated.find(id); it != im.allocated.end()) {
    owned = std::move(it->second);
    im.allocated.erase(it);
  }
  return Status::Ok();
}

std::vector<BlockKey> Router::Keys(std::span<const TokenId> tokens, const RequestOptions& o) const {
  return impl_->deriver.Keys(tokens, impl_->Layers(o), impl_->Heads(o));
}

namespace {

// One round of the replica plan (router/replica_plan.h PlaceRank): groups
// the indices i < n for which want(i) holds by the node at replica `rank` of
// key_of(i) (into sc.nodes[node].idx, the nodes used into sc.active).
// Returns false when no index was placed.
template <typename KeyOf, typename Want>
bool GroupByNode(const ShardMap& map, size_t n, const Affinity& hint, uint32_t rank, KeyOf key_of, Want want,
                 Scratch& sc) {
  sc.Reset(map.nodes().size());
  PlaceRank(map, n, hint, rank, key_of, want, [&](size_t i, uint32_t node) { sc.nodes[node].idx.push_back(i); });
  for (uint32_t node = 0; node < map.nodes().size(); ++node)
    if (!sc.nodes[node].idx.empty()) sc.active.push_back(node);
  return !sc.active.empty();
}

}  // namespace

Status Router::PutBatch(std::span<PutItem> items, const RequestOptions& o) {
  Impl& im = *impl_;
  if (im.any_device.load(std::memory_order_relaxed)) {
    // Blocks in device memory go through host copies (no transport moves GPU memory).
    std::vector<std::vector<std::byte>> host;
    std::vector<PutItem> staged(items.begin(), items.end());
    {
      std::shared_lock<std::shared_mutex> rl(im.regions_mu);
      for (PutItem& it : staged) {
        if (im.DeviceRegionOf(it.data.data(), it.data.size()) == nullptr) continue;
        host.emplace_back(it.data.size());
        KVMESH_RETURN_IF_ERROR(CopyFromDevice(host.back().data(), it.data.data(), it.data.size()));
        it.data = host.back();
      }
    }
    if (!host.empty()) {
      Status s = PutBatchHost(staged, o);
      for (size_t i = 0; i < items.size(); ++i) items[i].status = staged[i].status;
      return s;
    }
  }
  return PutBatchHost(items, o);
}

Status Router::PutBatchHost(std::span<PutItem> items, const RequestOptions& o) {
  Impl& im = *impl_;
  im.counters.puts.fetch_add(1, std::memory_order_relaxed);
  im.counters.put_blocks.fetch_add(items.size(), std::memory_order_relaxed);
  SteadyClock::time_point deadline{};
  im.WithRefresh(*this, [&](const View& view, bool* stale) {
    Scratch& sc = t_scratch;
    std::vector<WriteMerge>& merged = sc.merged;
    merged.assign(items.size(), WriteMerge{});
    // Every replica gets every block; the replica plan merges their answers (WriteMerge).
    for (uint32_t rank = 0; rank < StartRanks(*view.map, ReplicaOp::kPut); ++rank) {
      auto key_of = [&](size_t i) { return items[i].key; };
      if (!GroupByNode(*view.map, items.size(), o.affinity, rank, key_of, [](size_t) { return true; }, sc)) break;
      auto call = [&](ShardChannel& ch, NodeBatch& b, const RequestOptions& ro, ChannelCall* c) {
        b.put.clear();
        for (size_t i : b.idx) b.put.push_back(PutItem{items[i].key, items[i].data, {}});
        if (c == nullptr) return ch.Put(b.put, ro);
        ch.StartPut(b.put, ro, c);
        return Status::Ok();
      };
      auto merge = [&](NodeBatch& b, const Status& s) {
        for (size_t k = 0; k < b.idx.size(); ++k) merged[b.idx[k]].Add(rank, s.ok() ? b.put[k].status : s);
      };
      im.FanOut(view, sc, o, &deadline, stale, call, merge);
    }
    for (size_t i = 0; i < items.size(); ++i) items[i].status = merged[i].Result();
  });
  for (const PutItem& it : items)
    if (!it.status.ok()) return it.status;
  return Status::Ok();
}

Status Router::GetBatch(std::span<GetItem> items, const RequestOptions& o) {
  Impl& im = *impl_;
  if (im.any_device.load(std::memory_order_relaxed)) {
    // Destinations in device memory are read into host copies, then copied up.
    std::vector<std::vector<std::byte>> host;
    std::vector<size_t> which;
    std::vector<GetItem> staged(items.begin(), items.end());
    {
      std::shared_lock<std::shared_mutex> rl(im.regions_mu);
      for (size_t i = 0; i < staged.size(); ++i) {
        if (im.DeviceRegionOf(staged[i].dst.data(), staged[i].dst.size()) == nullptr) continue;
        host.emplace_back(staged[i].dst.size());
        staged[i].dst = host.back();
        which.push_back(i);
      }
    }
    if (!host.empty()) {
      KVMESH_RETURN_IF_ERROR(GetBatchHost(staged, o));
      for (size_t i = 0; i < items.size(); ++i) {
        items[i].size = staged[i].size;
        items[i].status = staged[i].status;
      }
      for (size_t k = 0; k < which.size(); ++k) {
        GetItem& it = items[which[k]];
        if (!it.status.ok()) continue;
        Status c = CopyToDevice(it.dst.data(), host[k].data(), it.size);
        if (!c.ok()) it.status = c;
      }
      return Status::Ok();
    }
  }
  return GetBatchHost(items, o);
}

Status Router::GetBatchHost(std::span<GetItem> items, const RequestOptions& o) {
  Impl& im = *impl_;
  im.counters.gets.fetch_add(1, std::memory_order_relaxed);
  im.counters.get_blocks.fetch_add(items.size(), std::memory_order_relaxed);
  SteadyClock::time_point deadline{};
  im.WithRefresh(*this, [&](const View& view, bool* stale) {
    Scratch& sc = t_scratch;
    for (GetItem& it : items) it.status = NotFound("not stored");
    // Replica r is asked only for the items the replica plan sends on (AskNextRank).
    std::vector<uint8_t>& pending = sc.pending;
    pending.assign(items.size(), 1);
    for (uint32_t rank = 0; rank < view.map->replicas(); ++rank) {
      auto key_of = [&](size_t i) { return items[i].key; };
      auto ask = [&](size_t i) { return pending[i] != 0; };
      if (!GroupByNode(*view.map, items.size(), o.affinity, rank, key_of, ask, sc)) break;
      auto call = [&](ShardChannel& ch, NodeBatch& b, const RequestOptions& ro, ChannelCall* c) {
        b.get.clear();
        for (size_t i : b.idx) b.get.push_back(GetItem{items[i].key, items[i].dst, 0, {}});
        if (c == nullptr) return ch.Get(b.get, ro);
        ch.StartGet(b.get, ro, c);
        return Status::Ok();
      };
      auto merge = [&](NodeBatch& b, const Status& s) {
        for (size_t k = 0; k < b.idx.size(); ++k) {
          GetItem& it = items[b.idx[k]];
          it.status = s.ok() ? b.get[k].status : s;
          it.size = s.ok() ? b.get[k].size : 0;
          pending[b.idx[k]] = AskNextRank(ReplicaOp::kGet, it.status);
        }
      };
      im.FanOut(view, sc, o, &deadline, stale, call, merge);
    }
  });
  uint64_t hits = 0;
  for (const GetItem& it : items) hits += it.status.ok();
  im.counters.get_hits.fetch_add(hits, std::memory_order_relaxed);
  return Status::Ok();
}

Status Router::ExistsBatch(std::span<const BlockKey> keys, std::span<uint8_t> found, const RequestOptions& o) {
  Impl& im = *impl_;
  if (found.size() < keys.size()) return InvalidArgument("found[] shorter than keys[]");
  SteadyClock::time_point deadline{};
  im.WithRefresh(*this, [&](const View& view, bool* stale) {
    Scratch& sc = t_scratch;
    std::fill(found.begin(), found.begin() + static_cast<ptrdiff_t>(keys.size()), 0);
    // Primary first; a key whose node did not answer is asked of its next replica (AskNextRank).
    std::vector<uint8_t>& pending = sc.pending;
    pending.assign(keys.size(), 1);
    for (uint32_t rank = 0; rank < view.map->replicas(); ++rank) {
      auto key_of = [&](size_t i) { return keys[i]; };
      auto ask = [&](size_t i) { return pending[i] != 0; };
      if (!GroupByNode(*view.map, keys.size(), o.affinity, rank, key_of, ask, sc)) break;
      auto call = [&](ShardChannel& ch, NodeBatch& b, const RequestOptions& ro, ChannelCall* c) {
        b.keys.clear();
        for (size_t i : b.idx) b.keys.push_back(keys[i]);
        b.found.assign(b.idx.size(), 0);
        if (c == nullptr) return ch.Exists(b.keys, b.found, /*touch=*/true, ro);
        ch.StartExists(b.keys, b.found, /*touch=*/true, ro, c);
        return Status::Ok();
      };
      auto merge = [&](NodeBatch& b, const Status& s) {
        for (size_t k = 0; k < b.idx.size(); ++k) {
          if (s.ok()) found[b.idx[k]] = b.found[k];
          pending[b.idx[k]] = AskNextRank(ReplicaOp::kExists, s);
        }
      };
      im.FanOut(view, sc, o, &deadline, stale, call, merge);
    }
  });
  return Status::Ok();
}

Result<size_t> Router::MatchPrefix(std::span<const TokenId> tokens, const RequestOptions& o) {
  Impl& im = *impl_;
  std::vector<BlockKey> keys = Keys(tokens, o);
  // Deepest block first: each node refreshes the hits in that order, so a
  // chain's first block ends most recent and its deepest leaves first (a
  // parent evicted before its cached children would strand them; measured
  // with `kvmesh replay --through-cluster`, docs/eviction.md).
  std::reverse(keys.begin(), keys.end());
  std::vector<uint8_t> found(keys.size(), 0);
  KVMESH_RETURN_IF_ERROR(ExistsBatch(keys, found, o));
  size_t run = 0;
  while (run < keys.size() && found[keys.size() - 1 - run]) ++run;
  im.counters.match_calls.fetch_add(1, std::memory_order_relaxed);
  im.counters.match_blocks_asked.fetch_add(keys.size(), std::memory_order_relaxed);
  im.counters.match_blocks_hit.fetch_add(run, std::memory_order_relaxed);
  return run;
}

Status Router::Put(std::span<const TokenId> tokens, std::span<const std::span<const std::byte>> blocks,
                   const RequestOptions& o, size_t first_block) {
  std::vector<BlockKey> keys = Keys(tokens, o);
  if (first_block + blocks.size() > keys.size()) {
    return InvalidArgument("Put of blocks [" + std::to_string(first_block) + "," +
                           std::to_string(first_block + blocks.size()) + ") but the tokens hold only " +
                           std::to_string(keys.size()) + " full blocks");
  }
  std::vector<PutItem> items;
  items.reserve(blocks.size());
  // Deepest block first, as MatchPrefix refreshes: the shallowest stored ends most recent.
  for (size_t i = blocks.size(); i-- > 0;) items.push_back(PutItem{keys[first_block + i], blocks[i], {}});
  return PutBatch(items, o);
}

template <typename Send>
Status Router::Impl::ToEveryReplica(Router& self, std::span<const BlockKey> keys, const RequestOptions& o,
                                    Send send) {
  Status first;
  SteadyClock::time_point deadline{};
  WithRefresh(self, [&](const View& view, bool* stale) {
    Scratch& sc = t_scratch;
    first = Status::Ok();
    for (uint32_t rank = 0; rank < StartRanks(*view.map, ReplicaOp::kErase); ++rank) {
      auto key_of = [&](size_t i) { return keys[i]; };
      if (!GroupByNode(*view.map, keys.size(), o.affinity, rank, key_of, [](size_t) { return true; }, sc)) break;
      auto call = [&](ShardChannel& ch, NodeBatch& b, const RequestOptions& ro, ChannelCall* c) {
        b.keys.clear();
        for (size_t i : b.idx) b.keys.push_back(keys[i]);
        b.statuses.assign(b.idx.size(), Status::Ok());
        return send(ch, b, ro, c);
      };
      auto merge = [&](NodeBatch&, const Status& s) {
        if (!s.ok() && first.ok()) first = s;
      };
      FanOut(view, sc, o, &deadline, stale, call, merge);
    }
  });
  return first;
}

Status Router::Erase(std::span<const BlockKey> keys, const RequestOptions& o) {
  // Every replica forgets the key; NotFound items are fine: the key is gone.
  return impl_->ToEveryReplica(*this, keys, o,
                               [](ShardChannel& ch, NodeBatch& b, const RequestOptions& ro, ChannelCall* c) {
                                 if (c == nullptr) return ch.Erase(b.keys, b.statuses);  // the channel's own timeout
                                 ch.StartErase(b.keys, b.statuses, ro, c);
                                 return Status::Ok();
                               });
}

Status Router::Release(std::span<const BlockKey> keys, const RequestOptions& o) {
  // Every replica holds its own order; NotFound items are fine: nothing to release.
  return impl_->ToEveryReplica(*this, keys, o,
                               [](ShardChannel& ch, NodeBatch& b, const RequestOptions&, ChannelCall* c) {
                                 Status s = ch.Release(b.keys, b.statuses);  // a small frame: no asynchronous form
                                 if (c == nullptr) return s;
                                 c->Finish(std::move(s));
                                 return Status::Ok();
                               });
}

Result<std::vector<std::byte>> Router::Get(const BlockKey& key, const RequestOptions& o) {
  // The slot size bounds every block; a node never returns more.
  std::vector<std::byte> buf(impl_->model.FullBlockBytes());
  GetItem it{key, buf, 0, {}};
  KVMESH_RETURN_IF_ERROR(GetBatch(std::span<GetItem>(&it, 1), o));
  if (it.status.code() == StatusCode::kResourceExhausted && it.size > buf.size()) {
    buf.resize(it.size);
    it = GetItem{key, buf, 0, {}};
    KVMESH_RETURN_IF_ERROR(GetBatch(std::span<GetItem>(&it, 1), o));
  }
  if (!it.status.ok()) return it.status;
  buf.resize(it.size);
  return buf;
}

// ---- live sequences -------------------------------------------------------------

namespace {
// A Status as a Result, for OnSequenceNode.
Result<bool> AsResult(const Status& s) {
  if (!s.ok()) return s;
  return true;
}
bool Unreachable(const Status& s) {
  return s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kDeadlineExceeded;
}
}  // namespace

Result<SequenceHandle> Router::CreateSequence(std::span<const TokenId> prefix, const RequestOptions& o,
                                              size_t max_blocks) {
  Impl& im = *impl_;
  const Range layers = im.Layers(o), heads = im.Heads(o);
  // Prefix affinity: rendezvous on the first full block's stored key.
  BlockKey anchor;
  if (prefix.size() >= im.model.block_tokens) {
    anchor = im.deriver.Keys(prefix.first(im.model.block_tokens), layers, heads).at(0);
  } else {
    anchor = BlockKey{im.spread.fetch_add(1, std::memory_order_relaxed) * 0x9E3779B97F4A7C15ull, 0x5eed};
  }
  SeqCreateArgs a;
  a.layers = layers;
  a.heads = heads;
  a.tenant_salt = im.options.tenant_salt;
  a.priority = o.priority;
  a.prefix = prefix;
  a.max_blocks = max_blocks;
  Status last = Unavailable("no live node for this sequence");
  EpochRetry retry;
  for (;;) {
    std::shared_ptr<const View> v = im.Snapshot();
    uint32_t place[ShardMap::kMaxReplicas];
    const size_t cands = v->map->Place(anchor, o.affinity, place, ShardMap::kMaxReplicas);
    bool stale = false;
    for (size_t c = 0; c < cands; ++c) {
      Result<SeqCreated> r = v->channels[place[c]]->SeqCreate(a, o);
      if (!r.ok()) {
        im.NoteCall(r.status(), &stale);
        last = r.status();
        if (Unreachable(last)) continue;  // the next node in rendezvous order
        break;
      }
      SequenceHandle h;
      h.node = place[c];
      h.id = r->id;
      h.epoch = v->map->epoch();
      h.node_id = v->map->nodes()[place[c]].id;
      h.layers = layers;
      h.heads = heads;
      h.prefix_tokens = r->length;
      return h;
    }
    if (!im.Refreshed(*this, retry, stale)) break;
  }
  return last;
}

Result<uint32_t> Router::AppendSequence(const SequenceHandle& s, std::span<const TokenId> tokens,
                                        std::span<const std::byte> k, std::span<const std::byte> v,
                                        const RequestOptions& o) {
  return impl_->OnSequenceNode<uint32_t>(*this, s, [&](ShardChannel& ch) {
    return ch.SeqAppend(s.id, tokens, k, v, s.layers.size(), o);
  });
}

Status Router::TruncateSequence(const SequenceHandle& s, uint32_t n, const RequestOptions& o) {
  return impl_->OnSequenceNode<bool>(*this, s, [&](ShardChannel& ch) { return AsResult(ch.SeqTruncate(s.id, n, o)); })
      .status();
}

Result<SequenceHandle> Router::ForkSequence(const SequenceHandle& s, const RequestOptions& o) {
  KVMESH_ASSIGN_OR_RETURN(SeqId id,
                          impl_->OnSequenceNode<SeqId>(*this, s, [&](ShardChannel& ch) { return ch.SeqFork(s.id, o); }));
  SequenceHandle f = s;
  f.id = id;
  f.prefix_tokens = 0;
  return f;
}

Status Router::ReleaseSequence(const SequenceHandle& s, const RequestOptions& o) {
  return impl_->OnSequenceNode<bool>(*this, s, [&](ShardChannel& ch) { return AsResult(ch.SeqRelease(s.id, o)); })
      .status();
}

Result<SequenceState> Router::SequenceInfo(const SequenceHandle& s, const RequestOptions& o) {
  return impl_->OnSequenceNode<SequenceState>(*this, s, [&](ShardChannel& ch) { return ch.SeqInfo(s.id, o); });
}

Status Router::ReadSequence(const SequenceHandle& s, uint32_t from, uint32_t n, std::vector<std::byte>* k,
                            std::vector<std::byte>* v, const RequestOptions& o) {
  return impl_
      ->OnSequenceNode<bool>(*this, s, [&](ShardChannel& ch) { return AsResult(ch.SeqRead(s.id, from, n, k, v, o)); })
      .status();
}

RouterStats Router::Stats() const {
  const Counters& c = impl_->counters;
  RouterStats s;
  s.puts = c.puts.load();
  s.put_blocks = c.put_blocks.load();
  s.gets = c.gets.load();
  s.get_blocks = c.get_blocks.load();
  s.get_hits = c.get_hits.load();
  s.match_calls = c.match_calls.load();
  s.match_blocks_asked = c.match_blocks_asked.load();
  s.match_blocks_hit = c.match_blocks_hit.load();
  s.node_errors = c.node_errors.load();
  return s;
}

}  // namespace kvmesh

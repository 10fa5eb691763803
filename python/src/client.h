// python/src/client.h — the objects behind kvmesh.Client, kvmesh.EmbeddedCluster,
// kvmesh.Region and kvmesh.Sequence.
//
// A Client owns either a NetworkClient (coordinator + daemons) or an
// EmbeddedCluster (nodes in this process) and calls its Router. Every call
// that does I/O or waits releases the GIL and holds io_mu_ shared for its
// duration; Close and Unregister take io_mu_ exclusively (with the GIL
// released), so memory is never forgotten, and a router never destroyed,
// under a call in flight.
//
// Thread-safety: every method may be called from many Python threads. The
// members touched with the GIL held (regions_) are guarded by the GIL.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "convert.h"
#include "kvmesh/config.h"
#include "kvmesh/embedded.h"
#include "kvmesh/network.h"
#include "kvmesh/router.h"

namespace kvmesh::python {

// One entry of a batch's answer (get_into / put_from).
struct ItemStatus {
  StatusCode code = StatusCode::kOk;
  std::string message;
  size_t size = 0;  // get: bytes of the block (or needed, for RESOURCE_EXHAUSTED); put: bytes stored
  bool ok() const { return code == StatusCode::kOk; }
  bool miss() const { return IsMiss(Status(code, "")); }
};

// A region of memory registered with the router: a Python object's memory
// (register) or memory the router allocated (allocate). Holds the memory (the
// Python object, or a co-owner of the router's allocation) for its whole
// life: a call in flight keeps the region alive, so memory unregistered
// meanwhile is never released under it.
struct Region {
  uint64_t id = 0;
  std::byte* base = nullptr;
  size_t bytes = 0;
  Memory memory;                        // register: the object's buffer
  std::shared_ptr<std::byte> allocated;  // allocate: the router's memory, co-owned
  MemoryKind kind = MemoryKind::kHost;
  bool writable = true;    // false: read-only memory (put_from only)
  bool registered = true;
  bool Contains(uintptr_t p, size_t n) const {
    const auto b = reinterpret_cast<uintptr_t>(base);
    return p >= b && n <= bytes && p - b <= bytes - n;
  }
};

struct ConnectArgs {
  std::optional<std::string> coordinator;
  py::object config;  // None, a path, JSON text or a dict
  std::string tenant;                // the key salt; with an explicit token also the identity
  std::optional<std::string> token;  // with tenant: that tenant's token; without: the cluster secret
  std::optional<std::string> salt;   // the key salt when it is not the tenant
  int64_t timeout_ms = 2000;
  int64_t connect_timeout_ms = 1000;
  int64_t refresh_ms = 1000;
  std::string client_id = "kvmesh-python";
};

// A config from a path, JSON text (starting with '{') or a dict.
ClusterConfig LoadConfigArg(py::handle config);

// Integers in [0, 2**64) from a sequence of ints, a numpy array or a tensor;
// InvalidArgument naming `what` otherwise.
std::vector<uint64_t> ToU64s(py::handle h, const char* what);

class Client {
 public:
  static std::shared_ptr<Client> Connect(const ConnectArgs& args);
  virtual ~Client();

  bool embedded() const { return embedded_ != nullptr; }
  const ModelSpec& model() const { return model_; }
  uint64_t epoch();
  size_t num_nodes();
  py::dict stats();
  void Close();
  bool closed() const { return closed_.load(); }
  // Runs f(router) as the data calls do: the GIL released, the client open
  // for the call's duration (FailedPrecondition when closed).
  template <typename F>
  auto WithRouter(F&& f) {
    return Io(std::forward<F>(f));
  }

  std::vector<BlockKey> Keys(py::handle tokens, const RequestOptions& o);
  size_t MatchPrefix(py::handle tokens, const RequestOptions& o);
  void Put(py::handle tokens, py::handle blocks, size_t first_block, const RequestOptions& o);
  py::bytes Get(py::handle key, const RequestOptions& o);
  std::vector<ItemStatus> GetInto(py::handle keys, py::handle buffers, const RequestOptions& o);
  std::vector<ItemStatus> PutFrom(py::handle keys, py::handle buffers, const RequestOptions& o);
  // Addresses [ptrs[i], ptrs[i] + sizes[i]) must lie in regions registered here.
  std::vector<ItemStatus> GetIntoPtrs(py::handle keys, py::handle ptrs, py::handle sizes, const RequestOptions& o);
  std::vector<ItemStatus> PutFromPtrs(py::handle keys, py::handle ptrs, py::handle sizes, const RequestOptions& o);
  std::vector<bool> ExistsEach(py::handle keys, const RequestOptions& o);
  size_t Exists(py::handle keys, const RequestOptions& o);
  void Erase(py::handle keys, const RequestOptions& o);
  void Release(py::handle keys, const RequestOptions& o);

  std::shared_ptr<Region> Register(py::handle obj);
  // Host memory from Router::AllocateMemory (over UCX: shared memory the
  // nodes of this host map), registered like Register's. The region co-owns
  // the memory, so it outlives unregister and close.
  std::shared_ptr<Region> Allocate(size_t bytes);
  // NotFound when the region is not registered here (unregistered already, or
  // the client closed).
  void Unregister(const std::shared_ptr<Region>& region);
  std::vector<std::shared_ptr<Region>> regions() const { return regions_; }

  // Live sequences (Sequence below wraps the handle).
  SequenceHandle CreateSequence(py::handle prefix, std::optional<size_t> max_blocks, const RequestOptions& o);
  uint32_t AppendSequence(const SequenceHandle& h, py::handle tokens, py::handle k, py::handle v,
                          const RequestOptions& o);
  void TruncateSequence(const SequenceHandle& h, uint32_t n, const RequestOptions& o);
  SequenceHandle ForkSequence(const SequenceHandle& h, const RequestOptions& o);
  void ReleaseSequence(const SequenceHandle& h, const RequestOptions& o);
  py::dict SequenceInfo(const SequenceHandle& h, const RequestOptions& o);
  py::tuple ReadSequence(const SequenceHandle& h, uint32_t from, uint32_t n, const RequestOptions& o);

 protected:
  Client() = default;
  // Starts the nodes of `config` in this process (EmbeddedClient).
  void StartEmbedded(py::handle config, const std::string& tenant);

 private:
  // Runs f(router) with the GIL released and io_mu_ held shared.
  // FailedPrecondition when the client is closed.
  template <typename F>
  auto Io(F&& f) {
    py::gil_scoped_release nogil;
    std::shared_lock<std::shared_mutex> lock(io_mu_);
    if (router_ == nullptr) Throw(FailedPrecondition("the client is closed"));
    return f(*router_);
  }
  // The registered region holding [p, p + n), or nullptr.
  std::shared_ptr<Region> RegionOf(uintptr_t p, size_t n) const;
  // The memory of each (address, size) range, each inside a region registered
  // here (a writable one when `writable`), else InvalidArgument naming the
  // item; `hold` gets those regions, to keep them alive through the call.
  std::vector<std::span<std::byte>> RegisteredSpans(const std::vector<std::pair<uintptr_t, size_t>>& ranges,
                                                    bool writable, std::vector<std::shared_ptr<Region>>* hold) const;
  // The memory of n buffers (writable ones when `writable`), device memory
  // only when registered; InvalidArgument naming `call` when the count is not n.
  std::vector<Memory> Buffers(py::handle buffers, size_t n, bool writable, const char* call) const;
  // The batch of keys[i] over spans[i] (GetItem or PutItem), handed to
  // call(router, items) with the GIL released; one ItemStatus per item.
  template <typename Item, typename Call>
  std::vector<ItemStatus> Batch(const std::vector<BlockKey>& keys, const std::vector<std::span<std::byte>>& spans,
                                Call call);
  // Device memory must lie in a registered device region (the router stages it).
  void CheckDevice(const Memory& m) const;

  std::unique_ptr<NetworkClient> network_;
  std::unique_ptr<EmbeddedCluster> embedded_;
  Router* router_ = nullptr;  // guarded by io_mu_ (written exclusively, read shared)
  std::atomic<bool> closed_{false};
  ModelSpec model_;
  std::shared_mutex io_mu_;
  std::vector<std::shared_ptr<Region>> regions_;  // guarded by the GIL
};

// kvmesh.EmbeddedCluster: a Client over nodes started in this process.
class EmbeddedClient : public Client {
 public:
  static std::shared_ptr<EmbeddedClient> Start(py::handle config, const std::string& tenant) {
    auto c = std::make_shared<EmbeddedClient>();
    c->StartEmbedded(config, tenant);
    return c;
  }
};

// kvmesh.Sequence: a live sequence on one node, with the client that made it.
struct Sequence {
  std::shared_ptr<Client> client;
  SequenceHandle handle;
};

}  // namespace kvmesh::python

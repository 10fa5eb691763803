// kvmesh._core: the Python bindings of the kvmesh router (docs/python.md).
// The package kvmesh (python/kvmesh/__init__.py) re-exports these names; the
// signatures and types are written out in python/kvmesh/_core.pyi.
#include <pybind11/pybind11.h>

#include "allocation.h"
#include "client.h"
#include "convert.h"
#include "keys.h"
#include "kvmesh/build_config.h"

namespace py = pybind11;
using namespace kvmesh;
using namespace kvmesh::python;

namespace {

constexpr const char* kOptionsDoc =
    "\n\nOptions (keywords): priority (eviction class, 0 evicted first), layers and heads\n"
    "((begin, end) slice; None = whole model), timeout_ms (0 = the client's), expert /\n"
    "layer_group / rank (placement hint), score, replace (put: overwrite a stored key).";

std::string Doc(const char* text) { return std::string(text) + kOptionsDoc; }

py::dict ModelDict(const ModelSpec& m) {
  py::dict d;
  d["model_id"] = m.model_id;
  d["num_layers"] = m.num_layers;
  d["num_kv_heads"] = m.num_kv_heads;
  d["head_dim"] = m.head_dim;
  d["dtype"] = std::string(DTypeName(m.dtype));
  d["block_tokens"] = m.block_tokens;
  d["num_experts"] = m.num_experts;
  d["block_bytes"] = m.FullBlockBytes();
  return d;
}

py::tuple RangeTuple(Range r) { return py::make_tuple(r.begin, r.end); }

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "kvmesh's router from Python: the C++ extension behind the kvmesh package.";
  InstallErrorTranslator();
#if defined(KVMESH_HAVE_CUDA)
  m.attr("HAVE_CUDA") = true;
#else
  m.attr("HAVE_CUDA") = false;
#endif
#if defined(KVMESH_HAVE_UCX)
  m.attr("HAVE_UCX") = true;
#else
  m.attr("HAVE_UCX") = false;
#endif
  m.attr("VERSION") = KVMESH_VERSION;
  AddKeyFunctions(m);

  py::class_<ItemStatus>(m, "ItemStatus", "The result of one item of a batch (get_into, put_from).")
      .def_property_readonly(
          "code", [](const ItemStatus& s) { return CodeName(s.code); }, "kvmesh status code: 'OK', 'NOT_FOUND', ...")
      .def_readonly("message", &ItemStatus::message, "why, when not OK")
      .def_readonly("size", &ItemStatus::size,
                    "get: bytes of the block (for RESOURCE_EXHAUSTED, the size needed); put: bytes stored")
      .def_property_readonly("ok", &ItemStatus::ok, "True when the item succeeded")
      .def_property_readonly("miss", &ItemStatus::miss,
                             "True for NOT_FOUND, DATA_LOSS, UNAVAILABLE, DEADLINE_EXCEEDED: recompute")
      .def("__bool__", &ItemStatus::ok)
      .def("__repr__", [](const ItemStatus& s) {
        std::string r = "ItemStatus(" + CodeName(s.code) + ", size=" + std::to_string(s.size);
        if (!s.message.empty()) r += ", message=" + std::string(py::repr(py::str(s.message)));
        return r + ")";
      });

  py::class_<Region, std::shared_ptr<Region>>(m, "Region",
                                              "Memory registered with Client.register (zero-copy transfers).")
      .def_readonly("id", &Region::id, "the router's region id")
      .def_property_readonly(
          "address", [](const Region& r) { return reinterpret_cast<uintptr_t>(r.base); }, "first byte")
      .def_property_readonly(
          "nbytes", [](const Region& r) { return r.bytes; }, "length in bytes")
      .def_property_readonly(
          "allocated", [](const Region& r) { return r.allocated != nullptr; },
          "True for memory from Client.allocate (the Allocation owns it)")
      .def_property_readonly(
          "device", [](const Region& r) { return r.kind == MemoryKind::kDevice; }, "CUDA device memory")
      .def_readonly("writable", &Region::writable, "False for read-only memory (put_from only)")
      .def_readonly("registered", &Region::registered, "False once unregistered (or the client closed)")
      .def_property_readonly(
          "obj",
          [](const Region& r) -> py::object {
            return r.registered && r.memory.owner() ? r.memory.owner() : py::none();
          },
          "the registered object (None once unregistered, and for memory from allocate; it is\n"
          "released when the Region is)")
      .def("__repr__", [](const Region& r) {
        return "Region(id=" + std::to_string(r.id) + ", nbytes=" + std::to_string(r.bytes) +
               (r.registered ? "" : ", unregistered") + ")";
      });

  BindAllocation(m);

  py::class_<Client, std::shared_ptr<Client>>(m, "Client", R"(A client of a kvmesh cluster.

Client(coordinator="127.0.0.1:7070") reaches daemons through their coordinator;
Client(config="cluster.json") takes the coordinator address and auth token from
a cluster config. tenant is the key salt: keys of different tenants never meet.
With token, tenant is also the identity: the client proves it is that tenant of
the cluster's $.auth.tenants with the tenant's token, and the nodes keep its
blocks in the tenant's namespace (no other tenant reads them, whatever key
bytes it sends). token without tenant is the cluster secret ($.auth.token; from
the config otherwise). salt, when given, salts the keys instead of tenant.
Every method releases the GIL while it does I/O.)")
      .def(py::init([](std::optional<std::string> coordinator, py::object config, std::string tenant,
                       std::optional<std::string> token, std::optional<std::string> salt, int64_t timeout_ms,
                       int64_t connect_timeout_ms, int64_t refresh_ms, std::string client_id) {
             ConnectArgs a{std::move(coordinator), std::move(config), std::move(tenant), std::move(token),
                           std::move(salt), timeout_ms, connect_timeout_ms, refresh_ms, std::move(client_id)};
             return Client::Connect(a);
           }),
           py::arg("coordinator") = py::none(), py::kw_only(), py::arg("config") = py::none(),
           py::arg("tenant") = "", py::arg("token") = py::none(), py::arg("salt") = py::none(),
           py::arg("timeout_ms") = 2000,
           py::arg("connect_timeout_ms") = 1000, py::arg("refresh_ms") = 1000,
           py::arg("client_id") = "kvmesh-python")
      .def_property_readonly(
          "model", [](const Client& c) { return ModelDict(c.model()); },
          "the model: model_id, num_layers, num_kv_heads, head_dim, dtype, block_tokens, block_bytes")
      .def_property_readonly(
          "block_tokens", [](const Client& c) { return c.model().block_tokens; }, "tokens per block")
      .def_property_readonly(
          "block_bytes", [](const Client& c) { return c.model().FullBlockBytes(); },
          "bytes of a full block (all layers, all KV heads; [layer][k|v][head][token][dim])")
      .def_property_readonly("epoch", &Client::epoch, "the shard map's epoch")
      .def_property_readonly("num_nodes", &Client::num_nodes, "nodes in the shard map")
      .def_property_readonly("closed", &Client::closed)
      .def("stats", &Client::stats, "the router's counters (puts, gets, hits, node errors, ...)")
      .def("close", &Client::Close, "Unregisters every region and drops the connections (or the nodes).")
      .def("__enter__", [](std::shared_ptr<Client> c) { return c; })
      .def("__exit__", [](Client& c, py::args) { c.Close(); })
      .def(
          "keys", [](Client& c, py::handle t, py::kwargs kw) { return FromKeys(c.Keys(t, kw)); }, py::arg("tokens"),
          Doc("Stored keys, (hi, lo) pairs, of the full blocks of tokens for the options' slice.").c_str())
      .def("match_prefix", &Client::MatchPrefix, py::arg("tokens"),
           Doc("Number of leading full blocks of tokens that are cached (hits are refreshed).").c_str())
      .def("put", &Client::Put, py::arg("tokens"), py::arg("blocks"), py::kw_only(), py::arg("first_block") = 0,
           Doc("Stores blocks[i] (buffers or tensors) as full block first_block + i of tokens.\n"
               "Raises the first block's error (every block is still attempted).")
               .c_str())
      .def("get", &Client::Get, py::arg("key"), Doc("One block, copied out as bytes; a miss raises.").c_str())
      .def("get_into", &Client::GetInto, py::arg("keys"), py::arg("buffers"),
           Doc("Reads keys[i] into buffers[i] (writable, contiguous; zero-copy when registered).\n"
               "Returns one ItemStatus per key; misses are items, not exceptions.")
               .c_str())
      .def("put_from", &Client::PutFrom, py::arg("keys"), py::arg("buffers"),
           Doc("Stores buffers[i] under keys[i]; one ItemStatus per key.").c_str())
      .def("get_into_ptrs", &Client::GetIntoPtrs, py::arg("keys"), py::arg("ptrs"), py::arg("sizes"),
           Doc("get_into by address: [ptrs[i], ptrs[i] + sizes[i]) must lie in memory registered with\n"
               "this client (sizes may be one int for all). For engines that hand out raw pointers.")
               .c_str())
      .def("put_from_ptrs", &Client::PutFromPtrs, py::arg("keys"), py::arg("ptrs"), py::arg("sizes"),
           Doc("put_from by address, inside registered memory.").c_str())
      .def("exists", &Client::Exists, py::arg("keys"),
           Doc("Number of consecutive keys, from the first, that are cached.").c_str())
      .def("exists_each", &Client::ExistsEach, py::arg("keys"), Doc("One bool per key: cached or not.").c_str())
      .def("erase", &Client::Erase, py::arg("keys"), Doc("Removes the keys (absent ones are fine).").c_str())
      .def("release", &Client::Release, py::arg("keys"),
           Doc("Eviction hint: the caller is done with these blocks (a closed session's private blocks); each "
               "stored one becomes the next to leave its node's cache until read again. Nothing is erased.")
               .c_str())
      .def("register", &Client::Register, py::arg("buffer"),
           "Registers the memory of a buffer or tensor once, so transfers into and out of it are zero-copy.\n"
           "The client holds the object until unregister() or close(). A CUDA tensor is device memory\n"
           "(kvmesh built with CUDA only).")
      .def(
          "allocate",
          [](std::shared_ptr<Client> c, size_t nbytes) {
            std::shared_ptr<Region> r = c->Allocate(nbytes);
            return std::make_shared<Allocation>(std::move(c), std::move(r));
          },
          py::arg("nbytes"),
          "nbytes of host memory, already registered, for the transfers' fastest path: over UCX\n"
          "shared memory that a node on this host maps itself (a GET into it is one copy, made by\n"
          "the node); otherwise page-aligned anonymous memory. Returns an Allocation, a writable\n"
          "buffer (memoryview, numpy.frombuffer, torch.frombuffer) that owns the memory: it is freed\n"
          "with the last reference to the Allocation, never under a view, whatever happens to the\n"
          "client. Put an engine's host KV pool here rather than registering memory from elsewhere.")
      .def("unregister", &Client::Unregister, py::arg("region"),
           "Forgets a region; waits for calls in flight.")
      .def_property_readonly("regions", &Client::regions, "the regions registered now")
      .def(
          "create_sequence",
          [](std::shared_ptr<Client> c, py::handle prefix, std::optional<size_t> max_blocks, py::kwargs kw) {
            return Sequence{c, c->CreateSequence(prefix, max_blocks, kw)};
          },
          py::arg("prefix") = py::list(), py::kw_only(), py::arg("max_blocks") = py::none(),
          Doc("A live sequence for the options' slice, placed by prefix affinity; it attaches the\n"
              "leading full blocks of prefix its node has (Sequence.prefix_tokens says how many tokens).")
              .c_str());

  py::class_<EmbeddedClient, Client, std::shared_ptr<EmbeddedClient>>(m, "EmbeddedCluster",
                                                                      R"(A whole cluster in this process.

EmbeddedCluster(config) starts one shard node per configured node (config: a
path, JSON text or a dict) and is a Client of them.)")
      .def(py::init(&EmbeddedClient::Start), py::arg("config"), py::kw_only(), py::arg("tenant") = "");

  py::class_<Sequence>(m, "Sequence", R"(A live sequence held by one node.

K and V of n tokens are each [layer][n][heads][head_dim] over the sequence's slice
in the model dtype (kv_bytes(n) bytes). Full blocks are sealed into the node's store.)")
      .def_property_readonly("node", [](const Sequence& s) { return s.handle.node_id; })
      .def_property_readonly("id", [](const Sequence& s) { return s.handle.id; })
      .def_property_readonly("prefix_tokens", [](const Sequence& s) { return s.handle.prefix_tokens; },
                             "tokens attached from the prefix at creation (0 for a fork)")
      .def_property_readonly("layers", [](const Sequence& s) { return RangeTuple(s.handle.layers); })
      .def_property_readonly("heads", [](const Sequence& s) { return RangeTuple(s.handle.heads); })
      .def(
          "kv_bytes",
          [](const Sequence& s, size_t n) {
            const ModelSpec& m = s.client->model();
            return size_t{s.handle.layers.size()} * n * s.handle.heads.size() * m.head_dim * DTypeSize(m.dtype);
          },
          py::arg("n"), "bytes of K (and of V) for n tokens")
      .def(
          "append",
          [](Sequence& s, py::handle t, py::handle k, py::handle v, py::kwargs kw) {
            return s.client->AppendSequence(s.handle, t, k, v, kw);
          },
          py::arg("tokens"), py::arg("k"), py::arg("v"),
          "Appends tokens with their K and V; returns the first position.")
      .def(
          "truncate", [](Sequence& s, uint32_t n, py::kwargs kw) { s.client->TruncateSequence(s.handle, n, kw); },
          py::arg("n"), "Drops the last n tokens.")
      .def(
          "fork", [](Sequence& s, py::kwargs kw) { return Sequence{s.client, s.client->ForkSequence(s.handle, kw)}; },
          "A new sequence on the same node with the same tokens (sealed blocks shared).")
      .def(
          "release", [](Sequence& s, py::kwargs kw) { s.client->ReleaseSequence(s.handle, kw); },
          "Unpins and forgets the sequence (its sealed blocks stay cached).")
      .def(
          "info", [](Sequence& s, py::kwargs kw) { return s.client->SequenceInfo(s.handle, kw); },
          "{'length', 'sealed_blocks', 'tokens'}")
      .def(
          "read",
          [](Sequence& s, uint32_t start, uint32_t n, py::kwargs kw) {
            return s.client->ReadSequence(s.handle, start, n, kw);
          },
          py::arg("start"), py::arg("n"), "(K, V) bytes of positions [start, start + n).")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](Sequence& s, py::args) {
        if (!s.client->closed()) s.client->ReleaseSequence(s.handle, py::kwargs());
      });
}

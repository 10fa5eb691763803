// kvmesh.Client and kvmesh.EmbeddedCluster (bindings.h). The data calls take
// the options of options.h as keyword-only arguments (DefWithOptions).
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "allocation.h"
#include "bindings.h"
#include "client.h"
#include "options.h"

namespace kvmesh::python {

namespace {

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

}  // namespace

void BindClient(py::module_& m) {
  py::class_<Client, std::shared_ptr<Client>> c(m, "Client", R"(A client of a kvmesh cluster.

Client(coordinator="127.0.0.1:7070") reaches daemons through their coordinator;
several separated by commas ("h0:7070,h1:7070", an etcd-backed control plane)
are tried in turn, and the client moves on when the one it uses stops
answering. Client(config="cluster.json") takes the coordinator addresses
($.coordinator.addresses, else host:port) and auth token from a cluster
config. tenant is the key salt: keys of different tenants never meet.
With token, tenant is also the identity: the client proves it is that tenant of
the cluster's $.auth.tenants with the tenant's token, and the nodes keep its
blocks in the tenant's namespace (no other tenant reads them, whatever key
bytes it sends). token without tenant is the cluster secret ($.auth.token; from
the config otherwise). salt, when given, salts the keys instead of tenant.
Every method releases the GIL while it does I/O.)");
  c.def(py::init([](std::optional<std::string> coordinator, py::object config, std::string tenant,
                    std::optional<std::string> token, std::optional<std::string> salt, int64_t timeout_ms,
                    int64_t connect_timeout_ms, int64_t refresh_ms, std::string client_id) {
          ConnectArgs a{std::move(coordinator), std::move(config), std::move(tenant), std::move(token),
                        std::move(salt), timeout_ms, connect_timeout_ms, refresh_ms, std::move(client_id)};
          return Client::Connect(a);
        }),
        py::arg("coordinator") = py::none(), py::kw_only(), py::arg("config") = py::none(), py::arg("tenant") = "",
        py::arg("token") = py::none(), py::arg("salt") = py::none(), py::arg("timeout_ms") = 2000,
        py::arg("connect_timeout_ms") = 1000, py::arg("refresh_ms") = 1000, py::arg("client_id") = "kvmesh-python")
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
      .def("__exit__", [](Client& c, py::args) { c.Close(); });

  DefWithOptions(
      c, "keys", [](Client& c, py::handle t, const RequestOptions& o) { return FromKeys(c.Keys(t, o)); },
      "Stored keys, (hi, lo) pairs, of the full blocks of tokens for the options' slice.", py::arg("tokens"));
  DefWithOptions(c, "match_prefix", &Client::MatchPrefix,
                 "Number of leading full blocks of tokens that are cached (hits are refreshed).", py::arg("tokens"));
  DefWithOptions(c, "put", &Client::Put,
                 "Stores blocks[i] (buffers or tensors) as full block first_block + i of tokens.\n"
                 "Raises the first block's error (every block is still attempted).",
                 py::arg("tokens"), py::arg("blocks"), py::kw_only(), py::arg("first_block") = 0);
  DefWithOptions(c, "get", &Client::Get, "One block, copied out as bytes; a miss raises.", py::arg("key"));
  DefWithOptions(c, "get_into", &Client::GetInto,
                 "Reads keys[i] into buffers[i] (writable, contiguous; zero-copy when registered).\n"
                 "Returns one ItemStatus per key; misses are items, not exceptions.",
                 py::arg("keys"), py::arg("buffers"));
  DefWithOptions(c, "put_from", &Client::PutFrom, "Stores buffers[i] under keys[i]; one ItemStatus per key.",
                 py::arg("keys"), py::arg("buffers"));
  DefWithOptions(c, "get_into_ptrs", &Client::GetIntoPtrs,
                 "get_into by address: [ptrs[i], ptrs[i] + sizes[i]) must lie in memory registered with\n"
                 "this client (sizes may be one int for all). For engines that hand out raw pointers.",
                 py::arg("keys"), py::arg("ptrs"), py::arg("sizes"));
  DefWithOptions(c, "put_from_ptrs", &Client::PutFromPtrs, "put_from by address, inside registered memory.",
                 py::arg("keys"), py::arg("ptrs"), py::arg("sizes"));
  DefWithOptions(c, "exists", &Client::Exists, "Number of consecutive keys, from the first, that are cached.",
                 py::arg("keys"));
  DefWithOptions(c, "exists_each", &Client::ExistsEach, "One bool per key: cached or not.", py::arg("keys"));
  DefWithOptions(c, "erase", &Client::Erase, "Removes the keys (absent ones are fine).", py::arg("keys"));
  DefWithOptions(c, "release", &Client::Release,
                 "Eviction hint: the caller is done with these blocks (a closed session's private blocks); each "
                 "stored one becomes the next to leave its node's cache until read again. Nothing is erased.",
                 py::arg("keys"));

  c.def("register", &Client::Register, py::arg("buffer"),
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
      .def("unregister", &Client::Unregister, py::arg("region"), "Forgets a region; waits for calls in flight.")
      .def_property_readonly("regions", &Client::regions, "the regions registered now");

  DefWithOptions(
      c, "create_sequence",
      [](std::shared_ptr<Client> c, py::handle prefix, std::optional<size_t> max_blocks, const RequestOptions& o) {
        return Sequence{c, c->CreateSequence(prefix, max_blocks, o)};
      },
      "A live sequence for the options' slice, placed by prefix affinity; it attaches the\n"
      "leading full blocks of prefix its node has (Sequence.prefix_tokens says how many tokens).",
      py::arg("prefix") = py::list(), py::kw_only(), py::arg("max_blocks") = py::none());

  py::class_<EmbeddedClient, Client, std::shared_ptr<EmbeddedClient>>(m, "EmbeddedCluster",
                                                                      R"(A whole cluster in this process.

EmbeddedCluster(config) starts one shard node per configured node (config: a
path, JSON text or a dict) and is a Client of them.)")
      .def(py::init(&EmbeddedClient::Start), py::arg("config"), py::kw_only(), py::arg("tenant") = "");
}

}  // namespace kvmesh::python

// kvmesh.Sequence (bindings.h): a live sequence on one node. Its calls take
// the options of options.h as keyword-only arguments (DefWithOptions).
#include <utility>

#include "bindings.h"
#include "client.h"
#include "options.h"

namespace kvmesh::python {

namespace {

py::tuple RangeTuple(Range r) { return py::make_tuple(r.begin, r.end); }

}  // namespace

void BindSequence(py::module_& m) {
  py::class_<Sequence> s(m, "Sequence", R"(A live sequence held by one node.

K and V of n tokens are each [layer][n][heads][head_dim] over the sequence's slice
in the model dtype (kv_bytes(n) bytes). Full blocks are sealed into the node's store.)");
  s.def_property_readonly("node", [](const Sequence& s) { return s.handle.node_id; })
      .def_property_readonly("id", [](const Sequence& s) { return s.handle.id; })
      .def_property_readonly(
          "prefix_tokens", [](const Sequence& s) { return s.handle.prefix_tokens; },
          "tokens attached from the prefix at creation (0 for a fork)")
      .def_property_readonly("layers", [](const Sequence& s) { return RangeTuple(s.handle.layers); })
      .def_property_readonly("heads", [](const Sequence& s) { return RangeTuple(s.handle.heads); })
      .def(
          "kv_bytes",
          [](const Sequence& s, size_t n) {
            const ModelSpec& m = s.client->model();
            return BlockLayout{s.handle.layers, s.handle.heads, m.block_tokens, m.head_dim, m.dtype}.side_bytes(n);
          },
          py::arg("n"), "bytes of K (and of V) for n tokens");
  DefWithOptions(
      s, "append",
      [](Sequence& s, py::handle t, py::handle k, py::handle v, const RequestOptions& o) {
        return s.client->AppendSequence(s.handle, t, k, v, o);
      },
      "Appends tokens with their K and V; returns the first position.", py::arg("tokens"), py::arg("k"),
      py::arg("v"));
  DefWithOptions(
      s, "truncate",
      [](Sequence& s, uint32_t n, const RequestOptions& o) { s.client->TruncateSequence(s.handle, n, o); },
      "Drops the last n tokens.", py::arg("n"));
  DefWithOptions(
      s, "fork",
      [](Sequence& s, const RequestOptions& o) { return Sequence{s.client, s.client->ForkSequence(s.handle, o)}; },
      "A new sequence on the same node with the same tokens (sealed blocks shared).");
  DefWithOptions(
      s, "release", [](Sequence& s, const RequestOptions& o) { s.client->ReleaseSequence(s.handle, o); },
      "Unpins and forgets the sequence (its sealed blocks stay cached).");
  DefWithOptions(
      s, "info", [](Sequence& s, const RequestOptions& o) { return s.client->SequenceInfo(s.handle, o); },
      "{'length', 'sealed_blocks', 'tokens'}");
  DefWithOptions(
      s, "read",
      [](Sequence& s, uint32_t start, uint32_t n, const RequestOptions& o) {
        return s.client->ReadSequence(s.handle, start, n, o);
      },
      "(K, V) bytes of positions [start, start + n).", py::arg("start"), py::arg("n"));
  s.def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](Sequence& s, py::args) {
        if (!s.client->closed()) s.client->ReleaseSequence(s.handle, RequestOptions{});
      });
}

}  // namespace kvmesh::python

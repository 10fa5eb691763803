// kvmesh.KvIndex: KV-aware routing's prefix index (kvmesh/kv_route.h,
// docs/kv-events.md "Routing") from Python: feed it the payloads of KV
// events (a pyzmq SUB socket's third frame) and ask route(keys, candidates).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "bindings.h"
#include "convert.h"
#include "kvmesh/kv_route.h"

namespace kvmesh::python {

namespace py = pybind11;

namespace {

KvTier TierOf(const std::string& medium) {
  Result<KvTier> t = ParseKvTier(medium);
  Check(t.status());
  return *t;
}

py::list Matches(const std::vector<PrefixMatch>& ms) {
  py::list out;
  for (const PrefixMatch& m : ms) {
    py::dict d;
    d["instance"] = m.instance;
    d["blocks"] = m.blocks;
    d["gpu_blocks"] = m.gpu_blocks;
    d["cpu_blocks"] = m.cpu_blocks;
    d["load"] = m.load;
    d["score"] = m.score;
    out.append(std::move(d));
  }
  return out;
}

}  // namespace

void BindKvIndex(py::module_& m) {
  py::class_<KvIndex>(m, "KvIndex",
                      "Prefix index over KV events (vLLM's format, kvmesh nodes' and engines') and the routing\n"
                      "query: per candidate instance the longest cached prefix by tier and a score weighing\n"
                      "tier and load (docs/kv-events.md).")
      .def(py::init([](double gpu, double cpu, double disk, double load, double approx_ttl) {
             return std::make_unique<KvIndex>(RouteWeights{gpu, cpu, disk, load, approx_ttl});
           }),
           py::kw_only(), py::arg("gpu") = 1.0, py::arg("cpu") = 0.5, py::arg("disk") = 0.25, py::arg("load") = 0.5,
           py::arg("approx_ttl") = 0.0,
           "approx_ttl > 0: approximate mode (routed() counts a request's blocks as on the instance's\n"
           "device for that many seconds).")
      .def(
          "apply_batch",
          [](KvIndex& x, const std::string& instance, py::bytes payload) {
            std::string_view p = payload;
            Check(x.ApplyBatch(instance, std::as_bytes(std::span<const char>(p.data(), p.size()))));
          },
          py::arg("instance"), py::arg("payload"), "Applies one EventBatch payload (msgpack) that `instance` published.")
      .def(
          "stored",
          [](KvIndex& x, const std::string& instance, const std::string& medium, py::handle keys) {
            Check(x.Stored(instance, TierOf(medium), ToKeys(keys)));
          },
          py::arg("instance"), py::arg("medium"), py::arg("keys"), "Blocks `instance` now holds in `medium`.")
      .def(
          "removed",
          [](KvIndex& x, const std::string& instance, const std::string& medium, py::handle keys) {
            Check(x.Removed(instance, TierOf(medium), ToKeys(keys)));
          },
          py::arg("instance"), py::arg("medium"), py::arg("keys"), "Blocks `instance` no longer holds in `medium`.")
      .def(
          "cleared", [](KvIndex& x, const std::string& instance) { Check(x.Cleared(instance)); },
          py::arg("instance"), "Everything `instance` held is gone.")
      .def(
          "set_load", [](KvIndex& x, const std::string& instance, double load) { Check(x.SetLoad(instance, load)); },
          py::arg("instance"), py::arg("load"), "The instance's load, 0 (idle) to 1 (saturated).")
      .def(
          "routed",
          [](KvIndex& x, const std::string& instance, py::handle keys) { Check(x.Routed(instance, ToKeys(keys))); },
          py::arg("instance"), py::arg("keys"),
          "Approximate mode: the request with these keys went to `instance` (its blocks count as on\n"
          "its device for approx_ttl seconds).")
      .def_property_readonly("approx_entries", &KvIndex::approx_entries,
                             "(block, instance) pairs of approximate mode not yet dropped")
      .def(
          "route",
          [](const KvIndex& x, py::handle keys, const std::vector<std::string>& candidates) {
            std::vector<BlockKey> k = ToKeys(keys);
            std::vector<PrefixMatch> r;
            {
              py::gil_scoped_release release;
              r = x.Route(k, candidates);
            }
            return Matches(r);
          },
          py::arg("keys"), py::arg("candidates"),
          "One dict per candidate, best first: instance, blocks (longest cached prefix), gpu_blocks,\n"
          "cpu_blocks, load, score.")
      .def_property_readonly("blocks", &KvIndex::blocks, "distinct blocks indexed")
      .def_property_readonly("memory_bytes", &KvIndex::memory_bytes, "bytes the index's tables hold")
      .def_property_readonly("instances", &KvIndex::instances, "instance names, in the order first seen");
}

}  // namespace kvmesh::python

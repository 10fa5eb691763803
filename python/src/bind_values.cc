// kvmesh.ItemStatus and kvmesh.Region: the values calls return (bindings.h).
#include <cstdint>
#include <string>

#include "bindings.h"
#include "client.h"

namespace kvmesh::python {

void BindItemStatus(py::module_& m) {
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
}

void BindRegion(py::module_& m) {
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
}

}  // namespace kvmesh::python

#include "allocation.h"

#include <string>

#include "bindings.h"

namespace kvmesh::python {

Allocation::~Allocation() { Unregister(); }

void Allocation::Unregister() noexcept {
  if (!region_->registered || client_->closed()) return;
  try {
    client_->Unregister(region_);  // waits for calls in flight, with the GIL released
  } catch (...) {
    // The router forgets the region when the client closes either way.
  }
}

void Allocation::Close() {
  if (closed_) return;
  if (exports_ > 0)
    throw py::buffer_error("cannot close an allocation while " + std::to_string(exports_) +
                           " buffer export(s) (memoryviews, numpy arrays) exist");
  closed_ = true;
  if (region_->registered && !client_->closed()) client_->Unregister(region_);
}

int Allocation::GetBuffer(PyObject* self, Py_buffer* view, int flags) {
  Allocation* a = nullptr;
  try {
    a = py::handle(self).cast<Allocation*>();
  } catch (...) {
    a = nullptr;
  }
  if (a == nullptr) {
    view->obj = nullptr;
    PyErr_SetString(PyExc_TypeError, "not an initialized kvmesh.Allocation");
    return -1;
  }
  if (a->closed_) {
    view->obj = nullptr;
    PyErr_SetString(PyExc_ValueError, "the allocation is closed");
    return -1;
  }
  if (PyBuffer_FillInfo(view, self, a->region_->base, static_cast<Py_ssize_t>(a->region_->bytes), /*readonly=*/0,
                        flags) != 0)
    return -1;
  view->internal = a;
  ++a->exports_;
  return 0;
}

void Allocation::ReleaseBuffer(PyObject*, Py_buffer* view) {
  // view->obj holds the object (and so the Allocation) until after this call.
  --static_cast<Allocation*>(view->internal)->exports_;
}

void BindAllocation(py::module_& m) {
  py::class_<Allocation, std::shared_ptr<Allocation>> cls(m, "Allocation", py::buffer_protocol(),
                                                          R"(Host memory from Client.allocate, registered with the client.

A writable, contiguous buffer of nbytes bytes: memoryview(a), numpy.frombuffer(a,
dtype), torch.frombuffer(a, dtype=...) view it without a copy, and get_into /
put_from / get_into_ptrs / put_from_ptrs on it (or on views of it) are zero-copy.
Over UCX it is shared memory that a node on this host maps itself, so a GET
into it is a single copy made by the node.

The memory lives until the last reference to this object is gone (views made
from it hold one) and the client stays open while it lives. close() (or the
end of a with block) unregisters it and refuses new views; it raises
BufferError while views from the buffer protocol exist (memoryview, numpy),
as mmap.close does. Closing the client unregisters it too; the memory stays
valid for the views that remain.)");
  // pybind11 installed its own buffer slots (py::buffer_protocol); these count
  // exports so close() can refuse while one exists.
  auto* heap_type = reinterpret_cast<PyHeapTypeObject*>(cls.ptr());
  heap_type->as_buffer.bf_getbuffer = &Allocation::GetBuffer;
  heap_type->as_buffer.bf_releasebuffer = &Allocation::ReleaseBuffer;
  cls.def_property_readonly("nbytes", &Allocation::nbytes, "length in bytes")
      .def("__len__", &Allocation::nbytes)
      .def_property_readonly("address", &Allocation::address, "first byte (page-aligned)")
      .def_property_readonly("registered", &Allocation::registered,
                             "False once closed, unregistered or the client closed")
      .def_property_readonly("closed", &Allocation::closed, "True after close()")
      .def_property_readonly("exports", &Allocation::exports,
                             "buffer exports alive now (memoryviews, numpy arrays; close() refuses while > 0)")
      .def_property_readonly("region", &Allocation::region, "the Region registered with the client")
      .def_property_readonly("client", &Allocation::client, "the client the memory is registered with")
      .def("close", &Allocation::Close,
           "Unregisters the memory and refuses new views (the memory itself is freed with the last\n"
           "reference). BufferError while a memoryview or numpy array of it exists.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](Allocation& a, py::args) { a.Close(); })
      .def("__repr__", [](const Allocation& a) {
        return "Allocation(nbytes=" + std::to_string(a.nbytes()) + ", region=" + std::to_string(a.region()->id) +
               (a.closed() ? ", closed" : a.registered() ? "" : ", unregistered") + ")";
      });
}

}  // namespace kvmesh::python

// kvmesh._core: the Python bindings of the kvmesh router (docs/python.md).
// The package kvmesh (python/kvmesh/__init__.py) re-exports these names; the
// signatures and types are written out in python/kvmesh/_core.pyi. Each class
// or area is bound by its own function in its own file (bindings.h).
#include <pybind11/pybind11.h>

#include "bindings.h"
#include "convert.h"
#include "kvmesh/build_config.h"

namespace kvmesh::python {

void BindBuild(py::module_& m) {
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
}

}  // namespace kvmesh::python

PYBIND11_MODULE(_core, m) {
  using namespace kvmesh::python;
  m.doc() = "kvmesh's router from Python: the C++ extension behind the kvmesh package.";
  InstallErrorTranslator();
  BindBuild(m);
  BindKeys(m);
  BindItemStatus(m);
  BindRegion(m);
  BindAllocation(m);
  BindSequence(m);
  BindClient(m);
  BindKvIndex(m);
  BindFrames(m);
}

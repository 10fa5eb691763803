// python/src/bindings.h — the parts of the kvmesh._core module, one function
// per class or area (pybind11's FAQ, "How can I reduce the build time?": each
// in its own file, compiled apart), called in order by the short
// PYBIND11_MODULE of module.cc. A class is bound before the ones whose
// signatures name it.
#pragma once

#include <pybind11/pybind11.h>

namespace kvmesh::python {

void BindBuild(pybind11::module_& m);       // module.cc: HAVE_CUDA, HAVE_UCX, VERSION
void BindKeys(pybind11::module_& m);        // keys.cc: chain_keys, derive_keys, text_keys
void BindItemStatus(pybind11::module_& m);  // bind_values.cc: ItemStatus
void BindRegion(pybind11::module_& m);      // bind_values.cc: Region
void BindAllocation(pybind11::module_& m);  // allocation.cc: Allocation
void BindSequence(pybind11::module_& m);    // bind_sequence.cc: Sequence
void BindClient(pybind11::module_& m);      // bind_client.cc: Client, EmbeddedCluster
void BindKvIndex(pybind11::module_& m);     // bind_kv_route.cc: KvIndex (KV-aware routing)
void BindFrames(pybind11::module_& m);      // bind_frames.cc: FrameStream (world-model frames)

}  // namespace kvmesh::python

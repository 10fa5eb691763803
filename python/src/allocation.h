// python/src/allocation.h — kvmesh.Allocation: memory from Client.allocate,
// registered with the client and exported through the buffer protocol.
//
// Ownership: the Allocation holds its Client (which stays open while it
// lives) and its Region, which co-owns the router's memory. The memory is
// freed when the Allocation object is deallocated (every Python reference
// gone: the object itself, memoryviews, numpy arrays, tensors made from it,
// and any call in flight that holds the region), never earlier, whatever
// happens to the client: close() and the client's close() only unregister it.
//
// Thread-safety: every member is used with the GIL held (buffer exports,
// close, the properties); the destructor runs with the GIL held and releases
// it while it waits for calls in flight (Client::Unregister).
#pragma once

#include <cstdint>
#include <memory>

#include "client.h"

namespace kvmesh::python {

class Allocation {
 public:
  Allocation(std::shared_ptr<Client> client, std::shared_ptr<Region> region)
      : client_(std::move(client)), region_(std::move(region)) {}
  ~Allocation();
  Allocation(const Allocation&) = delete;
  Allocation& operator=(const Allocation&) = delete;

  // Unregisters the memory and refuses new exports. BufferError (raised as
  // py::buffer_error) while a buffer export exists (a memoryview, a numpy
  // array). Closing twice is a no-op.
  void Close();

  bool closed() const { return closed_; }
  bool registered() const { return region_->registered; }
  size_t nbytes() const { return region_->bytes; }
  uintptr_t address() const { return reinterpret_cast<uintptr_t>(region_->base); }
  const std::shared_ptr<Region>& region() const { return region_; }
  const std::shared_ptr<Client>& client() const { return client_; }
  int exports() const { return exports_; }

  // The buffer protocol (installed on the Python type by BindAllocation).
  static int GetBuffer(PyObject* self, Py_buffer* view, int flags);
  static void ReleaseBuffer(PyObject* self, Py_buffer* view);

 private:
  void Unregister() noexcept;

  std::shared_ptr<Client> client_;
  std::shared_ptr<Region> region_;
  int exports_ = 0;  // live Py_buffer exports; guarded by the GIL
  bool closed_ = false;
};

}  // namespace kvmesh::python

// python/src/convert.h — conversions between Python objects and kvmesh's
// values for the `kvmesh._core` extension: status codes to exceptions, keys,
// token ids, request options, and the memory behind a Python object.
//
// Every function here needs the GIL (it touches Python objects), except
// StatusError, which is plain C++ and may be thrown with the GIL released.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstddef>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "kvmesh/request.h"
#include "kvmesh/status.h"
#include "kvmesh/types.h"

namespace kvmesh::python {

namespace py = pybind11;

// A non-OK Status on its way to Python: the translator installed by
// InstallErrorTranslator raises it as the kvmesh.errors class of its code.
class StatusError : public std::exception {
 public:
  explicit StatusError(Status s) : status_(std::move(s)), what_(status_.ToString()) {}
  const Status& status() const { return status_; }
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  Status status_;
  std::string what_;
};

[[noreturn]] inline void Throw(Status s) { throw StatusError(std::move(s)); }
inline void Check(const Status& s) {
  if (!s.ok()) Throw(s);
}
template <typename T>
T Value(Result<T> r) {
  if (!r.ok()) Throw(r.status());
  return std::move(r).value();
}

// "NOT_FOUND" for kNotFound: the names kvmesh.Error.code carries.
std::string CodeName(StatusCode code);

// Translates StatusError into kvmesh.errors.<Class>(message, code).
void InstallErrorTranslator();

// Keys are (hi, lo) pairs of ints in [0, 2**64).
BlockKey ToKey(py::handle h);
// `obj` itself when it is a list or a tuple; obj.tolist() when it has one (a
// numpy array or a tensor: Python ints in one call, not a numpy or 0-d tensor
// scalar per item); else `obj`.
py::object AsPlainSequence(py::handle obj);

std::vector<BlockKey> ToKeys(py::handle seq);
py::tuple FromKey(const BlockKey& k);
py::list FromKeys(const std::vector<BlockKey>& keys);

// Token ids from a list/tuple/range of ints, a 1-D integer buffer (numpy),
// or anything with tolist() (a torch tensor). Each must fit in int32.
std::vector<TokenId> ToTokens(py::handle obj);

// The setters of RequestOptions from an option's Python value (the table
// of options.h names one per keyword). InvalidArgument for a bad value.
void SetPriority(RequestOptions& o, py::handle v);
void SetLayers(RequestOptions& o, py::handle v);
void SetHeads(RequestOptions& o, py::handle v);
void SetTimeout(RequestOptions& o, py::handle v);
void SetExpert(RequestOptions& o, py::handle v);  // None: no hint (likewise the next two)
void SetLayerGroup(RequestOptions& o, py::handle v);
void SetRank(RequestOptions& o, py::handle v);
void SetScore(RequestOptions& o, py::handle v);
void SetReplace(RequestOptions& o, py::handle v);

// The contiguous memory behind a Python object, held for the object's
// lifetime: the buffer protocol (bytearray, memoryview, numpy arrays, ...)
// or a torch tensor (data_ptr / numel / element_size; must be contiguous).
// A tensor on a CUDA device is device memory. Move-only; the destructor
// releases the buffer and so needs the GIL.
class Memory {
 public:
  // InvalidArgument for an object with neither interface, a non-contiguous
  // one, a read-only one when `writable`, or a tensor on another device type.
  static Memory Acquire(py::handle obj, bool writable);

  Memory() = default;
  Memory(Memory&&) = default;
  Memory& operator=(Memory&&) = default;
  ~Memory();

  std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  bool device() const { return device_; }
  const py::object& owner() const { return owner_; }

 private:
  struct BufferDeleter {
    void operator()(Py_buffer* b) const;
  };
  std::unique_ptr<Py_buffer, BufferDeleter> view_;
  py::object owner_;
  std::byte* data_ = nullptr;
  size_t size_ = 0;
  bool device_ = false;
};

}  // namespace kvmesh::python

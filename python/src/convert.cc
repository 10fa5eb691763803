#include "convert.h"

#include <cctype>
#include <climits>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace kvmesh::python {

std::string CodeName(StatusCode code) {
  // "NotFound" -> "NOT_FOUND".
  std::string_view camel = StatusCodeName(code);
  std::string out;
  for (size_t i = 0; i < camel.size(); ++i) {
    const char c = camel[i];
    if (i > 0 && std::isupper(static_cast<unsigned char>(c)) && std::islower(static_cast<unsigned char>(camel[i - 1])))
      out += '_';
    out += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  }
  return out;
}

void InstallErrorTranslator() {
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      py::object make = py::module_::import("kvmesh.errors").attr("_make");
      py::object exc = make(CodeName(e.status().code()), e.status().message());
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
    }
  });
}

namespace {

uint64_t ToU64(py::handle h, const char* what) {
  if (!PyLong_Check(h.ptr()) && !PyIndex_Check(h.ptr())) Throw(InvalidArgument(std::string(what) + " must be an int"));
  py::object idx = py::reinterpret_steal<py::object>(PyNumber_Index(h.ptr()));  // numpy integers too
  if (!idx) {
    PyErr_Clear();
    Throw(InvalidArgument(std::string(what) + " must be an int"));
  }
  const unsigned long long v = PyLong_AsUnsignedLongLong(idx.ptr());
  if (v == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
    PyErr_Clear();
    Throw(InvalidArgument(std::string(what) + " must lie in [0, 2**64)"));
  }
  return static_cast<uint64_t>(v);
}

int64_t ToI64(py::handle h, const char* what) {
  if (!PyLong_Check(h.ptr()) && !PyIndex_Check(h.ptr())) Throw(InvalidArgument(std::string(what) + " must be an int"));
  py::object idx = py::reinterpret_steal<py::object>(PyNumber_Index(h.ptr()));
  if (!idx) {
    PyErr_Clear();
    Throw(InvalidArgument(std::string(what) + " must be an int"));
  }
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(idx.ptr(), &overflow);
  if (overflow != 0) Throw(InvalidArgument(std::string(what) + " is out of range"));
  return static_cast<int64_t>(v);
}

TokenId ToToken(int64_t v) {
  if (v < INT32_MIN || v > INT32_MAX) Throw(InvalidArgument("token id " + std::to_string(v) + " does not fit int32"));
  return static_cast<TokenId>(v);
}

// Tokens from a 1-D buffer of integers (numpy int8..int64, uint8..uint64).
bool TokensFromBuffer(py::handle obj, std::vector<TokenId>* out) {
  if (!PyObject_CheckBuffer(obj.ptr())) return false;
  Py_buffer b;
  if (PyObject_GetBuffer(obj.ptr(), &b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) {
    PyErr_Clear();
    Throw(InvalidArgument("tokens: the buffer is not C-contiguous"));
  }
  std::unique_ptr<Py_buffer, void (*)(Py_buffer*)> hold(&b, PyBuffer_Release);
  std::string_view fmt = b.format ? b.format : "B";
  if (!fmt.empty() && (fmt[0] == '<' || fmt[0] == '=' || fmt[0] == '@')) fmt.remove_prefix(1);
  if (b.ndim > 1) Throw(InvalidArgument("tokens must be one-dimensional"));
  if (fmt.size() != 1 || std::string_view("bBhHiIlLqQ").find(fmt[0]) == std::string_view::npos)
    Throw(InvalidArgument("tokens: buffer format '" + std::string(fmt) + "' is not an integer type"));
  const bool is_signed = std::islower(static_cast<unsigned char>(fmt[0]));
  const size_t n = static_cast<size_t>(b.len / b.itemsize);
  out->resize(n);
  const auto* p = static_cast<const unsigned char*>(b.buf);
  for (size_t i = 0; i < n; ++i, p += b.itemsize) {
    int64_t v = 0;
    switch (b.itemsize) {
      case 1: v = is_signed ? int64_t{*reinterpret_cast<const int8_t*>(p)} : int64_t{*p}; break;
      case 2: {
        int16_t s; uint16_t u;
        std::memcpy(&s, p, 2), std::memcpy(&u, p, 2);
        v = is_signed ? int64_t{s} : int64_t{u};
        break;
      }
      case 4: {
        int32_t s; uint32_t u;
        std::memcpy(&s, p, 4), std::memcpy(&u, p, 4);
        v = is_signed ? int64_t{s} : int64_t{u};
        break;
      }
      case 8: {
        uint64_t u;
        std::memcpy(&u, p, 8);
        if (!is_signed && u > static_cast<uint64_t>(INT64_MAX)) Throw(InvalidArgument("token id does not fit int32"));
        std::memcpy(&v, p, 8);
        break;
      }
      default: Throw(InvalidArgument("tokens: unsupported item size"));
    }
    (*out)[i] = ToToken(v);
  }
  return true;
}

Range ToRange(py::handle h, const char* what) {
  if (h.is_none()) return {};
  if (!py::isinstance<py::sequence>(h) || py::len(h) != 2)
    Throw(InvalidArgument(std::string(what) + " must be a (begin, end) pair"));
  py::sequence s = py::reinterpret_borrow<py::sequence>(h);
  const int64_t b = ToI64(s[0], what), e = ToI64(s[1], what);
  if (b < 0 || e < b || e > UINT32_MAX) Throw(InvalidArgument(std::string(what) + " must satisfy 0 <= begin <= end"));
  return Range{static_cast<uint32_t>(b), static_cast<uint32_t>(e)};
}

}  // namespace

py::object AsPlainSequence(py::handle obj) {
  if (!py::isinstance<py::list>(obj) && !py::isinstance<py::tuple>(obj) && py::hasattr(obj, "tolist"))
    return obj.attr("tolist")();
  return py::reinterpret_borrow<py::object>(obj);
}

BlockKey ToKey(py::handle h) {
  if (!py::isinstance<py::sequence>(h) || py::isinstance<py::str>(h) || py::len(h) != 2)
    Throw(InvalidArgument("a key is a (hi, lo) pair of ints"));
  py::sequence s = py::reinterpret_borrow<py::sequence>(h);
  return BlockKey{ToU64(s[0], "key hi"), ToU64(s[1], "key lo")};
}

namespace {

// Keys from an (n, 2) C-contiguous buffer of 64-bit unsigned ints (a numpy
// uint64 array, as kvmesh.derive_keys returns): one copy, no Python object
// per key. False when `obj` is not such a buffer.
bool KeysFromBuffer(py::handle obj, std::vector<BlockKey>* out) {
  if (!PyObject_CheckBuffer(obj.ptr())) return false;
  Py_buffer b;
  if (PyObject_GetBuffer(obj.ptr(), &b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) {
    PyErr_Clear();
    return false;
  }
  std::unique_ptr<Py_buffer, void (*)(Py_buffer*)> hold(&b, PyBuffer_Release);
  std::string_view fmt = b.format ? b.format : "B";
  if (!fmt.empty() && (fmt[0] == '<' || fmt[0] == '=' || fmt[0] == '@')) fmt.remove_prefix(1);
  if (b.ndim != 2 || b.shape[1] != 2 || b.itemsize != 8 || fmt.size() != 1 || (fmt[0] != 'Q' && fmt[0] != 'L'))
    return false;
  const size_t n = static_cast<size_t>(b.shape[0]);
  out->resize(n);
  static_assert(sizeof(BlockKey) == 16, "BlockKey is {hi, lo}");
  if (n != 0) std::memcpy(out->data(), b.buf, n * 16);
  return true;
}

}  // namespace

std::vector<BlockKey> ToKeys(py::handle seq) {
  std::vector<BlockKey> keys;
  if (KeysFromBuffer(seq, &keys)) return keys;
  if (!py::isinstance<py::sequence>(seq)) Throw(InvalidArgument("keys must be a sequence of (hi, lo) pairs"));
  py::sequence s = py::reinterpret_borrow<py::sequence>(seq);
  keys.reserve(py::len(s));
  // Each item held while it is read: iterating a py::sequence yields a
  // temporary accessor, and a py::handle taken from it dangles when the item
  // is made on access (a numpy array's rows): used after it was freed.
  for (py::object h : s) keys.push_back(ToKey(h));
  return keys;
}

py::tuple FromKey(const BlockKey& k) { return py::make_tuple(py::int_(k.hi), py::int_(k.lo)); }

py::list FromKeys(const std::vector<BlockKey>& keys) {
  py::list out(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) out[i] = FromKey(keys[i]);
  return out;
}

std::vector<TokenId> ToTokens(py::handle obj) {
  std::vector<TokenId> out;
  if (TokensFromBuffer(obj, &out)) return out;
  py::object seq = AsPlainSequence(obj);
  if (py::isinstance<py::str>(seq) || py::isinstance<py::bytes>(seq) || !py::isinstance<py::iterable>(seq))
    Throw(InvalidArgument("tokens must be a sequence of ints"));
  if (py::hasattr(seq, "__len__")) out.reserve(py::len(seq));
  for (py::handle h : seq) out.push_back(ToToken(ToI64(h, "token id")));
  return out;
}

void SetPriority(RequestOptions& o, py::handle v) {
  const int64_t p = ToI64(v, "priority");
  if (p < 0 || p >= kMaxPriorityClasses) Throw(InvalidArgument("priority must lie in [0, 8)"));
  o.priority = static_cast<Priority>(p);
}

void SetLayers(RequestOptions& o, py::handle v) { o.layers = ToRange(v, "layers"); }

void SetHeads(RequestOptions& o, py::handle v) { o.heads = ToRange(v, "heads"); }

void SetTimeout(RequestOptions& o, py::handle v) {
  o.timeout_ms = ToI64(v, "timeout_ms");
  if (o.timeout_ms < 0) Throw(InvalidArgument("timeout_ms must be >= 0"));
}

namespace {

// expert, layer_group, rank: a uint32 placement hint; None gives none.
void SetAffinity(RequestOptions& o, py::handle v, const char* what, Affinity (*make)(uint32_t)) {
  if (v.is_none()) return;
  const int64_t x = ToI64(v, what);
  if (x < 0 || x > UINT32_MAX) Throw(InvalidArgument(std::string(what) + " is out of range"));
  o.affinity = make(static_cast<uint32_t>(x));
}

}  // namespace

void SetExpert(RequestOptions& o, py::handle v) { SetAffinity(o, v, "expert", &Affinity::Expert); }

void SetLayerGroup(RequestOptions& o, py::handle v) { SetAffinity(o, v, "layer_group", &Affinity::LayerGroup); }

void SetRank(RequestOptions& o, py::handle v) { SetAffinity(o, v, "rank", &Affinity::Rank); }

void SetScore(RequestOptions& o, py::handle v) { o.score = py::cast<float>(v); }

void SetReplace(RequestOptions& o, py::handle v) { o.replace = py::cast<bool>(v); }

void Memory::BufferDeleter::operator()(Py_buffer* b) const {
  PyBuffer_Release(b);
  delete b;
}

Memory::~Memory() = default;

Memory Memory::Acquire(py::handle obj, bool writable) {
  Memory m;
  m.owner_ = py::reinterpret_borrow<py::object>(obj);
  if (PyObject_CheckBuffer(obj.ptr())) {
    auto* b = new Py_buffer;
    const int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj.ptr(), b, flags) != 0) {
      delete b;
      py::error_already_set why;  // takes the Python error (a closed Allocation's ValueError, ...)
      Throw(InvalidArgument(std::string(writable ? "the buffer must be writable and C-contiguous"
                                                 : "the buffer must be C-contiguous") +
                            " (" + why.what() + ")"));
    }
    m.view_.reset(b);
    m.data_ = static_cast<std::byte*>(b->buf);
    m.size_ = static_cast<size_t>(b->len);
    return m;
  }
  if (py::hasattr(obj, "data_ptr") && py::hasattr(obj, "element_size") && py::hasattr(obj, "numel")) {
    if (py::hasattr(obj, "is_contiguous") && !py::cast<bool>(obj.attr("is_contiguous")()))
      Throw(InvalidArgument("the tensor must be contiguous"));
    std::string device = "cpu";
    if (py::hasattr(obj, "device")) device = py::cast<std::string>(obj.attr("device").attr("type"));
    if (device != "cpu" && device != "cuda")
      Throw(InvalidArgument("tensors on '" + device + "' devices are not supported (cpu or cuda)"));
    m.device_ = device == "cuda";
    m.data_ = reinterpret_cast<std::byte*>(py::cast<uintptr_t>(obj.attr("data_ptr")()));
    m.size_ = py::cast<size_t>(obj.attr("numel")()) * py::cast<size_t>(obj.attr("element_size")());
    return m;
  }
  Throw(InvalidArgument(std::string("expected a buffer (bytearray, memoryview, numpy array) or a tensor, got ") +
                        std::string(py::str(obj.get_type().attr("__name__")))));
}

}  // namespace kvmesh::python

#include "keys.h"

#include <pybind11/numpy.h>
#include <xxhash.h>

#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "convert.h"
#include "kvmesh/block_key.h"

namespace kvmesh::python {
namespace {

namespace py = pybind11;
using KeyArray = py::array_t<uint64_t, py::array::c_style>;

BlockKey Hash(const void* p, size_t n) {
  const XXH128_hash_t h = XXH3_128bits(p, n);
  return ContentKey(BlockKey{h.high64, h.low64});  // never a group tag (kvmesh/block_key.h)
}

// bytes, bytearray or str (UTF-8) as raw bytes.
std::string Bytes(py::handle h, const char* what) {
  if (py::isinstance<py::str>(h)) return py::cast<std::string>(h);
  if (py::isinstance<py::bytes>(h)) return std::string(py::cast<py::bytes>(h));
  if (PyByteArray_Check(h.ptr()))
    return std::string(PyByteArray_AsString(h.ptr()), static_cast<size_t>(PyByteArray_Size(h.ptr())));
  Throw(InvalidArgument(std::string(what) + " must be bytes or str"));
}

KeyArray NewKeys(size_t n) { return KeyArray({static_cast<py::ssize_t>(n), static_cast<py::ssize_t>(2)}); }

KeyArray ChainKeys(py::handle tokens, int64_t block_tokens, py::handle salt_obj) {
  if (block_tokens <= 0 || block_tokens > (1 << 20)) Throw(InvalidArgument("block_tokens must lie in [1, 2**20]"));
  const std::vector<TokenId> t = ToTokens(tokens);
  std::string root_in = "kvmesh-adapter-v1";
  root_in += Bytes(salt_obj, "salt");
  const size_t bt = static_cast<size_t>(block_tokens), n = t.size() / bt;
  KeyArray out = NewKeys(n);
  {
    py::gil_scoped_release unlocked;
    BlockKey prev = Hash(root_in.data(), root_in.size());
    for (size_t i = 0; i < n; ++i) {
      prev = KeyDeriver::Chain(prev, std::span<const TokenId>(t.data() + i * bt, bt));
      uint64_t* p = out.mutable_data() + 2 * i;  // numpy's buffer: no Python call
      p[0] = prev.hi;
      p[1] = prev.lo;
    }
  }
  return out;
}

KeyArray DeriveKeys(py::handle keys_obj, py::handle tags_obj) {
  const std::vector<BlockKey> keys = ToKeys(keys_obj);
  std::vector<std::string> tags;
  if (py::isinstance<py::str>(tags_obj) || py::isinstance<py::bytes>(tags_obj)) {
    tags.push_back(Bytes(tags_obj, "tag"));
  } else {
    for (py::handle h : tags_obj) tags.push_back(Bytes(h, "tag"));
  }
  KeyArray out = NewKeys(keys.size() * tags.size());
  uint64_t* dst = out.mutable_data();
  {
    py::gil_scoped_release unlocked;
    std::string buf;
    for (size_t i = 0; i < keys.size(); ++i) {
      for (size_t j = 0; j < tags.size(); ++j) {
        buf.resize(16 + tags[j].size());
        std::memcpy(buf.data(), &keys[i].hi, 8);
        std::memcpy(buf.data() + 8, &keys[i].lo, 8);
        std::memcpy(buf.data() + 16, tags[j].data(), tags[j].size());
        const BlockKey k = Hash(buf.data(), buf.size());
        dst[2 * (i * tags.size() + j)] = k.hi;
        dst[2 * (i * tags.size() + j) + 1] = k.lo;
      }
    }
  }
  return out;
}

KeyArray TextKeys(py::handle texts, py::handle salt_obj) {
  std::string prefix = "kvmesh-text-v1";
  prefix += Bytes(salt_obj, "salt");
  prefix.push_back('\0');
  std::vector<std::string> in;
  for (py::handle h : texts) in.push_back(Bytes(h, "text"));
  KeyArray out = NewKeys(in.size());
  uint64_t* dst = out.mutable_data();
  {
    py::gil_scoped_release unlocked;
    std::string buf;
    for (size_t i = 0; i < in.size(); ++i) {
      buf.assign(prefix);
      buf += in[i];
      const BlockKey k = Hash(buf.data(), buf.size());
      dst[2 * i] = k.hi;
      dst[2 * i + 1] = k.lo;
    }
  }
  return out;
}

}  // namespace

void BindKeys(py::module_& m) {
  m.def("chain_keys", &ChainKeys, py::arg("tokens"), py::arg("block_tokens"), py::arg("salt"),
        "Chained keys of the full blocks of `tokens` (blocks of `block_tokens`), rooted at\n"
        "H('kvmesh-adapter-v1' | salt): an (n, 2) uint64 array, one (hi, lo) row per block.\n"
        "A key names its whole prefix and the salt (the adapters put the engine's model and\n"
        "the tenant there).");
  m.def("derive_keys", &DeriveKeys, py::arg("keys"), py::arg("tags"),
        "H(key | tag) for every key and tag, key-major: row i * len(tags) + j is keys[i] with\n"
        "tags[j]. keys: any sequence of keys or an (n, 2) uint64 array; tags: bytes or str\n"
        "(one, or a sequence).");
  m.def("text_keys", &TextKeys, py::arg("texts"), py::arg("salt"),
        "A key for each text (an engine's string key, e.g. SGLang's page hash) under `salt`:\n"
        "H('kvmesh-text-v1' | salt | 0 | text), an (n, 2) uint64 array.");
}

}  // namespace kvmesh::python

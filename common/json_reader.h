// common/json_reader.h — strict reading of JSON objects with path-qualified errors.
//
// Used by every config section so that a bad config always names the JSON path
// of the field and the reason:
//
//   ObjectReader r(j, "$.model");
//   r.Required("model_id", &spec.model_id).Optional("num_experts", &spec.num_experts);
//   KVMESH_RETURN_IF_ERROR(r.Finish());   // also rejects unknown keys
//
// The first error wins; later calls become no-ops. Not thread-safe.
#pragma once

#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvmesh/size.h"
#include "kvmesh/status.h"

namespace kvmesh {

std::string JsonTypeName(const nlohmann::json& j);

class ObjectReader {
 public:
  ObjectReader(const nlohmann::json& j, std::string path);

  bool ok() const { return status_.ok(); }
  const std::string& path() const { return path_; }
  std::string PathOf(std::string_view key) const { return path_ + "." + std::string(key); }

  template <typename T>
  ObjectReader& Required(const char* key, T* out) {
    return Field(key, out, /*required=*/true);
  }
  template <typename T>
  ObjectReader& Optional(const char* key, T* out) {
    return Field(key, out, /*required=*/false);
  }
  // A byte size: a string ("8GB", "512MiB") or a non-negative integer. Must be > 0.
  ObjectReader& Size(const char* key, uint64_t* out, bool required);

  // Marks `key` as known and returns it (nullptr when absent, or required and absent -> error).
  const nlohmann::json* Child(const char* key, bool required = false);

  // Records an error at this object's field `key` (first error wins).
  void Fail(std::string_view key, std::string reason);
  void FailAt(std::string path, std::string reason);

  // OK, or the first error; reports the first unknown key if there was no other error.
  Status Finish();

 private:
  template <typename T>
  ObjectReader& Field(const char* key, T* out, bool required);
  template <typename T>
  bool Convert(const nlohmann::json& v, const char* key, T* out);

  const nlohmann::json& j_;
  std::string path_;
  std::set<std::string> seen_;
  Status status_;
};

template <typename T>
ObjectReader& ObjectReader::Field(const char* key, T* out, bool required) {
  const nlohmann::json* v = Child(key, required);
  if (v == nullptr || !ok()) return *this;
  T tmp{};
  if (Convert(*v, key, &tmp)) *out = std::move(tmp);
  return *this;
}

template <typename T>
bool ObjectReader::Convert(const nlohmann::json& v, const char* key, T* out) {
  if constexpr (std::is_same_v<T, std::string>) {
    if (!v.is_string()) {
      Fail(key, "expected a string, got " + JsonTypeName(v));
      return false;
    }
    *out = v.get<std::string>();
    return true;
  } else if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) {
      Fail(key, "expected true or false, got " + JsonTypeName(v));
      return false;
    }
    *out = v.get<bool>();
    return true;
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!v.is_number()) {
      Fail(key, "expected a number, got " + JsonTypeName(v));
      return false;
    }
    *out = v.get<T>();
    return true;
  } else if constexpr (std::is_integral_v<T>) {
    if (!v.is_number_integer()) {
      Fail(key, "expected an integer, got " + JsonTypeName(v));
      return false;
    }
    if constexpr (std::is_unsigned_v<T>) {
      if (v.is_number_unsigned() ? false : v.get<int64_t>() < 0) {
        Fail(key, "must not be negative (got " + v.dump() + ")");
        return false;
      }
      uint64_t x = v.get<uint64_t>();
      if (x > std::numeric_limits<T>::max()) {
        Fail(key, "too large (max " + std::to_string(std::numeric_limits<T>::max()) + ")");
        return false;
      }
      *out = static_cast<T>(x);
    } else {
      int64_t x = v.get<int64_t>();
      if (x < std::numeric_limits<T>::min() || x > std::numeric_limits<T>::max()) {
        Fail(key, "out of range");
        return false;
      }
      *out = static_cast<T>(x);
    }
    return true;
  } else {
    static_assert(sizeof(T) == 0, "unsupported field type");
  }
}

}  // namespace kvmesh

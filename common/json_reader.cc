#include "common/json_reader.h"

namespace kvmesh {

std::string JsonTypeName(const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null: return "null";
    case nlohmann::json::value_t::object: return "an object";
    case nlohmann::json::value_t::array: return "an array";
    case nlohmann::json::value_t::string: return "a string";
    case nlohmann::json::value_t::boolean: return "a boolean";
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned: return "an integer";
    case nlohmann::json::value_t::number_float: return "a number";
    default: return "an unsupported value";
  }
}

ObjectReader::ObjectReader(const nlohmann::json& j, std::string path)
    : j_(j), path_(std::move(path)) {
  if (!j_.is_object()) FailAt(path_, "expected an object, got " + JsonTypeName(j_));
}

const nlohmann::json* ObjectReader::Child(const char* key, bool required) {
  seen_.insert(key);
  if (!ok()) return nullptr;
  auto it = j_.find(key);
  if (it == j_.end()) {
    if (required) Fail(key, "required field is missing");
    return nullptr;
  }
  return &*it;
}

ObjectReader& ObjectReader::Size(const char* key, uint64_t* out, bool required) {
  const nlohmann::json* v = Child(key, required);
  if (v == nullptr || !ok()) return *this;
  uint64_t bytes = 0;
  if (v->is_string()) {
    Result<uint64_t> r = ParseSize(v->get<std::string>());
    if (!r.ok()) {
      Fail(key, r.status().message());
      return *this;
    }
    bytes = *r;
  } else if (v->is_number_integer()) {
    if (!v->is_number_unsigned() && v->get<int64_t>() < 0) {
      Fail(key, "size must be positive (got " + v->dump() + ")");
      return *this;
    }
    bytes = v->get<uint64_t>();
  } else {
    Fail(key, "expected a size such as \"8GB\", \"512MiB\" or a byte count, got " + JsonTypeName(*v));
    return *this;
  }
  if (bytes == 0) {
    Fail(key, "size must be positive (got " + v->dump() + ")");
    return *this;
  }
  *out = bytes;
  return *this;
}

void ObjectReader::Fail(std::string_view key, std::string reason) {
  FailAt(PathOf(key), std::move(reason));
}

void ObjectReader::FailAt(std::string path, std::string reason) {
  if (!status_.ok()) return;
  status_ = InvalidArgument(path + ": " + reason);
}

Status ObjectReader::Finish() {
  if (!ok()) return status_;
  for (auto it = j_.begin(); it != j_.end(); ++it) {
    if (!seen_.count(it.key())) {
      std::string known;
      for (const auto& k : seen_) known += (known.empty() ? "" : ", ") + k;
      FailAt(PathOf(it.key()), "unknown key (known keys here: " + known + ")");
      break;
    }
  }
  return status_;
}

}  // namespace kvmesh

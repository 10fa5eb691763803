#include "kvmesh/types.h"

#include <cstdio>

namespace kvmesh {

std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kFp16: return "fp16";
    case DType::kBf16: return "bf16";
    case DType::kFp32: return "fp32";
  }
  return "?";
}

Result<DType> ParseDType(std::string_view name) {
  if (name == "fp16" || name == "float16") return DType::kFp16;
  if (name == "bf16" || name == "bfloat16") return DType::kBf16;
  if (name == "fp32" || name == "float32") return DType::kFp32;
  return InvalidArgument("unknown dtype '" + std::string(name) + "' (expected fp16, bf16 or fp32)");
}

size_t ModelSpec::FullBlockBytes() const { return BlockLayout::Full(*this).bytes(); }

Status ModelSpec::Validate() const {
  if (model_id.empty()) return InvalidArgument("model_id: must not be empty");
  if (num_layers == 0) return InvalidArgument("num_layers: must be > 0");
  if (num_kv_heads == 0) return InvalidArgument("num_kv_heads: must be > 0");
  if (head_dim == 0) return InvalidArgument("head_dim: must be > 0");
  if (block_tokens == 0) return InvalidArgument("block_tokens: must be > 0");
  return Status::Ok();
}

BlockLayout BlockLayout::Full(const ModelSpec& m) {
  return BlockLayout{{0, m.num_layers}, {0, m.num_kv_heads}, m.block_tokens, m.head_dim, m.dtype};
}

Result<BlockLayout> BlockLayout::Slice(const ModelSpec& m, Range layers, Range heads) {
  if (layers.empty() || layers.end > m.num_layers)
    return InvalidArgument("layer range [" + std::to_string(layers.begin) + "," +
                           std::to_string(layers.end) + ") outside the model's " +
                           std::to_string(m.num_layers) + " layers");
  if (heads.empty() || heads.end > m.num_kv_heads)
    return InvalidArgument("head range [" + std::to_string(heads.begin) + "," +
                           std::to_string(heads.end) + ") outside the model's " +
                           std::to_string(m.num_kv_heads) + " KV heads");
  return BlockLayout{layers, heads, m.block_tokens, m.head_dim, m.dtype};
}

std::string BlockKey::ToHex() const {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(hi),
                static_cast<unsigned long long>(lo));
  return std::string(buf, 32);
}

Result<BlockKey> BlockKey::FromHex(std::string_view hex) {
  if (hex.size() != 32) return InvalidArgument("a block key is 32 hex digits");
  BlockKey k;
  for (size_t i = 0; i < 32; ++i) {
    char c = hex[i];
    uint64_t v;
    if (c >= '0' && c <= '9') v = c - '0';
    else if (c >= 'a' && c <= 'f') v = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F') v = c - 'A' + 10;
    else return InvalidArgument("a block key is 32 hex digits");
    uint64_t& half = i < 16 ? k.hi : k.lo;
    half = (half << 4) | v;
  }
  return k;
}

}  // namespace kvmesh

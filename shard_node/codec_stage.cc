#include "shard_node/codec_stage.h"

#include <vector>

#include "kernels/codec.h"
#include "kernels/lowrank.h"

namespace kvmesh {
namespace {

Result<kernels::CodecSpec> SpecAt(const std::string& text, const std::string& path) {
  Result<kernels::CodecSpec> s = kernels::ParseCodecSpec(text);
  if (!s.ok()) return InvalidArgument(path + ": " + s.status().message());
  return s;
}

}  // namespace

CodecStage::~CodecStage() = default;

Result<kernels::CodecPolicy> MakeCodecPolicy(const CodecConfig& c, const std::string& path) {
  kernels::CodecPolicy p;
  KVMESH_ASSIGN_OR_RETURN(p.base, SpecAt(c.codec, path + ".codec"));
  for (size_t i = 0; i < c.layers.size(); ++i) {
    KVMESH_ASSIGN_OR_RETURN(kernels::CodecSpec s,
                            SpecAt(c.layers[i].codec, path + ".layers[" + std::to_string(i) + "].codec"));
    p.rules.push_back({c.layers[i].layers, s});
  }
  Result<kernels::Lossless> ll = kernels::ParseLossless(c.lossless);
  if (!ll.ok()) return InvalidArgument(path + ".lossless: " + ll.status().message());
  p.lossless = *ll;
  p.lossless_level = c.zstd_level;
  p.threads = c.threads;
  if (!c.basis.empty()) {
    Result<kernels::LowRankBasis> b = kernels::LowRankBasis::Load(c.basis);
    if (!b.ok()) return InvalidArgument(path + ".basis: " + b.status().message());
    p.basis = std::make_shared<kernels::LowRankBasis>(std::move(b).value());
  }
  return p;
}

Result<std::unique_ptr<CodecStage>> CodecStage::Create(const ClusterConfig& config) {
  const CodecConfig& c = config.codec;
  if (!c.enabled()) return std::unique_ptr<CodecStage>();
  KVMESH_ASSIGN_OR_RETURN(kernels::CodecPolicy p, MakeCodecPolicy(c, "$.codec"));
  const uint8_t id = kernels::PrimaryCodecId(p);
  Result<std::unique_ptr<kernels::Codec>> codec = kernels::MakeCodec(std::move(p));
  if (!codec.ok()) return InvalidArgument("$.codec: " + codec.status().message());
  const kernels::BlockShape shape = kernels::BlockShape::FromLayout(BlockLayout::Full(config.model));
  Result<size_t> enc = (*codec)->MaxEncodedSize(shape);
  if (!enc.ok()) return InvalidArgument("$.codec: " + enc.status().message());
  std::unique_ptr<CodecStage> st(new CodecStage());
  st->codec_ = std::move(codec).value();
  st->name_ = st->codec_->name();
  st->codec_id_ = id;
  st->raw_bytes_ = shape.bytes();
  st->enc_bytes_ = *enc;
  st->layout_ = BlockLayout::Full(config.model);
  return st;
}

Result<std::span<const std::byte>> CodecStage::Encode(std::span<const std::byte> raw) const {
  thread_local std::vector<std::byte> buf;
  if (!Encodes(raw))
    return InvalidArgument("codec stage: a " + std::to_string(raw.size()) + "-byte payload is not a full block (" +
                           std::to_string(raw_bytes_) + " bytes)");
  buf.resize(enc_bytes_);
  KVMESH_ASSIGN_OR_RETURN(size_t n, codec_->Encode(kernels::BlockShape::FromLayout(layout_), raw, buf));
  return std::span<const std::byte>(buf.data(), n);
}

Result<size_t> CodecStage::Decode(std::span<const std::byte> stored, std::span<std::byte> dst) const {
  KVMESH_ASSIGN_OR_RETURN(kernels::BlockInfo info, kernels::InspectBlock(stored));
  const size_t need = info.shape.bytes();
  if (dst.size() < need)
    return ResourceExhausted("destination holds " + std::to_string(dst.size()) + " bytes, the decoded block needs " +
                             std::to_string(need));
  KVMESH_RETURN_IF_ERROR(codec_->Decode(stored, dst));
  return need;
}

}  // namespace kvmesh

#include "kernels/block_format.h"

#include <cstring>
#include <string>

#include "kernels/xxh3_dispatch.h"

namespace kvmesh::kernels {
namespace {

template <typename T>
void Put(uint8_t* p, size_t off, T v) {
  std::memcpy(p + off, &v, sizeof(T));
}
template <typename T>
T Get(const uint8_t* p, size_t off) {
  T v;
  std::memcpy(&v, p + off, sizeof(T));
  return v;
}

uint64_t BlockChecksum(const uint8_t* block, size_t total) {
  const uint64_t seed = Xxh3(block, kChecksumOffset);
  return Xxh3Seeded(block + kBlockHeaderBytes, total - kBlockHeaderBytes, seed);
}

bool ValidAxis(uint8_t a) { return a == kPerToken || a == kPerChannel; }

}  // namespace

uint64_t SegmentBodyBytes(const CodecSpec& spec, const BlockShape& shape, uint32_t layers) {
  const PlaneGeom k = PlaneGeometry(spec, shape, 0, spec.rank);
  const PlaneGeom v = PlaneGeometry(spec, shape, 1, spec.rank);
  return uint64_t{layers} * shape.heads * (k.bytes + v.bytes);
}

void WriteBlockMetadata(const BlockInfo& info, uint8_t* out) {
  std::memset(out, 0, MetadataBytes(info.segments.size()));
  Put<uint32_t>(out, 0, kBlockMagic);
  Put<uint16_t>(out, 4, kBlockVersion);
  Put<uint8_t>(out, 6, static_cast<uint8_t>(info.shape.dtype));
  Put<uint8_t>(out, 7, static_cast<uint8_t>(info.lossless));
  Put<uint32_t>(out, 8, info.shape.layer_begin);
  Put<uint32_t>(out, 12, info.shape.layers);
  Put<uint32_t>(out, 16, info.shape.head_begin);
  Put<uint32_t>(out, 20, info.shape.heads);
  Put<uint32_t>(out, 24, info.shape.tokens);
  Put<uint32_t>(out, 28, info.shape.head_dim);
  Put<uint16_t>(out, 32, static_cast<uint16_t>(info.segments.size()));
  Put<uint64_t>(out, 40, info.body_bytes);
  Put<uint64_t>(out, 48, info.stored_bytes);
  for (size_t i = 0; i < info.segments.size(); ++i) {
    const SegmentInfo& s = info.segments[i];
    uint8_t* e = out + kBlockHeaderBytes + i * kSegmentEntryBytes;
    Put<uint8_t>(e, 0, s.spec.kind);
    Put<uint8_t>(e, 1, s.spec.key_axis);
    Put<uint8_t>(e, 2, s.spec.value_axis);
    Put<uint32_t>(e, 4, s.spec.group_size);
    Put<uint32_t>(e, 8, s.layer_begin);
    Put<uint32_t>(e, 12, s.layers);
    Put<uint32_t>(e, 16, s.spec.rank);
    Put<uint64_t>(e, 24, s.basis_id);
    Put<uint64_t>(e, 32, s.offset);
    Put<uint64_t>(e, 40, s.bytes);
  }
}

void SealBlock(uint8_t* block, size_t total) { Put<uint64_t>(block, kChecksumOffset, BlockChecksum(block, total)); }

BlockHasher::BlockHasher(const uint8_t* header) : stream_(std::make_unique<Xxh3Stream>(Xxh3(header, kChecksumOffset))) {}
BlockHasher::~BlockHasher() = default;
void BlockHasher::Update(const uint8_t* p, size_t n) { stream_->Update(p, n); }
void BlockHasher::Seal(uint8_t* header) { Put<uint64_t>(header, kChecksumOffset, stream_->Digest()); }

Result<BlockInfo> InspectBlock(std::span<const std::byte> block) {
  const auto* p = reinterpret_cast<const uint8_t*>(block.data());
  const size_t n = block.size();
  if (n < kBlockHeaderBytes)
    return DataLoss("compressed block truncated: " + std::to_string(n) + " bytes, the header alone needs 64");
  if (Get<uint32_t>(p, 0) != kBlockMagic) return InvalidArgument("not a kvmesh compressed block (bad magic)");
  BlockInfo info;
  info.version = Get<uint16_t>(p, 4);
  if (info.version != kBlockVersion)
    return InvalidArgument("compressed block version " + std::to_string(info.version) + " is not supported (this build reads " +
                           std::to_string(kBlockVersion) + ")");
  const uint8_t dtype = Get<uint8_t>(p, 6), lossless = Get<uint8_t>(p, 7);
  if (dtype > 2) return DataLoss("compressed block: bad dtype " + std::to_string(dtype));
  if (lossless > 2) return DataLoss("compressed block: bad lossless stage " + std::to_string(lossless));
  info.shape.dtype = static_cast<DType>(dtype);
  info.lossless = static_cast<Lossless>(lossless);
  info.shape.layer_begin = Get<uint32_t>(p, 8);
  info.shape.layers = Get<uint32_t>(p, 12);
  info.shape.head_begin = Get<uint32_t>(p, 16);
  info.shape.heads = Get<uint32_t>(p, 20);
  info.shape.tokens = Get<uint32_t>(p, 24);
  info.shape.head_dim = Get<uint32_t>(p, 28);
  if (Status s = info.shape.Validate(); !s.ok()) return DataLoss("compressed block: " + s.message());
  const uint16_t segments = Get<uint16_t>(p, 32);
  info.body_bytes = Get<uint64_t>(p, 40);
  info.stored_bytes = Get<uint64_t>(p, 48);
  if (segments == 0 || segments > info.shape.layers)
    return DataLoss("compressed block: " + std::to_string(segments) + " segments for " +
                    std::to_string(info.shape.layers) + " layers");
  const size_t meta = MetadataBytes(segments);
  if (n < meta) return DataLoss("compressed block truncated inside its segment table");
  if (info.stored_bytes > n - meta)
    return DataLoss("compressed block truncated: " + std::to_string(n) + " bytes, the header announces " +
                    std::to_string(meta + info.stored_bytes));
  info.total_bytes = meta + info.stored_bytes;
  if (Get<uint64_t>(p, kChecksumOffset) != BlockChecksum(p, info.total_bytes))
    return DataLoss("compressed block checksum mismatch (corrupt or torn)");
  if (info.lossless == Lossless::kNone && info.stored_bytes != info.body_bytes)
    return DataLoss("compressed block: stored and body lengths differ without a lossless stage");
  if (info.body_bytes > 4 * kMaxRawBytes) return DataLoss("compressed block: body length out of range");

  uint64_t next_layer = info.shape.layer_begin, next_offset = 0;
  for (uint16_t i = 0; i < segments; ++i) {
    const uint8_t* e = p + kBlockHeaderBytes + size_t{i} * kSegmentEntryBytes;
    SegmentInfo s;
    const uint8_t kind = Get<uint8_t>(e, 0), ka = Get<uint8_t>(e, 1), va = Get<uint8_t>(e, 2);
    const std::string where = "compressed block segment " + std::to_string(i) + ": ";
    if (kind >= kCodecKindCount) return InvalidArgument(where + "unknown codec id " + std::to_string(kind));
    if (!ValidAxis(ka) || !ValidAxis(va)) return DataLoss(where + "bad quantisation axis");
    s.spec.kind = static_cast<CodecKind>(kind);
    s.spec.key_axis = static_cast<QuantAxis>(ka);
    s.spec.value_axis = static_cast<QuantAxis>(va);
    s.spec.group_size = Get<uint32_t>(e, 4);
    s.layer_begin = Get<uint32_t>(e, 8);
    s.layers = Get<uint32_t>(e, 12);
    s.spec.rank = Get<uint32_t>(e, 16);
    s.basis_id = Get<uint64_t>(e, 24);
    s.offset = Get<uint64_t>(e, 32);
    s.bytes = Get<uint64_t>(e, 40);
    if (IsQuantising(kind) && (s.spec.group_size == 0 || s.spec.group_size > kMaxExtent))
      return DataLoss(where + "bad group size " + std::to_string(s.spec.group_size));
    if (kind == kCodecLowRank && (s.spec.rank == 0 || s.spec.rank > info.shape.head_dim))
      return DataLoss(where + "bad rank " + std::to_string(s.spec.rank));
    if (s.layer_begin != next_layer || s.layers == 0 ||
        uint64_t{s.layer_begin} + s.layers > uint64_t{info.shape.layer_begin} + info.shape.layers)
      return DataLoss(where + "layer range does not continue the previous segment");
    if (s.offset != next_offset) return DataLoss(where + "offset does not continue the previous segment");
    const uint64_t want = SegmentBodyBytes(s.spec, info.shape, s.layers);
    if (s.bytes != want)
      return DataLoss(where + "length " + std::to_string(s.bytes) + " does not match its shape (" + std::to_string(want) + ")");
    next_layer = uint64_t{s.layer_begin} + s.layers;
    next_offset += s.bytes;
    info.segments.push_back(s);
  }
  if (next_layer != uint64_t{info.shape.layer_begin} + info.shape.layers)
    return DataLoss("compressed block: segments do not cover every layer");
  if (next_offset != info.body_bytes) return DataLoss("compressed block: segment lengths do not add up to the body");
  return info;
}

}  // namespace kvmesh::kernels

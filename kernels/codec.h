// kernels/codec.h — KV-block compression codecs (docs/block-format.md).
//
// A Codec turns one raw KV block (layout [layer][k|v][head][token][dim], see
// kvmesh/types.h) into a self-describing compressed block (docs/block-format.md)
// and back. What it does per layer range is a CodecPolicy: a base CodecSpec
// (fp16, bf16, int8, int4, fp8-e4m3, fp8-e5m2, lowrank, raw), optional rules
// that give other layer ranges another spec (mixed precision by layer), and
// an optional lossless stage (lz4, zstd) over the result.
//
//   CodecPolicy p;
//   p.base = *ParseCodecSpec("int8");           // KIVI axes, group 128
//   KVMESH_ASSIGN_OR_RETURN(auto codec, MakeCodec(p));
//   std::vector<std::byte> blob(codec->MaxEncodedSize(shape));
//   KVMESH_ASSIGN_OR_RETURN(size_t n, codec->Encode(shape, raw, blob));
//   KVMESH_RETURN_IF_ERROR(DecodeBlock({blob.data(), n}, raw_out));
//
// Decoding needs no codec object: the block names its codec, shape and
// parameters. Corrupt or truncated blocks are rejected with DataLoss (checksum,
// lengths) or InvalidArgument (unknown version/codec), never read out of bounds.
//
// Thread-safety: Codec objects are immutable after MakeCodec; Encode/Decode may
// run concurrently from many threads. Large blocks are split over threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/codec_math.h"
#include "kvmesh/status.h"
#include "kvmesh/types.h"

namespace kvmesh::kernels {

class LowRankBasis;

// Shape of a raw block (or slice): layers [layer_begin, +layers) and heads
// [head_begin, +heads) of the model, `tokens` tokens of `head_dim` each.
struct BlockShape {
  uint32_t layer_begin = 0;
  uint32_t layers = 0;
  uint32_t head_begin = 0;
  uint32_t heads = 0;
  uint32_t tokens = 0;
  uint32_t head_dim = 0;
  DType dtype = DType::kFp16;

  size_t planes() const { return size_t{2} * layers * heads; }
  size_t plane_elements() const { return size_t{tokens} * head_dim; }
  size_t elements() const { return planes() * plane_elements(); }
  size_t bytes() const { return elements() * DTypeSize(dtype); }
  // InvalidArgument unless every extent is > 0 and the block is < 2^40 bytes.
  Status Validate() const;
  static BlockShape FromLayout(const BlockLayout& l);
  std::string ToString() const;  // "L4xH8xT64xD128 fp16"
  friend bool operator==(const BlockShape&, const BlockShape&) = default;
};

enum class Lossless : uint8_t { kNone = 0, kLz4 = 1, kZstd = 2 };

// What a codec does to the layers it covers.
struct CodecSpec {
  CodecKind kind = kCodecFp16;
  uint32_t group_size = 128;             // quantising codecs: elements per scale
  QuantAxis key_axis = kPerChannel;      // KIVI: keys per channel ...
  QuantAxis value_axis = kPerToken;      // ... values per token
  uint32_t rank = 0;                     // lowrank: the basis rank (0 = the basis's)

  friend bool operator==(const CodecSpec&, const CodecSpec&) = default;
};

// A layer-range override: absolute model layers [layers.begin, layers.end).
struct LayerRule {
  Range layers;
  CodecSpec spec;
};

struct CodecPolicy {
  CodecSpec base;
  std::vector<LayerRule> rules;  // first matching rule wins; others use `base`
  Lossless lossless = Lossless::kNone;
  int lossless_level = 0;        // zstd level (0: 3); lz4 ignores it
  std::shared_ptr<const LowRankBasis> basis;  // REQUIRED when any spec is lowrank
  uint32_t threads = 0;          // worker threads for large blocks (0: hardware)
  // Force the scalar CPU path (tests compare it with the vector path).
  bool force_scalar = false;
};

// ---- Registry -------------------------------------------------------------------
struct CodecInfo {
  std::string_view name;         // "int8"
  CodecKind kind;
  bool quantising;               // has scales and a CUDA kernel
  std::string_view description;
};
// All codecs, in CodecKind order.
std::span<const CodecInfo> ListCodecs();
// NotFound naming the known codecs.
Result<const CodecInfo*> FindCodec(std::string_view name);
const CodecInfo& CodecInfoOf(CodecKind kind);

// Parses "int8", "int4:g64", "int4:g32:token", "int8:kivi", "lowrank:r32",
// "fp8-e4m3:g128". Suffixes: gN (group), kivi (keys per channel, values per
// token; the default), token (both per token), channel (both per channel), rN (rank).
Result<CodecSpec> ParseCodecSpec(std::string_view text);
std::string CodecSpecName(const CodecSpec& s);  // inverse of ParseCodecSpec
Result<Lossless> ParseLossless(std::string_view text);  // "none" | "lz4" | "zstd"
std::string_view LosslessName(Lossless l);

// ---- Codecs ---------------------------------------------------------------------------
class Codec {
 public:
  virtual ~Codec() = default;
  // "int8:g128:kivi", "fp16[0-2]+int4:g128:kivi+zstd" for mixed policies.
  virtual std::string name() const = 0;
  virtual const CodecPolicy& policy() const = 0;
  // Bytes Encode may write for `shape` (exact when there is no lossless stage;
  // with one, the block is stored uncompressed whenever compression does not help).
  virtual Result<size_t> MaxEncodedSize(const BlockShape& shape) const = 0;
  // Encodes `raw` (shape.bytes()) into `out` and returns the bytes written.
  // Errors: InvalidArgument (bad shape, short buffers, basis mismatch).
  virtual Result<size_t> Encode(const BlockShape& shape, std::span<const std::byte> raw,
                                std::span<std::byte> out) const = 0;
  // DecodeBlock with this codec's basis and CPU path.
  virtual Status Decode(std::span<const std::byte> block, std::span<std::byte> raw) const = 0;
};

// InvalidArgument for a bad policy (unknown kind, group 0, lowrank without a
// basis, overlapping rules).
Result<std::unique_ptr<Codec>> MakeCodec(CodecPolicy policy);

// ---- Blocks -------------------------------------------------------------------------------
struct SegmentInfo {
  CodecSpec spec;
  uint32_t layer_begin = 0, layers = 0;  // absolute
  uint64_t basis_id = 0;
  uint64_t offset = 0, bytes = 0;        // inside the (uncompressed) body
};
struct BlockInfo {
  uint16_t version = 0;
  BlockShape shape;
  Lossless lossless = Lossless::kNone;
  uint64_t body_bytes = 0;    // segments, before the lossless stage
  uint64_t stored_bytes = 0;  // after it
  uint64_t total_bytes = 0;   // header + table + stored body
  std::vector<SegmentInfo> segments;
};

// Parses and checks a block's header, segment table, lengths and checksum.
// DataLoss for a bad checksum or inconsistent lengths, InvalidArgument for a
// non-block, an unknown version or codec.
Result<BlockInfo> InspectBlock(std::span<const std::byte> block);

struct DecodeOptions {
  const LowRankBasis* basis = nullptr;  // needed for lowrank segments
  bool force_scalar = false;
  uint32_t threads = 0;
};
// Decodes a block into `raw` (REQUIRES raw.size() >= shape.bytes(); the raw
// dtype is the one the block was encoded from).
Status DecodeBlock(std::span<const std::byte> block, std::span<std::byte> raw,
                   const DecodeOptions& o = {});

// Batches: many blocks of one shape spread over `threads` threads (0: all
// cores; blocks are the unit of work). sizes[i] receives block i's encoded
// length. The first error is returned (other blocks may be done).
// REQUIRES: raws, outs and sizes have the same length.
Status EncodeBatch(const Codec& codec, const BlockShape& shape, std::span<const std::span<const std::byte>> raws,
                   std::span<const std::span<std::byte>> outs, std::span<size_t> sizes, uint32_t threads);
Status DecodeBatch(const Codec& codec, std::span<const std::span<const std::byte>> blocks,
                   std::span<const std::span<std::byte>> raws, uint32_t threads);

// BlockMeta::codec for blocks encoded under `p`: 1 + the base spec's
// CodecKind, so it is never 0 (0 means "stored as given, not a KVB1 block").
uint8_t PrimaryCodecId(const CodecPolicy& p);

// ---- Internals shared with the CUDA path and tests ---------------------------------
// The geometry of plane (kv, of a layer covered by `spec`) of `shape`.
PlaneGeom PlaneGeometry(const CodecSpec& spec, const BlockShape& shape, uint32_t kv, uint32_t rank);

}  // namespace kvmesh::kernels

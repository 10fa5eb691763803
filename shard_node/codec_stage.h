// shard_node/codec_stage.h — the codec step of a shard node.
//
// Built from the config's `codec` section: full raw blocks (the model's
// FullBlockBytes, layout [layer][k|v][head][token][dim]) are encoded on put
// with the codec of each layer range and stored with BlockMeta::codec set;
// reads decode them back. Anything else (a slice, an already-encoded block)
// passes through unchanged. A node's slot size becomes the encoded size of a
// full block, so compression turns directly into more blocks per node.
//
// Thread-safety: immutable after Create; Encode/Decode may run concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "kvmesh/block_key.h"
#include "kvmesh/config.h"
#include "kvmesh/status.h"
#include "kvmesh/types.h"

namespace kvmesh {

// Whether a KV codec may encode `key`'s block: content-addressed KV blocks
// only. A grouped key's block (a RESP value's head or part) is opaque bytes,
// stored and kept exactly as written whatever its size (put, reservation,
// pressure re-encoding).
inline bool CodecMayEncode(const BlockKey& key) { return !IsGroupedKey(key); }

namespace kernels {
class Codec;
struct CodecPolicy;
}

// The kernels' policy for a codec config section (the lowrank basis file is
// read here). InvalidArgument naming `path` (e.g. "$.codec") and the field.
Result<kernels::CodecPolicy> MakeCodecPolicy(const CodecConfig& c, const std::string& path);

class CodecStage {
 public:
  // nullptr when the config has no codec ("none"). InvalidArgument naming the
  // config path for a codec the kernels reject; the lowrank basis file is read here.
  static Result<std::unique_ptr<CodecStage>> Create(const ClusterConfig& config);
  ~CodecStage();

  const std::string& name() const { return name_; }
  uint8_t codec_id() const { return codec_id_; }            // BlockMeta::codec of encoded blocks
  size_t raw_block_bytes() const { return raw_bytes_; }     // the model's full block
  size_t encoded_block_bytes() const { return enc_bytes_; } // upper bound of an encoded full block

  // True for the payloads Encode accepts (full raw blocks).
  bool Encodes(std::span<const std::byte> payload) const { return payload.size() == raw_bytes_; }
  // Encodes a full raw block into a buffer owned by the calling thread; the
  // span is valid until this thread's next Encode.
  Result<std::span<const std::byte>> Encode(std::span<const std::byte> raw) const;
  // Decodes a stored encoded block into dst and returns the raw size.
  // ResourceExhausted (naming the size needed) when dst is too small,
  // DataLoss for a corrupt block.
  Result<size_t> Decode(std::span<const std::byte> stored, std::span<std::byte> dst) const;

 private:
  CodecStage() = default;
  std::unique_ptr<kernels::Codec> codec_;
  std::string name_;
  uint8_t codec_id_ = 0;
  size_t raw_bytes_ = 0, enc_bytes_ = 0;
  BlockLayout layout_;
};

}  // namespace kvmesh

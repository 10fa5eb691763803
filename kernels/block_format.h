// kernels/block_format.h — byte layout of a compressed block (internal).
// The layout is documented in docs/block-format.md; golden blobs in
// tests/golden/ pin it. All fields are little-endian.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "kernels/codec.h"

namespace kvmesh::kernels {

inline constexpr uint32_t kBlockMagic = 0x3142564Bu;  // "KVB1" in file order
inline constexpr uint16_t kBlockVersion = 1;
inline constexpr size_t kBlockHeaderBytes = 64;
inline constexpr size_t kSegmentEntryBytes = 48;
inline constexpr size_t kChecksumOffset = 56;
inline constexpr uint32_t kMaxExtent = 1u << 24;        // any one of layers/heads/tokens/dim
inline constexpr uint64_t kMaxRawBytes = uint64_t{1} << 40;

// Bytes of the header plus segment table for n segments.
constexpr size_t MetadataBytes(size_t segments) { return kBlockHeaderBytes + segments * kSegmentEntryBytes; }

// Encoded bytes of one segment of `layers` layers of `shape` under `spec`.
uint64_t SegmentBodyBytes(const CodecSpec& spec, const BlockShape& shape, uint32_t layers);

// Writes the header and segment table of `info` (checksum left zero).
// REQUIRES: out holds MetadataBytes(info.segments.size()).
void WriteBlockMetadata(const BlockInfo& info, uint8_t* out);
// Computes and stores the checksum of a complete block of `total` bytes.
void SealBlock(uint8_t* block, size_t total);

// The same checksum computed while the block is written (each piece hashed
// while it is still in cache): construct after the header is complete, feed
// every byte after the header in order, then Seal.
class BlockHasher {
 public:
  explicit BlockHasher(const uint8_t* header);
  ~BlockHasher();
  BlockHasher(const BlockHasher&) = delete;
  BlockHasher& operator=(const BlockHasher&) = delete;
  void Update(const uint8_t* p, size_t n);
  void Seal(uint8_t* header);

 private:
  std::unique_ptr<class Xxh3Stream> stream_;
};

}  // namespace kvmesh::kernels

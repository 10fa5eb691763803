// libFuzzer target for the self-describing KVB1 block format
// (kernels/block_format.cc, kernels/codec.cc): a client reading a block it
// did not write (Get on an encoded block, an SSD slot, a peer's bytes) parses
// header, segment table and lengths, then decodes. Corrupt input must be
// DataLoss or InvalidArgument, never a read or write out of bounds.
// Build and run (clang only): fuzz/build.sh && build-fuzz/bin/fuzz_block -max_total_time=60
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/block_format.h"
#include "kernels/codec.h"

using namespace kvmesh;

namespace {

uint64_t Le(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = v << 8 | p[i];
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The first byte picks the mode, the rest is the block. A mutated block
  // almost never keeps a valid checksum, which would stop every input at the
  // first check; so when the first byte is odd the checksum is set right
  // before the block is read, and the parser and decoders behind it get
  // fuzzed too (anyone can write bytes with a matching checksum: it is not a
  // secret).
  if (size == 0) return 0;
  std::vector<uint8_t> copy(data + 1, data + size);
  if ((data[0] & 1) && copy.size() >= kernels::kBlockHeaderBytes) {
    const uint64_t segments = Le(copy.data() + 32, 2), stored = Le(copy.data() + 48, 8);
    const uint64_t total = kernels::MetadataBytes(segments) + stored;
    if (stored <= copy.size() && total <= copy.size()) kernels::SealBlock(copy.data(), total);
  }
  data = copy.data();
  size = copy.size();
  std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);
  Result<kernels::BlockInfo> info = kernels::InspectBlock(in);
  const size_t want = info.ok() ? info->shape.bytes() : 0;
  // Decode into a buffer of the size the block claims (bounded), and into one
  // byte too few: the second must be refused without writing past it.
  const size_t cap = info.ok() && want <= (8u << 20) ? want : 4096;
  std::vector<std::byte> raw(cap);
  kernels::DecodeOptions o;
  o.threads = 1;
  o.force_scalar = size > 0 && (data[size - 1] & 1);
  Status s = kernels::DecodeBlock(in, raw, o);
  if (s.ok() && !info.ok()) __builtin_trap();  // decoded what inspection refused
  if (info.ok() && want > 0 && want <= (8u << 20)) {
    std::vector<std::byte> small(want - 1);
    if (kernels::DecodeBlock(in, small, o).ok()) __builtin_trap();
  }
  return 0;
}

#include "kvmesh/block_key.h"

#include <xxhash.h>

#include <bit>
#include <cstring>

namespace kvmesh {
namespace {

// Appends little-endian bytes; kvmesh only targets little-endian hosts, which
// the static_assert below makes explicit.
static_assert(std::endian::native == std::endian::little, "kvmesh assumes a little-endian host");

void Feed(XXH3_state_t* st, const void* p, size_t n) { XXH3_128bits_update(st, p, n); }
void FeedKey(XXH3_state_t* st, const BlockKey& k) {
  Feed(st, &k.hi, 8);
  Feed(st, &k.lo, 8);
}
BlockKey Digest(XXH3_state_t* st) {
  XXH128_hash_t h = XXH3_128bits_digest(st);
  return BlockKey{h.high64, h.low64};
}

struct State {
  State() : st(XXH3_createState()) { XXH3_128bits_reset(st); }
  ~State() { XXH3_freeState(st); }
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  XXH3_state_t* st;
};

}  // namespace

KeyDeriver::KeyDeriver(std::string_view model_id, std::string_view tenant_salt,
                       uint32_t block_tokens)
    : block_tokens_(block_tokens) {
  State s;
  static constexpr char kTag[] = "kvmesh-key-v1";
  Feed(s.st, kTag, sizeof kTag - 1);
  Feed(s.st, model_id.data(), model_id.size());
  const uint8_t sep = 0;
  Feed(s.st, &sep, 1);
  Feed(s.st, tenant_salt.data(), tenant_salt.size());
  root_ = ContentKey(Digest(s.st));
}

BlockKey KeyDeriver::Chain(const BlockKey& prev, std::span<const TokenId> block) {
  // One-shot over a small stack buffer for the common sizes keeps this hot
  // path allocation-free; long blocks fall back to the streaming state.
  uint8_t buf[16 + 4 * 256];
  const size_t n = 16 + 4 * block.size();
  if (n <= sizeof buf) {
    std::memcpy(buf, &prev.hi, 8);
    std::memcpy(buf + 8, &prev.lo, 8);
    std::memcpy(buf + 16, block.data(), 4 * block.size());
    XXH128_hash_t h = XXH3_128bits(buf, n);
    return ContentKey(BlockKey{h.high64, h.low64});
  }
  State s;
  FeedKey(s.st, prev);
  Feed(s.st, block.data(), 4 * block.size());
  return ContentKey(Digest(s.st));
}

BlockKey KeyDeriver::Qualify(const BlockKey& chain, Range layers, Range heads) {
  uint8_t buf[32];
  std::memcpy(buf, &chain.hi, 8);
  std::memcpy(buf + 8, &chain.lo, 8);
  const uint32_t r[4] = {layers.begin, layers.end, heads.begin, heads.end};
  std::memcpy(buf + 16, r, 16);
  XXH128_hash_t h = XXH3_128bits(buf, sizeof buf);
  return ContentKey(BlockKey{h.high64, h.low64});
}

void KeyDeriver::ChainKeys(std::span<const TokenId> tokens, std::vector<BlockKey>* out) const {
  out->clear();
  const size_t n = FullBlocks(tokens.size());
  out->reserve(n);
  BlockKey prev = root_;
  for (size_t i = 0; i < n; ++i) {
    prev = Chain(prev, tokens.subspan(i * block_tokens_, block_tokens_));
    out->push_back(prev);
  }
}

std::vector<BlockKey> KeyDeriver::Keys(std::span<const TokenId> tokens, Range layers,
                                       Range heads) const {
  std::vector<BlockKey> keys;
  ChainKeys(tokens, &keys);
  for (auto& k : keys) k = Qualify(k, layers, heads);
  return keys;
}

}  // namespace kvmesh

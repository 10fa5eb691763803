#include "transport/resp/resp_value.h"

#include <xxhash.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <random>

#include "kvmesh/block_key.h"

namespace kvmesh {
namespace {

// Seeds keep the hash domains apart (a group name never hashes like a key).
constexpr uint64_t kGroupSeed = 0x7265737067726f75ull;  // "resp grou"
constexpr uint64_t kHeadSeed = 0x7265737068656164ull;   // "resp head"
constexpr uint64_t kPartSeed = 0x7265737070617274ull;   // "resp part"

void PutU32(char* p, uint32_t v) { std::memcpy(p, &v, 4); }
void PutU64(char* p, uint64_t v) { std::memcpy(p, &v, 8); }
uint32_t GetU32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint64_t GetU64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// The longest configured suffix `key` ends in (after a stem), or npos.
size_t SuffixOf(std::string_view key, const RespKeyRules& rules) {
  size_t best = std::string::npos, len = 0;
  for (size_t i = 0; i < rules.group_suffixes.size(); ++i) {
    const std::string& s = rules.group_suffixes[i];
    if (!s.empty() && s.size() > len && key.size() > s.size() && key.ends_with(s)) best = i, len = s.size();
  }
  return best;
}

bool HasHashTag(std::string_view key) {
  const size_t open = key.find('{');
  if (open == std::string_view::npos) return false;
  const size_t close = key.find('}', open + 1);
  return close != std::string_view::npos && close > open + 1;
}

// The group name of `key`: its hash tag, its stem, or the key; *co_evict says which.
std::string_view GroupName(std::string_view key, const RespKeyRules& rules, bool* co_evict) {
  *co_evict = false;
  if ((rules.hash_tags || rules.cluster_slots) && HasHashTag(key)) {  // Redis Cluster: the first '{', the first '}' after it
    const size_t open = key.find('{');
    const size_t close = key.find('}', open + 1);
    *co_evict = true;
    return key.substr(open + 1, close - open - 1);
  }
  const size_t i = rules.cluster_slots ? std::string::npos : SuffixOf(key, rules);
  if (i != std::string::npos) {
    *co_evict = true;
    return key.substr(0, key.size() - rules.group_suffixes[i].size());
  }
  return key;
}

// CRC16-CCITT (XModem: polynomial 0x1021, initial value 0), as Redis Cluster;
// a byte at a time through a table built at compile time.
constexpr std::array<uint16_t, 256> MakeCrc16Table() {
  std::array<uint16_t, 256> t{};
  for (unsigned i = 0; i < 256; ++i) {
    uint16_t crc = static_cast<uint16_t>(i << 8);
    for (int b = 0; b < 8; ++b)
      crc = (crc & 0x8000) ? static_cast<uint16_t>((crc << 1) ^ 0x1021) : static_cast<uint16_t>(crc << 1);
    t[i] = crc;
  }
  return t;
}
constexpr std::array<uint16_t, 256> kCrc16Table = MakeCrc16Table();

uint16_t Crc16(std::string_view s) {
  uint16_t crc = 0;
  for (unsigned char c : s) crc = static_cast<uint16_t>((crc << 8) ^ kCrc16Table[((crc >> 8) ^ c) & 0xFF]);
  return crc;
}

}  // namespace

uint32_t RespKeySlot(std::string_view key) {
  if (HasHashTag(key)) {
    const size_t open = key.find('{');
    const size_t close = key.find('}', open + 1);
    key = key.substr(open + 1, close - open - 1);
  }
  return Crc16(key) & (kRespClusterSlots - 1);
}

bool RespPrimaryKey(std::string_view key, const RespKeyRules& rules, std::string* primary) {
  if (rules.cluster_slots) return false;
  if (rules.hash_tags && HasHashTag(key)) return false;
  const size_t i = SuffixOf(key, rules);
  if (i == std::string::npos || i == 0) return false;
  *primary = std::string(key.substr(0, key.size() - rules.group_suffixes[i].size())) + rules.group_suffixes[0];
  return true;
}

RespKeyGroup RespGroupOf(std::string_view key, const RespKeyRules& rules) {
  bool co_evict = false;
  std::string_view name = GroupName(key, rules, &co_evict);
  const uint64_t h = XXH3_64bits_withSeed(name.data(), name.size(), kGroupSeed);
  if (!rules.cluster_slots) return RespKeyGroup{h, co_evict, false};
  // The slot of the whole key is the slot of its group (its tag, or itself).
  const uint64_t slot = RespKeySlot(key);
  return RespKeyGroup{(slot << kGroupSlotShift) | (h & ((uint64_t{1} << kGroupSlotShift) - 1)), co_evict, true};
}

BlockKey RespKey(std::string_view key, const RespKeyRules& rules) {
  const RespKeyGroup g = RespGroupOf(key, rules);
  return GroupedKey(g.hash, XXH3_64bits_withSeed(key.data(), key.size(), kHeadSeed), g.co_evict, g.slotted);
}

BlockKey RespPartKey(std::string_view key, const RespKeyGroup& g, uint64_t nonce, uint32_t index) {
  char tail[12];
  PutU64(tail, nonce);
  PutU32(tail + 8, index);
  const uint64_t seed = XXH3_64bits_withSeed(tail, sizeof(tail), kPartSeed);
  return GroupedKey(g.hash, XXH3_64bits_withSeed(key.data(), key.size(), seed), g.co_evict, g.slotted);
}

void EncodeRespHead(const RespHead& h, char out[kRespHeadBytes]) {
  std::memset(out, 0, kRespHeadBytes);
  PutU32(out, kRespHeadMagic);
  out[4] = 1;  // version
  PutU64(out + 8, h.nonce);
  PutU64(out + 16, static_cast<uint64_t>(h.expire_at_ms));
  PutU64(out + 24, h.value_bytes);
  PutU32(out + 32, h.part_bytes);
  PutU32(out + 36, h.parts);
}

Status DecodeRespHead(std::span<const char> block, RespHead* out) {
  if (block.size() < kRespHeadBytes) return InvalidArgument("not a RESP value head: too short");
  const char* p = block.data();
  if (GetU32(p) != kRespHeadMagic || p[4] != 1 || p[5] != 0 || p[6] != 0 || p[7] != 0)
    return InvalidArgument("not a RESP value head: bad magic or version");
  RespHead h;
  h.nonce = GetU64(p + 8);
  h.expire_at_ms = static_cast<int64_t>(GetU64(p + 16));
  h.value_bytes = GetU64(p + 24);
  h.part_bytes = GetU32(p + 32);
  h.parts = GetU32(p + 36);
  const uint64_t rest = block.size() - kRespHeadBytes;
  if (h.parts == 0) {
    if (h.part_bytes != 0 || h.value_bytes != rest) return InvalidArgument("RESP value head: inline size mismatch");
  } else {
    if (rest != 0 || h.part_bytes == 0) return InvalidArgument("RESP value head: bad part layout");
    const uint64_t full = uint64_t{h.part_bytes} * (h.parts - 1);
    if (h.value_bytes <= full || h.value_bytes - full > h.part_bytes)
      return InvalidArgument("RESP value head: part count contradicts the value size");
  }
  *out = h;
  return Status::Ok();
}

void LayoutRespValue(uint64_t value_bytes, uint64_t block_bytes, RespHead* h) {
  h->value_bytes = value_bytes;
  if (value_bytes + kRespHeadBytes <= block_bytes) {
    h->part_bytes = 0;
    h->parts = 0;
    return;
  }
  const uint64_t part = std::min<uint64_t>(block_bytes, UINT32_MAX);
  h->part_bytes = static_cast<uint32_t>(part);
  h->parts = static_cast<uint32_t>((value_bytes + part - 1) / part);
}

uint64_t RespNonce() {
  thread_local std::mt19937_64 rng([] {
    std::random_device rd;
    return (uint64_t{rd()} << 32) ^ rd() ^
           static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  }());
  uint64_t n = 0;
  while (n == 0) n = rng();
  return n;
}

int64_t RespNowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace kvmesh

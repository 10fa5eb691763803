// transport/resp/resp_value.h — how both RESP fronts store a Redis value in
// kvmesh blocks (docs/resp.md, "Values").
//
// A value of any size (up to the front's max_value_bytes) is a head block
// plus, when it does not fit the head, `parts` part blocks of part_bytes
// each (the last one shorter):
//
//   head  = RespKey(key):  40-byte header [+ the value itself when it fits
//                          in one block (inline)]
//   part i = RespPartKey(key, nonce, i): bytes [i*part_bytes, ...) of the value
//
// The header (little-endian): magic u32 "KVRH", version u8 (1), flags u8
// (0), reserved u16 (0), nonce u64, expire_at_ms i64 (Unix ms, 0 = never),
// value_bytes u64, part_bytes u32, parts u32 (0 = inline).
//
// Every SET draws a fresh random nonce and its parts are new keys, so the
// blocks of one version are never rewritten: a SET stores its parts before
// its head (the head swapped last), and a reader that found a head reads the
// parts its nonce names, all of them or it answers a miss. A reader can
// therefore never see a torn value or bytes of two versions mixed.
//
// Keys that belong together share a group (kvmesh/block_key.h GroupedKey):
// the Redis Cluster hash tag (the text between the first '{' and the next
// '}', when not empty), else the key less a configured suffix
// (RespKeyRules::group_suffixes, by default "kv_bytes" and "metadata": an
// LMCache-style connector's "<key>kv_bytes" chunk and "<key>metadata" land
// together), else the key itself. Every block of a key is placed by its
// group, so a group lives on one node (per replica); blocks of a hash-tag or
// suffix group are marked co-evicted, so that node drops the group as a
// whole (shard_node/key_groups.h). A plain key is a group of its own and is
// not co-evicted (its all-or-nothing read suffices). Within a suffix group
// the first suffix names the key the others depend on (RespPrimaryKey).
//
// Redis Cluster mode (RespKeyRules::cluster_slots, $.resp.cluster): a key's
// group is its hash tag or the key itself, as a cluster-aware client computes
// it (the suffix rule is off: such a client sends "<key>metadata" to the
// owner of its own slot), and the group's hash carries the group's hash slot
// (RespKeySlot) in its top 14 bits with the slotted tag, so placement ranks
// nodes by the slot (kvmesh/block_key.h PlacementKey).
//
// Thread-safety: pure functions; RespNonce is thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvmesh/status.h"
#include "kvmesh/types.h"

namespace kvmesh {

struct RespKeyRules {
  bool hash_tags = true;  // Redis Cluster {tag} groups
  // A key ending in one of these (longest first) is grouped with the other
  // keys of the same stem. Empty: no suffix rule.
  std::vector<std::string> group_suffixes = {"kv_bytes", "metadata"};
  // Redis Cluster mode: groups are placed by their hash slot; hash tags
  // always apply and the suffix rule never does.
  bool cluster_slots = false;
};

struct RespKeyGroup {
  uint64_t hash = 0;      // the group's 64-bit hash (BlockKey::hi of every block)
  bool co_evict = false;  // a hash-tag or suffix group: its blocks are evicted together
  bool slotted = false;   // cluster mode: placed by the slot in hash's top 14 bits
};

inline constexpr uint32_t kRespClusterSlots = 16384;

// The Redis Cluster hash slot of `key`: CRC16 (XModem) of its hash tag when
// it has a non-empty one, else of the whole key, mod 16384. The same function
// every cluster-aware Redis client computes.
uint32_t RespKeySlot(std::string_view key);

// The group a RESP key belongs to under `rules`.
RespKeyGroup RespGroupOf(std::string_view key, const RespKeyRules& rules);

// The key `key` depends on under the suffix rule, if any: for a key ending
// in a suffix other than the first of RespKeyRules::group_suffixes, the same
// stem with the first suffix ("<stem>metadata" depends on "<stem>kv_bytes").
// A dependent key reads as absent (GET nil, EXISTS 0, TTL -2) unless the
// whole value of the key it depends on is there too, so a reader never finds
// an LMCache-style metadata key whose chunk is gone, whatever eviction
// removed and in whatever order the two were written. Keys with a hash tag
// depend on nothing.
bool RespPrimaryKey(std::string_view key, const RespKeyRules& rules, std::string* primary);

// The head block of a RESP key (what a GET reads first; what placement
// ranks nodes by, through its group).
BlockKey RespKey(std::string_view key, const RespKeyRules& rules = {});
// Part `index` of the version `nonce` of `key` (g = RespGroupOf(key)).
BlockKey RespPartKey(std::string_view key, const RespKeyGroup& g, uint64_t nonce, uint32_t index);

inline constexpr size_t kRespHeadBytes = 40;
inline constexpr uint32_t kRespHeadMagic = 0x4852564B;  // "KVRH" little-endian

struct RespHead {
  uint64_t nonce = 0;
  int64_t expire_at_ms = 0;  // Unix ms; 0 = never
  uint64_t value_bytes = 0;
  uint32_t part_bytes = 0;   // 0 when inline
  uint32_t parts = 0;        // 0: the value follows the header in the head block

  bool is_inline() const { return parts == 0; }
  bool expired(int64_t now_ms) const { return expire_at_ms != 0 && now_ms >= expire_at_ms; }
  // Size of part i. REQUIRES i < parts.
  uint64_t PartSize(uint32_t i) const {
    return i + 1 < parts ? part_bytes : value_bytes - uint64_t{part_bytes} * (parts - 1);
  }
};

void EncodeRespHead(const RespHead& h, char out[kRespHeadBytes]);
// Parses a head block. InvalidArgument when it is not one (wrong magic or
// version, sizes that contradict each other or the block's length).
Status DecodeRespHead(std::span<const char> block, RespHead* out);

// How a value of `value_bytes` is laid out when a block holds at most
// `block_bytes`: inline (parts = 0) when the header and the value fit one block.
// REQUIRES block_bytes > kRespHeadBytes.
void LayoutRespValue(uint64_t value_bytes, uint64_t block_bytes, RespHead* h);

// A random 64-bit version tag, never 0.
uint64_t RespNonce();

// Unix time in ms (the clock expiry is measured on).
int64_t RespNowMs();

}  // namespace kvmesh

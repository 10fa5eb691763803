// shard_node/kv_event_wire.h — the sequence-number frame of KV events and
// their replay answers (docs/kv-events.md): 8 bytes, big-endian; -1 ends a
// replay or snapshot answer. Shared by the publisher (kv_events.cc) and the
// subscriber (coordinator/kv_subscriber.cc).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kvmesh {

inline std::string KvEventSeqBytes(int64_t seq) {
  std::string b(8, '\0');
  const uint64_t u = static_cast<uint64_t>(seq);
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>(u >> (56 - 8 * i));
  return b;
}

// -2 when `b` is not 8 bytes.
inline int64_t KvEventSeqOf(std::string_view b) {
  if (b.size() != 8) return -2;
  uint64_t v = 0;
  for (unsigned char c : b) v = (v << 8) | c;
  return static_cast<int64_t>(v);
}

}  // namespace kvmesh

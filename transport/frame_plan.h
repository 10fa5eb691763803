// transport/frame_plan.h — what a client sends one node for one batch,
// decided without I/O: where the batch splits into frames under the node's
// ProtocolLimits, which PUT items are never sent, and the bytes of each
// frame's item table (PUT records carrying the payload checksums the node
// verifies, or key lists). The TCP channel, the UCX channel and the RESP
// proxy's engine (router/proxy/resp_engine.cc) only execute it, each with
// its own gather list, as the RESP fronts execute transport/resp/resp_ops.h;
// tests/test_client_plans.cc checks it alone.
//
//   for (size_t at = 0; at < n;) {
//     FrameSpan f = NextPutFrame(at, n, limits, size_of, refuse);  // refuse(i, status) for blocks never sent
//     if (f.empty()) break;
//     uint64_t body = BuildPutTable(f, piece_of, &table, add_payload);  // table, then the payloads given to add_payload
//     ... send header(count = f.size(), body_len = body), table, payloads ...
//     at = f.end;
//   }
//
// The builders reuse the caller's table string (no allocation once warm).
// Thread-safety: free functions on values; safe from any thread.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "kvmesh/status.h"
#include "kvmesh/types.h"
#include "transport/protocol.h"

namespace kvmesh::proto {

// Items [begin, end) of a batch, sent as one frame.
struct FrameSpan {
  size_t begin = 0, end = 0;
  size_t size() const { return end - begin; }
  bool empty() const { return end == begin; }
};

// What one item adds to a frame, held against max_body_bytes: a PUT item its
// record and payload (the request body); a GET item its answer record and the
// payload it may bring back (the answer body; a node never returns more than
// max_block_bytes); a key-list item (EXISTS, ERASE, ...) its key.
inline uint64_t PutItemBytes(uint64_t payload) { return kPutItemSize + payload; }
inline uint64_t GetItemBytes(uint64_t expect, const ProtocolLimits& lim) {
  return kGetItemSize + std::min<uint64_t>(expect, lim.max_block_bytes);
}
inline constexpr uint64_t kKeyItemBytes = kKeySize;

// The end of the frame that starts at item `begin` of `n`: the longest run of
// at most max_items items whose item_bytes(i) add up to at most
// max_body_bytes. Never empty when begin < n: an item over the body limit on
// its own goes alone (the node refuses it).
template <typename ItemBytes>
size_t FrameEnd(size_t begin, size_t n, const ProtocolLimits& lim, ItemBytes item_bytes) {
  const size_t max_items = std::max<uint32_t>(1, lim.max_items);
  size_t end = begin;
  uint64_t body = 0;
  while (end < n && end - begin < max_items) {
    const uint64_t b = item_bytes(end);
    if (end > begin && body + b > lim.max_body_bytes) break;
    body += b;
    ++end;
  }
  return end;
}

// OK when a block of `size` bytes may go in a PUT frame: not empty and at
// most max_block_bytes (else the node would drop the connection, failing
// every other call on it). ResourceExhausted otherwise.
Status CheckPutBlock(uint64_t size, const ProtocolLimits& lim);

// The next PUT frame at or after item `at` of `n` (size_of(i): item i's
// payload bytes). Items CheckPutBlock refuses are passed to refuse(i, status)
// and skipped; a frame never spans one, so every frame is a contiguous run.
// Empty when no item from `at` on is sent.
template <typename SizeOf, typename Refuse>
FrameSpan NextPutFrame(size_t at, size_t n, const ProtocolLimits& lim, SizeOf size_of, Refuse refuse) {
  for (; at < n; ++at) {
    Status s = CheckPutBlock(size_of(at), lim);
    if (s.ok()) break;
    refuse(at, std::move(s));
  }
  if (at == n) return FrameSpan{n, n};
  size_t stop = at + 1;  // the first refused item after `at` ends the run
  while (stop < n && CheckPutBlock(size_of(stop), lim).ok()) ++stop;
  return FrameSpan{at, FrameEnd(at, stop, lim, [&](size_t i) { return PutItemBytes(size_of(i)); })};
}

// xxHash3-64 of head followed by data: the checksum a PUT record carries for
// the block head + data, which the node verifies over the bytes it receives.
uint64_t PayloadChecksum(std::span<const std::byte> head, std::span<const std::byte> data);

// One PUT item as the builder sees it: the block is head then data (either
// may be empty; the channels send data alone, the proxy a value's head and part).
struct PutPiece {
  BlockKey key;
  std::span<const std::byte> head, data;
  Priority priority = kDefaultPriority;
};

// Writes the PUT item table of frame f (piece_of(i) for each of its items)
// into *table (its bytes replaced) and gives each non-empty payload span, in
// item order, to add_payload(span): the frame's body is the table followed by
// those spans. Returns the body length.
template <typename PieceOf, typename AddPayload>
uint64_t BuildPutTable(FrameSpan f, PieceOf piece_of, std::string* table, AddPayload add_payload) {
  table->assign(f.size() * kPutItemSize, '\0');
  uint64_t body = table->size();
  for (size_t i = f.begin; i < f.end; ++i) {
    const PutPiece p = piece_of(i);
    const uint64_t size = p.head.size() + p.data.size();
    EncodePutRecord(PutRecord{p.key, static_cast<uint32_t>(size), p.priority, 0, PayloadChecksum(p.head, p.data)},
                    reinterpret_cast<std::byte*>(table->data()) + (i - f.begin) * kPutItemSize);
    if (!p.head.empty()) add_payload(p.head);
    if (!p.data.empty()) add_payload(p.data);
    body += size;
  }
  return body;
}

// Writes the key list of frame f (key_of(i) for each of its items) into
// *table (its bytes replaced): the whole body of a GET, EXISTS or ERASE
// request. Returns the body length.
template <typename KeyOf>
uint64_t BuildKeyTable(FrameSpan f, KeyOf key_of, std::string* table) {
  table->clear();
  for (size_t i = f.begin; i < f.end; ++i) AppendKey(table, key_of(i));
  return table->size();
}

// ---- the answers: what every client makes of a GET record ------------------

// A GET record's status as the item's: NotFound("not stored") for a miss,
// else ItemStatus of its code. OK for a hit.
Status GetRecordStatus(const GetRecord& r);
// OK when `bytes` (a hit's payload, where it landed) hash to the record's
// checksum; DataLoss otherwise (a miss, never wrong bytes).
Status VerifyPayload(std::span<const std::byte> bytes, uint64_t checksum);

}  // namespace kvmesh::proto

// libFuzzer target for every parser of untrusted wire bytes (transport/protocol.cc).
// Build and run (clang only): fuzz/build.sh && build-fuzz/bin/fuzz_protocol -max_total_time=60
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "transport/protocol.h"

using namespace kvmesh;
using namespace kvmesh::proto;

// Every SEQ_* parser, requests and answers, on the same bytes.
static void ParseSequenceBodies(std::span<const std::byte> b) {
  SeqCreateRequest create;
  (void)ParseSeqCreate(b, &create);
  SeqCreated created;
  (void)ParseSeqCreateAnswer(b, &created);
  SeqAppendRequest append;
  if (ParseSeqAppend(b, &append).ok()) {
    // The K/V views must lie inside the input.
    if (append.k.size() != append.v.size() || append.v.data() + append.v.size() > b.data() + b.size()) __builtin_trap();
  }
  uint64_t id = 0;
  uint32_t n = 0, from = 0, pos = 0;
  (void)ParseSeqId(b, &id);
  (void)ParseSeqTruncate(b, &id, &n);
  (void)ParseSeqRead(b, &id, &from, &n);
  (void)ParseU32Answer(b, &pos);
  SequenceState info;
  (void)ParseSeqInfoAnswer(b, &info);
  SeqReadAnswer read;
  if (ParseSeqReadAnswer(b, &read).ok()) {
    if (read.v.data() + read.v.size() > b.data() + b.size()) __builtin_trap();
  }
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);
  ProtocolLimits lim;
  lim.max_body_bytes = 1 << 16;
  lim.max_items = 256;
  lim.max_block_bytes = 1 << 14;
  FrameHeader h;
  if (!DecodeHeader(in, lim, &h).ok()) {
    // Still exercise the body parsers on raw input.
    Hello hello;
    (void)ParseHelloBody(in, &hello);
    HelloAnswer ans;
    (void)ParseHelloAnswerBody(in, &ans);
    LocalMapAnswer local;
    (void)ParseLocalMapAnswer(in, &local);
    ParseSequenceBodies(in);
    return 0;
  }
  std::span<const std::byte> body = in.subspan(kHeaderSize);
  if (body.size() > h.body_len) body = body.first(h.body_len);
  if (body.size() < h.body_len) return 0;  // truncated: a server waits for more bytes
  std::vector<BlockKey> keys;
  std::vector<PutRecord> puts;
  std::vector<GetRecord> gets;
  std::vector<uint8_t> codes;
  uint32_t matched = 0;
  if (h.is_response() && h.status != StatusCode::kOk) {
    (void)ParseErrorBody(h, body);
    return 0;
  }
  switch (h.opcode) {
    case Opcode::kHello: {
      Hello hello;
      HelloAnswer ans;
      (void)(h.is_response() ? ParseHelloAnswerBody(body, &ans) : ParseHelloBody(body, &hello));
      break;
    }
    case Opcode::kPut:
      if (h.is_response()) (void)ParseStatusBytes(h, body, &codes);
      else (void)ParsePutTable(h, body.first(size_t{h.count} * kPutItemSize), lim, &puts);
      break;
    case Opcode::kGet:
      if (h.is_response()) (void)ParseGetTable(h, body.first(size_t{h.count} * kGetItemSize), lim, &gets);
      else (void)ParseKeys(h, body, &keys);
      break;
    case Opcode::kMatchPrefix:
      if (h.is_response()) (void)ParseMatchAnswer(h, body, &matched);
      else (void)ParseKeys(h, body, &keys);
      break;
    case Opcode::kStats:
      break;
    case Opcode::kLocalMap: {
      LocalMapAnswer local;
      uint64_t host = 0;
      (void)(h.is_response() ? ParseLocalMapAnswer(body, &local) : ParseSeqId(body, &host));
      break;
    }
    case Opcode::kSeqCreate:
    case Opcode::kSeqAppend:
    case Opcode::kSeqTruncate:
    case Opcode::kSeqFork:
    case Opcode::kSeqRelease:
    case Opcode::kSeqInfo:
    case Opcode::kSeqRead:
      ParseSequenceBodies(body);
      break;
    default:
      if (h.is_response()) (void)ParseStatusBytes(h, body, &codes);
      else (void)ParseKeys(h, body, &keys);
  }
  return 0;
}

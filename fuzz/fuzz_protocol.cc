// libFuzzer target for every parser of untrusted wire bytes (transport/protocol.cc).
// Build and run (clang only, not part of CI): fuzz/build.sh && /tmp/kvmesh-fuzz/fuzz_protocol -max_total_time=60
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "transport/protocol.h"

using namespace kvmesh;
using namespace kvmesh::proto;

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
    default:
      if (h.is_response()) (void)ParseStatusBytes(h, body, &codes);
      else (void)ParseKeys(h, body, &keys);
  }
  return 0;
}

// Wire protocol: round trips of every frame kind and rejection of each
// malformed or oversize case (docs/protocol.md).
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/checksum.h"
#include "transport/protocol.h"

using namespace kvmesh;
using namespace kvmesh::proto;

namespace {

std::span<const std::byte> Bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

FrameHeader Req(Opcode op, uint32_t count, uint64_t id = 7, uint64_t epoch = 3) {
  FrameHeader h;
  h.opcode = op;
  h.count = count;
  h.request_id = id;
  h.epoch = epoch;
  return h;
}

// Re-encodes a header after editing a raw byte at `offset` (checksum fixed up
// so that the field check, not the checksum, is what rejects it).
std::string Patch(std::string frame, size_t offset, uint8_t value) {
  frame[offset] = static_cast<char>(value);
  uint32_t crc = static_cast<uint32_t>(Checksum64(frame.data(), 36));
  std::memcpy(frame.data() + 36, &crc, 4);
  return frame;
}

Status Decode(const std::string& frame, FrameHeader* h, ProtocolLimits lim = {}) {
  return DecodeHeader(Bytes(frame), lim, h);
}

}  // namespace

TEST_CASE("GatherWithChecksum64 lands the pieces in order with the checksum of the whole", "[protocol]") {
  std::mt19937_64 rng(11);
  for (const auto& sizes : std::vector<std::pair<size_t, size_t>>{
           {0, 0}, {48, 0}, {0, 5}, {48, 16384}, {16384, 1}, {100, 40000}, {20000, 70000}, {16383, 16385}}) {
    std::string a(sizes.first, '\0'), b(sizes.second, '\0');
    for (char& c : a) c = static_cast<char>(rng());
    for (char& c : b) c = static_cast<char>(rng());
    std::vector<char> dst(a.size() + b.size() + 1, 'X');
    const uint64_t sum = GatherWithChecksum64(dst.data(), {std::span<const char>(a), std::span<const char>(b)});
    const std::string whole = a + b;
    INFO(sizes.first << " + " << sizes.second);
    CHECK(sum == Checksum64(whole.data(), whole.size()));
    CHECK(std::string(dst.data(), whole.size()) == whole);
    CHECK(dst.back() == 'X');  // nothing past the pieces
  }
}

TEST_CASE("CopyWithChecksum64 copies and hashes as memcpy and Checksum64 at every chunk boundary", "[protocol]") {
  std::mt19937_64 rng(12);
  for (size_t n : {size_t{0}, size_t{1}, size_t{16383}, size_t{16384}, size_t{16385}, size_t{32768}, size_t{100001}}) {
    std::string src(n, '\0');
    for (char& c : src) c = static_cast<char>(rng());
    std::vector<char> dst(n + 1, 'X');
    INFO(n);
    CHECK(CopyWithChecksum64(dst.data(), src.data(), n) == Checksum64(src.data(), n));
    CHECK(std::string(dst.data(), n) == src);
    CHECK(dst.back() == 'X');
  }
}

TEST_CASE("Header round trip keeps every field", "[protocol]") {
  FrameHeader h = Req(Opcode::kGet, 3, 0x1122334455667788ull, 42);
  std::string body;
  for (int i = 0; i < 3; ++i) AppendKey(&body, BlockKey{uint64_t(i), uint64_t(i * 10)});
  std::string f = BuildFrame(h, body);
  REQUIRE(f.size() == kHeaderSize + 48);
  FrameHeader d;
  REQUIRE(Decode(f, &d).ok());
  CHECK(d.opcode == Opcode::kGet);
  CHECK(d.request_id == 0x1122334455667788ull);
  CHECK(d.epoch == 42);
  CHECK(d.count == 3);
  CHECK(d.body_len == 48);
  CHECK(!d.is_response());
  std::vector<BlockKey> keys;
  REQUIRE(ParseKeys(d, Bytes(f).subspan(kHeaderSize), &keys).ok());
  REQUIRE(keys.size() == 3);
  CHECK(keys[2] == BlockKey{2, 20});
}

TEST_CASE("HELLO round trip carries client id, tenant and token", "[protocol]") {
  Hello h{1, 1, "client-a", "tenant-x", "s3cret"};
  std::string body = EncodeHelloBody(h);
  std::string f = BuildFrame(Req(Opcode::kHello, 0), body);
  FrameHeader d;
  REQUIRE(Decode(f, &d).ok());
  Hello back;
  REQUIRE(ParseHelloBody(Bytes(body), &back).ok());
  CHECK(back.client_id == "client-a");
  CHECK(back.tenant == "tenant-x");
  CHECK(back.token == "s3cret");

  HelloAnswer a{"n7", {1 << 20, 64, 1 << 16}};
  std::string ab = EncodeHelloAnswerBody(a);
  FrameHeader rh = Req(Opcode::kHello, 0);
  rh.flags = kFlagResponse;
  std::string af = BuildFrame(rh, ab);
  REQUIRE(Decode(af, &d).ok());
  HelloAnswer aback;
  REQUIRE(ParseHelloAnswerBody(Bytes(ab), &aback).ok());
  CHECK(aback.node_id == "n7");
  CHECK(aback.limits.max_items == 64);
  CHECK(aback.limits.max_block_bytes == 1u << 16);

  // A string whose length runs past the body is refused.
  std::string bad = body;
  bad[4] = static_cast<char>(0xFF);
  CHECK(!ParseHelloBody(Bytes(bad), &back).ok());
  // Trailing garbage is refused.
  CHECK(!ParseHelloBody(Bytes(body + "x"), &back).ok());
}

TEST_CASE("LOCAL_MAP: an 8-byte request; the answer's sizes and paths round trip, bad ones refused", "[protocol]") {
  FrameHeader d;
  std::string req(8, '\x01');
  REQUIRE(Decode(BuildFrame(Req(Opcode::kLocalMap, 0), req), &d).ok());
  CHECK(d.opcode == Opcode::kLocalMap);
  CHECK_FALSE(Decode(BuildFrame(Req(Opcode::kLocalMap, 0), req + "x"), &d).ok());
  LocalMapAnswer a{1 << 30, 1 << 20, "/proc/42/fd/7", "/proc/42/fd/8"};
  const std::string body = EncodeLocalMapAnswer(a);
  FrameHeader rh = Req(Opcode::kLocalMap, 0);
  rh.flags = kFlagResponse;
  REQUIRE(Decode(BuildFrame(rh, body), &d).ok());
  LocalMapAnswer back;
  REQUIRE(ParseLocalMapAnswer(Bytes(body), &back).ok());
  CHECK(back.pool_bytes == a.pool_bytes);
  CHECK(back.index_bytes == a.index_bytes);
  CHECK(back.pool_path == a.pool_path);
  CHECK(back.index_path == a.index_path);
  CHECK_FALSE(ParseLocalMapAnswer(Bytes(body + "x"), &back).ok());  // trailing bytes
  CHECK_FALSE(ParseLocalMapAnswer(Bytes(body.substr(0, 20)), &back).ok());  // cut short
  LocalMapAnswer none{0, 1 << 20, "/a", "/b"};
  CHECK_FALSE(ParseLocalMapAnswer(Bytes(EncodeLocalMapAnswer(none)), &back).ok());  // names no memory
}

TEST_CASE("PUT table round trip and payload accounting", "[protocol]") {
  std::mt19937_64 rng(5);
  std::vector<std::string> payloads = {std::string(100, 'a'), std::string(7, 'b'), std::string(4096, 'c')};
  std::string table, data;
  for (size_t i = 0; i < payloads.size(); ++i) {
    PutRecord r{BlockKey{rng(), rng()}, uint32_t(payloads[i].size()), Priority(i), 0,
                Checksum64(payloads[i].data(), payloads[i].size())};
    std::byte rec[kPutItemSize];
    EncodePutRecord(r, rec);
    table.append(reinterpret_cast<const char*>(rec), kPutItemSize);
    data += payloads[i];
  }
  std::string f = BuildFrame(Req(Opcode::kPut, 3), table + data);
  FrameHeader d;
  REQUIRE(Decode(f, &d).ok());
  std::vector<PutRecord> recs;
  ProtocolLimits lim;
  REQUIRE(ParsePutTable(d, Bytes(table), lim, &recs).ok());
  REQUIRE(recs.size() == 3);
  CHECK(recs[2].size == 4096);
  CHECK(recs[1].priority == 1);
  CHECK(recs[0].checksum == Checksum64(payloads[0].data(), 100));

  SECTION("sizes that do not add up are refused") {
    FrameHeader shorter = d;
    shorter.body_len -= 1;
    CHECK(ParsePutTable(shorter, Bytes(table), lim, &recs).code() == StatusCode::kInvalidArgument);
  }
  SECTION("a payload over the block limit is refused before any allocation") {
    lim.max_block_bytes = 1000;
    CHECK(ParsePutTable(d, Bytes(table), lim, &recs).code() == StatusCode::kResourceExhausted);
  }
  SECTION("an empty item is refused") {
    std::string t2 = table;
    std::memset(t2.data() + 16, 0, 4);
    CHECK(!ParsePutTable(d, Bytes(t2), lim, &recs).ok());
  }
}

TEST_CASE("GET answer table round trip", "[protocol]") {
  std::string table;
  GetRecord recs[] = {{StatusCode::kOk, 5, 99}, {StatusCode::kNotFound, 0, 0}, {StatusCode::kOk, 3, 1}};
  for (auto& r : recs) {
    std::byte b[kGetItemSize];
    EncodeGetRecord(r, b);
    table.append(reinterpret_cast<const char*>(b), kGetItemSize);
  }
  FrameHeader h = Req(Opcode::kGet, 3);
  h.flags = kFlagResponse;
  std::string f = BuildFrame(h, table + "hello" + "abc");
  FrameHeader d;
  REQUIRE(Decode(f, &d).ok());
  std::vector<GetRecord> back;
  REQUIRE(ParseGetTable(d, Bytes(table), {}, &back).ok());
  CHECK(back[0].size == 5);
  CHECK(back[0].checksum == 99);
  CHECK(back[1].status == StatusCode::kNotFound);
  // A miss claiming a payload is malformed.
  std::string bad = table;
  bad[kGetItemSize + 4] = 1;
  CHECK(!ParseGetTable(d, Bytes(bad), {}, &back).ok());
}

TEST_CASE("Status-per-item, MATCH_PREFIX and error answers", "[protocol]") {
  FrameHeader h = Req(Opcode::kErase, 3);
  h.flags = kFlagResponse;
  std::string body = {char(0), char(2), char(0)};
  std::string f = BuildFrame(h, body);
  FrameHeader d;
  REQUIRE(Decode(f, &d).ok());
  std::vector<uint8_t> codes;
  REQUIRE(ParseStatusBytes(d, Bytes(body), &codes).ok());
  CHECK(codes == std::vector<uint8_t>{0, 2, 0});
  std::string bad = {char(0), char(200), char(0)};
  CHECK(!ParseStatusBytes(d, Bytes(bad), &codes).ok());

  FrameHeader m = Req(Opcode::kMatchPrefix, 4);
  m.flags = kFlagResponse;
  std::string mb = {char(2), 0, 0, 0};
  REQUIRE(Decode(BuildFrame(m, mb), &d).ok());
  uint32_t matched = 0;
  REQUIRE(ParseMatchAnswer(d, Bytes(mb), &matched).ok());
  CHECK(matched == 2);

  FrameHeader e = Req(Opcode::kGet, 0);
  e.flags = kFlagResponse;
  e.status = StatusCode::kStaleEpoch;
  e.epoch = 9;
  std::string ef = BuildFrame(e, "epoch 3 is stale; node is at 9");
  REQUIRE(Decode(ef, &d).ok());
  Status s = ParseErrorBody(d, Bytes(ef).subspan(kHeaderSize));
  CHECK(s.code() == StatusCode::kStaleEpoch);
  CHECK(s.message() == "epoch 3 is stale; node is at 9");
  CHECK(d.epoch == 9);
}

TEST_CASE("Malformed headers are rejected, each for its own reason", "[protocol]") {
  std::string body;
  AppendKey(&body, BlockKey{1, 2});
  const std::string good = BuildFrame(Req(Opcode::kGet, 1), body);
  FrameHeader d;
  REQUIRE(Decode(good, &d).ok());

  auto reason = [&](const std::string& f, ProtocolLimits lim = {}) {
    Status s = Decode(f, &d, lim);
    REQUIRE(!s.ok());
    return s.message();
  };
  CHECK_THAT(reason(good.substr(0, 39)), Catch::Contains("truncated header"));
  CHECK_THAT(reason(Patch(good, 0, 'X')), Catch::Contains("bad magic"));
  CHECK_THAT(reason(Patch(good, 4, 2)), Catch::Contains("unsupported protocol version 2"));
  std::string flipped = good;
  flipped[20] ^= 1;  // epoch byte without fixing the checksum
  CHECK_THAT(reason(flipped), Catch::Contains("checksum"));
  CHECK_THAT(reason(Patch(good, 6, 0)), Catch::Contains("unknown opcode"));
  CHECK_THAT(reason(Patch(good, 6, 77)), Catch::Contains("unknown opcode"));
  CHECK_THAT(reason(Patch(good, 7, 0x80)), Catch::Contains("unknown flag"));
  CHECK_THAT(reason(Patch(good, 33, 1)), Catch::Contains("reserved"));
  CHECK_THAT(reason(Patch(good, 32, 250)), Catch::Contains("status code"));
  CHECK_THAT(reason(Patch(good, 32, 7)), Catch::Contains("request with a status"));
  CHECK_THAT(reason(Patch(good, 24, 2)), Catch::Contains("count x 16"));  // count 2, body 16
  CHECK_THAT(reason(Patch(good, 28, 17)), Catch::Contains("count x 16"));

  ProtocolLimits small;
  small.max_body_bytes = 8;
  CHECK(Decode(good, &d, small).code() == StatusCode::kResourceExhausted);
  ProtocolLimits few;
  few.max_items = 0;
  CHECK(Decode(good, &d, few).code() == StatusCode::kResourceExhausted);

  // Oversize claims are refused from the header alone (nothing allocated yet).
  std::string huge = Patch(Patch(Patch(good, 31, 0x7F), 28, 0), 24, 0);
  CHECK(Decode(huge, &d).code() == StatusCode::kResourceExhausted);

  std::string stats_with_body = BuildFrame(Req(Opcode::kStats, 0), "x");
  CHECK_THAT(reason(stats_with_body), Catch::Contains("STATS"));
  std::string short_put = BuildFrame(Req(Opcode::kPut, 2), std::string(40, '\0'));
  CHECK_THAT(reason(short_put), Catch::Contains("PUT body shorter"));
}

TEST_CASE("Random bytes never decode into an out-of-bounds frame", "[protocol]") {
  std::mt19937_64 rng(1234);
  ProtocolLimits lim;
  int accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string f(kHeaderSize + (rng() % 64), '\0');
    for (auto& c : f) c = static_cast<char>(rng());
    if (i % 2) {  // make half of them pass the magic/version/checksum gate
      uint32_t magic = kMagic;
      std::memcpy(f.data(), &magic, 4);
      f[4] = 1;
      f[5] = 0;
      f[33] = f[34] = f[35] = 0;
      uint32_t crc = static_cast<uint32_t>(Checksum64(f.data(), 36));
      std::memcpy(f.data() + 36, &crc, 4);
    }
    FrameHeader d;
    if (DecodeHeader(Bytes(f), lim, &d).ok()) {
      ++accepted;
      CHECK(d.body_len <= lim.max_body_bytes);
      CHECK(d.count <= lim.max_items);
    }
  }
  CHECK(accepted < 20000);
}

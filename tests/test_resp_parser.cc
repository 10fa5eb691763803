// The incremental RESP parser (RespCommandParser, transport/resp/resp_protocol.h)
// against the one-shot ParseRespCommand: however a stream of commands is cut
// into reads, it yields the same commands and the same errors; and the time
// a byte costs does not grow with the command it belongs to.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "transport/resp/resp_protocol.h"

using namespace kvmesh;

namespace {

std::string Cmd(const std::vector<std::string>& args) {
  std::string s = "*" + std::to_string(args.size()) + "\r\n";
  for (const std::string& a : args) s += "$" + std::to_string(a.size()) + "\r\n" + a + "\r\n";
  return s;
}

struct Parsed {
  std::vector<std::vector<std::string>> commands;
  std::string error;  // "" when none
  bool operator==(const Parsed& o) const { return commands == o.commands && error == o.error; }
};

// The whole stream at once, one command after the other.
Parsed OneShot(const std::string& in, uint64_t max_bulk) {
  Parsed out;
  size_t pos = 0;
  std::vector<std::string_view> args;
  for (;;) {
    size_t used = 0;
    std::string err;
    const RespParse p = ParseRespCommand(std::string_view(in).substr(pos), max_bulk, &args, &used, &err);
    if (p == RespParse::kNeedMore) return out;
    if (p == RespParse::kError) {
      out.error = err;
      return out;
    }
    out.commands.emplace_back(args.begin(), args.end());
    pos += used;
  }
}

// The stream as a connection reads it: `cuts` bytes at a time, into a buffer
// that moves (copied) after every read, parsed incrementally.
Parsed Incremental(const std::string& in, uint64_t max_bulk, const std::vector<size_t>& cuts) {
  Parsed out;
  RespCommandParser parser;
  std::string buf;  // the unparsed bytes, the current command first
  size_t fed = 0, k = 0;
  std::vector<std::string_view> args;
  while (fed < in.size()) {
    const size_t n = std::min(cuts[k++ % cuts.size()], in.size() - fed);
    std::string moved = buf + in.substr(fed, n);  // a new buffer each read: offsets, not pointers, carry over
    buf.swap(moved);
    fed += n;
    size_t pos = 0;
    for (;;) {
      size_t used = 0;
      std::string err;
      const RespParse p = parser.Parse(std::string_view(buf).substr(pos), max_bulk, &args, &used, &err);
      if (p == RespParse::kNeedMore) break;
      if (p == RespParse::kError) {
        out.error = err;
        return out;
      }
      out.commands.emplace_back(args.begin(), args.end());
      pos += used;
    }
    buf.erase(0, pos);
  }
  return out;
}

}  // namespace

TEST_CASE("RESP: the incremental parser finds what the one-shot parser finds, however the bytes are cut",
          "[resp]") {
  std::vector<std::string> streams = {
      Cmd({"SET", "key", std::string(3000, 'v')}) + Cmd({"GET", "key"}) + "PING\r\n" + Cmd({}) + "\r\n" +
          Cmd({"MSET", "a", "1", "b", "", "c", std::string(70, 'x')}) + "  GET   spaced  \n",
      Cmd({"ECHO", std::string(1, '\0') + "\r\n$3\r\n"}),
      "*2\r\n$3\r\nGET\r\n$-1\r\n",           // a negative bulk length
      "*2\r\n$3\r\nGET\r\n$4\r\nabc\r\n",     // a bulk not ended by CRLF
      "*1\r\n+PING\r\n",                       // not a bulk string
      "*99999999999999999999999\r\n",          // a count past every limit
      "*2\r\n$3\r\nGET\r\n$100\r\n" + std::string(50, 'x'),  // a bulk over max_bulk (64 here)
      "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$" + std::string(40, '9') + "\r\n",  // a length line too long
      std::string(70000, 'a'),                 // an inline command without its end
  };
  std::mt19937_64 rng(39);
  for (const std::string& s : streams) {
    const Parsed whole = OneShot(s, 64 << 10);
    const Parsed small = OneShot(s, 64);
    for (const std::vector<size_t>& cuts : std::vector<std::vector<size_t>>{{1}, {2}, {3, 1, 7}, {s.size()}}) {
      INFO(s.substr(0, 60) << " cut " << cuts[0]);
      CHECK(Incremental(s, 64 << 10, cuts) == whole);
      CHECK(Incremental(s, 64, cuts) == small);
    }
    for (int r = 0; r < 20; ++r) {
      std::vector<size_t> cuts;
      for (int i = 0; i < 16; ++i) cuts.push_back(1 + rng() % 40);
      CHECK(Incremental(s, 64 << 10, cuts) == whole);
    }
  }
}

TEST_CASE("RESP: a command parsed a few bytes at a time costs the same per byte early and late", "[resp]") {
  // 300,001 arguments, fed 70 bytes (ten arguments) per call; the time of a
  // thousand calls at the start and after most of the command has arrived.
  std::string in = "*300001\r\n$3\r\nDEL\r\n";
  for (int i = 0; i < 300000; ++i) in += "$1\r\na\r\n";
  RespCommandParser parser;
  std::vector<std::string_view> args;
  size_t fed = 19, used = 0;
  std::string err;
  RespParse last = RespParse::kNeedMore;
  auto feed = [&](int calls) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) {
      fed = std::min(fed + 70, in.size());
      last = parser.Parse(std::string_view(in).substr(0, fed), 1 << 20, &args, &used, &err);
      if (fed < in.size()) REQUIRE(last == RespParse::kNeedMore);
    }
    return std::chrono::steady_clock::now() - t0;
  };
  const auto early = feed(1000);
  while (fed < in.size() - 80'000) feed(1);
  const auto late = feed(1000);
  INFO("1000 calls: " << std::chrono::duration_cast<std::chrono::microseconds>(early).count() << " us early, "
                      << std::chrono::duration_cast<std::chrono::microseconds>(late).count() << " us late");
  // ParseRespCommand from the start each time: ~2 MB walked per call late.
  CHECK(late < 5 * early + std::chrono::milliseconds(20));
  while (fed < in.size()) feed(1);
  REQUIRE(last == RespParse::kCommand);
  CHECK(args.size() == 300001);
  CHECK(used == in.size());
}

TEST_CASE("RespReadBuffer::MakeRoom: doubles a full buffer, jumps to a bulk string's end, stops at the bound",
          "[resp][limits]") {
  RespReadBuffer buf;
  REQUIRE(buf.MakeRoom(0, 4096, 0, 65536));  // nothing yet: the first size
  CHECK(buf.capacity() == 4096);
  REQUIRE(buf.MakeRoom(100, 4096, 0, 65536));  // room left: unchanged
  CHECK(buf.capacity() == 4096);
  std::memset(buf.data(), 'x', 4096);
  REQUIRE(buf.MakeRoom(4096, 4096, 0, 65536));  // full: doubled, the bytes kept
  CHECK(buf.capacity() == 8192);
  CHECK(buf.data()[4095] == 'x');
  REQUIRE(buf.MakeRoom(8192, 4096, 40000, 65536));  // the parser waits for byte 40,000: one step there
  CHECK(buf.capacity() == 40000);
  REQUIRE(buf.MakeRoom(40000, 4096, 0, 65536));  // never past the bound
  CHECK(buf.capacity() == 65536);
  CHECK_FALSE(buf.MakeRoom(65536, 4096, 0, 65536));  // full at the bound: the connection must close
  CHECK(buf.capacity() == 65536);
}

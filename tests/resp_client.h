// tests/resp_client.h — a small blocking RESP2 client for the RESP tests:
// sends commands (pipelined or one at a time) and parses each reply (simple
// string, error, integer, bulk or nil, array) with a deadline.
#pragma once

#include <sys/socket.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <string>
#include <vector>

#include "transport/socket_util.h"

namespace kvmesh::testing {

struct RespValue {
  char type = 0;       // '+', '-', ':', '$', '*'; '$' with nil for a nil bulk
  bool nil = false;
  std::string str;     // simple string, error text, bulk bytes
  int64_t num = 0;     // integer
  std::vector<RespValue> arr;
  bool is_error() const { return type == '-'; }
  bool ok() const { return type == '+' && str == "OK"; }
};

inline std::string RespCmd(const std::vector<std::string>& args) {
  std::string s = "*" + std::to_string(args.size()) + "\r\n";
  for (const std::string& a : args) s += "$" + std::to_string(a.size()) + "\r\n" + a + "\r\n";
  return s;
}

class RespTestClient {
 public:
  explicit RespTestClient(uint16_t port) {
    auto f = ConnectTcp("127.0.0.1", port, std::chrono::steady_clock::now() + std::chrono::seconds(2));
    REQUIRE(f.ok());
    fd_ = std::move(*f);
  }
  int fd() const { return fd_.get(); }
  void Send(const std::string& s) {
    REQUIRE(WriteAll(fd_.get(), s.data(), s.size(), std::chrono::steady_clock::now() + std::chrono::seconds(30)).ok());
  }
  RespValue Call(const std::vector<std::string>& args) {
    Send(RespCmd(args));
    return Read();
  }
  // One reply; REQUIREs that it arrives within the stall limit.
  RespValue Read() {
    RespValue v;
    const std::string line = Line();
    REQUIRE(!line.empty());
    v.type = line[0];
    const std::string rest = line.substr(1);
    switch (v.type) {
      case '+':
      case '-': v.str = rest; break;
      case ':': v.num = std::stoll(rest); break;
      case '$': {
        const int64_t n = std::stoll(rest);
        if (n < 0) {
          v.nil = true;
          break;
        }
        v.str = Bytes(static_cast<size_t>(n) + 2);
        v.str.resize(static_cast<size_t>(n));
        break;
      }
      case '*': {
        const int64_t n = std::stoll(rest);
        for (int64_t i = 0; i < n; ++i) v.arr.push_back(Read());
        break;
      }
      default: FAIL("bad RESP reply type '" << v.type << "'");
    }
    return v;
  }

 private:
  std::string Line() {
    std::string l;
    for (;;) {
      if (pos_ == buf_.size()) Fill();
      const char c = buf_[pos_++];
      if (c == '\n') break;
      l += c;
    }
    if (!l.empty() && l.back() == '\r') l.pop_back();
    return l;
  }
  std::string Bytes(size_t n) {
    std::string out;
    out.reserve(n);
    while (out.size() < n) {
      if (pos_ == buf_.size()) Fill();
      const size_t take = std::min(n - out.size(), buf_.size() - pos_);
      out.append(buf_, pos_, take);
      pos_ += take;
    }
    return out;
  }
  void Fill() {
    buf_.resize(1 << 20);
    REQUIRE(ReadSome());
    pos_ = 0;
  }
  bool ReadSome() {
    // ReadFull of 1 byte bounds the wait; then take what else is there.
    char first;
    if (!ReadFull(fd_.get(), &first, 1, 30000, {}).ok()) return false;
    buf_[0] = first;
    ssize_t n = ::recv(fd_.get(), buf_.data() + 1, buf_.size() - 1, MSG_DONTWAIT);
    buf_.resize(1 + (n > 0 ? static_cast<size_t>(n) : 0));
    return true;
  }
  UniqueFd fd_;
  std::string buf_;
  size_t pos_ = 0;
};

}  // namespace kvmesh::testing

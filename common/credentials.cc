#include "common/credentials.h"

#include <array>
#include <cstdint>

namespace kvmesh {
namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int Sextet(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

bool StartsWithNoCase(std::string_view s, std::string_view prefix) {
  if (s.size() < prefix.size()) return false;
  for (size_t i = 0; i < prefix.size(); ++i) {
    char a = s[i], b = prefix[i];
    if (a >= 'A' && a <= 'Z') a = static_cast<char>(a - 'A' + 'a');
    if (b >= 'A' && b <= 'Z') b = static_cast<char>(b - 'A' + 'a');
    if (a != b) return false;
  }
  return true;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  // Every byte of the longer input is visited, so the time does not say how
  // long a common prefix is; a length mismatch is folded into the result.
  const size_t n = a.size() > b.size() ? a.size() : b.size();
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned>(x ^ y);
  }
  return diff == 0;
}

std::string Base64Encode(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= in.size(); i += 3) {
    const uint32_t v = uint32_t(uint8_t(in[i])) << 16 | uint32_t(uint8_t(in[i + 1])) << 8 | uint8_t(in[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out += kAlphabet[(v >> s) & 63];
  }
  if (const size_t rest = in.size() - i; rest > 0) {
    uint32_t v = uint32_t(uint8_t(in[i])) << 16;
    if (rest == 2) v |= uint32_t(uint8_t(in[i + 1])) << 8;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += rest == 2 ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::optional<std::string> Base64Decode(std::string_view in) {
  if (in.size() % 4 != 0) return std::nullopt;
  std::string out;
  out.reserve(in.size() / 4 * 3);
  for (size_t i = 0; i < in.size(); i += 4) {
    const bool last = i + 4 == in.size();
    int pad = 0;
    uint32_t v = 0;
    for (size_t k = 0; k < 4; ++k) {
      const char c = in[i + k];
      int s = 0;
      if (c == '=') {
        // Padding only at the end of the last quantum, in positions 2 and 3.
        if (!last || k < 2 || (k == 2 && in[i + 3] != '=')) return std::nullopt;
        ++pad;
      } else {
        if (pad > 0) return std::nullopt;
        s = Sextet(c);
        if (s < 0) return std::nullopt;
      }
      v = v << 6 | static_cast<uint32_t>(s);
    }
    out += static_cast<char>((v >> 16) & 0xFF);
    if (pad < 2) out += static_cast<char>((v >> 8) & 0xFF);
    if (pad < 1) out += static_cast<char>(v & 0xFF);
  }
  return out;
}

HttpCredentials ParseAuthorization(std::string_view header) {
  HttpCredentials c;
  header = Trim(header);
  if (header.empty()) return c;
  c.kind = HttpCredentials::Kind::kMalformed;
  if (StartsWithNoCase(header, "bearer ")) {
    std::string_view t = Trim(header.substr(7));
    if (t.empty()) return c;
    c.kind = HttpCredentials::Kind::kBearer;
    c.secret = std::string(t);
    return c;
  }
  if (StartsWithNoCase(header, "basic ")) {
    std::optional<std::string> raw = Base64Decode(Trim(header.substr(6)));
    if (!raw) return c;
    const size_t colon = raw->find(':');
    if (colon == std::string::npos || colon == 0) return c;
    c.kind = HttpCredentials::Kind::kBasic;
    c.user = raw->substr(0, colon);
    c.secret = raw->substr(colon + 1);
    return c;
  }
  return c;
}

std::string BearerAuthorization(std::string_view token) { return "Bearer " + std::string(token); }

std::string BasicAuthorization(std::string_view user, std::string_view password) {
  return "Basic " + Base64Encode(std::string(user) + ":" + std::string(password));
}

}  // namespace kvmesh

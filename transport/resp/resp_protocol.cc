#include "transport/resp/resp_protocol.h"

#include <cctype>
#include <cstring>

namespace kvmesh {
namespace {

// Reads "<digits>\r\n" at in[pos] after a type byte. kNeedMore when the line is incomplete.
RespParse ReadNumber(std::string_view in, size_t* pos, int64_t* out) {
  size_t eol = in.find("\r\n", *pos);
  if (eol == std::string_view::npos) return in.size() - *pos > 32 ? RespParse::kError : RespParse::kNeedMore;
  if (eol == *pos || eol - *pos > 20) return RespParse::kError;
  int64_t v = 0;
  bool neg = false;
  size_t i = *pos;
  if (in[i] == '-') {
    neg = true;
    ++i;
  }
  if (i == eol) return RespParse::kError;
  for (; i < eol; ++i) {
    if (!std::isdigit(static_cast<unsigned char>(in[i]))) return RespParse::kError;
    if (v > (INT64_MAX - 9) / 10) return RespParse::kError;
    v = v * 10 + (in[i] - '0');
  }
  *out = neg ? -v : v;
  *pos = eol + 2;
  return RespParse::kCommand;
}

}  // namespace

RespParse ParseRespCommand(std::string_view in, uint64_t max_bulk, std::vector<std::string_view>* args,
                           size_t* consumed, std::string* err) {
  args->clear();
  if (in.empty()) return RespParse::kNeedMore;
  if (in[0] != '*') {  // inline command: words up to the end of the line
    size_t eol = in.find('\n');
    if (eol == std::string_view::npos) {
      if (in.size() > kRespMaxInline) {
        *err = "inline command too long";
        return RespParse::kError;
      }
      return RespParse::kNeedMore;
    }
    std::string_view line = in.substr(0, eol);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    size_t i = 0;
    while (i < line.size()) {
      while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
      size_t j = i;
      while (j < line.size() && line[j] != ' ' && line[j] != '\t') ++j;
      if (j > i) args->push_back(line.substr(i, j - i));
      i = j;
    }
    *consumed = eol + 1;
    return RespParse::kCommand;
  }
  size_t pos = 1;
  int64_t n = 0;
  RespParse p = ReadNumber(in, &pos, &n);
  if (p != RespParse::kCommand) {
    if (p == RespParse::kError) *err = "invalid multibulk length";
    return p;
  }
  if (n < 0 || n > kRespMaxArgs) {
    *err = "invalid multibulk length";
    return RespParse::kError;
  }
  for (int64_t a = 0; a < n; ++a) {
    if (pos >= in.size()) return RespParse::kNeedMore;
    if (in[pos] != '$') {
      *err = "expected '$', got '" + std::string(1, in[pos]) + "'";
      return RespParse::kError;
    }
    ++pos;
    int64_t len = 0;
    p = ReadNumber(in, &pos, &len);
    if (p != RespParse::kCommand) {
      if (p == RespParse::kError) *err = "invalid bulk length";
      return p;
    }
    if (len < 0 || static_cast<uint64_t>(len) > max_bulk) {
      *err = "invalid bulk length";
      return RespParse::kError;
    }
    if (in.size() - pos < static_cast<size_t>(len) + 2) return RespParse::kNeedMore;
    if (in[pos + len] != '\r' || in[pos + len + 1] != '\n') {
      *err = "bulk string not terminated by CRLF";
      return RespParse::kError;
    }
    args->push_back(in.substr(pos, static_cast<size_t>(len)));
    pos += static_cast<size_t>(len) + 2;
  }
  *consumed = pos;
  return RespParse::kCommand;
}

std::string RespInfoHeader() { return "# Server\r\nredis_version:7.0.0-kvmesh\r\nkvmesh_version:0.1.0\r\n"; }

// ---- RespReply ------------------------------------------------------------------

void RespReply::Add(std::string s) {
  bytes_ += s.size();
  // Coalesce small pieces into the previous owned string.
  if (!strs_.empty() && !pieces_.empty() && pieces_.back().data() == strs_.back().data() && s.size() < 256 &&
      strs_.back().size() < 4096) {
    strs_.back() += s;
    pieces_.back() = std::span<const char>(strs_.back());
    return;
  }
  strs_.push_back(std::move(s));
  pieces_.emplace_back(strs_.back());
}

void RespReply::Bulk(std::string_view s) {
  if (s.size() >= 4096) return BulkOwned(std::string(s));
  Add("$" + std::to_string(s.size()) + "\r\n" + std::string(s) + "\r\n");
}

void RespReply::BulkOwned(std::string s) {
  Add("$" + std::to_string(s.size()) + "\r\n");
  bytes_ += s.size();
  strs_.push_back(std::move(s));
  pieces_.emplace_back(strs_.back());
  Add("\r\n");
}

void RespReply::BulkBorrowed(std::span<const char> s, std::shared_ptr<const void> keep) {
  Add("$" + std::to_string(s.size()) + "\r\n");
  Borrowed(s, std::move(keep));
  Add("\r\n");
}

void RespReply::Borrowed(std::span<const char> s, std::shared_ptr<const void> keep) {
  if (keep) keep_.push_back(std::move(keep));
  if (s.empty()) return;
  pieces_.push_back(s);
  bytes_ += s.size();
}

void RespReply::Err(const std::string& m) {
  std::string line = "-" + m;
  for (char& c : line)
    if (c == '\r' || c == '\n') c = ' ';
  Add(line + "\r\n");
}

}  // namespace kvmesh

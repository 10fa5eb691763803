#include "transport/resp/resp_protocol.h"

#include <algorithm>
#include <cctype>
#include <cstring>

namespace kvmesh {
namespace {

// Reads "<digits>\r\n" at in[pos] after a type byte. kNeedMore when the line is
// incomplete (a line is at most 22 bytes: only that much is searched).
RespParse ReadNumber(std::string_view in, size_t* pos, int64_t* out) {
  const std::string_view line = in.substr(*pos, 34);
  const size_t at = line.find("\r\n");
  if (at == std::string_view::npos) return line.size() > 32 ? RespParse::kError : RespParse::kNeedMore;
  const size_t eol = *pos + at;
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

void RespCommandParser::Reset() {
  nargs_ = -1;
  pos_ = 0;
  scan_ = 0;
  wanted_ = 0;
  spans_.clear();
}

RespParse RespCommandParser::Parse(std::string_view in, uint64_t max_bulk, std::vector<std::string_view>* args,
                                   size_t* consumed, std::string* err) {
  args->clear();
  if (in.empty()) return RespParse::kNeedMore;
  auto fail = [&](std::string why) {
    *err = std::move(why);
    Reset();
    return RespParse::kError;
  };
  if (in[0] != '*') {  // inline command: words up to the end of the line
    const size_t eol = in.find('\n', scan_);
    if (eol == std::string_view::npos) {
      if (in.size() > kRespMaxInline) return fail("inline command too long");
      scan_ = in.size();
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
    Reset();
    return RespParse::kCommand;
  }
  if (nargs_ < 0) {
    size_t pos = 1;
    int64_t n = 0;
    const RespParse p = ReadNumber(in, &pos, &n);
    if (p == RespParse::kNeedMore) return p;
    if (p == RespParse::kError || n < 0 || n > kRespMaxArgs) return fail("invalid multibulk length");
    nargs_ = n;
    pos_ = pos;
    spans_.clear();
    spans_.reserve(static_cast<size_t>(std::min<int64_t>(n, 1024)));
  }
  while (static_cast<int64_t>(spans_.size()) < nargs_) {
    if (pos_ >= in.size()) return RespParse::kNeedMore;
    if (in[pos_] != '$') return fail("expected '$', got '" + std::string(1, in[pos_]) + "'");
    size_t pos = pos_ + 1;
    int64_t len = 0;
    const RespParse p = ReadNumber(in, &pos, &len);
    if (p == RespParse::kNeedMore) return p;  // the bulk header is read again next time (at most 22 bytes)
    if (p == RespParse::kError || len < 0 || static_cast<uint64_t>(len) > max_bulk) return fail("invalid bulk length");
    const size_t ulen = static_cast<size_t>(len);
    wanted_ = std::max(wanted_, pos + ulen + 2);
    if (in.size() - pos < ulen + 2) return RespParse::kNeedMore;
    if (in[pos + ulen] != '\r' || in[pos + ulen + 1] != '\n') return fail("bulk string not terminated by CRLF");
    spans_.emplace_back(pos, ulen);
    pos_ = pos + ulen + 2;
  }
  args->reserve(spans_.size());
  for (const auto& [off, len] : spans_) args->push_back(in.substr(off, len));
  *consumed = pos_;
  Reset();
  return RespParse::kCommand;
}

RespParse ParseRespCommand(std::string_view in, uint64_t max_bulk, std::vector<std::string_view>* args,
                           size_t* consumed, std::string* err) {
  RespCommandParser p;
  return p.Parse(in, max_bulk, args, consumed, err);
}

void RespReadBuffer::Resize(size_t cap, size_t keep) {
  if (cap == cap_) return;
  std::unique_ptr<char[]> next(new char[cap]);  // not zero-filled
  if (keep) std::memcpy(next.get(), data_.get(), keep);
  data_ = std::move(next);
  cap_ = cap;
}

bool RespReadBuffer::MakeRoom(size_t filled, size_t first, size_t wanted, size_t max) {
  if (filled < cap_) return true;
  if (filled >= max) return false;
  const size_t cap = cap_ ? cap_ * 2 : first;
  Resize(std::min(std::max(cap, wanted), max), filled);
  return true;
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

#include "transport/resp/resp_protocol.h"

#include <xxhash.h>

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

bool Eq(std::string_view a, const char* b) {
  size_t n = std::strlen(b);
  if (a.size() != n) return false;
  for (size_t i = 0; i < n; ++i)
    if (std::toupper(static_cast<unsigned char>(a[i])) != b[i]) return false;
  return true;
}

bool IsPlainGet(const RespCommand& c) { return c.size() == 2 && Eq(c[0], "GET"); }
bool IsPlainSet(const RespCommand& c) { return c.size() >= 3 && Eq(c[0], "SET"); }

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

BlockKey RespKey(std::string_view key) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_128bits_reset(st);
  XXH3_128bits_update(st, "resp", 5);  // includes the NUL: a separate key space
  XXH3_128bits_update(st, key.data(), key.size());
  XXH128_hash_t h = XXH3_128bits_digest(st);
  XXH3_freeState(st);
  return BlockKey{h.high64, h.low64};
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
  keep_.push_back(std::move(keep));
  pieces_.push_back(s);
  bytes_ += s.size();
  strs_.push_back("\r\n");
  pieces_.emplace_back(strs_.back());
  bytes_ += 2;
}

void RespReply::Err(const std::string& m) {
  std::string line = "-" + m;
  for (char& c : line)
    if (c == '\r' || c == '\n') c = ' ';
  Add(line + "\r\n");
}

// ---- RespCommands ---------------------------------------------------------------

Status RespCommands::CheckValue(std::string_view v) const {
  if (v.empty()) return InvalidArgument("kvmesh stores non-empty values only");
  if (v.size() > max_value_bytes_)
    return ResourceExhausted("value of " + std::to_string(v.size()) + " bytes exceeds the slot size of " +
                             std::to_string(max_value_bytes_) + " bytes");
  return Status::Ok();
}

bool RespCommands::Run(std::span<const RespCommand> cmds, RespReply* out) {
  std::vector<std::string_view> keys, values;
  std::vector<Status> statuses;
  size_t i = 0;
  while (i < cmds.size()) {
    if (cmds[i].empty()) {
      ++i;
      continue;
    }
    size_t j = i;
    if (IsPlainGet(cmds[i])) {  // a run of GETs: one backend batch, one answer each
      keys.clear();
      while (j < cmds.size() && IsPlainGet(cmds[j])) keys.push_back(cmds[j++][1]);
      commands_.fetch_add(j - i, std::memory_order_relaxed);
      backend_->Get(keys, out);
      i = j;
      continue;
    }
    if (IsPlainSet(cmds[i])) {  // a run of SETs: the valid values go as one batch
      keys.clear(), values.clear();
      std::vector<Status> answer;
      std::vector<size_t> slot;  // index into keys, or SIZE_MAX when refused here
      for (; j < cmds.size() && IsPlainSet(cmds[j]); ++j) {
        Status s = CheckValue(cmds[j][2]);
        slot.push_back(s.ok() ? keys.size() : SIZE_MAX);
        answer.push_back(std::move(s));
        if (slot.back() != SIZE_MAX) keys.push_back(cmds[j][1]), values.push_back(cmds[j][2]);
      }
      statuses.assign(keys.size(), Status::Ok());
      if (!keys.empty()) backend_->Set(keys, values, statuses);
      for (size_t k = 0; k < slot.size(); ++k) {
        const Status& s = slot[k] == SIZE_MAX ? answer[k] : statuses[slot[k]];
        if (s.ok()) out->Ok();
        else out->Err("ERR " + s.ToString());
      }
      commands_.fetch_add(j - i, std::memory_order_relaxed);
      i = j;
      continue;
    }
    commands_.fetch_add(1, std::memory_order_relaxed);
    if (!Execute(cmds[i], out)) return false;
    ++i;
  }
  return true;
}

bool RespCommands::Execute(const RespCommand& a, RespReply* out) {
  const std::string_view cmd = a[0];
  const size_t argc = a.size();
  auto arity = [&](bool ok) {
    if (!ok) out->Err("ERR wrong number of arguments for '" + std::string(cmd.substr(0, 64)) + "' command");
    return ok;
  };
  std::span<const std::string_view> rest(a.data() + 1, argc - 1);
  if (Eq(cmd, "GET")) {
    arity(false);  // GET with two arguments ran as a batch in Run()
  } else if (Eq(cmd, "SET")) {
    arity(false);
  } else if (Eq(cmd, "MGET")) {
    if (arity(argc >= 2)) {
      out->Array(argc - 1);
      backend_->Get(rest, out);
    }
  } else if (Eq(cmd, "MSET")) {
    if (arity(argc >= 3 && argc % 2 == 1)) {
      std::vector<std::string_view> keys, values;
      Status first;
      for (size_t i = 1; i + 1 < argc; i += 2) {
        Status s = CheckValue(a[i + 1]);
        if (!s.ok()) {
          if (first.ok()) first = s;
          continue;
        }
        keys.push_back(a[i]);
        values.push_back(a[i + 1]);
      }
      std::vector<Status> statuses(keys.size());
      if (!keys.empty()) backend_->Set(keys, values, statuses);
      for (Status& s : statuses)
        if (!s.ok() && first.ok()) first = std::move(s);
      if (first.ok()) out->Ok();
      else out->Err("ERR " + first.ToString());
    }
  } else if (Eq(cmd, "EXISTS")) {
    if (arity(argc >= 2)) out->Int(backend_->Exists(rest));
  } else if (Eq(cmd, "DEL") || Eq(cmd, "UNLINK")) {
    if (arity(argc >= 2)) out->Int(backend_->Del(rest));
  } else if (Eq(cmd, "PING")) {
    if (argc == 1) out->Add("+PONG\r\n");
    else out->Bulk(a[1]);
  } else if (Eq(cmd, "ECHO")) {
    if (arity(argc == 2)) out->Bulk(a[1]);
  } else if (Eq(cmd, "INFO")) {
    std::string info = RespInfoHeader() + "resp_commands_processed:" + std::to_string(commands()) + "\r\n";
    info += backend_->Info();
    out->BulkOwned(std::move(info));
  } else if (Eq(cmd, "DBSIZE")) {
    out->Int(backend_->DbSize());
  } else if (Eq(cmd, "SELECT")) {
    if (arity(argc == 2)) {
      if (a[1] == "0") out->Ok();
      else out->Err("ERR kvmesh has one database (0)");
    }
  } else if (Eq(cmd, "CONFIG")) {
    // redis-benchmark reads "save" and "appendonly": kvmesh is a cache with neither.
    if (argc == 3 && Eq(a[1], "GET")) {
      std::string_view k = a[2];
      if (k == "save" || k == "appendonly") {
        out->Array(2);
        out->Bulk(k);
        out->Bulk(k == "save" ? "" : "no");
      } else {
        out->Array(0);
      }
    } else {
      out->Err("ERR CONFIG supports only GET");
    }
  } else if (Eq(cmd, "COMMAND")) {
    out->Array(0);
  } else if (Eq(cmd, "CLIENT")) {
    out->Ok();
  } else if (Eq(cmd, "HELLO")) {
    out->Err("NOPROTO kvmesh speaks RESP2 only");
  } else if (Eq(cmd, "QUIT")) {
    out->Ok();
    return false;
  } else {
    out->Err("ERR unknown command '" + std::string(cmd.substr(0, 64)) +
             "' (kvmesh speaks PING ECHO GET SET MGET MSET EXISTS DEL INFO DBSIZE SELECT QUIT)");
  }
  return true;
}

}  // namespace kvmesh
